"""A static decode: the decode's state at fixed addresses (an arena per decoder pair), each pass one CUDA graph.

A small decoder's pass on a GPU is bound by the host launching its hundreds of kernels, not by the kernels (H200:
a whisper-base target step 4.25 ms eager, 1.31 ms replayed as a graph; H100: the loop's own work 4.3 ms a pass). A
graph replays its kernels with the addresses and shapes it was captured with, so here everything a pass touches
lives in an :class:`Arena` made once per (target, draft, K, rules, memory length) and kept for later decodes:

- **slots** (:class:`~asr_spec.decoding.slots.Slots`): both decoders' caches, the tokens, lengths, rule states and
  budgets of ``slots`` rows. A decode's rows claim slots 0..B-1; rows that finish leave and the last live rows move
  into their slots (in place), so the live rows are always the first slots; rows joining take the slots after them;
- **buckets**: a pass over m live rows runs the bucket of the next power of two (slots beyond m are idle: their
  length does not move, their writes land in stale positions), one graph per bucket, captured on first use;
- **the pass**: the eager loop's own functions (passes.py: ``draft``, ``verify``, ``prefill``), called with a fixed
  draft length and a catch-up of the last two tokens (re-feeding a cached one when only one is new), so that no shape
  depends on the rows' positions; the host reads one row per slot.

Every decoder call has the shapes of the eager loop's exact target (all K + 1 positions, the whole self-attention
cache masked), so a row's bits are the eager loop's: the same tokens (tests/decoding/test_static.py). Decodes that ask for it
(``DecodeOptions.static``) and are greedy without recorded heads take it, one at a time per arena (a decode finding
it busy runs eagerly): whole windows of files and uploads, and a stream engine's steps — each stream's buffer padded
to one width and attended under its mask (``padded``: the target's mask too, in the arena as in the eager loop), its
hint proposed in the draft's place (the draft reads it). K is fixed (the adaptive chooser and the draft's early stop
change speed only, and would read the host inside a pass); a decode without a draft proposes no hints here (the
eager loop's hint-only passes change speed only). On a CPU the same passes run without graphs (the tests).
``ASR_SPEC_STATIC``: ``auto`` (default: on CUDA), ``on`` (any device), ``off``.
"""
from __future__ import annotations

import os
import threading
import weakref
from typing import Callable

import torch

from ..models.kv_decoder import CachedDecoder, CrossKV, length_mask
from ..models.pair import Pair
from . import budget, passes
from .passes import PassRead
from .rows import DecodeOptions, Decoders, RowRequest, RowResult
from .slots import Slots
from .speculative import DecodingTask, decode_capacity

_ARENAS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # target decoder -> {key: Arena}
_LOOKUP = threading.Lock()
_INSIDE = threading.local()  # ``.depth`` > 0 while this thread runs an arena's pass or prefill


def arenas(decoder) -> dict:
    """The arenas kept for a target decoder (key -> :class:`Arena`; empty when none)."""
    return _ARENAS.get(decoder, {})


def forget_arenas() -> None:
    """Drop every kept arena (the next static decode builds its own)."""
    _ARENAS.clear()
# what ``budget.counting`` tallies: an arena's pass or prefill (on CUDA one graph replay: eval's operation counts count
# one operation for each, and, on a CPU, none for the operations inside it: what a GPU would launch), and the decodes
# that asked to be static by how they ran (eager: sampling fallbacks, recorded heads, an arena busy with another
# thread's decode, or ``ASR_SPEC_STATIC`` off)
RUN, STATIC, EAGER = "arena runs", "static decodes", "eager decodes"
CATCH_UP = 2  # tokens the draft feeds before proposing in a static pass: at most two are new after any pass


def inside() -> bool:
    """Whether this thread is running an arena's pass or prefill."""
    return getattr(_INSIDE, "depth", 0) > 0


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
    """Whether this decode can be static: asked to (``DecodeOptions.static``), greedy, no recorded heads."""
    return o.static and wanted(decoders.target.device) and o.sampler.greedy and not o.attention_heads \
        and not budget.timed()


