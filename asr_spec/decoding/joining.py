"""Rows joining a running decode between passes (continuous batching): a finished row's place is taken at once
instead of at the next decode. A decode's caches hold ``room`` rows, the live rows first: rows that leave are
replaced by the last live rows (only those move), rows that join are written after the live rows — no pass copies
the other rows' caches. The joining rows are set up as a decode of their own (``DecodingTask.fresh``), their prompts
prefilled on their own, then their device state put after the live rows' (``place``: the eager loop writes their
caches into its free rows; a static decode copies them into free slots of its arena) and their host state appended
(``adopt``). A row's bits do not depend on the rows beside it, so a row that joins gets the result it gets alone."""
from __future__ import annotations

import torch

from ..models.pair import Pair
from .rows import RowRequest


def move_rows(tensors: list[torch.Tensor], rows: list[int]) -> None:
    """Rows ``rows`` of every tensor become its rows 0, 1, ..., in place; only rows whose place changes are copied."""
    dst = [j for j, i in enumerate(rows) if i != j]
    if not dst:
        return
    at = tensors[0].device
    d, s = torch.tensor(dst, device=at), torch.tensor([rows[j] for j in dst], device=at)
    for t in tensors:
        t.index_copy_(0, d, t.index_select(0, s))


class JoinRows:
    """What :class:`~asr_spec.decoding.speculative.DecodingTask` does to let rows join it."""

    def can_join(self, memories: Pair[torch.Tensor], requests: list[RowRequest]) -> bool:
        """Whether these rows may join this decode now: its caches have room for them."""
        return not self.o.attention_heads and self.d_cross is None and len(self.live) + len(requests) <= self.room_rows

    @torch.inference_mode()
    def join(self, memories: Pair[torch.Tensor], requests: list[RowRequest]) -> range:
        """Rows joining the decode between passes: their prompts are prefilled on their own and they run from the
        next pass. Returns their request indices."""
        if not self.can_join(memories, requests):
            raise ValueError("these rows cannot join this decode (no room, or it records heads)")
        new, first = self.fresh(memories, requests), len(self.live)
        self.place(new)
        ids = self.adopt(new)
        self.finish([(i, False) for i in range(first, len(self.live)) if self.room(i) <= 0])
        return ids

    def place(self, new: "JoinRows") -> None:
        """The device state of ``new``'s rows, prefilled, after this decode's live rows."""
        new.prefill()
        m, j = len(self.live), len(new.live)
        self.t_room = self.t_room.widened(new.t_cache.cross_k[0].shape[2])  # (a longer memory: once, not per pass)
        self.t_room.put(m, new.t_cache)
        self.t_cache = self.t_room.rows(m + j)
        self.seq, self.n = torch.cat([self.seq, new.seq]), torch.cat([self.n, new.n])
        self.sample_len, self.state = torch.cat([self.sample_len, new.sample_len]), self.state.cat(new.state)
        if self.draft is not None:  # the new rows' draft cache starts empty: their first draft pass catches up
            if self.d_room is None:
                self.build_draft_cache()
            new.build_draft_cache()
            self.d_room = self.d_room.widened(new.d_cache.cross_k[0].shape[2])
            self.d_room.put(m, new.d_cache)
            self.d_cache = self.d_room.rows(m + j)

    def adopt(self, new: "JoinRows") -> range:
        """The host's part of ``new``'s rows, after this decode's; returns their request indices."""
        at = len(self.requests)
        for name in ("requests", "prompts", "hints", "sampled", "generated", "following", "sum_logprob",
                     "no_speech_prob", "stats", "results", "logprobs"):
            getattr(self, name).extend(getattr(new, name))
        self.recorder.kept.extend(new.recorder.kept)
        self.live += [at + r for r in new.live]
        self.n_host += new.n_host
        self.dn += new.dn
        self.sot_pending += [at + r for r in new.sot_pending]
        return range(at, len(self.requests))
