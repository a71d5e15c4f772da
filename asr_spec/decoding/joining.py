"""Rows joining a running decode between passes (continuous batching): a finished row's place is taken at once
instead of at the next decode. A decode's slots hold ``reserved`` rows, the live rows first: rows that leave are
replaced by the last live rows (only those move), rows that join are written into the slots after the live rows — no
pass copies the other rows' state. The joining rows are set up as a decode of their own (``DecodingTask.fresh``),
their device state put after the live rows' and their prompts prefilled there (``place``: the eager loop prefills
them on their own first; a static decode prefills them in its arena) and their host rows appended (``adopt``). A
row's bits do not depend on the rows beside it, so a row that joins gets the result it gets alone."""
from __future__ import annotations

import torch

from ..models.pair import Pair
from .rows import RowRequest


class JoinRows:
    """What :class:`~asr_spec.decoding.speculative.DecodingTask` does to let rows join it."""

    def can_join(self, memories: Pair[torch.Tensor], requests: list[RowRequest]) -> bool:
        """Whether these rows may join this decode now: its slots have room for them (not a padded decode's: its
        rows attend under a kept mask)."""
        return not self.o.attention_heads and self.d_cross is None and self.slots.target.static_mask is None \
            and len(self.live) + len(requests) <= self.reserved

    @torch.inference_mode()
    def join(self, memories: Pair[torch.Tensor], requests: list[RowRequest]) -> range:
        """Rows joining the decode between passes: their prompts are prefilled and they run from the next pass.
        Returns their request indices."""
        if not self.can_join(memories, requests):
            raise ValueError("these rows cannot join this decode (no room, or it records heads)")
        new, first = self.fresh(memories, requests), len(self.live)
        self.place(new)
        ids = self.adopt(new)
        self.finish([(i, False) for i in range(first, len(self.live)) if self.live[i].tokens_left(self.max_pos) <= 0])
        return ids

    def place(self, new: "JoinRows") -> None:
        """The device state of ``new``'s rows, prefilled, after this decode's live rows."""
        new.prefill()
        m, j, s = len(self.live), len(new.live), self.slots
        s.target = s.target.widened(new.slots.target.cross_k[0].shape[2])  # a longer memory: once, not per pass
        if self.draft is not None:  # the new rows' draft cache starts empty: their first draft pass catches up
            if s.draft is None:
                self.build_draft_cache()
            new.build_draft_cache()
            s.draft = s.draft.widened(new.slots.draft.cross_k[0].shape[2])
        s.put(m, new.slots, j)

    def adopt(self, new: "JoinRows") -> range:
        """The host's part of ``new``'s rows, after this decode's; returns their request indices."""
        at = len(self.rows)
        for r in new.rows:
            r.index += at
        self.rows += new.rows
        self.live += new.live
        self.recorder.kept.extend(new.recorder.kept)
        return range(at, len(self.rows))