def padded(requests: list[RowRequest]) -> bool:
    """Whether a decode's rows give their memory lengths (a stream's buffers, padded): every row then attends the
    padded width under its mask (``DecodeOptions.static``)."""
    return any(r.memory_length is not None for r in requests)


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
    """A decoder pair's fixed-address decode state for up to ``size`` rows (:class:`Slots`), and its pass per bucket
    (a CUDA graph on CUDA)."""

    def __init__(self, target: CachedDecoder, draft: CachedDecoder | None, k: int, o: DecodeOptions, size: int,
                 memories: Pair[torch.Tensor], capacity: int, masked: bool = False):
        dev = target.device
        self.target, self.draft, self.k, self.o, self.size = target, draft, k, o, size
        blank = lambda m: torch.zeros(size, *m.shape[1:], dtype=m.dtype, device=m.device)  # noqa: E731
        ones = lambda m: torch.ones(size, 1, 1, m.shape[1], dtype=torch.bool, device=dev)  # noqa: E731
        d = None
        if draft is not None:
            d = draft.new_cache(blank(memories.draft), capacity)
            d.static_mask = ones(memories.draft)
        t = target.new_cache(blank(memories.target), capacity)
        t.static_mask = ones(memories.target) if masked else None  # padded rows: the target attends under a mask
        self.slots = Slots.empty(size, capacity, t, d)
        self.hints = torch.zeros(size, max(k, 1), dtype=torch.long, device=dev)  # each row's next hint tokens
        self.hinted = torch.zeros(size, dtype=torch.bool, device=dev)  # the rows that propose them
        self.hinting = False  # whether any row of the last pass did
        self.m = torch.zeros((), dtype=torch.long, device=dev)  # live rows of the pass (the first slots)
        self.out = torch.zeros(size, PassRead.columns(k + 1), dtype=torch.float64, device=dev)
        self.sot_at = torch.zeros(size, 1, dtype=torch.long, device=dev)  # where each prompt's no-speech is read
        self.no_speech = torch.zeros(size, dtype=torch.float32, device=dev)
        self.graphs: dict[tuple[int, ...], torch.cuda.CUDAGraph] = {}  # (bucket,): a pass; (bucket, width): a prefill
        self.lock = threading.Lock()  # held by the one decode using the arena

    def claim_cross(self, at: int, b: int, target: CrossKV | None, lengths: list[int],
                    draft_memory: torch.Tensor | None, draft_lengths: list[int] | None) -> None:
        """Slots at..at+b-1 take b rows' cross-attention keys and values: the target's (where given; its mask, where
        it has one, from ``lengths``), the draft's (computed here from its memory, each row masked to its own
        length)."""
        rows, s = slice(at, at + b), self.slots
        if target is not None:
            for mine, theirs in zip((*s.target.cross_k, *s.target.cross_v), (*target.keys, *target.values)):
                mine[rows, :, :theirs.shape[2]].copy_(theirs)
        if s.target.static_mask is not None:
            s.target.static_mask[rows] = length_mask(lengths, s.target.static_mask.shape[-1], s.n.device)
        if s.draft is not None:
            cross = self.draft.cross_kv(draft_memory)
            for mine, theirs in zip((*s.draft.cross_k, *s.draft.cross_v), (*cross.keys, *cross.values)):
                mine[rows, :, :theirs.shape[2]].copy_(theirs)
            s.draft.static_mask[rows] = length_mask(draft_lengths or [draft_memory.shape[1]] * b,
                                                    s.draft.static_mask.shape[-1], s.n.device)

    def _pass(self, b: int) -> None:
        """One pass over the first ``b`` slots (passes.py's, at fixed addresses); idle slots do not move."""
        s = self.slots.first(b)
        proposals = passes.draft(self.draft, s, self.k, self.o, CATCH_UP, fixed=True,
                                 forced=(self.hints[:b], self.hinted[:b]))[0] if self.k else s.n.new_empty(b, 0)
        live = torch.arange(b, device=s.n.device) < self.m
        self.out[:b].copy_(passes.verify(self.target, s, proposals, self.o, live=live))

    def _prefill(self, rows: slice, width: int) -> None:
        s = self.slots
        view = Slots(s.seq[rows], s.n[rows], [t[rows] for t in s.rules], s.sample_len[rows], s.target.rows(rows),
                     None if s.draft is None else s.draft.rows(rows))
        self.no_speech[rows].copy_(passes.prefill(self.target, self.draft if self.k else None, view, width,
                                                  self.sot_at[rows], self.o, fixed=True))

    def prefill(self, m: int, width: int, sot_at: list[int], at: int = 0) -> list[float]:
        """Prefill the prompts of the m rows from slot ``at`` (their first ``width`` tokens; a bucket of a power of
        two, at least EXACT_QUERIES, wide: an exact target gives a position the same bits in a pass of any width).
        Returns each row's no-speech probability at its ``sot_at``. A new decode's rows (at 0) prefill as a graph per
        bucket; rows joining a decode run their prefill without one (once per row: not worth a graph per place)."""
        w = min(bucket(max(width, 4)), self.target.max_positions)
        rows = slice(at, at + m)
        if at:
            self.sot_at[rows, 0] = torch.tensor(sot_at, device=self.m.device)
            self._prefill(rows, w)
            return self.no_speech[rows].tolist()
        b = min(bucket(m), self.size)
        self.sot_at.zero_()  # idle slots too: an earlier decode's longer prompts left theirs past this width
        self.sot_at[:m, 0] = torch.tensor(sot_at, device=self.m.device)
        self._run((b, w), lambda: self._prefill(slice(0, b), w))
        return self.no_speech[:m].tolist()

    def run_pass(self, m: int) -> list[list[float]]:
        """One pass over the m live rows (the first slots): the host's one read, a row per live row."""
        b = min(bucket(m), self.size)
        self.m.fill_(0)  # a pass captured now is captured with no live row: the live rows' state does not move
        self._run((b,), lambda: self._pass(b))
        self.m.fill_(m)
        if self.m.is_cuda:
            self.graphs[(b,)].replay()
            budget.count(RUN)
        else:
            _counted(lambda: self._pass(b))
        return self.out[:m].tolist()

    def propose_hints(self, rows: list[list[int] | None]) -> None:
        """Each live row's next K hint tokens, or None: the draft proposes for it (written before a pass)."""
        if not any(rows) and not self.hinting:
            return
        self.hinting = any(rows)
        eot, k, m = self.o.eot, self.hints.shape[1], len(rows)
        self.hints[:m] = torch.tensor([(h or [])[:k] + [eot] * (k - len((h or [])[:k])) for h in rows],
                                      dtype=torch.long).to(self.hints.device, non_blocking=True)
        self.hinted.zero_()
        self.hinted[:m] = torch.tensor([h is not None for h in rows]).to(self.hinted.device, non_blocking=True)

    def _run(self, key: tuple[int, ...], work) -> None:
        """On CUDA: capture ``work`` as the graph ``key`` if it is new (after two warm-up runs on a side stream), and
        replay prefills; on a CPU: run prefills. (A pass captured with no live row changes nothing; a prefill is
        idempotent: its warm-up runs write what its replay writes.)"""
        if not self.m.is_cuda:
            if len(key) == 2:
                _counted(work)
            return
        if key not in self.graphs:
            self.graphs[key] = capture(work)
        if len(key) == 2:
            self.graphs[key].replay()
            budget.count(RUN)


