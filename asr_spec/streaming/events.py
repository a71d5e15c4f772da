"""What a stream sends: partial and final results (and errors), built from committed tokens.

:class:`Emitter` turns a stream's newly committed tokens into a ``final`` (text, time span, segments split at
timestamps, words when asked) and its uncommitted continuation into a ``partial``; it keeps what finals need from
one to the next (where the last one ended, whether the stream has said anything) and times each final's latency.
"""
from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from typing import Callable

from ..alignment import Word
from ..decoding.rows import RowStats
from ..features import TOKEN_SECONDS

# times a final's words: (tokens decoded before it in the buffer, its own tokens) -> its words, in seconds from the
# buffer's start (the engine's Whisper alignment over the audio the tokens were decoded from)
Aligner = Callable[[list[int], list[int]], list[Word]]


@dataclass
class EventSegment:
    """A segment of an event's text (Whisper's, between timestamps), with its times in the stream."""
    start: float
    end: float
    text: str


@dataclass
class Event:
    type: str  # "partial", "final", or "error" (the engine could not decode the stream, which it has ended)
    text: str  # for "error": the message
    start: float
    end: float
    segments: list[EventSegment] = field(default_factory=list)
    end_of_utterance: bool = False
    words: list[Word] | None = None  # a final's words, when its stream asked for word timestamps
    join: str = ""  # what goes between the stream's previous final and this text: " ", or "" (punctuation, first)
    latency_s: float | None = None  # from the arrival of the audio at its end (a partial's: what its decode heard)
    logprobs: list[tuple[str, float]] | None = None  # a final's text tokens and the target's log-probability of each

    def as_dict(self) -> dict:
        if self.type == "error":
            return {"type": "error", "code": "decode_failed", "message": self.text}
        d = {"type": self.type, "text": self.text, "join": self.join, "start": round(self.start, 3),
             "end": round(self.end, 3)}
        if self.type == "final":
            d["segments"] = [{"start": round(s.start, 3), "end": round(s.end, 3), "text": s.text} for s in self.segments]
            d["end_of_utterance"] = self.end_of_utterance
            if self.words is not None:
                d["words"] = [w.as_dict() for w in self.words]
        return d


@dataclass
class StreamStats:
    audio_s: float = 0.0  # received
    decoded_s: float = 0.0  # left the buffer after a decode that covered it
    skipped_s: float = 0.0  # left the buffer as silence, never decoded
    decodes: int = 0
    fallbacks: int = 0  # decodes repeated at a higher temperature (Whisper's hallucination checks)
    utterances: int = 0
    decode: RowStats = field(default_factory=RowStats)
    final_latency_s: deque = field(default_factory=lambda: deque(maxlen=1000))  # emission - arrival of its end

    def as_dict(self) -> dict:
        d, lat = self.decode, sorted(self.final_latency_s)
        pct = lambda q: round(lat[min(len(lat) - 1, int(q * len(lat)))], 3) if lat else None  # noqa: E731
        return {"audio_seconds": round(self.audio_s, 3), "decoded_seconds": round(self.decoded_s + self.skipped_s, 3),
                "silence_skipped_seconds": round(self.skipped_s, 3), "decodes": self.decodes,
                "fallbacks": self.fallbacks, "utterances": self.utterances,
                "tokens": d.tokens, "target_passes": d.target_passes, "drafted": d.drafted, "accepted": d.accepted,
                "acceptance": round(d.acceptance, 4), "final_latency_median_s": pct(0.5), "final_latency_p90_s": pct(0.9)}


