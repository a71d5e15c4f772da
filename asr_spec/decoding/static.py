"""A static decode: the decode's state at fixed addresses (an arena per decoder pair), each pass one CUDA graph.

A small decoder's pass on a GPU is bound by the host launching its hundreds of kernels, not by the kernels (H200:
a whisper-base target step 4.25 ms eager, 1.31 ms replayed as a graph; H100: the loop's own work 4.3 ms a pass). A
graph replays its kernels with the addresses and shapes it was captured with, so here everything a pass touches
lives in an :class:`Arena` made once per (target, draft, K, rules, memory length) and kept for later decodes:

- **slots**: the target's and the draft's self- and cross-attention caches, the tokens, lengths, rule states and
  room of ``slots`` rows. A decode's rows claim slots 0..B-1; rows that finish leave and the last live rows move
  into their slots (in place), so the live rows are always the first slots; rows joining take the slots after them;
- **buckets**: a pass over m live rows runs the bucket of the next power of two (slots beyond m are idle: their
  length does not move, their writes land in stale positions), one graph per bucket, captured on first use;
- **the whole pass on the device**: the draft's K steps (its catch-up is always the last two tokens, re-feeding a
  cached one when only one is new), Whisper's rules and the greedy choice after each, the target's verify pass over
  K + 1 positions, acceptance and each row's advance, written in place; the host reads one row per slot.

Every decoder call has the shapes of the eager loop's exact target (all K + 1 positions, the whole self-attention
cache masked), so a row's bits are the eager loop's: the same tokens (tests/test_static.py). Decodes that ask for it
(``DecodeOptions.static``: whole windows of files and uploads) and are greedy without hints, recorded heads or ragged
target memories take it, one at a time per arena (a decode finding it busy runs eagerly); K is fixed (the adaptive chooser and the draft's early stop
change speed only, and would read the host inside a pass). On a CPU the same passes run without graphs (the tests).
``ASR_SPEC_STATIC``: ``auto`` (default: on CUDA), ``on`` (any device), ``off``.
"""
from __future__ import annotations

import os
import threading
import weakref
from typing import Callable

import torch

from ..models.kv_decoder import CrossKV, KVCache, StaticDecoder
from ..models.pair import Pair
from .joining import move_rows
from .judging import advance, host_row, judge
from .logits import RuleState
from .rows import DecodeOptions, Decoders, RowRequest
from .speculative import DecodingTask, decode_capacity

_ARENAS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # target decoder -> {key: Arena}
_LOOKUP = threading.Lock()


def bucket(m: int) -> int:
    """The batch size a pass over m rows runs at: the next power of two."""
    return 1 << (m - 1).bit_length()


def wanted(device: torch.device) -> bool:
    """Whether decodes on ``device`` take the static path when they can (``ASR_SPEC_STATIC``)."""
    mode = os.environ.get("ASR_SPEC_STATIC", "auto")
    if mode not in ("auto", "on", "off"):
        raise ValueError(f"ASR_SPEC_STATIC must be auto, on or off, not {mode!r}")
    return mode == "on" or (mode == "auto" and device.type == "cuda")


def eligible(decoders: Decoders, memories: Pair[torch.Tensor], requests: list[RowRequest], o: DecodeOptions) -> bool:
    """Whether this decode can be static: asked to (``DecodeOptions.static``), greedy, no hints, no recorded heads,
    one memory length for the target."""
    return (o.static and wanted(decoders.target.device) and o.sampler.greedy and not o.attention_heads
            and decoders.clock is None
            and all(not r.hint and (r.memory_length in (None, memories.target.shape[1])) for r in requests))


