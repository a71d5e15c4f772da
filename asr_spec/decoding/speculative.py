"""The draft/verify loop: speculative decoding of a batch of Whisper prompts, pass by pass.

Per pass, each row: the draft proposes up to K tokens, the target scores all K+1 positions in one forward pass,
the sampler accepts the drafts that match the target's own choice (greedy, or Gumbel-max with noise keyed by
position: see ``sampling``), and the row advances by accepted + 1 tokens. Rows advance by different amounts (ragged)
and leave the batch when they finish. Without a draft (or K = 0) the same loop is plain target decoding.

:class:`DecodingTask` owns one decode: the host's part — one :class:`Row` per request, what the pass is asked
(hints, the adaptive draft length, the sampler's noise, the draft's early stop) and what its one read says — around
the pass's device work, which lives in passes.py and runs on the decode's :class:`~asr_spec.decoding.slots.Slots`.
The static decode (static.py) is this task with its slots in an arena and each pass replayed as a CUDA graph.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..models.kv_decoder import CrossKV, KVCache, length_mask
from ..models.pair import Pair
from . import passes
from .budget import end_pass, phase, start_pass
from .costs import CostModel, wall_clock
from .joining import JoinRows
from .passes import PassRead
from .recording import HeadRecorder
from .rows import DecodeOptions, Decoders, RowRequest, RowResult, RowStats
from .slots import Slots

HINT_K = 8  # most hint tokens verified per pass


def decode_capacity(max_pos: int, k: int) -> int:
    """Positions a decode's caches hold: the decoder's, and a pass's widest overrun (K drafts or HINT_K hints)."""
    return max_pos + max(k, HINT_K) + 2


@dataclass
class Row:
    """One request's host state in a decode (its device state is its slot in ``Slots``)."""

    index: int  # its place among the decode's requests
    request: RowRequest
    length: int  # tokens its slot holds (prompt + sampled): the host's copy of ``Slots.n``
    sampled: list[int]  # the prefix, then the tokens sampled after it
    hint: list[int]  # a guess of its continuation, ending with end-of-text ([]: none)
    sot_pending: bool  # its prompt ends with <|startoftranscript|>: its no-speech probability comes with its 1st pass
    drafted_to: int = 0  # tokens the draft's cache holds
    generated: int = 0  # tokens sampled after the prefix
    following: bool = False  # its tokens so far are its hint's
    sum_logprob: float = 0.0
    no_speech_prob: float = 0.0
    stats: RowStats = field(default_factory=RowStats)
    logprobs: list[float] = field(default_factory=list)
    result: RowResult | None = None

    def tokens_left(self, max_pos: int) -> int:
        """Tokens it may still add: its sample_len counts the prefix, the decoder has ``max_pos`` positions."""
        return min(self.request.sample_len - len(self.sampled), max_pos + 1 - self.length)

    def hinted(self) -> bool:
        """Whether it proposes its hint's next tokens this pass (it still follows the hint, which has more)."""
        return self.following and len(self.hint) > self.generated


