"""What transcribing a file gives: its :class:`Transcript` of timed :class:`Segment` s and its :class:`Stats`, put
together from the file's pieces (:class:`Pieces`: the whole file, or its speech chunks) as they finish."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .alignment import Word
from .decoding.rows import RowStats


@dataclass
class Segment:
    start: float
    end: float
    text: str
    tokens: list[int]
    temperature: float
    avg_logprob: float
    compression_ratio: float
    no_speech_prob: float
    words: list[Word] | None = None  # with word_timestamps


@dataclass
class Stats:
    audio_seconds: float = 0.0
    encoder_seconds: float = 0.0
    decode_seconds: float = 0.0
    windows: int = 0
    fallbacks: int = 0
    decode: RowStats = field(default_factory=RowStats)

    def add(self, other: Stats) -> None:
        """Add the times and counts of another piece of the same file (its audio is counted by the caller)."""
        self.encoder_seconds += other.encoder_seconds
        self.decode_seconds += other.decode_seconds
        self.windows += other.windows
        self.fallbacks += other.fallbacks
        self.decode.add(other.decode)

    def as_dict(self) -> dict:
        d = self.decode
        passes = d.target_passes
        return {
            "audio_seconds": round(self.audio_seconds, 3),
            "encoder_seconds": round(self.encoder_seconds, 3),
            "decode_seconds": round(self.decode_seconds, 3),
            "windows": self.windows,
            "fallbacks": self.fallbacks,
            "tokens": d.tokens,
            "target_passes": passes,
            "drafted": d.drafted,
            "accepted": d.accepted,
            "rejected": d.rejected,
            "acceptance": round(d.acceptance, 4),
            "tokens_per_pass": round((d.accepted + passes) / passes, 3) if passes else 0.0,
        }


@dataclass
class Transcript:
    text: str
    segments: list[Segment]
    language: str | None
    stats: Stats


@dataclass
class Pieces:
    """A file being transcribed: one piece (Whisper's loop over the whole file), or its speech chunks."""
    duration: float
    left: int
    done: dict[int, Any] = field(default_factory=dict)  # by piece number: its finished loop (segments, stats, language)
    progress: dict[int, float] = field(default_factory=dict)  # seconds transcribed, by piece

    def transcript(self) -> Transcript:
        files = [self.done[n] for n in sorted(self.done)]
        stats = Stats(audio_seconds=self.duration)
        for f in files:
            stats.add(f.stats)
        segments = [s for f in files for s in f.segments]
        language = next((f.language for f in files), None)
        return Transcript("".join(s.text for s in segments).strip(), segments, language, stats)
