"""Whisper's logit rules as small composable filters (after openai/whisper ``decoding.py``), as tensor operations.

Each rule edits logits [N, columns] in place, reading what it needs of each row's history (the tokens sampled after
the prompt, prefix included) from a :class:`RuleState`: its length, its last two tokens and its last timestamp, as
tensors on the logits' device. No rule reads a history token by token or waits for the host, so the rules of every
verified position of a pass (each with its own prefix: ``RuleState.after``) run as a few batched operations. The
same rules run for the draft and for the target, so both see exactly the distribution Whisper would. Logit columns
are either the whole vocabulary or a sorted token shortlist (a reduced-vocabulary draft head): :class:`Columns` maps
token ids to columns, so the draft never expands its logits to the full vocabulary.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, Sequence

import torch

from ..models.kv_decoder import Columns
from ..models.vocab import WhisperVocab

NEG_INF = float("-inf")
FULL = Columns()
NONE = -1  # a token that is not there (a history shorter than two)


@dataclass(frozen=True)
class RuleState:
    """Per logit row (tensors of one shape, flattened in row order when applied): ``count`` tokens sampled so far,
    the ``last`` and ``penult``-imate of them (``NONE`` where the history is shorter) and the last timestamp
    token among them (``stamp``, ``NONE`` when there is none)."""
    count: torch.Tensor
    last: torch.Tensor
    penult: torch.Tensor
    stamp: torch.Tensor

    @classmethod
    def of(cls, sampled: Sequence[Sequence[int]], begin: int, device: torch.device | str = "cpu") -> "RuleState":
        """The state of each history in ``sampled`` (lists of tokens; ``begin``: the first timestamp token)."""
        rows = [[len(s), s[-1] if s else NONE, s[-2] if len(s) > 1 else NONE,
                 next((t for t in reversed(s) if t >= begin), NONE)] for s in sampled]
        t = torch.tensor(rows, dtype=torch.long, device=device).reshape(-1, 4)
        return cls(t[:, 0], t[:, 1], t[:, 2], t[:, 3])

    def after(self, tokens: torch.Tensor, begin: int) -> "RuleState":
        """The states [m, L + 1] after 0..L more ``tokens`` [m, L] of each of these m rows (a pass's positions: row i,
        position j has history + tokens[i, :j])."""
        m, n = tokens.shape
        if n == 0:
            return RuleState(*(t[:, None] for t in (self.count, self.last, self.penult, self.stamp)))
        steps = torch.arange(n + 1, device=tokens.device)
        seq = torch.cat([self.penult[:, None], self.last[:, None], tokens], dim=1)
        stamps = torch.cat([self.stamp[:, None], tokens], dim=1)
        where = torch.where(stamps >= begin, steps, 0).cummax(dim=1).values  # the newest timestamp so far
        return RuleState(self.count[:, None] + steps, seq[:, 1:], seq[:, :-1], stamps.gather(1, where))

    def push(self, tokens: torch.Tensor, begin: int) -> "RuleState":
        """The states after one more token per row (``tokens`` [m])."""
        return RuleState(self.count + 1, tokens, self.last, torch.where(tokens >= begin, tokens, self.stamp))

    def select(self, rows: torch.Tensor) -> "RuleState":
        """Only ``rows`` (batch compaction)."""
        return RuleState(*(t.index_select(0, rows) for t in (self.count, self.last, self.penult, self.stamp)))

    def take(self, at: torch.Tensor) -> "RuleState":
        """Row i's state at position ``at[i]`` of states [m, L + 1] (the state after a pass's accepted tokens)."""
        pick = lambda t: t.gather(1, at[:, None])[:, 0]  # noqa: E731
        return RuleState(pick(self.count), pick(self.last), pick(self.penult), pick(self.stamp))

    def flat(self) -> tuple[torch.Tensor, ...]:
        return tuple(t.reshape(-1) for t in (self.count, self.last, self.penult, self.stamp))


def fill_rows(region: torch.Tensor, rows: torch.Tensor, value: float = NEG_INF) -> None:
    """Set the rows of ``region`` [N, C] (a view into logits) where ``rows`` [N] is True to ``value``. On a CPU,
    finding the few such rows and filling only them beats a masked write over every row (50 us for 4 x 50k
    columns, where the rows' read costs a few); on an accelerator the masked write runs without waiting for the
    host."""
    if region.is_cuda:
        region.masked_fill_(rows[:, None], value)
    elif (at := rows.nonzero()[:, 0]).numel():
        region.index_fill_(0, at, value)


class LogitRule(Protocol):
    def apply(self, logits: torch.Tensor, state: RuleState, cols: Columns) -> None: ...


class SuppressTokens:
    def __init__(self, ids: Sequence[int]):
        self.ids = list(ids)

    def apply(self, logits: torch.Tensor, state: RuleState, cols: Columns) -> None:
        at = cols.tensor_of(self.ids, logits.device)
        if at.numel():
            logits.index_fill_(1, at, NEG_INF)


class SuppressAtBegin:
    """Blank and end-of-text are not allowed as the first sampled token."""

    def __init__(self, ids: Sequence[int]):
        self.ids = list(ids)

    def apply(self, logits: torch.Tensor, state: RuleState, cols: Columns) -> None:
        at = cols.tensor_of(self.ids, logits.device)
        if at.numel():
            first = state.count.reshape(-1) == 0
            if logits.is_cuda:
                logits[:, at] = logits[:, at].masked_fill(first[:, None], NEG_INF)
            elif (rows := first.nonzero()).numel():
                logits[rows, at[None, :]] = NEG_INF


class TimestampRules:
    """Timestamps come in pairs, never decrease, start the text, and win when their total probability beats any
    single text token. Per row, a few integers say which text tokens and which timestamps stay allowed (token ids
    from ``text_from`` on; timestamps in [``ts_from``, ``ts_to``)); two broadcast comparisons against the columns'
    token ids mask the rest."""

    def __init__(self, vocab: WhisperVocab):
        self.eot = vocab.eot
        self.no_timestamps = vocab.no_timestamps
        self.begin = vocab.timestamp_begin
        self.max_initial = vocab.max_initial_timestamp_index

    def apply(self, logits: torch.Tensor, state: RuleState, cols: Columns) -> None:
        begin, eot = self.begin, self.eot
        tb = cols.at(begin)
        ids = cols.ids_for(logits.shape[-1], logits.device)
        SuppressTokens([self.no_timestamps]).apply(logits, state, cols)
        count, last, penult, stamp = state.flat()
        last_ts = last >= begin
        penult_ts = (count < 2) | (penult >= begin)
        opened, closed = last_ts & ~penult_ts, last_ts & penult_ts
        sampled = count > 0
        # a timestamp never before the last one, after text or a pair never equal to it (nonzero segments); none
        # after a closed pair; first an early one
        anywhere = torch.iinfo(torch.long).max
        first_end = anywhere if self.max_initial is None else begin + self.max_initial + 1
        ts_from = torch.where(stamp < 0, begin, torch.where(opened, stamp, stamp + 1))
        ts_to = torch.where(closed, begin, torch.where(sampled, anywhere, first_end))
        text, stamps = logits[:, :tb], logits[:, tb:]
        at = ids[tb:]
        stamps.masked_fill_((at < ts_from[:, None]) | (at >= ts_to[:, None]), NEG_INF)
        # no text first, nor after an open timestamp (end-of-text and the specials after it stay allowed)
        fill_rows(text, ~sampled)
        fill_rows(text[:, :cols.at(eot)], opened)
        # timestamps win when their total probability beats the best text token's: compared on the logits
        # (log_softmax would subtract the same log-normaliser from both sides)
        fill_rows(text, stamps.logsumexp(dim=-1) > text.amax(dim=-1))


class LogitRules:
    """The full rule set of one decode (one place for Whisper's logit processing). ``begin``: the first timestamp
    token (what a :class:`RuleState` counts as a timestamp)."""

    def __init__(self, rules: Sequence[LogitRule], begin: int | None = None):
        self.rules = list(rules)
        self.begin = begin if begin is not None else next(
            (r.begin for r in self.rules if isinstance(r, TimestampRules)), torch.iinfo(torch.long).max)

    @property
    def key(self) -> tuple:
        """What the rules do, as a value (two rule sets with one key edit logits alike)."""
        return self.begin, tuple((type(r).__name__, tuple(getattr(r, "ids", ()))) for r in self.rules)

    @classmethod
    def whisper(cls, vocab: WhisperVocab, timestamps: bool) -> "LogitRules":
        begin = vocab.suppress_begin or (vocab.eot,)
        rules: list[LogitRule] = [SuppressAtBegin(begin), SuppressTokens(vocab.suppress)]
        if timestamps:
            rules.append(TimestampRules(vocab))
        return cls(rules, vocab.timestamp_begin)

    def state(self, sampled: Sequence[Sequence[int]], device: torch.device | str = "cpu") -> RuleState:
        return RuleState.of(sampled, self.begin, device)

    def __call__(self, logits: torch.Tensor, state: RuleState | Sequence[Sequence[int]],
                 cols: Columns = FULL) -> torch.Tensor:
        """Apply every rule to ``logits`` [N, columns] (float32, edited in place) and return it. ``state``: the rows'
        :class:`RuleState` (N rows in all), or their histories as lists of tokens."""
        if not isinstance(state, RuleState):
            state = self.state(state, logits.device)
        for rule in self.rules:
            rule.apply(logits, state, cols)
        return logits
