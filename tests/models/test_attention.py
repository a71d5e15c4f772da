"""Attention in blocks of queries (bfloat16 on CPUs without AMX): the fused kernel's result within the type's rounding,
each row independent of the others, and the streaming encoder still the encoder when nothing is frozen."""
from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from asr_spec.features import log_mel, window
from asr_spec.models import network
from asr_spec.models.network import attend, blocked_attention
from asr_spec.models.stream_encoder import EncoderCache, encode_tail


def _qkv(batch: int = 2, queries: int = 300, keys: int = 300, dtype: torch.dtype = torch.float32):
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(batch, 4, n, 16, generator=g) for n in (queries, keys, keys))
    return (q * 16 ** -0.5).to(dtype), k.to(dtype), v.to(dtype)


def test_blocked_attention_is_the_fused_kernel_s_within_rounding():
    q, k, v = _qkv()
    mask = torch.ones(300, 300, dtype=torch.bool)
    mask[:200, 250:] = False  # as the streaming encoder's: early queries do not hear the last keys
    for m in (None, mask):
        want = F.scaled_dot_product_attention(q, k, v, attn_mask=m, scale=1.0)
        torch.testing.assert_close(blocked_attention(q, k, v, m), want, rtol=1e-5, atol=1e-5)
        got = blocked_attention(*(t.bfloat16() for t in (q, k, v)), m).float()
        torch.testing.assert_close(got, want, rtol=0.05, atol=0.03)  # bfloat16's rounding of scores and output
    assert not torch.allclose(blocked_attention(q, k, v, mask), blocked_attention(q, k, v))  # the mask is applied


def test_each_row_of_blocked_attention_depends_on_its_own_inputs_only():
    q, k, v = _qkv(dtype=torch.bfloat16)
    both = blocked_attention(q, k, v)
    for i in range(2):
        assert torch.equal(both[i:i + 1], blocked_attention(q[i:i + 1], k[i:i + 1], v[i:i + 1]))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rows_whose_exponentials_overflow_or_vanish_are_computed_with_the_softmax(dtype):
    q, k, v = _qkv(dtype=dtype)
    q[0, 1, 5] *= 400  # scores far beyond exp's range: the exponentials overflow
    k[1, 2, :, 0] += 10  # every key of a head shares a component, and a query opposes it: every score far below
    q[1, 2, 7] = 0       # exp's range, the exponentials vanish
    q[1, 2, 7, 0] = -50
    ref = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), scale=1.0)
    got = blocked_attention(q, k, v)
    assert torch.isfinite(got).all()
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=0.05, atol=0.03)
    torch.testing.assert_close(got.float(), ref, **tol)
    with torch.no_grad():  # the fast way alone would have failed on those rows
        assert not torch.isfinite(torch.matmul(q[0, 1, 5], k[0, 1].T).float().exp()).all()
        assert torch.matmul(q[1, 2, 7], k[1, 2].T).float().exp().sum() == 0
    for i in range(2):  # the other rows' bits are their own
        assert torch.equal(got[i:i + 1], blocked_attention(q[i:i + 1], k[i:i + 1], v[i:i + 1]))
    calm = q.clone()
    calm[0, 1, 5], calm[1, 2, 7] = q[0, 1, 4], q[1, 2, 6]
    same = torch.ones_like(got, dtype=torch.bool)
    same[0, 1, 5] = same[1, 2, 7] = False
    assert torch.equal(got[same], blocked_attention(calm, k, v)[same])


