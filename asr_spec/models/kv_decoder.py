"""A Whisper decoder with static KV caches, per-row positions and ragged batches.

Each row of a batch writes its new tokens at its own positions; a query at position p attends to the
cached keys at positions <= p. Entries beyond a row's current length are stale and invisible, so
rolling a row back is just feeding from an earlier position next time (gpt-fast style).
"""
from __future__ import annotations

import warnings
from bisect import bisect_left
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel


class Columns:
    """The token ids of the logit columns: the full vocabulary (``ids`` None) or a sorted shortlist."""

    def __init__(self, ids: torch.Tensor | None = None):
        self.ids = ids
        self._ids = ids.tolist() if ids is not None else None
        self._cache: dict[tuple[int, ...], list[int]] = {}

    def at(self, token: int) -> int:
        """The first column whose token id is >= ``token`` (a range boundary)."""
        return token if self._ids is None else bisect_left(self._ids, token)

    def of(self, tokens: Sequence[int]) -> list[int]:
        """The columns of those ``tokens`` that have one."""
        if self._ids is None:
            return list(tokens)
        key = tuple(tokens)
        if key not in self._cache:
            self._cache[key] = [c for c in map(self.at, key) if c < len(self._ids) and self._ids[c] in key]
        return self._cache[key]


@dataclass
class KVCache:
    self_k: list[torch.Tensor]  # per layer [B, H, capacity, Dh]
    self_v: list[torch.Tensor]
    cross_k: list[torch.Tensor]  # per layer [B, H, S, Dh]
    cross_v: list[torch.Tensor]
    cross_mask: torch.Tensor | None = None  # [B, 1, 1, S]: encoder positions each row attends to (ragged memories)

    def select(self, rows: torch.Tensor) -> "KVCache":
        """Keep only ``rows`` (batch compaction when rows finish)."""
        pick = lambda ts: [t.index_select(0, rows) for t in ts]  # noqa: E731
        mask = self.cross_mask.index_select(0, rows) if self.cross_mask is not None else None
        return KVCache(pick(self.self_k), pick(self.self_v), pick(self.cross_k), pick(self.cross_v), mask)


# On CUDA, cuBLAS picks its kernel, and with it the order of each output's sums, by the call's shapes, the row count
# included: a row's bits would depend on how many rows a pass has (H200, float16: speculative text differed from
# target-only on 3 of 65 dev utterances; eval/exact_linear.py --device cuda). There float layers multiply in blocks of
# exactly CUDA_ROWS rows (zero rows added): one kernel for every call, and rows that do not mix. A GPU's decode step
# is bound by its weights and its launches, not by its rows.
CUDA_ROWS = 256


def in_blocks(rows: torch.Tensor, weight: torch.Tensor, size: int) -> torch.Tensor:
    """``rows @ weight.T`` [m, n], multiplied in blocks of exactly ``size`` rows (zero rows added to the last)."""
    m = rows.shape[0]
    blocks = F.pad(rows, (0, 0, 0, -m % size)).split(size)
    return (torch.cat([b @ weight.t() for b in blocks]) if len(blocks) > 1 else blocks[0] @ weight.t())[:m]


