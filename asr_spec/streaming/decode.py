"""One engine step's decode: the requests of several streams, encoded each at its own length and decoded as one
ragged speculative batch, with Whisper's temperature fallback and AlignAtt's word alignment.

Where the device wants static decodes (``ASR_SPEC_STATIC``: CUDA by default), every buffer is padded to 30 s
(``PADDED``) and the decode may run in a static decode's arena (its passes replayed as CUDA graphs): each row attends
its own length under a mask, so its bits depend on nothing else, eager or static (decoding/static.py).

A row encoded shorter than Whisper's 30 s window that looks looped, or (a committing row) fails Whisper's checks, or
(a final) says words its alignment places after its audio, is decoded again on Whisper's padded 30 s window, and a
committing row that still fails them climbs the temperature ladder: ``Recognizer.retry`` decides, as it does for
files. AlignAtt's rows have their continuations aligned together, in
one pass of the target decoder over the cross-attention keys and values the decode kept.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from functools import partial

import torch

from ..alignment import Alignment, Word, align, align_many, alignment_heads, decoded_words
from ..decoding import static
from ..decoding.rows import SAMPLE_LEN, RowResult
from ..features import HOP, N_FRAMES, SAMPLE_RATE
from ..models.kv_decoder import CrossKV, stack_cross
from ..models.pair import Pair
from ..recognizer import EncoderWindow, Recognizer, Retry, pad_memories
from .config import EngineConfig, WordTiming
from .encoding import Encoded, encode_buffers, encode_whole, encode_windows
from .events import Aligner
from .request import Decoded, RequestKind, StreamRequest

log = logging.getLogger(__name__)
PADDED = N_FRAMES // 2  # encoder positions every buffer is padded to where decodes may be static: 30 s
RAN_PAST_S = 0.04  # a final's word that starts in this last part of its audio was not heard (two encoder positions)


def decode_apart(rec: Recognizer, requests: list[StreamRequest], config: EngineConfig) -> list[Decoded | Exception]:
    """:func:`decode_batch`; if the batch raises, each request alone, so that a request that cannot be decoded fails
    by itself (its exception in its place) instead of failing, and being retried with, every batch."""
    try:
        return decode_batch(rec, requests, config)
    except Exception as e:  # noqa: BLE001 - isolated below, reported to the one stream
        if len(requests) == 1:
            log.exception("decoding a stream failed")
            return [e]
    return [out for r in requests for out in decode_apart(rec, [r], config)]


def encode(rec: Recognizer, requests: list[StreamRequest], config: EngineConfig, rows: int | None) -> list[Encoded]:
    """Each request's buffer encoded: the streaming encoder's in one forward for all of them (``encode_buffers``),
    full windows in one call for all of them (``encode_windows``, at least ``rows`` windows a call where given), the
    buffer and 2 s of silence (``audio``) one by one."""
    window = config.encoder_window
    streamed = [i for i, r in enumerate(requests) if r.encoder is not None and window is EncoderWindow.STREAM]
    out: dict[int, Encoded] = dict(zip(streamed, encode_buffers([(requests[i].encoder, requests[i].audio,
                                                                   requests[i].start) for i in streamed])))
    if window is EncoderWindow.FULL:
        whole = [i for i in range(len(requests)) if i not in out]
        out |= dict(zip(whole, encode_windows(rec, [requests[i].audio for i in whole], rows)))
    return [out[i] if i in out else encode_whole(rec, r.audio, full=False) for i, r in enumerate(requests)]


@torch.inference_mode()
def decode_batch(rec: Recognizer, requests: list[StreamRequest], c: EngineConfig) -> list[Decoded]:
    width = PADDED if static.wanted(rec.target.decoder.device) else None
    encoded = encode(rec, requests, c, c.max_batch if width is not None else None)
    lengths = [e.positions for e in encoded]
    memories = _memories(encoded, width)
    languages = [r.language for r in requests]
    if rec.vocab.multilingual and None in languages:
        detected = rec.detect_language(memories.target, lengths, [r.languages for r in requests])
        languages = [lang or d for lang, d in zip(languages, detected)]
    rows = [replace(rec.prompt(r.context, lang, r.task, timestamps=True, hotwords=r.hotwords), prefix=r.prefix, hint=r.hint,
                    sample_len=min(SAMPLE_LEN, len(r.prefix) + 16 + int(c.tokens_per_s * len(r.audio) / SAMPLE_RATE)))
            for r, lang in zip(requests, languages)]
    # AlignAtt's rows: their words from the decode's own cross-attention, or from a pass of their own after it
    recorded = c.alignment is WordTiming.DECODE and any(r.aligns for r in requests)
    heads = tuple(alignment_heads(rec.target)) if recorded else ()
    decode = partial(rec.decode, k=c.k, draft_stop=c.draft_stop, seed=c.checks.seed, use_draft=c.draft,
                     keep_cross=True, attention_heads=heads, static=width is not None)
    short = [n < N_FRAMES // 2 for n in lengths]  # encoded shorter than 30 s: decoded again on 30 s if it loops
    results = decode(memories, [replace(row, memory_length=n, give_up=partial(rec.looping, positions=n) if s else None)
                                for row, n, s in zip(rows, lengths, short)], cross=_cross(encoded, width))
    rounds = [_Fallback(e, not s) for e, s in zip(encoded, short)]
    todo = list(range(len(requests)))
    while todo:  # Whisper's fallback, the rows that need another decode decoded together, round by round
        todo = [i for i in todo if _next_try(rec, requests[i], results, i, rounds[i], c, languages[i])]
        for attempt in sorted({rounds[i].attempt for i in todo}):
            group = [i for i in todo if rounds[i].attempt == attempt]
            own = [rounds[i].own for i in group]
            again = decode(_memories(own, width), [replace(rows[i], key=(attempt,), memory_length=e.positions)
                                                   for i, e in zip(group, own)],
                           c.checks.temperatures[attempt], cross=_cross(own, width))
            for i, result in zip(group, again):
                results[i] = result
    memory, fallbacks = [f.own.memory for f in rounds], [f.tries for f in rounds]
    words = (_decoded_continuations(rec, requests, results, languages) if heads
             else _align_continuations(rec, requests, results, memory, languages, width))
    return [Decoded(result, lang, not rec.needs_fallback(result, c.checks), tries,
                    _aligner(rec, r, mem, lang, result, known) if r.timed else None)
            for r, result, mem, lang, tries, known in zip(requests, results, memory, languages, fallbacks, words)]


@dataclass
class _Fallback:
    """A row's way through Whisper's fallback: what it is decoded from (its own encoding, or the padded 30 s window),
    whether that is padded, the temperature step, and the decodes repeated."""
    own: Encoded
    padded: bool
    attempt: int = 0
    tries: int = 0


def _next_try(rec: Recognizer, request: StreamRequest, results: list[RowResult], i: int, f: _Fallback,
              c: EngineConfig, language: str | None) -> bool:
    """Whether row i's result is decoded again (``Recognizer.retry``, as for files), preparing ``f`` for it: on
    Whisper's padded 30 s window (a looped or failing row encoded shorter, or a final whose words run past its audio;
    a partial is cut where it went wrong instead), or at the next temperature (a committing row that fails Whisper's
    checks)."""
    retry = rec.retry(results[i], f.own.positions, f.padded, f.attempt, c.checks, ladder=request.final)
    if retry is None and request.kind is RequestKind.FINAL and not f.padded \
            and _ran_past(rec, request, results[i], f.own, language):
        retry = Retry.PAD
    if retry is None:
        return False
    if retry is Retry.PAD and not request.final:
        results[i] = _cut_overrun(rec, results[i], f.own.positions, len(request.prefix))
        return False
    f.tries += 1
    if retry is Retry.PAD:  # looped, or failed the checks: decode it again as Whisper would, on 30 s
        f.own, f.padded = encode_whole(rec, request.audio, full=True), True
    else:
        f.attempt += 1
    return True


def _ran_past(rec: Recognizer, request: StreamRequest, result: RowResult, own: Encoded, language: str | None) -> bool:
    """Whether a final decoded from its buffer's own encoding says words after its audio: a word that Whisper's
    alignment starts in the audio's last ``RAN_PAST_S`` was not heard. Encoded at its length, a buffer cut inside
    speech (a flush) was ended with invented words ("the letter used should be for the art of the art.", all after
    "be" aligned to the last frame) where Whisper's padded 30 s window heard "used should be"."""
    cont = result.tokens[len(request.prefix):]
    if not any(t < rec.vocab.eot for t in cont):
        return False
    words = align(rec.target, own.memory, len(request.audio) // HOP, language, request.task, [request.prefix, cont],
                  result.cross, scored=1)[1]
    return any(w.start >= len(request.audio) / SAMPLE_RATE - RAN_PAST_S for w in words)


