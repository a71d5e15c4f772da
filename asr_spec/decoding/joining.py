"""Rows joining a running decode between passes (continuous batching): a finished row's place is taken at once
instead of at the next decode. The joining rows are set up as a decode of their own (``DecodingTask.fresh``), their
prompts prefilled on their own, and then their device state is put after the live rows' (``place``: the eager loop
concatenates; a static decode copies them into free slots of its arena) and their host state appended (``adopt``).
A row's bits do not depend on the rows beside it, so a row that joins gets the result it gets decoded alone."""
from __future__ import annotations

import torch

from ..models.pair import Pair
from .rows import RowRequest


class JoinRows:
    """What :class:`~asr_spec.decoding.speculative.DecodingTask` does to let rows join it."""

    def can_join(self, memories: Pair[torch.Tensor], requests: list[RowRequest]) -> bool:
        """Whether these rows may join this decode now (see ``join``)."""
        return not self.o.attention_heads and self.d_cross is None

    @torch.inference_mode()
    def join(self, memories: Pair[torch.Tensor], requests: list[RowRequest]) -> range:
        """Rows joining the decode between passes (continuous batching: a finished row's place taken at once): their
        prompts are prefilled on their own and they run from the next pass. A row's bits do not depend on the rows
        beside it, so its result is the one it gets decoded alone. Returns their request indices."""
        if not self.can_join(memories, requests):
            raise ValueError("rows can join only a decode without recorded heads or precomputed draft cross-attention")
        new, first = self.fresh(memories, requests), len(self.live)
        lengths = ((self.lengths or [self.t_cache.cross_k[0].shape[2]] * len(self.requests))
                   + (new.lengths or [memories.target.shape[1]] * len(requests)))  # per request, before the caches join
        self.place(new)
        ids = self.adopt(new)
        self.lengths = lengths
        self.finish([(i, False) for i in range(first, len(self.live)) if self.room(i) <= 0])
        return ids

    def place(self, new: "JoinRows") -> None:
        """The device state of ``new``'s rows, prefilled, after this decode's."""
        new.prefill()
        self.t_cache = self.t_cache.cat(new.t_cache)
        self.seq, self.n = torch.cat([self.seq, new.seq]), torch.cat([self.n, new.n])
        self.sample_len, self.state = torch.cat([self.sample_len, new.sample_len]), self.state.cat(new.state)
        if self.draft is not None:  # the new rows' draft cache starts empty: their first draft pass catches up
            if self.d_cache is None:
                self.build_draft_cache()
            new.build_draft_cache()
            self.d_cache = self.d_cache.cat(new.d_cache)

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
        self.cross_parts += [(at + first, cross) for first, cross in new.cross_parts]
        return range(at, len(self.requests))
