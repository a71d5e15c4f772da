"""A stream's buffer, encoded for its decodes: each audio frame a bounded number of times.

A stream's buffer grows by a step of audio between re-decodes. Encoding it whole at every step (``"audio"``: the
buffer plus 2 s of silence; ``"full"``: Whisper's padded 30 s window) costs the whole buffer per step. With
``"stream"`` (the default) a :class:`BufferEncoder` keeps what it has encoded (models/stream_encoder.py): only the
last ``lookahead_s`` of audio and ``pad_s`` of silence after it are encoded again at each step, attending to the
frozen positions before them, and the decoders' cross-attention keys and values of the frozen positions are kept
too. The log-mel scale follows the loudest frame so far. When the buffer loses its start (a commit trims it) the
state starts again from the new start.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ..features import HOP, N_FRAMES, encoder_frames, log_mel, log_mel_frames, scaled, window
from ..models.kv_decoder import CrossKV, StaticDecoder
from ..models.stream_encoder import EncoderCache, encode_tail, first_frame
from ..recognizer import Recognizer

WINDOWS = ("stream", "audio", "full")  # how a buffer is encoded (EngineConfig.encoder_window); the first: default


@dataclass
class Encoded:
    """A buffer's encoder outputs [1, S, D] (the draft's: None without a draft) and, when kept from earlier steps,
    the decoders' cross-attention keys and values of them."""
    memory: torch.Tensor
    draft_memory: torch.Tensor | None
    cross: CrossKV | None = None
    draft_cross: CrossKV | None = None

    @property
    def positions(self) -> int:
        return self.memory.shape[1]


class _FrozenCross:
    """A decoder's cross-attention keys and values of a buffer's frozen positions."""

    def __init__(self, decoder: StaticDecoder):
        self.decoder = decoder
        self.kv: CrossKV | None = None

    def extend(self, memory: torch.Tensor, frozen: int, freeze: int) -> CrossKV:
        """Keys and values of all of ``memory``'s positions: those before ``frozen`` kept, the rest computed now; up
        to ``freeze`` kept for later."""
        fresh = self.decoder.cross_kv(memory[:, frozen:])
        whole = fresh if self.kv is None else tuple([torch.cat([a, b], 2) for a, b in zip(old, new)]
                                                     for old, new in zip(self.kv, fresh))
        if freeze > frozen:
            self.kv = tuple([t[:, :, :freeze].contiguous() for t in ts] for ts in whole)
        return whole

    def cut(self, positions: int) -> None:
        if self.kv is not None:
            self.kv = tuple([t[:, :, :positions] for t in ts] for ts in self.kv) if positions else None


class BufferEncoder:
    """Encodes one stream's buffer, step after step (see the module's text)."""

    def __init__(self, recognizer: Recognizer, lookahead_s: float, pad_s: float):
        self.rec = recognizer
        self.lookahead, self.pad = int(lookahead_s * 100), int(pad_s * 100)  # mel frames
        self.cache = EncoderCache()
        self.top = float("-inf")  # the loudest log-mel value of the buffer so far
        self.start: float | None = None  # stream time of the buffer's start the state belongs to
        draft = recognizer.draft
        self.cross = _FrozenCross(recognizer.target.decoder)
        self.draft_cross = _FrozenCross(draft.decoder) if draft is not None and draft.encoder is None else None

    def encode(self, audio: np.ndarray, start: float) -> Encoded:
        """The encoder output of a buffer starting at stream time ``start`` holding ``audio`` (what was encoded of it
        before is kept when it is the same buffer, grown)."""
        if start != self.start:
            self.clear()
            self.start = start
        audio_frames = len(audio) // HOP
        frames = min(N_FRAMES, audio_frames + self.pad)  # a full window's padding is its last part, as Whisper's
        frames += frames % 2  # two mel frames per encoder position
        freeze = max(0, (audio_frames - self.lookahead) // 2)
        self._cut(min(self.cache.frozen, freeze))  # a final may decode less than the buffer holds
        first, frozen = first_frame(self.cache), self.cache.frozen
        log = log_mel_frames(audio, first, frames - first, self.rec.target.n_mels)
        self.top = max(self.top, float(log[:, :max(1, audio_frames - first)].max()))
        target = self.rec.target
        memory = encode_tail(target.encoder.inner, scaled(log, self.top)[None].to(target.decoder.device),
                             self.cache, freeze, audio_frames // 2)
        freeze = self.cache.frozen
        cross = self.cross.extend(memory, frozen, freeze)
        if self.draft_cross is not None:  # a draft that reads the target's encoder output
            return Encoded(memory, memory, cross, self.draft_cross.extend(memory, frozen, freeze))
        draft = self.rec.draft
        if draft is None:
            return Encoded(memory, None, cross)
        mel = window(log_mel(audio, target.n_mels), 0, frames)[None].to(target.decoder.device)
        return Encoded(memory, draft.encoder_out(mel, memory), cross)  # a draft with an encoder of its own

    def clear(self) -> None:
        self.top, self.start = float("-inf"), None
        self._cut(0)

    def _cut(self, positions: int) -> None:
        """Keep only the first ``positions`` frozen positions."""
        self.cache.truncate(positions)
        for cross in (self.cross, self.draft_cross):
            if cross is not None:
                cross.cut(positions)


def encode_whole(recognizer: Recognizer, audio: np.ndarray, full: bool) -> Encoded:
    """The whole buffer encoded at once: padded to Whisper's 30 s window (``full``), or its audio plus 2 s of silence
    rounded up to whole seconds."""
    frames = N_FRAMES if full else encoder_frames(len(audio) // HOP, full=False)
    mel = window(log_mel(audio, recognizer.target.n_mels), 0, frames)[None]
    memory, draft_memory = recognizer.encode(mel.to(recognizer.target.decoder.device))
    return Encoded(memory, draft_memory)
