"""Voice activity: Silero VAD (the ``silero-vad`` package ships its model) over 32 ms chunks."""
from __future__ import annotations

import warnings
from functools import lru_cache

import numpy as np
import torch

from ..audio import SAMPLE_RATE


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

    @torch.inference_mode()
    def __call__(self, audio: np.ndarray) -> list[bool]:
        """Voiced flags of the chunks ``audio`` completes (leftover samples wait for the next call)."""
        x = np.concatenate([self._rest, np.asarray(audio, dtype=np.float32)])
        n = len(x) // self.CHUNK
        self._rest = x[n * self.CHUNK:]
        chunks = torch.from_numpy(x[: n * self.CHUNK].copy()).view(n, self.CHUNK)
        return [float(self.model(chunk, SAMPLE_RATE)) >= self.threshold for chunk in chunks]