class DecodingTask(JoinRows):
    """One decode of a batch: ``rows`` (one per request, in request order), ``live`` (those still decoding, in the
    order of their slots), ``slots`` (the device state, the live rows first)."""

    def __init__(self, decoders: Decoders, memories: Pair[torch.Tensor], requests: list[RowRequest],
                 options: DecodeOptions, cross: Pair[CrossKV | None] = Pair(None), room: int = 0,
                 slots: Slots | None = None):
        o = self.o = options
        self.decoders, self.target = decoders, decoders.target
        self.k = decoders.k(o)
        self.draft = decoders.draft if self.k > 0 else None
        self.costs = decoders.costs if self.draft is not None else None
        self.dev = self.target.device
        self.max_pos = self.target.max_positions
        prompts = [r.prompt + r.prefix for r in requests]
        if (longest := max(map(len, prompts))) > self.max_pos:
            raise ValueError(f"prompt + prefix of {longest} tokens exceeds the decoder's {self.max_pos} positions")
        b = len(requests)
        self.capacity = decode_capacity(self.max_pos, self.k)
        lengths = None
        if any(r.memory_length is not None for r in requests):
            lengths = [memories.target.shape[1] if r.memory_length is None else r.memory_length for r in requests]
        self.reserved = max(b, room)  # slots the decode holds: its rows, and rows that join after them
        self.rows = [Row(i, r, len(p), list(r.prefix), r.hint + [o.eot] if r.hint else [],
                         r.sot_index == len(p) - 1, following=bool(r.hint)) for i, (r, p) in enumerate(zip(requests, prompts))]
        self.live = list(self.rows)
        # the draft's memory: each row's own length, or less where its ``draft_memory_length`` says so
        self.d_memory, self.d_lengths = memories.draft, lengths
        if memories.draft is not None and any(r.draft_memory_length is not None for r in requests):
            full = lengths or [memories.draft.shape[1]] * b
            self.d_lengths = [n if r.draft_memory_length is None else max(1, min(n, r.draft_memory_length))
                              for r, n in zip(requests, full)]
            self.d_memory = memories.draft[:, :max(self.d_lengths)]
        self.d_cross = cross.draft
        if slots is None:  # the eager loop's own: the target's cache now, the draft's at its first pass
            t = self.target.new_cache(memories.target, self.capacity, lengths, cross.target)
            if o.static and lengths is not None:  # a padded decode: attended as a static one attends it
                t.static_mask = length_mask(lengths, t.cross_k[0].shape[2], self.dev)
            t = t.grown(self.reserved)
            slots = Slots.empty(self.reserved, self.capacity, t, None)
        self.slots = slots
        self._write_rows(prompts, longest)
        self.recorder = HeadRecorder(o.attention_heads, b)
        self.built = 0.0  # seconds of this pass spent building the draft's cache (once per decode)
        self.ended: list[int] = []  # requests finished since ``collect`` was last called

    def _write_rows(self, prompts: list[list[int]], longest: int) -> None:
        """The rows' prompts, lengths, rule states and budgets into their slots (0..B-1)."""
        b, s = len(prompts), self.slots
        s.seq[:b, :longest] = torch.tensor([p + [self.o.eot] * (longest - len(p)) for p in prompts], device=self.dev)
        s.n[:b] = torch.tensor([len(p) for p in prompts], device=self.dev)
        s.sample_len[:b] = torch.tensor([r.request.sample_len for r in self.rows], device=self.dev)
        s.first(b).set_rules(self.o.rules.state([r.request.prefix for r in self.rows], self.dev))

    @property
    def requests(self) -> list[RowRequest]:
        return [r.request for r in self.rows]

    def view(self) -> Slots:
        """The live rows' device state (the first slots)."""
        return self.slots.first(len(self.live))

    @torch.inference_mode()
    def run(self) -> list[RowResult]:
        """The whole decode: ``start``, then passes until every row has finished."""
        self.start()
        while self.live:
            self.step()
        return [r.result for r in self.rows if r.result is not None]

    @torch.inference_mode()
    def start(self) -> None:
        self.prefill()
        self.finish([(i, False) for i, r in enumerate(self.live) if r.tokens_left(self.max_pos) <= 0])

    @torch.inference_mode()
    def step(self) -> None:
        """One pass over the live rows (rows that finish in it: ``collect``)."""
        if self.live:
            self.one_pass()

    def one_pass(self) -> None:
        now = wall_clock(self.dev)
        started = now() if self.costs is not None else 0.0
        self.built = 0.0
        t0, m = start_pass(), len(self.live)
        costs = self.costs(m) if self.costs is not None else None
        proposals, noise, chosen, hinted = self.propose(costs)
        reads = self.verify(proposals, noise)
        tokens = self.book(reads, hinted, chosen or 0, proposals.shape[1])
        if costs is not None and chosen is not None and not any(hinted):  # a pass's cost, not the decode's setup
            costs.record(chosen, tokens, now() - started - self.built)
        end_pass(t0, m, round(tokens * m))

    def collect(self) -> list[tuple[int, RowResult]]:
        """The requests that finished since the last call and their results (which the decode then forgets: one
        that rows keep joining holds only its live rows' tensors)."""
        ended, self.ended = self.ended, []
        taken = [(i, self.rows[i].result) for i in ended]
        for i in ended:
            self.rows[i].result = None
        return taken

    def close(self) -> None:
        """The decode is over (a static decode gives its arena back)."""

    def fresh(self, memories: Pair[torch.Tensor], requests: list[RowRequest]) -> DecodingTask:
        """A decode of other rows with these decoders and options (rows to join this one)."""
        return DecodingTask(self.decoders, memories, requests, self.o)

    def prefill(self) -> None:
        """Everything but each prompt's last token (that one is fed with the first proposals). The no-speech
        probability is read at <|startoftranscript|>: here, or in the first pass when the prompt ends with it."""
        width = max(r.length for r in self.live) - 1
        if not width:
            return
        at = torch.tensor([min(r.request.sot_index, width - 1) for r in self.live], device=self.dev)[:, None]
        scores = self.recorder.scores()
        recorded = [range(len(r.request.prompt) - 1, r.length - 1) for r in self.live]  # each row's prefix
        start = min(min(w.start for w in recorded), width - 1)  # the prompts' queries before it are not recorded
        no_speech = passes.prefill(self.target, None, self.view(), width, at, self.o, fixed=False, scores=scores,
                                   scores_from=start)
        self.recorder.record(scores, [r.index for r in self.live], recorded, start)
        for r, p in zip(self.live, no_speech.tolist()):
            r.no_speech_prob = p

    def noise(self, step: int) -> torch.Tensor | None:
        """The sampler's noise for every live row's token ``step`` places after its current end."""
        keys = [r.request.key for r in self.live]
        return self.o.sampler.noise(keys, [r.length + step for r in self.live], self.target.vocab_size, self.dev)

    def propose(self, costs: CostModel | None) -> tuple[torch.Tensor, list[torch.Tensor | None], int | None, list[bool]]:
        """The pass's proposals [m, kk]: the rows' hints while every live row still follows its own, else up to
        K draft tokens (as many as ``costs`` measures to pay most), the rows that still follow their hint proposing
        its next tokens instead; the sampler's noise at each of the kk + 1 positions the target will choose; the
        draft length chosen (None: hints only); which rows propose their hint."""
        hinted = [r.hinted() for r in self.live]
        if all(hinted):
            width = min(HINT_K, max(len(r.hint) - r.generated for r in self.live))
            proposals = self.hint_tokens(width, hinted)[0]
            return proposals, [self.noise(j) for j in range(width + 1)], None, hinted
        want = self.k if costs is None else costs.choose(self.k)  # the draft length measured to pay most
        # a row's own hint is a better guess than the draft's (streaming: the last hypothesis): it is proposed instead
        forced = self.hint_tokens(want, hinted) if any(hinted) else None
        if want:
            proposals, noise = self.draft_tokens(want, forced)
        else:
            proposals, noise = torch.empty(len(self.live), 0, dtype=torch.long, device=self.dev), []
        return proposals, noise + [self.noise(proposals.shape[1])], want, hinted

    def hint_tokens(self, kk: int, hinted: list[bool]) -> tuple[torch.Tensor, torch.Tensor]:
        """The ``hinted`` live rows' next kk hint tokens [m, kk] (end-of-text after the hint), and which rows [m]."""
        eot = self.o.eot
        rows = [(r.hint[r.generated:r.generated + kk] + [eot] * kk)[:kk] if h else [eot] * kk
                for r, h in zip(self.live, hinted)]
        return (torch.tensor(rows, dtype=torch.long, device=self.dev).view(len(rows), kk),
                torch.tensor(hinted, device=self.dev))

    def draft_tokens(self, k: int, forced: tuple[torch.Tensor, torch.Tensor] | None = None
                     ) -> tuple[torch.Tensor, list[torch.Tensor | None]]:
        """Up to ``k`` draft tokens per live row (``passes.draft``; ``forced``: rows that propose their hint instead),
        the draft catching up first on every token its cache lacks; its first pass builds its cache (once per decode:
        not what a draft length costs)."""
        if self.slots.draft is None:
            now = wall_clock(self.dev)
            t0 = now()
            self.build_draft_cache()
            self.built = now() - t0
        catch_up = max(r.length - r.drafted_to for r in self.live)
        return passes.draft(self.draft, self.view(), k, self.o, catch_up, fixed=False, noise=self.noise,
                            stop=self._stop if self.o.stop_below > 0 else None, forced=forced)

    def _stop(self, belief: torch.Tensor) -> bool:
        """The draft stops proposing once it believes every live row's proposal less than ``stop_below``."""
        with phase("host"):
            return bool((belief < self.o.stop_below).all())

    def build_draft_cache(self) -> None:
        """The draft's caches of the live rows, empty (it catches up from position 0); its rows past them for rows
        that join."""
        memory, lengths = self.d_memory, self.d_lengths
        rows = torch.tensor([r.index for r in self.live], dtype=torch.long, device=memory.device)
        cross = None if self.d_cross is None else \
            self.d_cross.map(lambda t: t[:, :, :memory.shape[1]].index_select(0, rows))
        with phase("draft"):
            self.slots.draft = self.draft.new_cache(memory.index_select(0, rows), self.capacity,
                                                    [lengths[r.index] for r in self.live] if lengths else None,
                                                    cross).grown(self.slots.size)

    def verify(self, proposals: torch.Tensor, noise: list[torch.Tensor | None]) -> list[PassRead]:
        """The target's pass over the live rows' proposals (``passes.verify``) and the host's one read of it."""
        kk = proposals.shape[1]
        scores = self.recorder.scores()
        read = passes.verify(self.target, self.view(), proposals, self.o,
                             None if noise[0] is None else torch.stack(noise, 1), scores=scores)
        # rejected positions are recorded again when the pass after feeds them
        self.recorder.record(scores, [r.index for r in self.live], [range(r.length - 1, r.length + kk) for r in self.live],
                             None)
        with phase("host"):
            values = read.tolist()
        return [PassRead(v, kk + 1) for v in values]

    def book(self, reads: list[PassRead], hinted: list[bool], drafted: int, kk: int) -> float:
        """The host's part of a pass from its one read: each live row's tokens and statistics; rows that are done
        leave. ``hinted``: the rows that proposed their hint; ``drafted``: tokens the draft proposed this pass (its
        cache holds the rows' tokens up to their start); ``kk``: the proposals per row. Returns the tokens emitted
        per row."""
        done, total = [], 0
        for i, (r, read) in enumerate(zip(self.live, reads)):
            a, c = read.accepted, read.cut
            if c < 1:  # every pass gives a live row a token: a row that took none would never finish
                raise RuntimeError(f"a decode pass gave row {r.index} no token (its state on the device is not its own)")
            left = r.tokens_left(self.max_pos)
            st = r.stats
            st.target_passes += 1
            judged = min(a, c)
            if r.sot_pending:  # the first pass of a prompt ending with <|sot|>
                r.no_speech_prob, r.sot_pending = read.no_speech, False
            if hinted[i]:
                st.hint_accepted += judged
            else:
                st.drafted += kk
                st.accepted += judged
                st.accepted_at.append(judged)
                if a < kk and c == a + 1:
                    st.rejected += 1
            if drafted and kk:  # the draft fed the row's proposals (its hint's, where hinted) but the last
                r.drafted_to = r.length + min(a, kk - 1)
            r.sum_logprob += sum(read.logprobs)
            r.logprobs += read.logprobs
            r.length += c
            if r.following:
                r.following = r.hint[r.generated:r.generated + c] == read.tokens
            r.sampled.extend(read.tokens)
            r.generated += c
            total += c
            give_up = r.request.give_up
            if read.ended or c >= left or (give_up is not None and give_up(r.sampled, c)):
                done.append((i, read.ended))
        self.finish(done)
        return total / len(reads)

    def finish(self, done: list[tuple[int, bool]]) -> None:
        """Record the results of live rows ``done`` (index, ended with end-of-text) and drop them from the batch."""
        if not done:
            return
        for i, ended in done:
            r = self.live[i]
            self.ended.append(r.index)
            tokens = r.sampled[:-1] if ended else list(r.sampled)
            r.stats.tokens = len(tokens)
            r.result = RowResult(tokens, r.sum_logprob, r.no_speech_prob, r.stats, self._cross_of(i),
                                 self.recorder.result(r.index, len(r.request.prompt) - 1, len(tokens)),
                                 r.logprobs[:len(tokens) - len(r.request.prefix)])
        gone = {i for i, _ in done}
        k = len(self.live) - len(gone)
        keep = list(range(k))  # the rows after the live ones move into the places of those that leave
        for hole, row in zip([i for i in range(k) if i in gone], [i for i in range(k, len(self.live)) if i not in gone]):
            keep[hole] = row
        self.live = [self.live[i] for i in keep]
        if keep:
            self.keep(keep)

    def keep(self, rows: list[int]) -> None:
        """Only the live rows ``rows`` stay on the device, as its rows 0, 1, ... (moved in place; only the rows whose
        place changes)."""
        self.slots.compact(rows)

    def _cross_of(self, i: int) -> CrossKV | None:
        """Live row i's cross-attention keys and values (a copy: its slot is taken by others)."""
        if not self.o.keep_cross:
            return None
        t: KVCache = self.slots.target
        end = t.cross_lengths[i] if t.cross_lengths else self.live[i].request.memory_length or t.cross_k[0].shape[2]
        return CrossKV(t.cross_k, t.cross_v).map(lambda x: x[i:i + 1, :, :end].clone())