def _cut_overrun(rec: Recognizer, result: RowResult, positions: int, prefix: int) -> RowResult:
    """A re-decode that ran past its audio or looped, kept up to where it did: its tail is decoded again at the next
    step anyway, so it is not worth a decode on a padded 30 s window (a partial's loop is mostly a word cut off at
    the buffer's end, said again and again)."""
    at = rec.overrun(result.tokens, positions)
    cut = len(result.tokens) if at is None else max(prefix, at)
    kept = result.logprobs[:cut - prefix]
    attention = None if result.attention is None else result.attention[:, :cut + 1]
    return replace(result, tokens=result.tokens[:cut], sum_logprob=sum(kept), logprobs=kept, attention=attention)


def _memories(encoded: list[Encoded], width: int | None) -> Pair[torch.Tensor]:
    """The rows' encoder outputs as one batch each (zeros after each row's length; to ``width`` where given)."""
    draft = all(e.draft_memory is not None for e in encoded)
    return Pair(pad_memories([e.memory for e in encoded], width),
                pad_memories([e.draft_memory for e in encoded], width) if draft else None)


def _cross(encoded: list[Encoded], width: int | None) -> Pair[CrossKV | None]:
    """The rows' cross-attention keys and values as one batch each, where every row's are known."""
    return Pair(_stacked([e.cross for e in encoded], width), _stacked([e.draft_cross for e in encoded], width))


