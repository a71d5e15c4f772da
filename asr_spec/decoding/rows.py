"""What a speculative decode is asked and what it returns: the options every row shares (``DecodeOptions``), one
row's request (``RowRequest``), its result (``RowResult``, ``RowStats``) and the decoders that run it (``Decoders``)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch

from ..models.kv_decoder import CachedDecoder, CrossKV
from .costs import CostModel
from .logits import LogitRules
from .sampling import GREEDY, Sampler

SAMPLE_LEN = 224  # Whisper's most tokens per window (half the decoder's 448 positions)


@dataclass(frozen=True)
class DecodeOptions:
    """How one batch is decoded, the same for every row (after openai/whisper's ``DecodingOptions``)."""
    rules: LogitRules
    eot: int
    no_speech: int
    sampler: Sampler = GREEDY
    k: int = 0  # most drafted tokens per pass (0: the target alone)
    stop_below: float = 0.0  # a pass stops drafting once the draft believes every live row's proposal less than this
    keep_cross: bool = False  # each result keeps its row's cross-attention keys and values (word timestamps)
    # (layer, head) pairs whose cross-attention scores each result keeps, for every token it chose (word timing from
    # the decode itself: streaming's AlignAtt)
    attention_heads: tuple[tuple[int, int], ...] = ()
    # may run as a static decode (decoding/static.py) where the device wants one: whole 30 s windows (files, uploads),
    # or a stream's buffers padded to one width (rows with a ``memory_length``: every row then attends that width
    # under its mask, eagerly or not, so that its bits depend on its own length and the width only)
    static: bool = False


@dataclass(frozen=True)
class RowRequest:
    """One row of a decode: its prompt and what bounds or guides its continuation."""
    prompt: list[int]
    sot_index: int  # where <|startoftranscript|> sits in the prompt (the no-speech probability is read there)
    prefix: list[int] = field(default_factory=list)  # forced start of the continuation (Whisper's prefix)
    hint: list[int] = field(default_factory=list)  # a guess of the continuation after the prefix (eot implied)
    sample_len: int = SAMPLE_LEN  # most tokens of the continuation, prefix included
    memory_length: int | None = None  # the row's encoder output is its first that many positions
    # the draft cross-attends to only the first that many positions (the window's audio and a little after): the
    # draft proposes and the target decides, so what the draft reads changes its speed, never the text
    draft_memory_length: int | None = None
    key: tuple[int, ...] = ()  # sampling: the row's noise key (the same key and seed give the same draws)
    # (tokens so far, how many of them are new) -> True to stop the row early: its caller discards such a result
    # (streaming and short windows: a decode that loops is decoded again on a padded window), so the tokens a loop
    # would add until ``sample_len`` are not worth their passes
    give_up: Callable[[list[int], int], bool] | None = None


def acceptance(accepted: int, rejected: int) -> float | None:
    """α: the share of judged drafts the target accepted (drafts after a rejection are not judged)."""
    return accepted / (accepted + rejected) if accepted + rejected else None


@dataclass
class RowStats:
    target_passes: int = 0
    drafted: int = 0
    accepted: int = 0
    rejected: int = 0
    tokens: int = 0
    hint_accepted: int = 0  # hint tokens accepted (streaming: the previous hypothesis, verified for free)
    accepted_at: list[int] = field(default_factory=list)  # accepted drafts per draft pass

    def add(self, other: "RowStats") -> None:
        for name in ("target_passes", "drafted", "accepted", "rejected", "tokens", "hint_accepted"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.accepted_at.extend(other.accepted_at)

    @property
    def acceptance(self) -> float:
        return acceptance(self.accepted, self.rejected) or 0.0


@dataclass
class RowResult:
    tokens: list[int]  # sampled tokens (prefix included), without the final end-of-text
    sum_logprob: float  # target log-probabilities of every sampled token (end-of-text included)
    no_speech_prob: float
    stats: RowStats
    cross: CrossKV | None = None  # with DecodeOptions.keep_cross
    # with DecodeOptions.attention_heads: [heads, len(tokens) + 1, S] scores before the softmax; row j is the query
    # that chose tokens[j], the last the one after the last token (when the decode ended with end-of-text)
    attention: torch.Tensor | None = None
    logprobs: list[float] = field(default_factory=list)  # the target's, of each token after the prefix

    @property
    def avg_logprob(self) -> float:
        return self.sum_logprob / (len(self.tokens) + 1)


@dataclass
class Decoders:
    target: CachedDecoder
    draft: CachedDecoder | None = None
    costs: Callable[[int], CostModel] | None = None  # the measured costs of a pass over n rows (None: always k)

    def k(self, options: DecodeOptions) -> int:
        """The drafted tokens per pass a decode with ``options`` runs: its K with a draft, 0 without one (the one
        place this is decided; the recognizer decides whether a decode drafts at all)."""
        return options.k if self.draft is not None else 0