def capture(work: Callable[[], object], warm_ups: int = 2) -> torch.cuda.CUDAGraph:
    """``work`` (static shapes, inputs and outputs at fixed addresses) captured as a CUDA graph, after ``warm_ups``
    runs on a side stream (which really run: ``work`` must tolerate them)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(warm_ups):
            work()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, capture_error_mode="thread_local"):  # other threads (streams) may launch meanwhile
        work()
    return graph


class Arena:
    """A decoder pair's fixed-address decode state for up to ``slots`` rows, and its pass per bucket (a CUDA graph
    on CUDA)."""

    def __init__(self, target: StaticDecoder, draft: StaticDecoder | None, k: int, o: DecodeOptions, slots: int,
                 memories: Pair[torch.Tensor], capacity: int):
        dev = target.device
        self.target, self.draft, self.k, self.o, self.slots = target, draft, k, o, slots
        self.max_pos = target.max_positions
        blank = lambda m: torch.zeros(slots, *m.shape[1:], dtype=m.dtype, device=m.device)  # noqa: E731
        self.t = target.new_cache(blank(memories.target), capacity)
        self.d: KVCache | None = None
        if draft is not None:
            self.d = draft.new_cache(blank(memories.draft), capacity)
            self.d.static_mask = torch.ones(slots, 1, 1, memories.draft.shape[1], dtype=torch.bool, device=dev)
        self.seq = torch.zeros(slots, capacity, dtype=torch.long, device=dev)
        self.n = torch.full((slots,), 2, dtype=torch.long, device=dev)
        self.state = [torch.zeros(slots, dtype=torch.long, device=dev) for _ in range(4)]  # RuleState's fields
        self.sample_len = torch.zeros(slots, dtype=torch.long, device=dev)
        self.m = torch.zeros((), dtype=torch.long, device=dev)  # live rows of the pass (the first slots)
        self.out = torch.zeros(slots, 3 + 2 * (k + 1) + 1, dtype=torch.float64, device=dev)
        self.sot_at = torch.zeros(slots, 1, dtype=torch.long, device=dev)  # where each prompt's no-speech is read
        self.no_speech = torch.zeros(slots, dtype=torch.float32, device=dev)
        self.graphs: dict[tuple[int, ...], torch.cuda.CUDAGraph] = {}  # (bucket,): a pass; (bucket, width): a prefill
        self.lock = threading.Lock()  # held by the one decode using the arena

    def tensors(self) -> list[torch.Tensor]:
        """Every per-slot tensor (compaction moves them all)."""
        caches = [self.t] + ([self.d] if self.d is not None else [])
        kv = [t for c in caches for t in c.tensors()]
        mask = [self.d.static_mask] if self.d is not None else []
        return kv + mask + [self.seq, self.n, self.sample_len, *self.state]

    def claim(self, task: DecodingTask, at: int = 0) -> None:
        """Slots at..at+B-1 take a decode's B rows (a new decode's, at 0; rows joining one, after its live rows): the
        target's cross-attention (computed by the task), the draft's (computed here from the task's draft memory,
        each row masked to its own length), tokens, lengths, rules' state."""
        rows, c, memory = slice(at, at + len(task.live)), task.t_cache, task.d_memory
        for mine, theirs in zip((*self.t.cross_k, *self.t.cross_v), (*c.cross_k, *c.cross_v)):
            mine[rows].copy_(theirs)
        if self.d is not None:
            cross = self.draft.cross_kv(memory)
            for mine, theirs in zip((*self.d.cross_k, *self.d.cross_v), (*cross.keys, *cross.values)):
                mine[rows, :, :theirs.shape[2]].copy_(theirs)
            s = self.d.static_mask.shape[-1]
            lengths = torch.tensor(task.d_lengths or [memory.shape[1]] * len(task.live), device=self.seq.device)
            self.d.static_mask[rows] = (torch.arange(s, device=self.seq.device) < lengths[:, None])[:, None, None, :]
        self.seq[rows].copy_(task.seq)
        self.n[rows].copy_(task.n)
        self.sample_len[rows].copy_(task.sample_len)
        for mine, theirs in zip(self.state, (task.state.count, task.state.last, task.state.penult, task.state.stamp)):
            mine[rows].copy_(theirs)

    def compact(self, rows: list[int]) -> None:
        """Only the rows in slots ``rows`` stay, moved in place to the first slots (only those whose slot changes)."""
        move_rows(self.tensors(), rows)

    def rule_state(self, b: int) -> RuleState:
        return RuleState(*(t[:b] for t in self.state))

    def _pass(self, b: int) -> None:
        """One pass over the first ``b`` slots, all on the device (see the module's docstring)."""
        o, k, steps = self.o, self.k, torch.arange(self.k + 2, device=self.seq.device)
        seq, n, state = self.seq[:b], self.n[:b], self.rule_state(b)
        drafts = seq.new_empty(b, 0)
        if k:
            fpos = (n[:, None] - 2 + steps[:2]).clamp(min=0)
            feed, at, d_cache, cols = seq.gather(1, fpos), fpos.new_full((b, 1), 1), self.d.rows(b), self.draft.columns
            s, chosen = state, []
            for j in range(k):
                logits = self.draft(d_cache, feed, fpos, at, shortlist=True, static=True)[:, 0]
                c = o.rules(logits.float(), s, cols).argmax(dim=-1)
                x = c if cols.ids is None else cols.ids[c]
                chosen.append(x)
                s = s.push(x, o.rules.begin)
                feed, fpos, at = x[:, None], (n + j)[:, None], at.new_zeros(b, 1)
            drafts = torch.stack(chosen, dim=1)
        feed = torch.cat([seq.gather(1, (n - 1)[:, None]), drafts], dim=1)
        logits = self.target(self.t.rows(b), feed, (n - 1)[:, None] + steps[:k + 1])
        no_speech = torch.softmax(logits[:, 0], dim=-1)[:, o.no_speech]  # a prompt ending with <|sot|>: its first pass
        accepted, emitted, token_lp = judge(logits, drafts, state, o)
        live = torch.arange(b, device=n.device) < self.m
        cut, ended, new, n_new = advance(seq, n, state, self.sample_len[:b], self.max_pos, accepted, emitted, o)
        n.copy_(torch.where(live, n_new, n))  # idle slots stay where they are
        for mine, theirs in zip(self.state, (new.count, new.last, new.penult, new.stamp)):
            mine[:b].copy_(torch.where(live, theirs, mine[:b]))
        self.out[:b].copy_(torch.cat([host_row(accepted, cut, ended, emitted, token_lp), no_speech[:, None].double()], 1))

    def _prefill(self, rows: slice, w: int) -> None:
        """Both decoders over the first ``w`` tokens of the slots ``rows``; the no-speech probability at each row's
        ``sot_at``. Positions past a row's prompt get stale entries, which its passes overwrite before reading."""
        pos = torch.arange(w, device=self.seq.device).expand(rows.stop - rows.start, w)
        first = self.target(self.t.rows(rows), self.seq[rows, :w], pos, self.sot_at[rows])
        self.no_speech[rows].copy_(torch.softmax(first[:, 0], dim=-1)[:, self.o.no_speech])
        if self.d is not None:
            self.draft(self.d.rows(rows), self.seq[rows, :w], pos, pos[:, :1], shortlist=True, static=True)

    def prefill(self, m: int, width: int, sot_at: list[int], at: int = 0) -> list[float]:
        """Prefill the prompts of the m rows from slot ``at`` (their first ``width`` tokens; a bucket of a power of
        two, at least EXACT_QUERIES, wide: an exact target gives a position the same bits in a pass of any width).
        Returns each row's no-speech probability at its ``sot_at``. A new decode's rows (at 0) prefill as a graph per
        bucket; rows joining a decode run their prefill without one (once per row: not worth a graph per place)."""
        w = min(bucket(max(width, 4)), self.max_pos)
        rows = slice(at, at + m)
        if at:
            self.sot_at[rows, 0] = torch.tensor(sot_at, device=self.seq.device)
            self._prefill(rows, w)
            return self.no_speech[rows].tolist()
        b = min(bucket(m), self.slots)
        self.sot_at.zero_()  # idle slots too: an earlier decode's longer prompts left theirs past this width
        self.sot_at[:m, 0] = torch.tensor(sot_at, device=self.seq.device)
        self._run((b, w), lambda: self._prefill(slice(0, b), w))
        return self.no_speech[:m].tolist()

    def run_pass(self, m: int) -> list[list[float]]:
        """One pass over the m live rows (the first slots): the host's one read, a row per live row."""
        b = min(bucket(m), self.slots)
        self.m.fill_(0)  # a pass captured now is captured with no live row: the live rows' state does not move
        self._run((b,), lambda: self._pass(b))
        self.m.fill_(m)
        if self.seq.is_cuda:
            self.graphs[(b,)].replay()
        else:
            self._pass(b)
        return self.out[:m].tolist()

    def _run(self, key: tuple[int, ...], work) -> None:
        """On CUDA: capture ``work`` as the graph ``key`` if it is new (after two warm-up runs on a side stream), and
        replay prefills; on a CPU: run prefills. (A pass captured with no live row changes nothing; a prefill is
        idempotent: its warm-up runs write what its replay writes.)"""
        if not self.seq.is_cuda:
            if len(key) == 2:
                work()
            return
        if key not in self.graphs:
            self.graphs[key] = capture(work)
        if len(key) == 2:
            self.graphs[key].replay()


