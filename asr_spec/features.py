"""Whisper's log-mel features, computed over a whole recording as openai/whisper does."""
from __future__ import annotations

from functools import lru_cache

import numpy as np
import torch
from transformers.audio_utils import mel_filter_bank

from .audio import SAMPLE_RATE

N_FFT, HOP = 400, 160
WINDOW_SECONDS = 30
N_SAMPLES = WINDOW_SECONDS * SAMPLE_RATE
N_FRAMES = N_SAMPLES // HOP  # 3000 mel frames per window
FRAMES_PER_SECOND = SAMPLE_RATE // HOP  # 100
TOKEN_SECONDS = 0.02  # one timestamp step = 2 mel frames


@lru_cache(maxsize=4)
def _filters(n_mels: int) -> torch.Tensor:
    fb = mel_filter_bank(num_frequency_bins=N_FFT // 2 + 1, num_mel_filters=n_mels, min_frequency=0.0,
                         max_frequency=SAMPLE_RATE / 2, sampling_rate=SAMPLE_RATE, norm="slaney", mel_scale="slaney")
    return torch.from_numpy(fb.T.astype(np.float32))


def log_mel(audio: np.ndarray, n_mels: int = 80, pad_samples: int = N_SAMPLES) -> torch.Tensor:
    """[n_mels, frames] for ``audio`` followed by ``pad_samples`` of silence (30 s, as Whisper pads)."""
    x = torch.from_numpy(np.asarray(audio, dtype=np.float32))
    if pad_samples:
        x = torch.nn.functional.pad(x, (0, pad_samples))
    stft = torch.stft(x, N_FFT, HOP, window=torch.hann_window(N_FFT), return_complex=True)
    power = stft[..., :-1].abs() ** 2
    mel = _filters(n_mels) @ power
    log = torch.clamp(mel, min=1e-10).log10()
    log = torch.maximum(log, log.max() - 8.0)
    return (log + 4.0) / 4.0


def window(mel: torch.Tensor, start: int, frames: int = N_FRAMES) -> torch.Tensor:
    """Frames [start, start + frames) of ``mel``, zero-padded at the end to a full window."""
    seg = mel[:, start:start + frames]
    if seg.shape[1] < frames:
        seg = torch.nn.functional.pad(seg, (0, frames - seg.shape[1]))
    return seg


FRAME_GRANULARITY = 100  # frames (1 s): encoder inputs shortened to the audio are rounded up to this
TAIL_FRAMES = 200  # silence kept after the audio: without it Whisper runs on past the end (dev WER +24 points)


def encoder_frames(audio_frames: int, full: bool = True) -> int:
    """Mel frames the encoder sees for a window holding ``audio_frames`` of audio: the padded 30 s window
    (Whisper's own behaviour, ``full``), or the audio plus 2 s of silence rounded up to whole seconds
    (work proportional to the audio; slightly different text: README, ``--encoder-window``)."""
    if full:
        return N_FRAMES
    return min(N_FRAMES, -(-(audio_frames + TAIL_FRAMES) // FRAME_GRANULARITY) * FRAME_GRANULARITY)
