"""The model side of Whisper decoding, shared by the window loop (``transcribe``), streaming and distillation:
encode audio windows, detect the language, build a window's prompt, decode a batch of windows speculatively,
and Whisper's checks on a decoded window (one place for its thresholds and temperature ladder)."""
from __future__ import annotations

import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from enum import Enum, StrEnum

import torch

from .decoding.beam import BeamOptions, beam_search
from .decoding.costs import BatchCosts
from .decoding.logits import LogitRules
from .decoding.rows import DecodeOptions, Decoders, RowRequest, RowResult
from .decoding.sampling import Sampler
from .decoding.speculative import DecodingTask
from .decoding.static import open_decode
from .models.auto import K  # most drafted tokens per target pass, by default
from .models.kv_decoder import CrossKV
from .models.loader import Draft, Whisper
from .models.pair import Pair

DRAFT_STOP = 0.3  # by default a pass stops drafting when the draft believes its proposal less than this


class EncoderWindow(StrEnum):
    """What the encoder reads of a window or a stream's buffer (``transcribe --encoder-window``,
    ``EngineConfig.encoder_window``)."""
    STREAM = "stream"  # streams only: each frame a bounded number of times, the rest kept (streaming/encoding.py)
    AUDIO = "audio"  # the audio plus 2 s of silence, rounded up to whole seconds
    FULL = "full"  # Whisper's padded 30 s window


class Retry(Enum):
    """Why a decoded window is decoded again (:meth:`Recognizer.retry`)."""
    PAD = "pad"  # encoded shorter than 30 s and looks looped or fails the checks: again on the padded 30 s window
    HOTTER = "hotter"  # fails Whisper's checks: again at the next temperature


@dataclass(frozen=True)
class Checks:
    """Whisper's checks on a decoded window, and the temperatures a failing window is decoded again at."""
    temperatures: tuple[float, ...] = (0.0, 0.2, 0.4, 0.6, 0.8, 1.0)  # see temperature_ladder()
    compression_ratio_threshold: float | None = 2.4
    logprob_threshold: float | None = -1.0
    no_speech_threshold: float | None = 0.6
    seed: int = 0  # sampling noise (the same seed gives the same text with and without the draft)


def temperature_ladder(start: float = 0.0, fallback: bool = True) -> tuple[float, ...]:
    """Whisper's temperatures: ``start``, then up by 0.2 to 1.0 when a decode fails its checks."""
    if not fallback:
        return (start,)
    steps = [round(start + 0.2 * i, 2) for i in range(6)]
    return tuple(t for t in steps if t <= 1.0 + 1e-9) or (start,)


def nothing_said(r: RowResult, o: Checks = Checks()) -> bool:
    """Whisper's no-speech rule: a window is skipped when its no-speech probability is above the threshold,
    unless its text is likely (mean log-probability above that threshold)."""
    return (o.no_speech_threshold is not None and r.no_speech_prob > o.no_speech_threshold
            and (o.logprob_threshold is None or r.avg_logprob < o.logprob_threshold))


def pad_memories(memories: list[torch.Tensor], width: int | None = None) -> torch.Tensor:
    """[1, S_i, D] encoder outputs -> [B, max S (or ``width``), D]: zeros after each row's length (give each request
    its ``memory_length`` so cross-attention masks them)."""
    longest = max(width or 0, *(m.shape[1] for m in memories))
    return torch.cat([torch.nn.functional.pad(m, (0, 0, 0, longest - m.shape[1])) for m in memories])


def compression_ratio(text: str) -> float:
    raw = text.encode("utf-8")
    return len(raw) / len(zlib.compress(raw)) if raw else 0.0


