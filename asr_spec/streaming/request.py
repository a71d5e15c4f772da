"""What a stream asks the engine to decode (a :class:`StreamRequest` of a :class:`RequestKind`), and what it gets
back (:class:`Decoded`)."""
from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

import numpy as np

from ..decoding.rows import RowResult
from .encoding import BufferEncoder
from .events import Aligner


class RequestKind(Enum):
    """What a re-decode of a stream is for (``Stream.due``)."""
    PARTIAL = "partial"  # re-decode the buffer: the policy commits what it may, the rest is the partial
    WINDOW = "window"  # the buffer is full: commit its first 30 s up to a segment end
    FINAL = "final"  # end of utterance or flush: commit everything


@dataclass
class StreamRequest:
    """One re-decode of a stream: its audio, prompt context and forced prefix."""
    audio: np.ndarray
    start: float  # stream time of audio[0] (the buffer's start)
    context: list[int]
    language: str | None
    task: str
    prefix: list[int]
    hint: list[int]
    kind: RequestKind
    waited_s: float = 0.0  # how long the stream's oldest undecoded audio had waited when this was requested
    aligns: bool = False  # its continuation will be aligned (AlignAtt): the engine aligns such rows together
    timed: bool = False  # words of it may be timed (AlignAtt, word timestamps): its result comes with an aligner
    encoder: BufferEncoder | None = None  # the stream's encoder state (EngineConfig.encoder_window STREAM)
    hotwords: list[int] = field(default_factory=list)  # tokens before the context in the prompt
    languages: tuple[str, ...] = ()  # with language None: the languages detection may choose (empty: any)

    @property
    def final(self) -> bool:
        return self.kind is not RequestKind.PARTIAL


@dataclass
class Decoded:
    """A request's decode. ``reliable`` is false when it failed Whisper's hallucination checks even after the
    temperature fallback (``fallbacks`` decodes again); ``aligner`` times words of it (AlignAtt, word timestamps)."""
    result: RowResult
    language: str | None = None
    reliable: bool = True
    fallbacks: int = 0
    aligner: Aligner | None = None
