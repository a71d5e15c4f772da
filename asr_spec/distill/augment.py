"""Audio augmentation for distillation data: more varied speech from the same recordings. The target labels each
augmented clip itself, so the labels stay the target's own (what it says on that audio), never the original's.

One kind per copy, chosen at random: speed (0.9-1.1, pitch moving with it, as a tape would), noise (white or pink
at 10-30 dB SNR), reverberation (a synthetic room: exponentially decaying noise, RT60 0.2-0.8 s) or telephone band
(300-3400 Hz, 8 kHz, light clipping).
"""
from __future__ import annotations

import random

import numpy as np
import soxr

from ..audio import SAMPLE_RATE

KINDS = ("speed", "noise", "reverb", "telephone")


def _noise(n: int, rng: np.random.Generator, pink: bool) -> np.ndarray:
    white = rng.standard_normal(n).astype(np.float32)
    if not pink:
        return white
    spectrum = np.fft.rfft(white)
    spectrum /= np.sqrt(np.arange(1, len(spectrum) + 1))  # 1/f power
    return np.fft.irfft(spectrum, n).astype(np.float32)


def _at_snr(audio: np.ndarray, noise: np.ndarray, snr_db: float) -> np.ndarray:
    power = float(np.mean(audio ** 2)) or 1e-8
    scale = np.sqrt(power / (float(np.mean(noise ** 2)) or 1e-8) / 10 ** (snr_db / 10))
    return audio + scale * noise


def _band(audio: np.ndarray, low: float, high: float, rate: int) -> np.ndarray:
    spectrum = np.fft.rfft(audio)
    freqs = np.fft.rfftfreq(len(audio), 1 / rate)
    spectrum[(freqs < low) | (freqs > high)] = 0
    return np.fft.irfft(spectrum, len(audio)).astype(np.float32)


def convolved(x: np.ndarray, ir: np.ndarray) -> np.ndarray:
    """``x`` convolved with ``ir``, as long as ``x``, by FFT (a direct convolution of 30 s with 0.8 s takes seconds)."""
    n = len(x) + len(ir) - 1
    return np.fft.irfft(np.fft.rfft(x, n) * np.fft.rfft(ir, n), n)[: len(x)].astype(np.float32)


def augment(audio: np.ndarray, rng: random.Random, kind: str | None = None) -> tuple[str, np.ndarray]:
    """A copy of ``audio`` (16 kHz mono float32) changed one way (``kind``, else one at random): (kind, audio)."""
    kind = kind or rng.choice(KINDS)
    g = np.random.default_rng(rng.randrange(2 ** 32))
    x = np.asarray(audio, dtype=np.float32)
    if kind == "speed":
        factor = rng.uniform(0.9, 1.1)  # resampled as if recorded at another rate: faster and higher, or slower
        out = soxr.resample(x, SAMPLE_RATE * factor, SAMPLE_RATE).astype(np.float32)
    elif kind == "noise":
        out = _at_snr(x, _noise(len(x), g, pink=rng.random() < 0.5), rng.uniform(10, 30))
    elif kind == "reverb":
        rt60 = rng.uniform(0.2, 0.8)
        t = np.arange(int(rt60 * SAMPLE_RATE)) / SAMPLE_RATE
        ir = g.standard_normal(len(t)).astype(np.float32) * np.exp(-6.9 * t / rt60).astype(np.float32)
        ir[0] = 1.0
        wet = convolved(x, ir)
        out = wet * (np.abs(x).max() / max(float(np.abs(wet).max()), 1e-8))
    elif kind == "telephone":
        narrow = soxr.resample(_band(x, 300, 3400, SAMPLE_RATE), SAMPLE_RATE, 8000)
        out = soxr.resample(np.clip(narrow * 1.5, -0.7, 0.7), 8000, SAMPLE_RATE).astype(np.float32)
    else:
        raise ValueError(f"unknown augmentation {kind!r}; known: {', '.join(KINDS)}")
    peak = float(np.abs(out).max())
    return kind, (out / peak * 0.9 if peak > 1.0 else out).astype(np.float32)
