"""Whisper's logit rules as small composable filters (after openai/whisper ``decoding.py``).

Each rule edits logits in place for N rows; ``sampled[i]`` is the list of tokens sampled so far for
row i (everything after the prompt). The same rules run for the draft and for every verified position
of the target, so both see exactly the distribution Whisper would. Logit columns are either the whole
vocabulary or a sorted token shortlist (a reduced-vocabulary draft head): :class:`Columns` maps token
ids to columns, so the draft never expands its logits to the full vocabulary.
"""
from __future__ import annotations

from typing import Protocol, Sequence

import torch

from ..models.kv_decoder import Columns
from ..models.vocab import WhisperVocab

NEG_INF = float("-inf")
FULL = Columns()


class LogitRule(Protocol):
    def apply(self, logits: torch.Tensor, sampled: Sequence[Sequence[int]], cols: Columns) -> None: ...


class SuppressTokens:
    def __init__(self, ids: Sequence[int]):
        self.ids = list(ids)

    def apply(self, logits: torch.Tensor, sampled: Sequence[Sequence[int]], cols: Columns) -> None:
        if at := cols.of(self.ids):
            logits[:, at] = NEG_INF


class SuppressAtBegin:
    """Blank and end-of-text are not allowed as the first sampled token."""

    def __init__(self, ids: Sequence[int]):
        self.ids = list(ids)

    def apply(self, logits: torch.Tensor, sampled: Sequence[Sequence[int]], cols: Columns) -> None:
        rows = [i for i, s in enumerate(sampled) if len(s) == 0]
        if rows and (at := cols.of(self.ids)):
            logits[torch.tensor(rows)[:, None], torch.tensor(at)[None, :]] = NEG_INF


class TimestampRules:
    """Timestamps come in pairs, never decrease, start the text, and win when their total
    probability beats any single text token. Per row only a few ints are computed; the masks go on
    all N rows at once: text prefixes by ``index_fill_`` of the rows sharing a bound, the timestamp
    columns by one broadcast comparison against per-row ranges and one ``masked_fill_``."""

    def __init__(self, vocab: WhisperVocab):
        self.eot = vocab.eot
        self.no_timestamps = vocab.no_timestamps
        self.begin = vocab.timestamp_begin
        self.max_initial = vocab.max_initial_timestamp_index

    def apply(self, logits: torch.Tensor, sampled: Sequence[Sequence[int]], cols: Columns) -> None:
        begin, n_cols = self.begin, logits.shape[-1]
        tb, eot = cols.at(begin), cols.at(self.eot)
        first_end = n_cols if self.max_initial is None else cols.at(begin + self.max_initial + 1)
        if at := cols.of([self.no_timestamps]):
            logits[:, at] = NEG_INF
        # per row only ints: text columns [text_from, tb) and timestamp columns [ts_from, ts_to) stay allowed
        text_from, ts_from, ts_to = [], [], []
        for seq in sampled:
            last_ts = len(seq) >= 1 and seq[-1] >= begin
            penultimate_ts = len(seq) < 2 or seq[-2] >= begin
            opened, closed = last_ts and not penultimate_ts, last_ts and penultimate_ts
            stamp = next((t for t in reversed(seq) if t >= begin), None)
            # no text after an open timestamp, nor first; a timestamp never before the last one, after text
            # or a pair never equal to it (nonzero segments); none after a closed pair; first an early one
            text_from.append(eot if opened else 0 if seq else tb)
            ts_from.append(tb if stamp is None else cols.at(stamp if opened else stamp + 1))
            ts_to.append(tb if closed else n_cols if seq else first_end)
        text, stamps = logits[:, :tb], logits[:, tb:]
        for bound in set(text_from) - {0}:  # at most two: eot, tb (row prefixes filled in place, no mask)
            rows = torch.tensor([i for i, b in enumerate(text_from) if b == bound], device=logits.device)
            text[:, :bound].index_fill_(0, rows, NEG_INF)
        col = torch.arange(tb, tb + stamps.shape[-1], device=logits.device)
        lo, hi = torch.tensor([ts_from, ts_to], device=logits.device)[:, :, None]
        stamps.masked_fill_((col < lo) | (col >= hi), NEG_INF)
        # timestamps win when their total probability beats the best text token's: compared on the logits
        # (log_softmax would subtract the same log-normaliser from both sides)
        forced = stamps.float().logsumexp(dim=-1) > text.float().amax(dim=-1)
        text.index_fill_(0, forced.nonzero()[:, 0], NEG_INF)


class LogitRules:
    """The full rule set of one decode (one place for Whisper's logit processing)."""

    def __init__(self, rules: Sequence[LogitRule]):
        self.rules = list(rules)

    @classmethod
    def whisper(cls, vocab: WhisperVocab, timestamps: bool) -> "LogitRules":
        begin = vocab.suppress_begin or (vocab.eot,)
        rules: list[LogitRule] = [SuppressAtBegin(begin), SuppressTokens(vocab.suppress)]
        if timestamps:
            rules.append(TimestampRules(vocab))
        return cls(rules)

    def __call__(self, logits: torch.Tensor, sampled: Sequence[Sequence[int]], cols: Columns = FULL) -> torch.Tensor:
        """Apply every rule to ``logits`` [N, columns] (float32, edited in place) and return it."""
        for rule in self.rules:
            rule.apply(logits, sampled, cols)
        return logits