def _counted(work: Callable[[], object]) -> None:
    """An arena's pass or prefill run without a graph (a CPU): counted as one run, what a GPU replays."""
    _INSIDE.depth = getattr(_INSIDE, "depth", 0) + 1
    try:
        work()
    finally:
        _INSIDE.depth -= 1
    budget.count(RUN)


def arena_for(decoders: Decoders, k: int, o: DecodeOptions, b: int, memories: Pair[torch.Tensor],
              capacity: int, masked: bool) -> Arena:
    """The arena of this decoder pair, K, rules, memory widths and masking (``masked``: padded rows) with room for
    ``b`` rows (made, or grown, here)."""
    draft = decoders.draft if k else None
    shapes = (memories.target.shape[1], None if draft is None else memories.draft.shape[1])
    key = (id(draft), k, o.rules.key, o.eot, o.no_speech, shapes, capacity, masked)
    with _LOOKUP:
        arenas = _ARENAS.setdefault(decoders.target, {})
        if key not in arenas or arenas[key].size < b:
            arenas.pop(key, None)  # its graphs and buffers go (once no decode holds them) before a bigger one is made
            arenas[key] = Arena(decoders.target, draft, k, o, bucket(b), memories, capacity, masked)
        return arenas[key]


class StaticDecodingTask(DecodingTask):
    """A :class:`DecodingTask` whose slots are an :class:`Arena`'s and whose passes and prefills the arena runs
    (replayed as CUDA graphs on CUDA)."""

    def __init__(self, decoders: Decoders, memories: Pair[torch.Tensor], requests: list[RowRequest],
                 options: DecodeOptions, cross: Pair[CrossKV | None] = Pair(None), arena: Arena | None = None):
        k = decoders.k(options)
        self.arena = arena or arena_for(decoders, k, options, len(requests), memories,
                                        decode_capacity(decoders.target.max_positions, k), padded(requests))
        super().__init__(decoders, memories, requests, options, cross, slots=self.arena.slots)
        self.reserved = self.arena.size
        width = memories.target.shape[1]
        self.arena.claim_cross(0, len(requests), cross.target or decoders.target.cross_kv(memories.target),
                               [r.memory_length or width for r in requests], self.d_memory, self.d_lengths)
        self.owns_lock = False  # set by ``open_decode``, which took the arena's lock for it

    def prefill(self, task: DecodingTask | None = None, at: int = 0) -> None:
        """Both decoders' prefill of this decode's rows, or of ``task``'s rows placed at slot ``at`` (rows joining):
        the draft's passes catch up on the last two tokens only."""
        task = task or self
        width = max(r.length for r in task.live) - 1
        if width:
            probs = self.arena.prefill(len(task.live), width, [min(r.request.sot_index, width - 1) for r in task.live],
                                       at)
            for r, p in zip(task.live, probs):
                r.no_speech_prob = p

    def can_join(self, memories: Pair[torch.Tensor], requests: list[RowRequest]) -> bool:
        """Rows may join while the arena has free slots, if they could have started a static decode in it."""
        s = self.slots
        return (len(self.live) + len(requests) <= self.arena.size and not any(r.hint for r in requests)
                and memories.target.shape[1] == s.target.cross_k[0].shape[2] and all(
                    r.memory_length in (None, memories.target.shape[1]) for r in requests)
                and (s.draft is None or memories.draft.shape[1] == s.draft.cross_k[0].shape[2]))

    def place(self, new: DecodingTask) -> None:
        """``new``'s rows take the free slots after the live rows, and are prefilled there."""
        at, j = len(self.live), len(new.live)
        self.slots.put(at, new.slots, j)  # their tokens, lengths, rule states, the target's cross-attention
        self.arena.claim_cross(at, j, None, [r.request.memory_length or self.slots.target.cross_k[0].shape[2]
                                             for r in new.live], new.d_memory, new.d_lengths)
        self.prefill(new, at)

    def one_pass(self) -> None:
        hinted = [self.k > 0 and r.hinted() for r in self.live]
        self.arena.propose_hints([r.hint[r.generated:r.generated + self.k] if h else None
                                  for r, h in zip(self.live, hinted)])
        reads = [PassRead(v, self.k + 1) for v in self.arena.run_pass(len(self.live))]
        self.book(reads, hinted, self.k, self.k)

    def close(self) -> None:
        """Gives the arena back to other decodes (its slots stay as they are: the next decode claims them)."""
        if self.owns_lock:
            self.owns_lock = False
            self.arena.lock.release()