def project(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear(x, weight, bias)`` for the few rows of a decode step. On this CPU, ``weight @ x.T`` with
    at least two rows streams the weight at full memory bandwidth, where ``F.linear`` picks kernels that
    are 1.5-5x slower for small row counts (the 51865-row output layer: 10.5 vs 3.1 ms per step;
    eval/bench_steps.py). Target-only and speculative decoding both use it. On CUDA: in blocks of ``CUDA_ROWS``
    rows, so that a row's result does not depend on the others."""
    rows = x.reshape(-1, x.shape[-1])
    m = rows.shape[0]
    if weight.is_cuda:
        y = in_blocks(rows, weight, CUDA_ROWS)
    else:
        if m == 1:
            rows = torch.cat([rows, rows])
        y = (weight @ rows.t()).t()[:m].contiguous()
    if bias is not None:
        y += bias
    return y.reshape(*x.shape[:-1], weight.shape[0])


class Dense:
    """A linear layer applied with :func:`project` in the weights' own precision."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None):
        self.weight, self.bias = weight, bias

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return project(x, self.weight, self.bias)


class Int8:
    """A linear layer with int8 weights (one scale per output row) and int8 activations.

    ``rows`` True (targets): each row of the input is quantized with its own scale and the products are summed
    in integers, so a row's result is bitwise the same whatever the other rows of the call are (the batch, the
    other verified positions): speculative and target-only decoding, batch 8 and batch 1, see the same numbers.
    On a CPU the fbgemm/x86 dynamic kernel quantizes with one range per call, so each row is scaled to peak 1
    and a fixed extra row holding -1 and +1 pins that range: the kernel's scale is the same for every call and a
    row's scale is its own peak (7-bit activations: fbgemm's ``reduce_range``, which keeps AVX2's 16-bit pair
    sums from saturating). Elsewhere (CUDA) ``torch._int_mm`` with per-row symmetric int8.
    ``rows`` False (drafts on a CPU): one scale per call, a little faster; a draft's precision changes how often
    it is accepted, never the text. Inputs and outputs are in the caller's float type. ``kernel``: "fbgemm" or
    "int_mm" (default: fbgemm on a CPU, int_mm elsewhere; int_mm runs on a CPU too, slowly: for tests)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None, rows: bool = True,
                 kernel: str | None = None):
        w = weight.detach().float()
        self.out_features, self.in_features = w.shape
        self.rows = rows
        self.bias = None if bias is None else bias.detach().float()
        scales = (w.abs().amax(1) / 127).clamp(min=1e-12)
        self.cpu = (kernel or ("fbgemm" if w.device.type == "cpu" else "int_mm")) == "fbgemm"
        if self.cpu:
            zeros = torch.zeros(w.shape[0], dtype=torch.long)
            with warnings.catch_warnings():  # quantized tensors are deprecated in favour of torchao; still in 2.13
                warnings.simplefilter("ignore", UserWarning)
                q = torch.quantize_per_channel(w, scales.double(), zeros, 0, torch.qint8)
            self.packed = torch.ops.quantized.linear_prepack(q, None if rows else self.bias)
            self.pin = w.new_zeros(1, self.in_features)
            self.pin[0, :2] = torch.tensor([-1.0, 1.0])
        else:  # torch._int_mm wants at least 17 rows and a multiple of 8 columns
            pad = -self.out_features % 8
            self.weight_t = F.pad(torch.round(w / scales[:, None]), (0, 0, 0, pad)).to(torch.int8).t().contiguous()
            self.scales = scales

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features).float()
        if self.cpu and not self.rows:
            y = torch.ops.quantized.linear_dynamic(rows, self.packed, True)
        else:
            peak = rows.abs().amax(1, keepdim=True).clamp(min=1e-30)
            if self.cpu:
                y = torch.ops.quantized.linear_dynamic(torch.cat([rows / peak, self.pin]), self.packed, True)[:-1] * peak
            else:
                m = rows.shape[0]
                q = F.pad(torch.round(rows * (127 / peak)), (0, 0, 0, max(0, 17 - m))).to(torch.int8)
                y = torch._int_mm(q, self.weight_t)[:m, :self.out_features].float() * (peak / 127) * self.scales
            if self.bias is not None:
                y += self.bias
        return y.to(x.dtype).reshape(*x.shape[:-1], self.out_features)


