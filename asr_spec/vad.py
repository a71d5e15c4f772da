"""Voice activity: Silero VAD (the ``silero-vad`` package ships its model) over 32 ms chunks."""
from __future__ import annotations

import warnings
from functools import lru_cache

import numpy as np
import torch

from .audio import SAMPLE_RATE, Audio, blocks_of


@lru_cache(maxsize=1)
def _model_path() -> str:
    from importlib.resources import files

    return str(files("silero_vad") / "data" / "silero_vad.jit")


class VoiceActivity:
    """Speech / non-speech per 512-sample chunk. One instance per stream: the model carries state."""

    CHUNK = 512

    def __init__(self, threshold: float = 0.5):
        threads = torch.get_num_threads()
        with warnings.catch_warnings():  # torch 2.13 deprecates TorchScript loading; the model ships as one
            warnings.simplefilter("ignore", DeprecationWarning)
            self.model = torch.jit.load(_model_path(), map_location="cpu").eval()
        torch.set_num_threads(threads)  # loading the model sets torch's thread count to 1
        self.threshold = threshold
        self._rest = np.zeros(0, dtype=np.float32)

    @property
    def pending(self) -> int:
        """Samples received but not yet flagged (the start of the next chunk)."""
        return len(self._rest)

    @torch.inference_mode()
    def __call__(self, audio: np.ndarray) -> list[bool]:
        """Voiced flags of the chunks ``audio`` completes (leftover samples wait for the next call)."""
        x = np.concatenate([self._rest, np.asarray(audio, dtype=np.float32)])
        n = len(x) // self.CHUNK
        self._rest = x[n * self.CHUNK:]
        chunks = torch.from_numpy(x[: n * self.CHUNK].copy()).view(n, self.CHUNK)
        return [float(self.model(chunk, SAMPLE_RATE)) >= self.threshold for chunk in chunks]


def speech_chunks(audio: Audio, max_s: float = 30.0, pad_s: float = 0.2) -> tuple[list[tuple[int, int]], int]:
    """Sample ranges of at most ``max_s`` that together hold all of ``audio``'s speech (``--chunked``), and the
    audio's length (read once, a block at a time): voiced runs widened by ``pad_s`` on each side, joined with the
    silence between them while the piece stays within ``max_s``; a run longer than that is cut every ``max_s``.
    Audio outside every piece is silence."""
    vad, flags, length = VoiceActivity(), [], 0
    for block in blocks_of(audio):
        flags += vad(block)
        length += len(block)
    step, limit, pad = VoiceActivity.CHUNK, int(max_s * SAMPLE_RATE), int(pad_s * SAMPLE_RATE)
    runs: list[tuple[int, int]] = []
    for i, voiced in enumerate(flags):
        if not voiced:
            continue
        a, b = max(0, i * step - pad), min(length, (i + 1) * step + pad)
        if runs and a <= runs[-1][1]:
            runs[-1] = (runs[-1][0], b)
        else:
            runs.append((a, b))
    pieces: list[tuple[int, int]] = []
    for a, b in runs:
        while b - a > limit:
            pieces.append((a, a + limit))
            a += limit
        if pieces and b - pieces[-1][0] <= limit:
            pieces[-1] = (pieces[-1][0], b)
        else:
            pieces.append((a, b))
    return pieces, length
