"""An int8 draft's few-token calls on a CPU run as traced graphs (``CachedDecoder(traced=True)``) once a shape is
called often: the same bits as its Python call with ``fixed`` before and after, in its logits, hidden states and cache
writes, at other memory lengths than the one it was traced at; one trace per shape; longer calls, exact decoders and
float drafts stay in Python (tiny random models)."""
from __future__ import annotations

import copy

import pytest
import torch

from asr_spec.models import traced_step
from asr_spec.models.compute import int8_kernels
from asr_spec.models.loader import load_draft
from asr_spec.models.traced_step import TRACED_TOKENS

needs_int8 = pytest.mark.skipif(not int8_kernels("cpu"), reason="no int8 CPU kernels here")
pytestmark = needs_int8


@pytest.fixture(scope="module")
def drafts(tiny_target):
    """The tiny target's 1-layer int8 draft, traced (as load_draft makes it on a CPU), and a copy in Python."""
    draft = load_draft("layers:0", tiny_target, int8=True).decoder
    assert draft.traces is not None
    python = copy.copy(draft)
    python.traces = None
    return draft, python


def test_a_traced_call_has_the_bits_of_its_python_call(drafts, tiny_target, monkeypatch):
    traced, python = drafts
    traced.traces = traced._traces()
    monkeypatch.setattr(traced_step, "TRACE_AFTER", 2)  # each shape's first call in Python, the next traced
    g = torch.Generator().manual_seed(0)
    d = tiny_target.net.config.d_model
    # memories of 24 positions twice (traced at the second), then 40 and 7: one trace serves every length
    for b, frames in ((1, 24), (1, 24), (1, 40), (1, 7), (2, 24), (2, 24)):
        memory = torch.randn(b, frames, d, generator=g)
        caches = [dec.new_cache(memory, 64) for dec in (traced, python)]
        n = 10
        tokens = torch.randint(0, traced.vocab_size, (b, n + 3), generator=g)
        pos = torch.arange(n + 3).expand(b, -1)
        for dec, cache in zip((traced, python), caches):
            dec(cache, tokens[:, :n], pos[:, :n])  # a prompt: in Python in both (wider than TRACED_TOKENS)
        for t in (1, 2):
            at = torch.full((b, 1), t - 1)
            got = traced(caches[0], tokens[:, n:n + t], pos[:, n:n + t], at, shortlist=True, hidden=True)
            want = python(caches[1], tokens[:, n:n + t], pos[:, n:n + t], at, shortlist=True, fixed=True, hidden=True)
            assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1]), (b, frames, t)
            assert all(torch.equal(x, y) for x, y in zip(caches[0].tensors(), caches[1].tensors())), (b, frames, t)
            n += t
    assert sorted(k[:2] for k in traced.traces.graphs) == [(1, 1), (1, 2), (2, 1), (2, 2)]  # rows and tokens: 4 shapes


def test_wide_calls_and_exact_decoders_stay_in_python(drafts, tiny_target):
    traced, _ = drafts
    traced.traces = traced._traces()
    memory = torch.zeros(1, 24, tiny_target.net.config.d_model)
    cache = traced.new_cache(memory, 64)
    width = TRACED_TOKENS + 1
    for _ in range(traced_step.TRACE_AFTER + 1):
        traced(cache, torch.zeros(1, width, dtype=torch.long), torch.arange(width)[None],
               torch.zeros(1, 1, dtype=torch.long))
    assert not traced.traces.graphs and not traced.traces.calls
    assert tiny_target.decoder.traces is None  # a target (exact) is never traced
    assert load_draft("layers:0", tiny_target, int8=False).decoder.traces is None  # nor a float draft