def arena_for(decoders: Decoders, k: int, o: DecodeOptions, b: int, memories: Pair[torch.Tensor],
              capacity: int) -> Arena:
    """The arena of this decoder pair, K, rules and memory lengths with room for ``b`` rows (made, or grown, here)."""
    draft = decoders.draft if k else None
    shapes = (memories.target.shape[1], None if draft is None else memories.draft.shape[1])
    key = (id(draft), k, o.rules.key, o.eot, o.no_speech, shapes, capacity)
    with _LOOKUP:
        arenas = _ARENAS.setdefault(decoders.target, {})
        if key not in arenas or arenas[key].slots < b:
            arenas.pop(key, None)  # its graphs and buffers go (once no decode holds them) before a bigger one is made
            arenas[key] = Arena(decoders.target, draft, k, o, bucket(b), memories, capacity)
        return arenas[key]


class StaticDecodingTask(DecodingTask):
    """A :class:`DecodingTask` whose passes run in an :class:`Arena` (see the module's docstring)."""

    def __init__(self, decoders: Decoders, memories: Pair[torch.Tensor], requests: list[RowRequest],
                 options: DecodeOptions, cross: Pair[CrossKV | None] = Pair(None), arena: Arena | None = None):
        super().__init__(decoders, memories, requests, options, cross)
        b = len(requests)
        self.arena = arena or arena_for(decoders, self.k, options, b, memories, self.capacity)
        self.arena.claim(self)
        self.point(b)
        self.owns_lock = False  # set by ``open_decode``, which took the arena's lock for it

    def point(self, b: int) -> None:
        """The task's device state: the arena's first ``b`` slots."""
        a = self.arena
        self.seq, self.n, self.sample_len, self.state = a.seq[:b], a.n[:b], a.sample_len[:b], a.rule_state(b)
        self.t_cache = a.t.rows(b)
        self.d_cache = a.d.rows(b) if a.d is not None else None

    def keep(self, rows: list[int]) -> None:
        self.arena.compact(rows)
        self.point(len(rows))

    def prefill(self, task: DecodingTask | None = None, at: int = 0) -> None:
        """Both decoders' prefill of this decode's rows, or of ``task``'s rows placed at slot ``at`` (rows joining):
        the draft's passes catch up on the last two tokens only."""
        task = task or self
        width = max(task.n_host) - 1
        if width:
            task.no_speech_prob = self.arena.prefill(len(task.live), width,
                                                     [min(r.sot_index, width - 1) for r in task.requests], at)

    def can_join(self, memories: Pair[torch.Tensor], requests: list[RowRequest]) -> bool:
        """Rows may join while the arena has free slots, if they could have started a static decode in it."""
        a = self.arena
        return (len(self.live) + len(requests) <= a.slots and not any(r.hint for r in requests)
                and memories.target.shape[1] == a.t.cross_k[0].shape[2] and all(
                    r.memory_length in (None, memories.target.shape[1]) for r in requests)
                and (a.d is None or memories.draft.shape[1] == a.d.cross_k[0].shape[2]))

    def place(self, new: DecodingTask) -> None:
        """``new``'s rows take the free slots after the live rows, and are prefilled there."""
        at = len(self.live)
        self.arena.claim(new, at)
        self.prefill(new, at)
        self.point(at + len(new.live))

    def one_pass(self) -> None:
        read = self.arena.run_pass(len(self.live))
        if self.sot_pending:  # the first pass of prompts ending with <|sot|>
            for i, r in enumerate(self.live):
                if r in self.sot_pending:
                    self.no_speech_prob[r] = read[i][-1]
            self.sot_pending = []
        self.book(read, [False] * len(self.live), self.k, self.k + 1)

    def close(self) -> None:
        """Gives the arena back to other decodes (its slots stay as they are: the next decode claims them)."""
        if self.owns_lock:
            self.owns_lock = False
            self.arena.lock.release()