def _stacked(rows: list[CrossKV | None], width: int | None) -> CrossKV | None:
    return stack_cross(rows, width) if rows and all(r is not None for r in rows) else None


def _aligner(rec: Recognizer, request: StreamRequest, memory: torch.Tensor, language: str | None,
             result: RowResult, known: dict[tuple, list[Word]]) -> Aligner:
    """Times words of a decode's tokens, Whisper's way (``align``), over the audio they were decoded from, in seconds
    from its start; the ``before`` tokens decoded ahead of them in that audio are aligned with them (their audio
    comes first) and their words dropped. ``known``: what the batch aligned already (AlignAtt's continuations); what it aligns is kept there."""
    def words(before: list[int], tokens: list[int]) -> list[Word]:
        key = (tuple(before), tuple(tokens))
        if (found := known.get(key)) is not None:
            return found
        try:
            known[key] = align(rec.target, memory, len(request.audio) // HOP, language, request.task, [before, tokens],
                               result.cross, scored=1)[1]
        except Exception:  # noqa: BLE001 - the final goes out without word times rather than not at all
            log.exception("aligning words failed")
            return []
        return known[key]
    return words


def _decoded_continuations(rec: Recognizer, requests: list[StreamRequest], results: list[RowResult],
                           languages: list[str | None]) -> list[dict[tuple, list[Word]]]:
    """:func:`_align_continuations` from the cross-attention each decode recorded as it chose its tokens."""
    out: list[dict[tuple, list[Word]]] = [{} for _ in requests]
    for i, (r, result) in enumerate(zip(requests, results)):
        if r.aligns and result.attention is not None:
            cont = result.tokens[len(r.prefix):]
            out[i][(tuple(r.prefix), tuple(cont))] = decoded_words(
                rec.target, result.attention, result.tokens, len(r.prefix), len(r.audio) // HOP, languages[i],
                result.logprobs)
    return out


def _align_continuations(rec: Recognizer, requests: list[StreamRequest], results: list[RowResult],
                         memory: list[torch.Tensor], languages: list[str | None],
                         width: int | None) -> list[dict[tuple, list[Word]]]:
    """The words of each aligning request's continuation after its prefix (what AlignAtt commits from), all rows in
    one pass of the target decoder (memories padded to ``width`` where the decode padded them: attended under a mask,
    as the decode attended them); {(prefix, continuation): its words} per request."""
    rows = [i for i, r in enumerate(requests) if r.aligns]
    out: list[dict[tuple, list[Word]]] = [{} for _ in requests]
    if not rows:
        return out
    cont = {i: results[i].tokens[len(requests[i].prefix):] for i in rows}
    windows = [Alignment(memory[i], len(requests[i].audio) // HOP, languages[i], requests[i].task,
                         [requests[i].prefix, cont[i]], results[i].cross, scored=1) for i in rows]
    try:
        words = align_many(rec.target, windows, width)
    except Exception:  # noqa: BLE001 - each row is aligned on its own when asked
        log.exception("aligning words failed")
        return out
    for i, w in zip(rows, words):
        out[i][(tuple(requests[i].prefix), tuple(cont[i]))] = w[1]
    return out