def test_attend_takes_blocks_for_bfloat16_on_a_cpu_without_amx(monkeypatch):
    q, k, v = _qkv(dtype=torch.bfloat16)
    fused = F.scaled_dot_product_attention(q, k, v, scale=1.0)
    monkeypatch.setattr(network, "_FUSED_BFLOAT16", False)
    assert torch.equal(attend(q, k, v), blocked_attention(q, k, v))
    assert not torch.equal(attend(q, k, v), fused)
    assert torch.equal(attend(q.float(), k.float(), v.float()), F.scaled_dot_product_attention(  # other types: fused
        q.float(), k.float(), v.float(), scale=1.0))
    causal = F.scaled_dot_product_attention(q, k, v, scale=1.0, is_causal=True)
    assert torch.equal(attend(q, k, v, causal=True), causal)  # the decoder's training forward: fused
    monkeypatch.setattr(network, "_FUSED_BFLOAT16", True)
    assert torch.equal(attend(q, k, v), fused)


def test_amx_counts_only_where_onednn_may_use_it(tmp_path, monkeypatch):
    """The fused bfloat16 attention (and serve's sessions per core) follow AMX as oneDNN sees it: a CPU with AMX tiles
    whose user left AMX out with ``ONEDNN_MAX_CPU_ISA`` computes as a CPU without them."""
    from asr_spec.models.compute import amx

    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("flags\t\t: fpu avx512f avx512_bf16 amx_bf16 amx_tile\n")
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
    assert amx(cpuinfo=str(cpuinfo))
    for isa, expected in (("AVX512_CORE_AMX", True), ("ALL", True), ("AVX512_CORE_BF16", False), ("avx2", False)):
        monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", isa)
        assert amx(cpuinfo=str(cpuinfo)) is expected, isa
    cpuinfo.write_text("flags\t\t: fpu avx512f avx512_bf16\n")
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "ALL")
    assert not amx(cpuinfo=str(cpuinfo)) and not amx("cuda", cpuinfo=str(cpuinfo))


def test_an_exact_decoder_attends_in_blocks_only_where_the_cpu_keeps_rows_apart(monkeypatch):
    q, k, v = _qkv(dtype=torch.bfloat16)
    monkeypatch.setattr(network, "_FUSED_BFLOAT16", False)
    fused = F.scaled_dot_product_attention(q, k, v, scale=1.0)
    assert torch.equal(attend(q, k, v, exact=True), blocked_attention(q, k, v) if network.rows_apart(
        torch.get_num_threads()) else fused)
    monkeypatch.setattr(network, "rows_apart", lambda threads: False)
    assert torch.equal(attend(q, k, v, exact=True), fused)
    assert torch.equal(attend(q, k, v), blocked_attention(q, k, v))  # a draft's or an encoder's call: blocks


def test_blocks_take_a_decoder_s_batched_masks():
    q, k, v = _qkv(queries=6, keys=40)
    mask = torch.arange(40)[None, None, None, :] <= torch.tensor([[30, 31, 32, 33, 34, 35], [9, 10, 11, 12, 13, 14]])[:, None, :, None]
    want = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=1.0)
    torch.testing.assert_close(blocked_attention(q, k, v, mask), want, rtol=1e-5, atol=1e-5)
    cross = torch.zeros(2, 1, 1, 40, dtype=torch.bool)
    cross[0, ..., :25], cross[1, ..., :40] = True, True  # ragged memories: each row its own length
    torch.testing.assert_close(blocked_attention(q, k, v, cross),
                               F.scaled_dot_product_attention(q, k, v, attn_mask=cross, scale=1.0), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("fused", [False, True])
def test_the_streaming_encoder_with_nothing_frozen_is_the_bfloat16_encoder(tiny_target, monkeypatch, fused):
    monkeypatch.setattr(network, "_FUSED_BFLOAT16", fused)
    encoder = copy.deepcopy(tiny_target.encoder.inner).to(torch.bfloat16)
    audio = np.random.default_rng(0).normal(0, 0.1, 3 * 16000).astype(np.float32)
    mel = window(log_mel(audio), 0, 400)[None].to(torch.bfloat16)
    with torch.inference_mode():
        assert torch.equal(encode_tail(encoder, mel, EncoderCache(), freeze=0), encoder(mel))