@torch.inference_mode()
def open_decode(decoders: Decoders, memories: Pair[torch.Tensor], requests: list[RowRequest], options: DecodeOptions,
                cross: Pair[CrossKV | None] = Pair(None), room: int = 0) -> DecodingTask:
    """A decode of these rows, static where it can be and the device wants it (``ASR_SPEC_STATIC``), with room for
    ``room`` rows in all where rows are to join it. An arena serves one decode at a time, until its ``close``: a
    decode that finds it busy (another thread's) runs the eager loop."""
    if eligible(decoders, memories, requests, options):
        k = options.k if decoders.draft is not None else 0
        arena = arena_for(decoders, k, options, max(len(requests), room), memories,
                          decode_capacity(decoders.target.max_positions, k))
        if arena.lock.acquire(blocking=False):
            try:
                task = StaticDecodingTask(decoders, memories, requests, options, cross, arena)
                task.owns_lock = True
                return task
            except BaseException:
                arena.lock.release()
                raise
    return DecodingTask(decoders, memories, requests, options, cross, room)


def decode_rows(decoders: Decoders, memories: Pair[torch.Tensor], requests: list[RowRequest], options: DecodeOptions,
                cross: Pair[CrossKV | None] = Pair(None)) -> list:
    """Decode these rows to the end (see ``open_decode``)."""
    task = open_decode(decoders, memories, requests, options, cross)
    try:
        return task.run()
    finally:
        task.close()
