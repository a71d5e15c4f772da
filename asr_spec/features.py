"""Whisper's log-mel features of a whole recording, as openai/whisper computes them: at once (:func:`log_mel`), or
a 30 s block at a time with the same bits (:class:`Features`)."""
from __future__ import annotations

from enum import StrEnum
from functools import lru_cache

import numpy as np
import torch

from .audio import SAMPLE_RATE, Audio, Cursor, blocks_of

N_FFT, HOP = 400, 160
WINDOW_SECONDS = 30
N_SAMPLES = WINDOW_SECONDS * SAMPLE_RATE
N_FRAMES = N_SAMPLES // HOP  # 3000 mel frames per window
FRAMES_PER_SECOND = SAMPLE_RATE // HOP  # 100
TOKEN_SECONDS = 0.02  # one timestamp step = 2 mel frames


def _slaney_mel(hz: np.ndarray) -> np.ndarray:
    """Hertz to Slaney's mel scale: linear (3 mels per 200 Hz) below 1 kHz, logarithmic above."""
    hz = np.asarray(hz, dtype=np.float64)
    return np.where(hz < 1000.0, 3.0 * hz / 200.0, 15.0 + np.log(np.maximum(hz, 1e-10) / 1000.0) * (27.0 / np.log(6.4)))


def _slaney_hz(mel: np.ndarray) -> np.ndarray:
    """The inverse of :func:`_slaney_mel`."""
    return np.where(mel < 15.0, 200.0 * mel / 3.0, 1000.0 * np.exp((mel - 15.0) * (np.log(6.4) / 27.0)))