class Int8Module(nn.Module):
    """:class:`Int8` (per row) in place of an ``nn.Linear`` inside a transformers module (the encoder)."""

    def __init__(self, linear: nn.Linear):
        super().__init__()
        self.layer = Int8(linear.weight, linear.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layer(x)


def quantize_linears(module: nn.Module) -> nn.Module:
    """Replace every ``nn.Linear`` inside ``module`` with :class:`Int8Module`, in place; returns ``module``."""
    for name, child in module.named_children():
        if isinstance(child, nn.Linear):
            setattr(module, name, Int8Module(child))
        else:
            quantize_linears(child)
    return module


Linear = Callable[..., Callable[[torch.Tensor], torch.Tensor]]  # (weight, bias=None) -> layer: Dense or Int8
INT8_MODES: dict[str, Linear] = {"rows": Int8, "tensor": lambda weight, bias=None: Int8(weight, bias, rows=False)}


CrossKV = tuple[list[torch.Tensor], list[torch.Tensor]]  # per layer cross-attention keys, values [B, H, S, Dh]



def stack_cross(rows: list[CrossKV]) -> CrossKV:
    """Rows' cross-attention keys and values [1, H, S_i, Dh] as one batch [B, H, max S, Dh] (zeros after each row's
    length: give the rows their lengths so that attention masks them)."""
    longest = max(r[0][0].shape[2] for r in rows)
    pad = lambda t: F.pad(t, (0, 0, 0, longest - t.shape[2]))  # noqa: E731
    return tuple([torch.cat([pad(r[part][layer]) for r in rows]) for layer in range(len(rows[0][0]))]
                 for part in (0, 1))


# Exact rows: torch's CPU attention kernel takes another path for 1-3 queries than for 4 or more, and blocks the keys
# by their count, so a position's numbers would depend on how many positions a pass feeds and how long the cache
# looks. Passes of an exact decoder give attention at least EXACT_QUERIES queries (zero rows added) and the whole
# self-attention cache (at least EXACT_KEYS positions, masked); then a row's bits are the same in a 1-token step, a
# verify pass and a prompt (tests/test_compute.py checks it on the machine that runs the tests).
EXACT_QUERIES = 4
EXACT_KEYS = 512
# On CUDA, torch picks cuDNN's attention for float16 with a mask, and cuDNN plans anew for every new shape: 2-3 ms a
# call with a stream's changing lengths (H100, eval/profile_stream.py --device cuda: 70 % of the engine's time).
# The memory-efficient kernel takes masks too and plans nothing.
SDPA_BACKENDS = [SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


class _Layer:
    """Weights of one decoder layer, with the self-attention q, k, v projections fused."""

    def __init__(self, layer: nn.Module, linear: Linear, cross: Linear | None = None):
        sa, ca = layer.self_attn, layer.encoder_attn
        self.heads = sa.num_heads
        self.scaling = sa.scaling
        zero = torch.zeros_like(sa.q_proj.bias)
        self.qkv = linear(torch.cat([sa.q_proj.weight, sa.k_proj.weight, sa.v_proj.weight]).detach(),
                          torch.cat([sa.q_proj.bias, zero, sa.v_proj.bias]).detach())
        weights = lambda m: linear(m.weight.detach(), m.bias.detach())  # noqa: E731
        self.sa_out, self.ca_q, self.ca_out = weights(sa.out_proj), weights(ca.q_proj), weights(ca.out_proj)
        # cross-attention keys and values, computed once per window: with ``cross`` (int8 targets), else in
        # transformers' own float layers
        self.ca_k, self.ca_v = (ca.k_proj, ca.v_proj) if cross is None else \
            (cross(ca.k_proj.weight.detach()), cross(ca.v_proj.weight.detach(), ca.v_proj.bias.detach()))
        self.fc1, self.fc2 = weights(layer.fc1), weights(layer.fc2)
        self.ca = ca
        self.ln1, self.ln2, self.ln3 = layer.self_attn_layer_norm, layer.encoder_attn_layer_norm, layer.final_layer_norm


class StaticDecoder:
    """Runs a transformers ``WhisperDecoder`` and an output layer ``head`` [n, d] over a :class:`KVCache`.

    With ``head_ids`` the output layer covers only that token shortlist (row i scores token head_ids[i]:
    a reduced-vocabulary draft head): calls return logits over the shortlist with ``shortlist=True``
    (columns in ascending token order, see ``columns``), else over the full vocabulary with ``-inf``
    outside it. ``int8``: its linear layers run with int8 weights (:class:`Int8`), quantizing activations per
    ``"rows"`` (exact per row: targets) or per ``"tensor"`` (drafts on a CPU); None: in the weights' float.
    It computes in the decoder's float type (its embeddings') and returns float32 logits. ``exact``: a row's
    numbers do not depend on the other rows or positions of a pass (see ``EXACT_QUERIES``; targets whose linear
    layers are row-exact: int8 and bfloat16/float16 ones).
    """

    def __init__(self, decoder: nn.Module, head: torch.Tensor, head_ids: torch.Tensor | None = None,
                 int8: str | None = None, exact: bool = False):
        self.decoder = decoder
        self.int8 = int8
        self.exact = exact
        linear: Linear = INT8_MODES[int8] if int8 else Dense
        # a per-call activation scale over a window's 1500 frames would blur a draft's keys: floats there
        self.layers = [_Layer(layer, linear, linear if int8 == "rows" else None) for layer in decoder.layers]
        self.vocab_size = decoder.embed_tokens.num_embeddings
        if head_ids is not None:
            head_ids, order = head_ids.sort()
            head = head[order]
        self.head_ids = head_ids
        self.columns = Columns(head_ids)
        self.head_w = head.detach()
        self.head = linear(self.head_w)
        self.max_positions = decoder.embed_positions.weight.shape[0]

    @property
    def device(self) -> torch.device:
        return self.head_w.device

    @property
    def dtype(self) -> torch.dtype:
        return self.decoder.embed_tokens.weight.dtype

    @torch.inference_mode()
    def new_cache(self, encoder_out: torch.Tensor, capacity: int, lengths: list[int] | None = None,
                  cross: CrossKV | None = None) -> KVCache:
        """Caches for a batch of encoder outputs [B, S, D]; with ``lengths`` row b attends only to its first
        ``lengths[b]`` encoder positions (memories of different lengths padded to S). ``cross``: the
        cross-attention keys and values of ``encoder_out`` computed before (a decode's, kept)."""
        b = encoder_out.shape[0]
        if self.exact:
            capacity = max(capacity, EXACT_KEYS)
        cross_k, cross_v = cross or self.cross_kv(encoder_out)
        self_k, self_v = [], []
        for k in cross_k:
            empty = k.new_zeros(b, k.shape[1], capacity, k.shape[3])
            self_k.append(empty)
            self_v.append(empty.clone())
        mask = None
        if lengths is not None and min(lengths) < encoder_out.shape[1]:
            mask = (torch.arange(encoder_out.shape[1], device=encoder_out.device)[None, :]
                    < torch.tensor(lengths, device=encoder_out.device)[:, None])[:, None, None, :]
        return KVCache(self_k, self_v, cross_k, cross_v, mask)

    @torch.inference_mode()
    def cross_kv(self, encoder_out: torch.Tensor) -> CrossKV:
        """The cross-attention keys and values of encoder outputs [B, S, D], per layer [B, H, S, Dh]. A position's
        depend on its own output only, so a growing buffer's can be computed a piece at a time (streaming)."""
        b = encoder_out.shape[0]
        encoder_out = encoder_out.to(self.dtype)
        keys, values = [], []
        for layer in self.layers:
            h, dh = layer.heads, layer.ca.k_proj.out_features // layer.heads
            split = lambda t: t.view(b, -1, h, dh).transpose(1, 2).contiguous()  # noqa: E731
            keys.append(split(layer.ca_k(encoder_out)))
            values.append(split(layer.ca_v(encoder_out)))
        return keys, values

    @torch.inference_mode()
    def __call__(self, cache: KVCache, tokens: torch.Tensor, positions: torch.Tensor,
                 logits_at: torch.Tensor | None = None, shortlist: bool = False,
                 cross_scores: dict[int, torch.Tensor] | None = None) -> torch.Tensor:
        """Feed ``tokens`` [B, T] at ``positions`` [B, T]; return logits [B, T', V] at the time
        indices ``logits_at`` [B, T'] (all T when None). ``cross_scores`` {layer: None, ...} is filled with
        those layers' cross-attention scores before the softmax [B, H, T, S] (word timestamps)."""
        b, t = tokens.shape
        dec = self.decoder
        pos = positions.clamp(max=self.max_positions - 1)
        x = dec.embed_tokens(tokens) + dec.embed_positions.weight[pos]
        keys = cache.self_k[0].shape[2] if self.exact else int(positions.max()) + 1
        mask = torch.arange(keys, device=tokens.device)[None, None, None, :] <= positions[:, None, :, None]
        pad = EXACT_QUERIES - t if self.exact and t < EXACT_QUERIES else 0
        if pad:  # zero queries that see every key; their outputs are dropped
            mask = torch.cat([mask, mask.new_ones(b, 1, pad, keys)], 2)
        def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, m: torch.Tensor | None) -> torch.Tensor:
            with sdpa_kernel(SDPA_BACKENDS) if q.is_cuda else nullcontext():
                return F.scaled_dot_product_attention(F.pad(q, (0, 0, 0, pad)) if pad else q, k, v, attn_mask=m,
                                                      scale=1.0)[:, :, :t]
        rows = torch.arange(b, device=tokens.device)[:, None]
        for i, layer in enumerate(self.layers):
            h = layer.heads
            y = layer.qkv(layer.ln1(x)).view(b, t, 3, h, -1)
            q = (y[:, :, 0] * layer.scaling).transpose(1, 2)
            cache.self_k[i][rows, :, positions] = y[:, :, 1]
            cache.self_v[i][rows, :, positions] = y[:, :, 2]
            a = attend(q, cache.self_k[i][:, :, :keys], cache.self_v[i][:, :, :keys], mask)
            x = x + layer.sa_out(a.transpose(1, 2).reshape(b, t, -1))
            q = (layer.ca_q(layer.ln2(x)) * layer.scaling).view(b, t, h, -1).transpose(1, 2)
            if cross_scores is not None and i in cross_scores:
                cross_scores[i] = (q @ cache.cross_k[i].transpose(-1, -2)).float()
            a = attend(q, cache.cross_k[i], cache.cross_v[i], cache.cross_mask)
            x = x + layer.ca_out(a.transpose(1, 2).reshape(b, t, -1))
            x = x + layer.fc2(F.gelu(layer.fc1(layer.ln3(x))))
        if logits_at is not None:
            x = x.gather(1, logits_at[:, :, None].expand(-1, -1, x.shape[-1]))
        logits = self.head(dec.layer_norm(x)).float()
        if self.head_ids is None or shortlist:
            return logits
        full = logits.new_full((*logits.shape[:-1], self.vocab_size), float("-inf"))
        return full.index_copy_(-1, self.head_ids, logits)
