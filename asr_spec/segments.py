"""A decoded window's tokens as Whisper's segments, and word times placed in them, as openai-whisper does."""
from __future__ import annotations

from typing import Callable

import numpy as np

from .alignment import Word
from .decoding.rows import RowResult
from .features import FRAMES_PER_SECOND, TOKEN_SECONDS
from .recognizer import compression_ratio
from .transcript import Segment


def window_segments(r: RowResult, timestamp_begin: int, decode: Callable[[list[int]], str], offset: float, size: int,
                    temperature: float, duration_limit: float) -> tuple[list[Segment], int]:
    """Split a window's tokens at consecutive timestamp pairs; return segments and how far to seek (mel frames). As
    in openai-whisper, a segment without text or of no duration (its two timestamps equal) is dropped, and so is an
    unfinished one after the last pair: their tokens are not the next windows' prompt either."""
    tb = timestamp_begin
    toks = r.tokens
    is_ts = [t >= tb for t in toks]

    def seg(start: float, end: float, part: list[int]) -> Segment:
        text = decode(part)
        start, end = (min(round(offset + t, 3), round(duration_limit, 3)) for t in (start, end))
        return Segment(start, end, text, part, temperature, r.avg_logprob, compression_ratio(text), r.no_speech_prob)

    single_ending = is_ts[-2:] == [False, True]
    cuts = [i + 1 for i in range(len(toks) - 1) if is_ts[i] and is_ts[i + 1]]
    if cuts:
        if single_ending:
            cuts.append(len(toks))
        out, last = [], 0
        for cut in cuts:
            part = toks[last:cut]
            start, end = (part[0] - tb) * TOKEN_SECONDS, (part[-1] - tb) * TOKEN_SECONDS
            out.append(seg(start, end, part))
            last = cut
        advance = size if single_ending else (toks[last - 1] - tb) * 2
        return [s for s in out if s.text.strip() and s.tokens[0] != s.tokens[-1]], advance
    stamps = [t for t in toks if t >= tb]
    duration = size / FRAMES_PER_SECOND
    if stamps and stamps[-1] != tb:
        duration = (stamps[-1] - tb) * TOKEN_SECONDS
    out = [seg(0.0, duration, toks)]
    return [s for s in out if s.text.strip()], size


def place_words(segments: list[Segment], aligned: list[list[Word]], start: float) -> None:
    """Give each segment its aligned words (times relative to the window at ``start`` s). As in openai/whisper, a
    segment's start and end move to its first and last word's, unless that word looks stretched over a pause (then
    the word is cut back to the segment's timestamp instead); so words always lie inside their segment."""
    durations = [w.end - w.start for words in aligned for w in words if w.end > w.start]
    median = min(0.7, float(np.median(durations))) if durations else 0.0
    for segment, words in zip(segments, aligned):
        for w in words:
            w.start, w.end = round(start + w.start, 3), round(start + w.end, 3)
        if words:
            first, last = words[0], words[-1]
            if segment.start < first.end and segment.start - 0.5 > first.start:
                first.start = max(0.0, min(first.end - median, segment.start))
            else:
                segment.start = first.start
            if segment.end > last.start and segment.end + 0.5 < last.end:
                last.end = max(last.start + median, segment.end)
            else:
                segment.end = last.end
        segment.words = words