def mel_filters(n_mels: int) -> np.ndarray:
    """Whisper's (librosa's) mel filter bank [n_mels, N_FFT / 2 + 1] in float64: ``n_mels`` triangles spaced evenly
    on Slaney's mel scale from 0 Hz to Nyquist, each scaled to unit area (Slaney's normalisation)."""
    edges = _slaney_hz(np.linspace(_slaney_mel(0.0), _slaney_mel(SAMPLE_RATE / 2), n_mels + 2))
    bins = np.linspace(0, SAMPLE_RATE // 2, N_FFT // 2 + 1)
    lower, centre, upper = edges[:-2, None], edges[1:-1, None], edges[2:, None]
    rising = (bins[None] - lower) / (centre - lower)
    falling = (upper - bins[None]) / (upper - centre)
    return np.maximum(0.0, np.minimum(rising, falling)) * (2.0 / (upper - lower))


@lru_cache(maxsize=4)
def _filters(n_mels: int) -> torch.Tensor:
    return torch.from_numpy(mel_filters(n_mels).astype(np.float32))


def log_mel(audio: np.ndarray, n_mels: int = 80, pad_samples: int = N_SAMPLES) -> torch.Tensor:
    """[n_mels, frames] for ``audio`` followed by ``pad_samples`` of silence (30 s, as Whisper pads)."""
    x = torch.from_numpy(np.asarray(audio, dtype=np.float32))
    if pad_samples:
        x = torch.nn.functional.pad(x, (0, pad_samples))
    stft = torch.stft(x, N_FFT, HOP, window=torch.hann_window(N_FFT), return_complex=True)
    log = _log10_mel(stft[..., :-1], n_mels)
    return _scaled(log, log.max())


def _log10_mel(stft: torch.Tensor, n_mels: int) -> torch.Tensor:
    return torch.clamp(_filters(n_mels) @ (stft.abs() ** 2), min=1e-10).log10()


def _scaled(log: torch.Tensor, top: torch.Tensor) -> torch.Tensor:
    """Whisper's range: 8 (x 10 dB) below the recording's loudest frame at most, then about -1..1."""
    return (torch.maximum(log, top - 8.0) + 4.0) / 4.0


class WindowPadding(StrEnum):
    """What follows a window's audio when it holds less than 30 s (its last window, or a short file), before the
    encoder: ``AUDIO``, the log-mel of the audio followed by silence (openai-whisper's ``decode()`` on
    ``log_mel_spectrogram(pad_or_trim(audio))``, transformers' feature extractor); ``MEL``, the window's own log-mel
    frames followed by zeros (openai-whisper's ``transcribe()``, which pads the mel with ``pad_or_trim``, and
    faster-whisper)."""
    AUDIO = "audio"
    MEL = "mel"


class Features:
    """:func:`log_mel` of a recording (followed by 30 s of silence), bit for bit, made one block of 30 s (3000
    frames, at multiples of 3000) at a time, as windows ask for them. Two passes over the audio: the first finds
    its length and its loudest frame (every frame is clamped to 8 below it), the second makes the blocks the
    windows need, reading forward only: memory holds two blocks and their audio, never the recording."""

    def __init__(self, audio: Audio, n_mels: int = 80):
        self.audio, self.n_mels = audio, n_mels
        self.length, self.top = self._scan()
        self._cursor: Cursor | None = None
        self._blocks: dict[int, torch.Tensor] = {}

    @property
    def frames(self) -> int:
        """Mel frames of audio (the 30 s of silence after them not counted)."""
        return self.length // HOP

    def window(self, start: int, frames: int = N_FRAMES, audio: int | None = None) -> torch.Tensor:
        """Frames [start, start + frames) (``frames`` <= 3000; only forward of the last window's first block); with
        ``audio``, the frames after the first ``audio`` are zeros (:attr:`WindowPadding.MEL`)."""
        if audio is not None and audio < frames:
            return torch.nn.functional.pad(self.window(start, audio), (0, frames - audio))
        first, last = start // N_FRAMES, (start + frames - 1) // N_FRAMES
        self._blocks = {k: b for k, b in self._blocks.items() if k >= first}
        if self._cursor is None:
            self._cursor = Cursor(blocks_of(self.audio))
        for k in range(first, last + 1):
            if k not in self._blocks:
                self._blocks[k] = self._block(self._cursor, k)
        log = torch.cat([self._blocks[k] for k in range(first, last + 1)], dim=1)
        return _scaled(log[:, start - first * N_FRAMES:][:, :frames], self.top)

    def _scan(self) -> tuple[int, torch.Tensor]:
        """(length in samples, loudest log-mel value). Blocks run on until one starts past the last frame; a block's
        frames past it hold only silence, which never raises the maximum (the log is clamped at -10 anyway)."""
        cursor, top, k = Cursor(blocks_of(self.audio)), torch.tensor(-10.0), 0
        while cursor.length is None or k * N_FRAMES < cursor.length // HOP + N_FRAMES:
            top = torch.maximum(top, self._block(cursor, k).max())
            k += 1
        return cursor.length, top

    def _block(self, cursor: Cursor, k: int) -> torch.Tensor:
        """Unscaled log-mel of frames [3000 k, 3000 (k + 1)): the STFT's centring (reflection at the start) done
        here, and always 3000 frames at once (a matrix product over other widths can differ in the last bit)."""
        lo = k * N_SAMPLES - N_FFT // 2
        x = cursor.take(max(lo, 0), lo + (N_FRAMES - 1) * HOP + N_FFT)
        if lo < 0:
            x = np.concatenate([x[1:1 - lo][::-1], x])
        stft = torch.stft(torch.from_numpy(x), N_FFT, HOP, window=torch.hann_window(N_FFT), center=False,
                          return_complex=True)
        return _log10_mel(stft, self.n_mels)


def log_mel_frames(audio: np.ndarray, first: int, frames: int, n_mels: int = 80) -> torch.Tensor:
    """Unscaled log-mel frames [first, first + frames) [n_mels, frames] of ``audio`` followed by silence, each frame
    read from the audio around it (as :func:`log_mel` centres them; reflected at the audio's start): a stream's
    newest frames, without the frames before them. Scale with :func:`scaled`."""
    lo, hi = first * HOP - N_FFT // 2, (first + frames - 1) * HOP + N_FFT // 2
    x = np.asarray(audio[max(lo, 0):max(0, min(hi, len(audio)))], dtype=np.float32)
    if lo < 0:
        x = np.concatenate([audio[1:1 - lo][::-1], x])
    x = np.pad(x, (0, hi - lo - len(x)))
    stft = torch.stft(torch.from_numpy(x), N_FFT, HOP, window=torch.hann_window(N_FFT), center=False,
                      return_complex=True)
    return _log10_mel(stft, n_mels)


def scaled(log: torch.Tensor, top: torch.Tensor | float) -> torch.Tensor:
    """Whisper's scale for unscaled log-mel frames, ``top`` being the loudest frame's value (see :func:`log_mel`)."""
    return _scaled(log, torch.as_tensor(top))


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
