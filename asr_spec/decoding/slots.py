"""A decode's state on the device, one row per slot, the live rows first: what both ways of running a pass read and
write (passes.py). The eager loop keeps one :class:`Slots` per decode; a static decode's arena keeps one per shape,
at fixed addresses, and reuses it (static.py).

Rows that leave are replaced by the last live rows, moved in place (only those move); rows that join are written into
the slots after the live ones (``put``). Views of the first ``b`` slots (``first``) are what a pass over ``b`` rows
reads and writes: the same memory.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..models.kv_decoder import KVCache
from .logits import RuleState

RULE_FIELDS = 4  # RuleState's tensors: count, last, penult, stamp


def move_rows(tensors: list[torch.Tensor], rows: list[int]) -> None:
    """Rows ``rows`` of every tensor become its rows 0, 1, ..., in place; only rows whose place changes are copied."""
    dst = [j for j, i in enumerate(rows) if i != j]
    if not dst:
        return
    at = tensors[0].device
    d, s = torch.tensor(dst, device=at), torch.tensor([rows[j] for j in dst], device=at)
    for t in tensors:
        t.index_copy_(0, d, t.index_select(0, s))


@dataclass
class Slots:
    """``seq`` [R, capacity] each row's tokens (prompt, then what it sampled; past its length, stale); ``n`` [R] its
    length; ``rules`` Whisper's rule state of what it sampled; ``sample_len`` [R] the most tokens it may sample; the
    target's and the draft's caches (``draft`` None: a decode without one)."""

    seq: torch.Tensor
    n: torch.Tensor
    rules: list[torch.Tensor]  # RuleState's fields, each [R]
    sample_len: torch.Tensor
    target: KVCache
    draft: KVCache | None = None

    @classmethod
    def empty(cls, rows: int, capacity: int, target: KVCache, draft: KVCache | None) -> Slots:
        dev = target.cross_k[0].device
        return cls(torch.zeros(rows, capacity, dtype=torch.long, device=dev),
                   torch.full((rows,), 2, dtype=torch.long, device=dev),
                   [torch.zeros(rows, dtype=torch.long, device=dev) for _ in range(RULE_FIELDS)],
                   torch.zeros(rows, dtype=torch.long, device=dev), target, draft)

    @property
    def size(self) -> int:
        return self.seq.shape[0]

    def first(self, b: int) -> Slots:
        """The first ``b`` slots, as views (a pass over b rows)."""
        return Slots(self.seq[:b], self.n[:b], [t[:b] for t in self.rules], self.sample_len[:b],
                     self.target.rows(b), None if self.draft is None else self.draft.rows(b))

    def rule_state(self) -> RuleState:
        return RuleState(*self.rules)

    def set_rules(self, state: RuleState, live: torch.Tensor | None = None) -> None:
        """Write ``state`` into the rule state in place (``live``: only the rows where it is True)."""
        for mine, theirs in zip(self.rules, (state.count, state.last, state.penult, state.stamp)):
            mine.copy_(theirs if live is None else torch.where(live, theirs, mine))

    def tensors(self) -> list[torch.Tensor]:
        """Every per-slot tensor (compaction moves them all)."""
        caches = [self.target] + ([self.draft] if self.draft is not None else [])
        kv = [t for c in caches for t in c.tensors()]
        mask = [c.static_mask for c in caches if c.static_mask is not None]
        return kv + mask + [self.seq, self.n, self.sample_len, *self.rules]

    def compact(self, rows: list[int]) -> None:
        """Only the slots ``rows`` stay, moved in place to the first slots (only those whose slot changes)."""
        move_rows(self.tensors(), rows)
        for cache in (self.target, self.draft):
            if cache is not None and cache.cross_lengths is not None:
                cache.cross_lengths[:len(rows)] = [cache.cross_lengths[i] for i in rows]
                cache.__dict__.pop("cross_groups", None)
                cache.__dict__.pop("cross_mask", None)

    def put(self, at: int, other: Slots, b: int) -> None:
        """``other``'s first ``b`` rows written into the slots ``at``.. (rows joining, or a decode's rows claiming an
        arena): tokens, lengths, rule state, budgets, and each cache's rows (a cache may hold a shorter memory:
        ``KVCache.put``)."""
        rows = slice(at, at + b)
        self.seq[rows, :other.seq.shape[1]].copy_(other.seq[:b])
        self.n[rows].copy_(other.n[:b])
        self.sample_len[rows].copy_(other.sample_len[:b])
        for mine, theirs in zip(self.rules, other.rules):
            mine[rows].copy_(theirs[:b])
        self.target.put(at, other.target.rows(b))
        if self.draft is not None and other.draft is not None:
            self.draft.put(at, other.draft.rows(b))
