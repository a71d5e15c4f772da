"""A stream's buffer, encoded for its decodes: each audio frame a bounded number of times.

A stream's buffer grows by a step of audio between re-decodes. Encoding it whole at every step (``AUDIO``: the
buffer plus 2 s of silence; ``FULL``: Whisper's padded 30 s window) costs the whole buffer per step. With
``STREAM`` (the default) a :class:`BufferEncoder` keeps what it has encoded (models/stream_encoder.py): only the
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
from ..models.kv_decoder import CachedDecoder, CrossKV
from ..models.stream_encoder import EncoderCache, Tail, encode_tails, first_frame
from ..recognizer import EncoderWindow, Recognizer

WINDOWS = tuple(EncoderWindow)  # how a buffer is encoded (EngineConfig.encoder_window); the first: default


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

    def __init__(self, decoder: CachedDecoder):
        self.decoder = decoder
        self.kv: CrossKV | None = None

    def extend(self, fresh: CrossKV, frozen: int, freeze: int) -> CrossKV:
        """Keys and values of all of a memory's positions: those before ``frozen`` kept, then ``fresh`` (those of the
        positions from ``frozen`` on); up to ``freeze`` kept for later."""
        joined = lambda old, new: [torch.cat([a, b], 2) for a, b in zip(old, new)]  # noqa: E731
        whole = fresh if self.kv is None else CrossKV(joined(self.kv.keys, fresh.keys),
                                                      joined(self.kv.values, fresh.values))
        if freeze > frozen:
            self.kv = whole.map(lambda t: t[:, :, :freeze].contiguous())
        return whole

    def cut(self, positions: int) -> None:
        if self.kv is not None:
            self.kv = self.kv.map(lambda t: t[:, :, :positions]) if positions else None


def cross_kv_of(decoder: CachedDecoder, memories: list[torch.Tensor]) -> list[CrossKV]:
    """``decoder``'s cross-attention keys and values of each memory [1, S_i, D], all in one call per layer (a
    position's depend on its own output only: the same numbers as one memory at a time, its layers being row-exact)."""
    if not memories:
        return []
    keys, values = decoder.cross_kv(torch.cat(memories, 1))
    cuts = [m.shape[1] for m in memories]
    split = lambda ts: list(zip(*(t.split(cuts, dim=2) for t in ts)))  # noqa: E731
    return [CrossKV(list(k), list(v)) for k, v in zip(split(keys), split(values))]


@dataclass
class _Step:
    """One buffer's step in the making: what it encodes and where its cross-attention keys stand."""
    encoder: "BufferEncoder"
    tail: Tail
    frozen: int


