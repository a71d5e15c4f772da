"""An int8 draft's few-token calls on a CPU as TorchScript graphs traced from its own call (``CachedDecoder(traced=True)``).

A traced graph runs the same operations as the call with ``fixed`` (the whole self-attention cache, masked), so it
gives the same bits, without the Python between them, which is about a quarter of a draft step on a 2-core CPU
(eval/experiments/profile_draft_step.py). A shape (rows, tokens fed, logits returned, the cache's capacity) is traced
at its ``TRACE_AFTER``-th call: a trace takes about 0.2 s, what a few hundred steps save, so a short file's few steps
never pay for one; before it, the call runs in Python with ``fixed`` (the same bits), so the draft's numbers never
depend on how long the process has run. A call feeding more than ``TRACED_TOKENS`` tokens (a prompt, a catch-up after
hints) or over memories of different lengths runs in Python as it is: its shapes vary.
"""
from __future__ import annotations

import warnings
from typing import Callable, Protocol

import torch
from torch import nn

TRACED_TOKENS = 4
TRACE_AFTER = 256

Output = torch.Tensor | tuple[torch.Tensor, torch.Tensor]


class Cache(Protocol):
    """What a traced call reads of a decoder's cache (``kv_decoder.KVCache``)."""
    self_k: list[torch.Tensor]
    cross_lengths: list[int] | None
    static_mask: torch.Tensor | None

    def tensors(self) -> list[torch.Tensor]: ...


class Traces:
    """A decoder's traced calls, one per shape (``graphs``), and each shape's calls so far (``calls``). ``forward``
    (cache, tokens, positions, logits_at, shortlist, hidden) -> the decoder's call with ``fixed``; ``cache_of`` (the
    cache's tensors) -> the cache; ``modules`` and ``packed`` (its int8 layers' packed weights): what it calls, which
    the tracer needs registered (a module's weights that take gradients cannot be the trace's constants)."""

    def __init__(self, forward: Callable[..., Output], cache_of: Callable[[list[torch.Tensor]], Cache],
                 modules: list[nn.Module], packed: list[torch.ScriptObject]):
        self.forward, self.cache_of, self.modules, self.packed = forward, cache_of, modules, packed
        self.graphs: dict[tuple, torch.jit.ScriptModule] = {}
        self.calls: dict[tuple, int] = {}

    @staticmethod
    def takes(cache: Cache, tokens: torch.Tensor, logits_at: torch.Tensor | None) -> bool:
        """Whether a call is one of those traced: few tokens, logits at given indices, one memory length."""
        return logits_at is not None and tokens.shape[1] <= TRACED_TOKENS and cache.cross_lengths is None \
            and cache.static_mask is None

    def __call__(self, cache: Cache, tokens: torch.Tensor, positions: torch.Tensor, logits_at: torch.Tensor,
                 shortlist: bool, hidden: bool) -> Output:
        """The call with ``fixed``: in Python for a shape's first ``TRACE_AFTER`` calls, then as the graph traced for
        that shape (the same bits either way, at any memory length: tests/models/test_traced_step.py)."""
        key = (*tokens.shape, logits_at.shape[1], shortlist, hidden, cache.self_k[0].shape[2])
        if (graph := self.graphs.get(key)) is None:
            self.calls[key] = calls = self.calls.get(key, 0) + 1
            if calls < TRACE_AFTER:
                return self.forward(cache, tokens, positions, logits_at, shortlist, hidden)
            with warnings.catch_warnings():  # the tracer's notes on shapes read as numbers: constant in these calls
                warnings.simplefilter("ignore")
                graph = self.graphs[key] = torch.jit.trace(_Step(self, shortlist, hidden).eval(),
                                                           (tokens, positions, logits_at, *cache.tensors()),
                                                           check_trace=False)
        # run as traced: TorchScript's optimizing executor profiles a graph's first calls and then rewrites it,
        # which cost more than it bought here (a step's second call 21 ms, later steps no faster)
        with torch.jit.optimized_execution(False):
            return graph(tokens, positions, logits_at, *cache.tensors())


class _Step(nn.Module):
    """The call ``torch.jit.trace`` traces: the cache given as its tensors, what it calls registered."""

    def __init__(self, traces: Traces, shortlist: bool, hidden: bool):
        super().__init__()
        self.traces, self.shortlist, self.hidden = traces, shortlist, hidden
        self.called = nn.ModuleList(traces.modules)
        for i, packed in enumerate(traces.packed):
            setattr(self, f"packed{i}", packed)

    def forward(self, tokens: torch.Tensor, positions: torch.Tensor, logits_at: torch.Tensor,
                *tensors: torch.Tensor) -> Output:
        cache = self.traces.cache_of(list(tensors))
        return self.traces.forward(cache, tokens, positions, logits_at, self.shortlist, self.hidden)
