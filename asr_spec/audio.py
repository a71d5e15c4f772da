"""Audio in: any file soundfile reads (wav, flac, ogg, mp3, ...), any rate and channel count,
to 16 kHz mono float32."""
from __future__ import annotations

import stat
from pathlib import Path

import numpy as np
import soundfile as sf
import soxr

SAMPLE_RATE = 16000
SILENCE_DBFS = -70.0  # a file whose peak stays below this holds no audible sound
_NOT_REGULAR = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
                (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


class AudioError(ValueError):
    """A file that cannot be transcribed, with the reason in words."""

    def __init__(self, path: str | Path, reason: str):
        super().__init__(f"{path}: {reason}")
        self.path, self.reason = str(path), reason


def to_mono_16k(samples: np.ndarray, rate: int) -> np.ndarray:
    """[frames] or [frames, channels] at ``rate`` -> mono float32 at 16 kHz."""
    x = np.asarray(samples, dtype=np.float32)
    if x.ndim == 2:
        x = x.mean(axis=1)
    if rate != SAMPLE_RATE:
        x = soxr.resample(x, rate, SAMPLE_RATE, quality="HQ")
    return np.ascontiguousarray(x, dtype=np.float32)


def load_audio(path: str | Path) -> np.ndarray:
    """Decode and resample one file; raises :class:`AudioError` naming the file and the problem."""
    p = Path(path)
    try:
        st = p.stat()
    except FileNotFoundError:
        raise AudioError(p, "no such file") from None
    except OSError as e:
        raise AudioError(p, f"cannot access ({e.strerror})") from None
    if not stat.S_ISREG(st.st_mode):  # never opened: reading a FIFO or a device could block forever
        kind = next((name for is_kind, name in _NOT_REGULAR if is_kind(st.st_mode)), "a special file")
        raise AudioError(p, f"is {kind}, not a regular file")
    if st.st_size == 0:
        raise AudioError(p, "empty file (0 bytes)")
    try:
        samples, rate = sf.read(str(p), dtype="float32", always_2d=True)
    except (sf.LibsndfileError, RuntimeError, TypeError) as e:
        raise AudioError(p, f"cannot decode audio ({e})") from None
    return checked_audio(p, samples, rate)


def checked_audio(name: str | Path, samples: np.ndarray, rate: int) -> np.ndarray:
    """Decoded ``samples`` [frames, channels] at ``rate`` -> 16 kHz mono, or :class:`AudioError` for audio with
    nothing to transcribe (no frames, non-finite samples, silence)."""
    p = Path(name)
    if samples.shape[0] == 0:
        raise AudioError(p, "contains no audio (zero length)")
    if bad := samples.size - np.count_nonzero(np.isfinite(samples)):
        raise AudioError(p, f"non-finite samples (NaN or Inf): {bad} of {samples.size}")
    audio = to_mono_16k(samples, rate)
    peak = float(np.abs(audio).max()) if audio.size else 0.0
    if peak == 0.0 or 20 * np.log10(peak) < SILENCE_DBFS:
        level = "digital silence" if peak == 0.0 else f"peak {20 * np.log10(peak):.0f} dBFS"
        raise AudioError(p, f"silent ({level}): nothing to transcribe")
    return audio