class BufferEncoder:
    """Encodes one stream's buffer, step after step (see the module's text); :func:`encode_buffers` encodes the
    buffers of several streams in one encoder forward."""

    def __init__(self, recognizer: Recognizer, lookahead_s: float, pad_s: float, drafts: bool = True):
        self.rec = recognizer
        self.lookahead, self.pad = int(lookahead_s * 100), int(pad_s * 100)  # mel frames
        self.cache = EncoderCache()
        self.top = float("-inf")  # the loudest log-mel value of the buffer so far
        self.start: float | None = None  # stream time of the buffer's start the state belongs to
        draft = recognizer.draft
        self.drafts = drafts and draft is not None  # the decodes draft: the draft's view of the buffer is made too
        self.cross = _FrozenCross(recognizer.target.decoder)
        self.draft_cross = _FrozenCross(draft.decoder) if self.drafts and draft.encoder is None else None

    def encode(self, audio: np.ndarray, start: float) -> Encoded:
        """The encoder output of a buffer starting at stream time ``start`` holding ``audio`` (what was encoded of it
        before is kept when it is the same buffer, grown)."""
        return encode_buffers([(self, audio, start)])[0]

    def _prepare(self, audio: np.ndarray, start: float) -> _Step:
        """The step's log-mel frames and what it freezes."""
        if start != self.start:
            self.clear()
            self.start = start
        audio_frames = len(audio) // HOP
        frames = min(N_FRAMES, audio_frames + self.pad)  # a full window's padding is its last part, as Whisper's
        frames += frames % 2  # two mel frames per encoder position
        freeze = max(0, (audio_frames - self.lookahead) // 2)
        self._cut(min(self.cache.frozen, freeze))  # a final may decode less than the buffer holds
        first = first_frame(self.cache)
        log = log_mel_frames(audio, first, frames - first, self.rec.target.n_mels)
        self.top = max(self.top, float(log[:, :max(1, audio_frames - first)].max()))
        mel = scaled(log, self.top).to(self.rec.target.decoder.device)
        return _Step(self, Tail(mel, self.cache, freeze, audio_frames // 2), self.cache.frozen)

    def clear(self) -> None:
        self.top, self.start = float("-inf"), None
        self._cut(0)

    def _cut(self, positions: int) -> None:
        """Keep only the first ``positions`` frozen positions."""
        self.cache.truncate(positions)
        for cross in (self.cross, self.draft_cross):
            if cross is not None:
                cross.cut(positions)


def encode_buffers(steps: list[tuple[BufferEncoder, np.ndarray, float]]) -> list[Encoded]:
    """Each (stream's encoder, its buffer's audio, the buffer's start) encoded as :meth:`BufferEncoder.encode` would,
    the buffers together: one encoder forward for all their new positions, and one call per decoder for those
    positions' cross-attention keys and values."""
    prepared = [enc._prepare(audio, start) for enc, audio, start in steps]
    if not prepared:
        return []
    rec = prepared[0].encoder.rec
    rec.encoder_calls += 1
    memories = encode_tails(rec.target.encoder.inner, [p.tail for p in prepared])
    fresh = [m[:, p.frozen:] for m, p in zip(memories, prepared)]
    target_kv = cross_kv_of(rec.target.decoder, fresh)
    drafts = prepared[0].encoder.drafts  # the engine's: all its streams alike
    own_draft = drafts and rec.draft.encoder is None
    draft_kv = cross_kv_of(rec.draft.decoder, fresh) if own_draft else [None] * len(prepared)
    out = []
    for p, memory, t_kv, d_kv, (_, audio, _) in zip(prepared, memories, target_kv, draft_kv, steps):
        enc, freeze = p.encoder, p.encoder.cache.frozen
        cross = enc.cross.extend(t_kv, p.frozen, freeze)
        if own_draft:  # a draft that reads the target's encoder output
            out.append(Encoded(memory, memory, cross, enc.draft_cross.extend(d_kv, p.frozen, freeze)))
        elif not drafts:
            out.append(Encoded(memory, None, cross))
        else:  # a draft with an encoder of its own
            mel = window(log_mel(audio, rec.target.n_mels), 0, 2 * memory.shape[1])[None].to(memory.device)
            out.append(Encoded(memory, rec.draft.encoder_out(mel, memory), cross))
    return out


def encode_whole(recognizer: Recognizer, audio: np.ndarray, full: bool) -> Encoded:
    """The whole buffer encoded at once: padded to Whisper's 30 s window (``full``), or its audio plus 2 s of silence
    rounded up to whole seconds."""
    frames = N_FRAMES if full else encoder_frames(len(audio) // HOP, full=False)
    mel = window(log_mel(audio, recognizer.target.n_mels), 0, frames)[None]
    memories = recognizer.encode(mel.to(recognizer.target.decoder.device))
    return Encoded(memories.target, memories.draft)


def encode_windows(recognizer: Recognizer, audios: list[np.ndarray], rows: int | None) -> list[Encoded]:
    """Each buffer on Whisper's padded 30 s window. With ``rows`` (where decodes are static: a GPU) all of them in one
    encoder call of at least ``rows`` windows (the rest zeros), and the target's cross-attention keys and values of
    them in one product per layer: the host's work per tick hardly grows with the streams while the GPU does the
    arithmetic, and at a fixed shape a window's numbers do not depend on how many were encoded with it. Without, one
    call each (on a CPU a batch's products may round otherwise than one window's)."""
    if not audios:
        return []
    if rows is None:
        return [encode_whole(recognizer, audio, full=True) for audio in audios]
    n_mels, decoder = recognizer.target.n_mels, recognizer.target.decoder
    mels = [window(log_mel(audio, n_mels), 0, N_FRAMES) for audio in audios]
    mels += [mels[0].new_zeros(mels[0].shape)] * max(0, rows - len(mels))
    memories = recognizer.encode(torch.stack(mels).to(decoder.device))
    kv = decoder.cross_kv(memories.target, fixed=True)  # the target's keys and values, at the same fixed shape
    draft = memories.draft
    return [Encoded(memories.target[i:i + 1], None if draft is None else draft[i:i + 1], kv.map(lambda t: t[i:i + 1]))
            for i in range(len(audios))]