class Emitter:
    """Builds a stream's events. Times are stream seconds: a token's timestamp counts from ``start``, the stream
    time of the buffer's first sample, which the stream passes in."""

    def __init__(self, tokenizer, stats: StreamStats, interim: bool = True, word_timestamps: bool = False):
        self.tokenizer, self.tb = tokenizer, tokenizer.vocab.timestamp_begin
        self.stats, self.interim, self.word_timestamps = stats, interim, word_timestamps
        self.partial = ""  # the text of the last partial sent
        self.emitted_end = 0.0  # end time of the last final sent
        self.said = False  # a final with text has been sent (the next one joins it with a space)
        self.arrivals: deque[tuple[float, float]] = deque(maxlen=4096)  # (stream time, wall time) of arrivals

    def arrived(self, stream_s: float) -> None:
        """Audio up to ``stream_s`` arrived now (a final's latency is measured from it)."""
        self.arrivals.append((stream_s, time.monotonic()))

    def final(self, tokens: list[int], before: list[int], start: float, heard: float, end_of_utterance: bool,
              aligner: Aligner | None = None, logprobs: list[float] | None = None) -> Event:
        """A final for newly committed ``tokens`` decoded after ``before`` in a buffer starting at ``start``, whose
        decode heard audio up to stream time ``heard``. Without a closing timestamp the span ends where the decoded
        audio ended (an estimate), and never after it; finals never overlap."""
        begin = max(self._end_of(before, start), self.emitted_end)
        closed = bool(tokens) and tokens[-1] >= self.tb
        end = max(min(self._time(tokens[-1], start), heard) if closed else heard, begin)
        words = None
        if aligner is not None and self.word_timestamps:
            words = aligner(list(before), list(tokens))
            if words:  # the words time the final better than the decode's estimate: its span follows them
                begin = round(max(self.emitted_end, start + words[0].start), 3)
                end = max(begin, round(min(start + words[-1].end, heard), 3))
            for w in words:
                w.start = round(min(max(start + w.start, begin), end), 3)
                w.end = round(min(max(start + w.end, w.start), end), 3)
        raw = self.tokenizer.decode(tokens)
        text, join = raw.strip(), self._join(raw)
        self.said = self.said or bool(text)
        latency = self._since(end) if closed and text else None  # a final's end is a timestamp only when closed
        if latency is not None:
            self.stats.final_latency_s.append(latency)
        if end_of_utterance:
            self.partial = ""
        self.emitted_end = end
        scored = None if logprobs is None else [(self.tokenizer.decode([t]), lp) for t, lp in zip(tokens, logprobs)
                                                if t < self.tokenizer.vocab.eot]
        return Event("final", text, begin, end, self._segments(tokens, start, begin, end), end_of_utterance, words,
                     join, latency, scored)

    def _since(self, stream_s: float) -> float | None:
        """Seconds since the audio at stream time ``stream_s`` arrived (None when it is no longer known)."""
        arrived = next((w for t, w in self.arrivals if t >= stream_s - 1e-6), None)
        return None if arrived is None else time.monotonic() - arrived

    def partial_event(self, tokens: list[int], committed: list[int], start: float, buffer_end: float) -> list[Event]:
        """A partial for the uncommitted ``tokens`` after ``committed`` (none when it says what the last one did)."""
        if not self.interim:
            return []
        raw = self.tokenizer.decode(tokens)
        if (text := raw.strip()) == self.partial:
            return []
        self.partial = text
        begin = max(self._end_of(committed, start), self.emitted_end)
        return [Event("partial", text, begin, max(begin, buffer_end), join=self._join(raw),
                      latency_s=self._since(buffer_end))]

    def _segments(self, tokens: list[int], start: float, begin: float, end: float) -> list[EventSegment]:
        segments, at, part = [], begin, []
        for t in tokens + [None]:
            if t is None or t >= self.tb:
                stop = end if t is None else min(max(self._time(t, start), at), end)
                if text := self.tokenizer.decode(part).strip():
                    segments.append(EventSegment(at, stop, text))
                part, at = [], stop
            else:
                part.append(t)
        return segments

    def _join(self, raw: str) -> str:
        """A space before text that Whisper's tokens begin with one (not before punctuation, nor in languages
        written without spaces), once the stream has said something."""
        return " " if self.said and raw[:1].isspace() else ""

    def _time(self, timestamp: int, start: float) -> float:
        return start + (timestamp - self.tb) * TOKEN_SECONDS

    def _end_of(self, tokens: list[int], start: float) -> float:
        """Stream time of the last timestamp in ``tokens`` (``start`` when there is none)."""
        stamps = [t for t in tokens if t >= self.tb]
        return self._time(stamps[-1], start) if stamps else start