@torch.inference_mode()
def open_decode(decoders: Decoders, memories: Pair[torch.Tensor], requests: list[RowRequest], options: DecodeOptions,
                cross: Pair[CrossKV | None] = Pair(None), room: int = 0) -> DecodingTask:
    """THE way to decode (the product's ``Recognizer.open`` and the tests call it): these rows' decode, static where
    it can be and the device wants it (``ASR_SPEC_STATIC``), with room for ``room`` rows in all where rows are to join
    it; drive it with ``start``/``step`` (or ``run``) and end it with ``close``. An arena serves one decode at a time,
    until its ``close``: a decode that finds it busy (another thread's) runs the eager loop."""
    if eligible(decoders, memories, requests, options):
        k = decoders.k(options)
        arena = arena_for(decoders, k, options, max(len(requests), room), memories,
                          decode_capacity(decoders.target.max_positions, k), padded(requests))
        if arena.lock.acquire(blocking=False):
            try:
                task = StaticDecodingTask(decoders, memories, requests, options, cross, arena)
                task.owns_lock = True
                budget.count(STATIC)
                return task
            except BaseException:
                arena.lock.release()
                raise
    if options.static:
        budget.count(EAGER)
    return DecodingTask(decoders, memories, requests, options, cross, room)


def run_decode(decoders: Decoders, memories: Pair[torch.Tensor], requests: list[RowRequest], options: DecodeOptions,
               cross: Pair[CrossKV | None] = Pair(None)) -> list[RowResult]:
    """:func:`open_decode`, run to the end and closed: each request's result, in order."""
    task = open_decode(decoders, memories, requests, options, cross)
    try:
        return task.run()
    finally:
        task.close()