def _repeats(text: list[int], ends: range) -> Iterator[tuple[int, int]]:
    """(end, n) for each phrase of n >= 4 tokens said twice at once and ending at ``end`` in ``text``, by ``end``."""
    return ((end, n) for end in ends for n in range(4, end // 2 + 1) if text[end - 2 * n:end - n] == text[end - n:end])


class Recognizer:
    """A target model and an optional draft, and what decoding their 30 s windows needs."""

    def __init__(self, target: Whisper, draft: Draft | None = None):
        self.target, self.draft = target, draft
        self.vocab = target.vocab
        self.costs = BatchCosts()  # what passes cost on this machine, by batch width, learnt while decoding
        self.encoder_calls = 0  # target-encoder forwards (a batch of windows or of streams' tails counts once)
        self.decoder_passes = 0  # target passes of the decodes (a pass over a batch counts once)

    def encode(self, mel: torch.Tensor) -> Pair[torch.Tensor]:
        """The encoder outputs of log-mel windows [B, n_mels, frames]: the target's, and the draft's (None without a
        draft)."""
        self.encoder_calls += 1
        enc = self.target.encode(mel)
        return Pair(enc, self.draft.encoder_out(mel, enc) if self.draft else None)

    @torch.inference_mode()
    def detect_language(self, target_memory: torch.Tensor, lengths: list[int] | None = None,
                        among: list[tuple[str, ...]] | None = None) -> list[str]:
        """The most likely language of each window in the batch (Whisper's detection from <|startoftranscript|>);
        ``among``: per window, the languages it may be (empty: any)."""
        v = self.vocab
        dec = self.target.decoder
        cache = dec.new_cache(target_memory, 1, lengths)
        sot = torch.full((target_memory.shape[0], 1), v.sot, device=dec.device)
        logits = dec(cache, sot, torch.zeros_like(sot))[:, 0].float()
        codes, ids = list(v.languages), list(v.languages.values())
        if among is not None and any(among):
            barred = torch.tensor([[bool(allowed) and code not in allowed for code in codes] for allowed in among],
                                  device=logits.device)
            return [codes[i] for i in logits[:, ids].masked_fill(barred, float("-inf")).argmax(dim=-1).tolist()]
        return [codes[i] for i in logits[:, ids].argmax(dim=-1).tolist()]

    def prompt(self, previous: list[int], language: str | None, task: str, timestamps: bool,
               hotwords: list[int] | tuple[int, ...] = ()) -> RowRequest:
        """The decode request of a window: Whisper's prompt (previous text after <|startofprev|>, then the
        start-of-transcript sequence); prefix, hint, length and sampling key are added with ``replace``.
        ``hotwords``: tokens placed before the previous text in every window (faster-whisper's ``hotwords``), which
        then keeps what room is left of Whisper's budget."""
        v = self.vocab
        budget = self.target.decoder.max_positions // 2 - 1  # Whisper: half the context less <|startofprev|>
        hot = list(hotwords[:budget])
        room = budget - len(hot)
        head = [v.sot_prev] + hot + (previous[-room:] if room else []) if previous or hot else []
        tail = v.sot_sequence(language, task) + ([] if timestamps else [v.no_timestamps])
        return RowRequest(head + tail, len(head))

    def decode(self, memories: Pair[torch.Tensor], requests: list[RowRequest],
               temperature: float = 0.0, timestamps: bool = True, *, k: int = K, draft_stop: float = DRAFT_STOP,
               seed: int = 0, use_draft: bool = True, adaptive_k: bool = False, keep_cross: bool = False,
               cross: Pair[CrossKV | None] = Pair(None),
               attention_heads: tuple[tuple[int, int], ...] = (), static: bool = False) -> list[RowResult]:
        """One speculative decode of a batch of windows (``memories`` rows match ``requests``). Sampling
        (``temperature`` > 0) draws with noise keyed by ``seed`` and each request's key: the same tokens with
        and without the draft, at any draft length. ``cross``: the decoders' cross-attention keys and values of
        ``memories`` where known (a stream keeps those of the audio it has encoded before); ``attention_heads``: the
        (layer, head) pairs whose cross-attention each result keeps (word timing from the decode itself); ``static``: may run
        as a static decode (``DecodeOptions.static``: whole 30 s windows)."""
        task = self.open(memories, requests, temperature, timestamps, k=k, draft_stop=draft_stop, seed=seed,
                         use_draft=use_draft, adaptive_k=adaptive_k, keep_cross=keep_cross, cross=cross,
                         attention_heads=attention_heads, static=static)
        try:
            results = task.run()
        finally:
            task.close()
        self.decoder_passes += max((r.stats.target_passes for r in results), default=0)
        return results

    def beam(self, memory: torch.Tensor, requests: list[RowRequest], timestamps: bool, options: BeamOptions,
             k: int = K, use_draft: bool = True) -> list[RowResult]:
        """A beam search of each window (``memory``: the target's encoder outputs), as openai-whisper's, drafting
        ``k`` tokens a beam where drafting was measured to pay for beam searches (``DraftWidths.beam``;
        ``decoding/beam.py``): the same result either way."""
        v = self.vocab
        ragged = any(r.memory_length is not None for r in requests)
        lengths = [r.memory_length or memory.shape[1] for r in requests] if ragged else None
        drafting = self.draft is not None and use_draft and k > 0 and self.draft.widths.beam
        results = beam_search(self.target.decoder, memory, requests, LogitRules.whisper(v, timestamps), v.eot,
                              v.no_speech, options, lengths, self.draft.decoder if drafting else None, k)
        self.decoder_passes += max((r.stats.target_passes for r in results), default=0)
        return results

    def open(self, memories: Pair[torch.Tensor], requests: list[RowRequest],
             temperature: float = 0.0, timestamps: bool = True, *, k: int = K, draft_stop: float = DRAFT_STOP,
             seed: int = 0, use_draft: bool = True, adaptive_k: bool = False, keep_cross: bool = False,
             cross: Pair[CrossKV | None] = Pair(None), attention_heads: tuple[tuple[int, int], ...] = (),
             static: bool = False, room: int = 0) -> DecodingTask:
        """``decode``'s decode, not run yet: its caller drives it pass by pass (``start``, ``step``), rows may
        ``join`` it between passes (``room``: how many rows it will hold at most) and ``close`` ends it."""
        # the draft drafts where it was measured to pay at this decode's width (its rows now, or at most: ``room``)
        drafting = self.draft is not None and use_draft and self.draft.widths(max(len(requests), room))
        draft = self.draft.decoder if drafting else None
        options = DecodeOptions(LogitRules.whisper(self.vocab, timestamps), self.vocab.eot, self.vocab.no_speech,
                                Sampler(temperature, seed), k, draft_stop, keep_cross, attention_heads,
                                static)
        return open_decode(Decoders(self.target.decoder, draft, self.costs if adaptive_k else None),
                           memories, requests, options, cross, room)

    def needs_fallback(self, r: RowResult, o: Checks) -> bool:
        """Whisper's checks on a decode (openai/whisper's order): repetitive text (compression ratio) or unlikely
        text (mean log-probability) is decoded again at the next temperature, unless the window is silent
        (no-speech probability above its threshold and mean log-probability below its threshold)."""
        silent = (o.no_speech_threshold is not None and r.no_speech_prob > o.no_speech_threshold
                  and o.logprob_threshold is not None and r.avg_logprob < o.logprob_threshold)
        if silent:
            return False
        repetitive = (o.compression_ratio_threshold is not None
                      and compression_ratio(self.target.tokenizer.decode(r.tokens)) > o.compression_ratio_threshold)
        return repetitive or (o.logprob_threshold is not None and r.avg_logprob < o.logprob_threshold)

    def retry(self, r: RowResult, positions: int, padded: bool, attempt: int, o: Checks, ladder: bool = True
              ) -> Retry | None:
        """Whisper's temperature fallback, one decision at a time, for files and streams alike: what to do with a
        window decoded at attempt ``attempt`` of ``o.temperatures`` from ``positions`` encoder positions.
        ``Retry.PAD``: it was encoded shorter than Whisper's 30 s (not ``padded``) and looks looped or fails the checks,
        so decode it again on the padded window, as Whisper would; ``Retry.HOTTER``: it fails the checks, so decode it
        at the next temperature (only with ``ladder``); None: keep it."""
        fails = self.needs_fallback(r, o) if ladder else False
        if not padded and (self.suspect(r, positions) or fails):
            return Retry.PAD
        if fails and attempt + 1 < len(o.temperatures):
            return Retry.HOTTER
        return None

    def suspect(self, r: RowResult, positions: int) -> bool:
        """Whether a decode of a window encoded at its audio's length (``positions`` encoder positions) looks
        like the decoder ran on without silence to end on: a timestamp past the audio it heard, or a phrase of
        4 or more tokens repeated at once. Such a window is decoded again on Whisper's padded 30 s window."""
        return self.looping(r.tokens, len(r.tokens), positions)

    def overrun(self, tokens: list[int], positions: int) -> int | None:
        """Where a decode that ``suspect`` finds went wrong (the index in ``tokens``): its first timestamp past
        ``positions``, or the second copy of its first phrase of 4 or more tokens repeated at once; None if nowhere."""
        late = self._late(tokens, positions, 0)
        at = [i for i, t in enumerate(tokens) if t < self.vocab.timestamp_begin]  # where the text tokens are
        repeat = next((at[end - n] for end, n in _repeats([tokens[i] for i in at], range(len(at) + 1))), None)
        return min((i for i in (late, repeat) if i is not None), default=None)

    def looping(self, tokens: list[int], new: int, positions: int) -> bool:
        """Whether ``overrun`` finds something in the last ``new`` of ``tokens``: a timestamp past ``positions``, or
        a repeated phrase that ends there. Checked as a decode goes (``RowRequest.give_up``), it stops a row as soon
        as its result is sure to be suspect, looking only at what the pass added."""
        if self._late(tokens, positions, len(tokens) - new) is not None:
            return True
        tb = self.vocab.timestamp_begin
        text = [t for t in tokens if t < tb]
        fresh = sum(t < tb for t in tokens[len(tokens) - new:])
        return next(_repeats(text, range(len(text) - fresh + 1, len(text) + 1)), None) is not None

    def _late(self, tokens: list[int], positions: int, start: int) -> int | None:
        """The index of the first timestamp past ``positions`` from ``tokens[start]`` on, or None."""
        tb = self.vocab.timestamp_begin
        return next((i for i in range(start, len(tokens)) if tokens[i] >= tb and tokens[i] - tb > positions), None)
