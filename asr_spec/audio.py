"""Audio in: any file soundfile reads (wav, flac, ogg, mp3, ...), any rate and channel count, to 16 kHz mono
float32, decoded and resampled a block at a time: memory holds one block at the file's own rate, never the whole
file at it. One path for every caller: :func:`load_audio` (a file on disk), :func:`decode_audio` (a path or a file
object, with a duration limit: uploads), :class:`AudioFile` (read again on each pass: ``asr_spec transcribe``
holds a window's audio, not the file's)."""
from __future__ import annotations

import stat
from pathlib import Path
from typing import BinaryIO, Iterable, Iterator, Union

import numpy as np
import soundfile as sf
import soxr

SAMPLE_RATE = 16000
SAMPLE = Path(__file__).parent / "samples" / "jfk.flac"  # the bundled clip (JFK, 11 s): --sample, and measurements
SILENCE_DBFS = -70.0  # a file whose peak stays below this holds no audible sound
MIN_RATE, MAX_RATE = 1000, 192000  # sample rates accepted (Hz)
MAX_CHANNELS = 16
BLOCK_FRAMES = 1 << 16  # frames decoded at a time, at the file's own rate
FORMATS = "WAV, FLAC, OGG (Vorbis, Opus) or MP3"
_UNKNOWN_FRAMES = 2**63 - 1  # libsndfile's frame count for a file whose header does not say its length
_TRUSTED_SAMPLES = 3600 * SAMPLE_RATE  # allocated up front from a header's length, at most (then grown)
_NOT_REGULAR = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
                (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


class AudioError(ValueError):
    """A file that cannot be transcribed, with the reason in words."""

    def __init__(self, path: str | Path, reason: str):
        super().__init__(f"{path}: {reason}")
        self.path, self.reason = str(path), reason


class AudioTooLong(AudioError):
    """Audio longer than the caller's limit (from the header, or found while decoding a header that did not say)."""


def load_audio(path: str | Path) -> np.ndarray:
    """Decode and resample one file; raises :class:`AudioError` naming the file and the problem."""
    return decode_audio(path)


def decode_audio(file: str | Path | BinaryIO, name: str | None = None, max_seconds: float | None = None) -> np.ndarray:
    """A file's whole audio at 16 kHz mono: memory holds that and one block. :class:`AudioTooLong` past
    ``max_seconds`` (refused from the header before decoding when it says the length), :class:`AudioError` for
    anything else that cannot be transcribed; ``name`` (default: the path) names the file in messages."""
    audio = AudioFile(file, name, max_seconds)
    return _collect(audio.blocks(), audio.expected_samples)


class AudioFile:
    """A file's audio, decoded from its start again on each pass (:meth:`blocks`), so a pass holds one block. The
    file is checked when this is made: a path must be a non-empty regular file (a FIFO or device is never opened),
    the header must give a sample rate in 1000..192000 Hz, at most 16 channels and, with ``max_seconds``, no more
    audio than that (:class:`AudioTooLong`)."""

    def __init__(self, file: str | Path | BinaryIO, name: str | None = None, max_seconds: float | None = None):
        self.file = Path(file) if isinstance(file, (str, Path)) else file
        self.name = name or (str(file) if isinstance(file, (str, Path)) else "audio")
        self.max_seconds = max_seconds
        if isinstance(self.file, Path):
            _check_path(self.file)
        with self._open() as f:
            self.rate, frames = f.samplerate, f.frames
            self._check_header(f.channels, frames)
        known = frames != _UNKNOWN_FRAMES  # the header's length is a hint for allocating, never trusted as a bound
        self.expected_samples = min(-(-frames * SAMPLE_RATE // self.rate) + 1, _TRUSTED_SAMPLES) if known else 0

    def blocks(self) -> Iterator[np.ndarray]:
        """16 kHz mono float32 blocks from the start of the file; at the end, :class:`AudioError` if it held nothing
        to transcribe (no frames, non-finite samples, silence)."""
        with self._open() as f:
            limit = None if self.max_seconds is None else self.max_seconds * self.rate
            yield from _to_16k(self.name, self._read(f), self.rate, limit)

    def _open(self) -> sf.SoundFile:
        if not isinstance(self.file, Path):
            self.file.seek(0)
        try:
            return sf.SoundFile(str(self.file) if isinstance(self.file, Path) else self.file)
        except (RuntimeError, TypeError) as e:  # LibsndfileError is a RuntimeError; its message names the object
            raise AudioError(self.name, f"cannot decode audio: not a {FORMATS} file this program can read"
                             + _detail(e)) from None

    def _check_header(self, channels: int, frames: int) -> None:
        if not MIN_RATE <= self.rate <= MAX_RATE:
            raise AudioError(self.name, f"sample rate {self.rate} Hz is outside {MIN_RATE}..{MAX_RATE} Hz")
        if channels > MAX_CHANNELS:
            raise AudioError(self.name, f"{channels} channels (at most {MAX_CHANNELS})")
        if self.max_seconds is not None and frames != _UNKNOWN_FRAMES and frames > self.max_seconds * self.rate:
            raise AudioTooLong(self.name, f"{frames / self.rate:.0f} s of audio, more than the limit of "
                                          f"{self.max_seconds:.0f} s")

    def _read(self, f: sf.SoundFile) -> Iterator[np.ndarray]:
        done = 0
        while True:
            try:
                block = f.read(BLOCK_FRAMES, dtype="float32", always_2d=True)
            except (RuntimeError, TypeError) as e:
                raise AudioError(self.name, f"cannot decode audio: damaged after {done / self.rate:.1f} s"
                                 + _detail(e)) from None
            if not len(block):
                return
            done += len(block)
            yield block


def _check_path(p: Path) -> None:
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


def _detail(e: Exception) -> str:
    """libsndfile's own words for an error (never the message soundfile builds, which names a file object)."""
    words = getattr(e, "error_string", "").strip()
    return f" ({words})" if words else ""


def _to_16k(name: str, native: Iterable[np.ndarray], rate: int, limit: float | None) -> Iterator[np.ndarray]:
    """[frames, channels] blocks at ``rate`` -> 16 kHz mono blocks: channels averaged, then one streaming
    resampler (bit for bit soxr's whole-array ``resample``). :class:`AudioTooLong` once more than ``limit`` frames
    are decoded; at the end, :class:`AudioError` for no frames, non-finite samples or silence."""
    resampler = None if rate == SAMPLE_RATE else soxr.ResampleStream(rate, SAMPLE_RATE, 1, "float32", "HQ")
    frames = size = bad = 0
    peak = 0.0
    for block in native:
        frames, size = frames + len(block), size + block.size
        if limit is not None and frames > limit:
            raise AudioTooLong(name, f"more than the limit of {limit / rate:.0f} s of audio")
        bad += block.size - np.count_nonzero(np.isfinite(block))
        mono = np.ascontiguousarray(block.mean(axis=1), dtype=np.float32)
        out = mono if resampler is None else resampler.resample_chunk(mono)
        peak = max(peak, float(np.abs(out).max()) if out.size else 0.0)
        yield out
    if resampler is not None:
        out = resampler.resample_chunk(np.zeros(0, np.float32), last=True)
        peak = max(peak, float(np.abs(out).max()) if out.size else 0.0)
        yield out
    if frames == 0:
        raise AudioError(name, "contains no audio (zero length)")
    if bad:
        raise AudioError(name, f"non-finite samples (NaN or Inf): {bad} of {size}")
    if peak == 0.0 or 20 * np.log10(peak) < SILENCE_DBFS:
        level = "digital silence" if peak == 0.0 else f"peak {20 * np.log10(peak):.0f} dBFS"
        raise AudioError(name, f"silent ({level}): nothing to transcribe")


def _collect(blocks: Iterable[np.ndarray], expected: int) -> np.ndarray:
    """The blocks as one array, written into one of ``expected`` samples (grown if that was short)."""
    out, n = np.empty(expected, np.float32), 0
    for block in blocks:
        if n + len(block) > len(out):
            out = np.concatenate([out[:n], np.empty(max(n, len(block)), np.float32)])
        out[n:n + len(block)] = block
        n += len(block)
    return out[:n]


Audio = Union[np.ndarray, AudioFile]  # 16 kHz mono samples, or a file read a block at a time


def blocks_of(audio: Audio) -> Iterator[np.ndarray]:
    """One pass over ``audio``'s 16 kHz samples, a block at a time."""
    return iter([audio]) if isinstance(audio, np.ndarray) else audio.blocks()


class Cursor:
    """Samples of one pass read forward: :meth:`take` gives [start, stop) (zeros past the end) and forgets what is
    before ``start``, so memory holds the span asked for and one block."""

    def __init__(self, blocks: Iterator[np.ndarray]):
        self._blocks = blocks
        self._buf, self._at = np.zeros(0, np.float32), 0  # samples from position _at
        self.length: int | None = None  # known once the pass has ended

    def take(self, start: int, stop: int) -> np.ndarray:
        if start < self._at:
            raise ValueError(f"a Cursor reads forward only (asked for {start}, at {self._at})")
        end = self._at + len(self._buf)
        parts = [self._buf[start - self._at:]]
        while end < stop and self.length is None:
            block = next(self._blocks, None)
            if block is None:
                self.length = end
                break
            parts.append(block[max(0, start - end):])
            end += len(block)
        parts = [p for p in parts if len(p)]  # a lone part is kept as it is (a view): no copy of an array source
        self._buf = parts[0] if len(parts) == 1 else np.concatenate(parts) if parts else np.zeros(0, np.float32)
        self._at = start
        out = self._buf[:stop - start]
        return np.pad(out, (0, stop - start - len(out))) if len(out) < stop - start else out.copy()
