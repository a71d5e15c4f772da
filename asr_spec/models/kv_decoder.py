"""A Whisper decoder with preallocated KV caches (rollback is a position), per-row positions and ragged batches.

Each row of a batch writes its new tokens at its own positions; a query at position p attends to the
cached keys at positions <= p. Entries beyond a row's current length are stale and invisible, so
rolling a row back is just feeding from an earlier position next time (gpt-fast style).
"""
from __future__ import annotations

import copy
from bisect import bisect_left
from dataclasses import dataclass
from functools import cached_property
from typing import Callable, NamedTuple, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from . import network
from .linear import INT8_MODES, Dense, Int8, Linear, Plain
from .traced_step import Traces


class Columns:
    """The token ids of the logit columns: the full vocabulary (``ids`` None) or a sorted shortlist."""

    def __init__(self, ids: torch.Tensor | None = None):
        self.ids = ids
        self._ids = ids.tolist() if ids is not None else None
        self._cache: dict[tuple[int, ...], list[int]] = {}
        self._tensors: dict[tuple, torch.Tensor] = {}

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

    def tensor_of(self, tokens: Sequence[int], device: torch.device) -> torch.Tensor:
        """``of(tokens)`` as a tensor on ``device`` (made once)."""
        key = (tuple(tokens), device)
        if key not in self._tensors:
            self._tensors[key] = torch.tensor(self.of(tokens), dtype=torch.long, device=device)
        return self._tensors[key]

    def ids_for(self, n: int, device: torch.device) -> torch.Tensor:
        """The token id of each of ``n`` logit columns on ``device`` (made once)."""
        key = (n, device)
        if key not in self._tensors:
            self._tensors[key] = torch.arange(n, device=device) if self.ids is None else self.ids.to(device)
        return self._tensors[key]


@dataclass
class KVCache:
    self_k: list[torch.Tensor]  # per layer [B, H, capacity, Dh]
    self_v: list[torch.Tensor]
    cross_k: list[torch.Tensor]  # per layer [B, H, S, Dh]
    cross_v: list[torch.Tensor]
    cross_lengths: list[int] | None = None  # encoder positions each row attends to (ragged memories; None: all S)
    # a [B, 1, 1, S] mask kept by its owner in place of ``cross_lengths``' (a static decode's arena, at fixed
    # addresses; a padded decode's): every row then attends the whole width S under it, exact decoders too
    static_mask: torch.Tensor | None = None

    def rows(self, b: int | slice) -> "KVCache":
        """The first ``b`` rows (or the rows of slice ``b``), as views (the same memory: a static decode's batch of b
        rows in its arena, or rows joining it)."""
        s = slice(0, b) if isinstance(b, int) else b
        view = lambda ts: [t[s] for t in ts]  # noqa: E731
        return KVCache(view(self.self_k), view(self.self_v), view(self.cross_k), view(self.cross_v),
                       None if self.cross_lengths is None else self.cross_lengths[s],
                       None if self.static_mask is None else self.static_mask[s])

    def grown(self, room: int) -> "KVCache":
        """These rows with room for ``room`` in all (rows that join a decode later take the rest), or itself."""
        b = self.cross_k[0].shape[0]
        if room <= b:
            return self
        more = lambda ts: [torch.cat([t, t.new_zeros(room - b, *t.shape[1:])]) for t in ts]  # noqa: E731
        lengths = None if self.cross_lengths is None else self.cross_lengths + [self.cross_k[0].shape[2]] * (room - b)
        mask = None if self.static_mask is None else torch.cat([self.static_mask, self.static_mask.new_ones(
            room - b, *self.static_mask.shape[1:])])
        return KVCache(more(self.self_k), more(self.self_v), more(self.cross_k), more(self.cross_v), lengths, mask)

    def widened(self, s: int) -> "KVCache":
        """These rows with room for memories of ``s`` positions (each row still attends to its own length)."""
        b, full = self.cross_k[0].shape[0], self.cross_k[0].shape[2]
        if s <= full:
            return self
        wide = lambda ts: [F.pad(t, (0, 0, 0, s - full)) for t in ts]  # noqa: E731
        return KVCache(self.self_k, self.self_v, wide(self.cross_k), wide(self.cross_v),
                       self.cross_lengths or [full] * b)

    def put(self, at: int, other: "KVCache") -> None:
        """``other``'s rows written into rows ``at``.. (rows joining a decode); its memory may be shorter than these
        rows' (each row attends to its own length)."""
        j, s, full = other.cross_k[0].shape[0], other.cross_k[0].shape[2], self.cross_k[0].shape[2]
        for mine, theirs in zip((*self.self_k, *self.self_v), (*other.self_k, *other.self_v)):
            mine[at:at + j].copy_(theirs)
        for mine, theirs in zip((*self.cross_k, *self.cross_v), (*other.cross_k, *other.cross_v)):
            mine[at:at + j, :, :s].copy_(theirs)
        lengths = self.cross_lengths or [full] * self.cross_k[0].shape[0]
        lengths[at:at + j] = other.cross_lengths or [s] * j
        self.cross_lengths = lengths if min(lengths) < full else None

    def tensors(self) -> list[torch.Tensor]:
        """Every per-row tensor."""
        return [*self.self_k, *self.self_v, *self.cross_k, *self.cross_v]

    @cached_property
    def cross_mask(self) -> torch.Tensor | None:
        """[B, 1, 1, S]: the encoder positions each row attends to (None: all)."""
        if self.static_mask is not None:
            return self.static_mask
        if self.cross_lengths is None:
            return None
        return length_mask(self.cross_lengths, self.cross_k[0].shape[2], self.cross_k[0].device)

    @cached_property
    def cross_groups(self) -> list[tuple[int, slice | torch.Tensor]]:
        """The rows by memory length: (length, rows as a slice or an index), the way an exact decoder attends. A
        kernel's sums over masked padding differ from its sums over the row's own positions, so a row padded to
        its batch's longest memory would get other bits in other company: each length is attended on its own."""
        b, s = self.cross_k[0].shape[0], self.cross_k[0].shape[2]
        lengths = self.cross_lengths or [s] * b
        groups = []
        for n in dict.fromkeys(lengths):
            rows = [i for i, m in enumerate(lengths) if m == n]
            contiguous = rows == list(range(rows[0], rows[-1] + 1))
            groups.append((n, slice(rows[0], rows[-1] + 1) if contiguous
                           else torch.tensor(rows, device=self.cross_k[0].device)))
        return groups


def length_mask(lengths: list[int], width: int, device: torch.device) -> torch.Tensor:
    """[B, 1, 1, width]: True at the first ``lengths[b]`` encoder positions of row b."""
    return (torch.arange(width, device=device)[None, :] < torch.tensor(lengths, device=device)[:, None])[:, None, None]


class CrossKV(NamedTuple):
    """A decoder's cross-attention keys and values of some encoder output, per layer [B, H, S, Dh]."""
    keys: list[torch.Tensor]
    values: list[torch.Tensor]

    def map(self, f: Callable[[torch.Tensor], torch.Tensor]) -> CrossKV:
        """``f`` applied to every layer's keys and values."""
        return CrossKV([f(t) for t in self.keys], [f(t) for t in self.values])


def stack_cross(rows: list[CrossKV], width: int | None = None) -> CrossKV:
    """Rows' cross-attention keys and values [1, H, S_i, Dh] as one batch [B, H, max S (or ``width``), Dh] (zeros
    after each row's length: give the rows their lengths so that attention masks them)."""
    longest = max(width or 0, *(r.keys[0].shape[2] for r in rows))
    pad = lambda t: t if t.shape[2] == longest else F.pad(t, (0, 0, 0, longest - t.shape[2]))  # noqa: E731
    stack = lambda parts: [torch.cat([pad(t) for t in layer]) for layer in zip(*parts)]  # noqa: E731
    return CrossKV(stack([r.keys for r in rows]), stack([r.values for r in rows]))


# Exact rows: torch's CPU attention kernel takes other paths for 1-3 queries than for 4 or more (float32: 1, 2, 3 and
# 4+ queries give a row four different results; bfloat16 inside the real decoder too, though not in isolation: a
# probe of the kernel alone missed it and the dev set's text changed), and blocks the keys by their count, so a
# position's numbers would depend on how many positions a pass feeds and how long the cache looks. Passes of an exact
# decoder give attention at least EXACT_QUERIES queries (zero rows added) and the whole self-attention cache (at
# least EXACT_KEYS positions, masked); then a row's bits are the same in a 1-token step, a verify pass and a prompt
# (tests/decoding/test_compute.py checks it on the tiny model, eval/experiments/exact_rows.py and eval's identical-to-target on the real one).
EXACT_QUERIES = 4
EXACT_KEYS = 512



class _Layer:
    """Weights of one decoder layer, with the self-attention q, k, v projections fused."""

    def __init__(self, layer: nn.Module, linear: Linear, cross: Linear | None, dtype: torch.dtype):
        sa, ca = layer.self_attn, layer.encoder_attn
        self.heads = sa.num_heads
        self.scaling = sa.scaling
        cast = lambda t: t.detach().to(dtype)  # noqa: E731
        zero = torch.zeros_like(sa.q_proj.bias)
        self.qkv = linear(cast(torch.cat([sa.q_proj.weight, sa.k_proj.weight, sa.v_proj.weight])),
                          cast(torch.cat([sa.q_proj.bias, zero, sa.v_proj.bias])))
        weights = lambda m: linear(cast(m.weight), cast(m.bias))  # noqa: E731
        self.sa_out, self.ca_q, self.ca_out = weights(sa.out_proj), weights(ca.q_proj), weights(ca.out_proj)
        # cross-attention keys and values, computed once per window (many rows): with ``cross`` (int8 targets), else
        # as wide float layers
        cross = cross or (lambda weight, bias=None: Dense(weight, bias, wide=True))
        self.ca_k, self.ca_v = cross(cast(ca.k_proj.weight)), cross(cast(ca.v_proj.weight), cast(ca.v_proj.bias))
        self.fc1, self.fc2 = weights(layer.fc1), weights(layer.fc2)
        self.ca = ca
        norm = lambda m: m if m.weight.dtype == dtype else copy.deepcopy(m).to(dtype)  # noqa: E731
        self.ln1, self.ln2, self.ln3 = norm(layer.self_attn_layer_norm), norm(layer.encoder_attn_layer_norm), \
            norm(layer.final_layer_norm)


class CachedDecoder:
    """Runs a transformers ``WhisperDecoder`` and an output layer ``head`` [n, d] over a :class:`KVCache`.

    With ``head_ids`` the output layer covers only that token shortlist (row i scores token head_ids[i]:
    a reduced-vocabulary draft head): calls return logits over the shortlist with ``shortlist=True``
    (columns in ascending token order, see ``columns``), else over the full vocabulary with ``-inf``
    outside it. ``int8``: its linear layers run with int8 weights (:class:`Int8`), quantizing activations per
    ``"rows"`` (exact per row: targets) or per ``"tensor"`` (drafts on a CPU); None: in the weights' float.
    It computes in ``dtype`` (default: the decoder's float type, its embeddings') and returns float32 logits. Its
    linear layers give a row the same bits whatever the other rows (``models/linear.py``); ``exact`` (targets)
    makes attention do the same: a row's numbers do not depend on the other rows or positions of a pass (see ``EXACT_QUERIES`` and
    ``KVCache.cross_groups``). Drafts need not be exact: the target verifies what they propose.

    ``rest_ids`` (a shortlist draft's): tokens outside the shortlist that :meth:`rest` scores from the draft's last
    hidden state with the target's own output layer (Whisper ties it to the token embeddings, which the draft shares),
    in the layers' type: a word the shortlist lacks can still be proposed (``passes.draft``).

    ``traced`` (int8 drafts on a CPU): its few-token calls run as traced graphs (``traced_step.Traces``).
    """

    def __init__(self, decoder: nn.Module, head: torch.Tensor, head_ids: torch.Tensor | None = None,
                 int8: str | None = None, exact: bool = False, dtype: torch.dtype | None = None,
                 rest_ids: torch.Tensor | None = None, traced: bool = False):
        self.decoder = decoder
        self.int8 = int8
        self.exact = exact
        self.dtype = dtype or decoder.embed_tokens.weight.dtype
        # float layers row-exact (``project``), but a draft's on CUDA as plain products (one kernel each; on a CPU the
        # row-exact way measured fastest is as fast)
        linear: Linear = INT8_MODES[int8] if int8 else Plain if head.is_cuda and not exact else Dense
        # cross-attention keys and values of int8 decoders in int8 with one scale per row (a per-call scale over a
        # window's 1500 frames would blur a draft's keys); a draft's in float32 cost 6.6 ms per 400 frames
        cross = INT8_MODES["rows"] if int8 else None
        self.layers = [_Layer(layer, linear, cross, self.dtype) for layer in decoder.layers]
        self.final_norm = decoder.layer_norm if decoder.layer_norm.weight.dtype == self.dtype else \
            copy.deepcopy(decoder.layer_norm).to(self.dtype)
        self.vocab_size = decoder.embed_tokens.num_embeddings
        if head_ids is not None:
            head_ids, order = head_ids.sort()
            head = head[order]
        self.head_ids = head_ids
        self.columns = Columns(head_ids)
        self.head = linear(head.detach().to(self.dtype))
        self.rest_ids = None if rest_ids is None else rest_ids.sort().values
        self.rest_head = None if rest_ids is None else \
            linear(decoder.embed_tokens.weight.detach()[self.rest_ids].to(self.dtype))
        self.max_positions = decoder.embed_positions.weight.shape[0]
        # float layers hold oneDNN's packed weights, which a trace cannot keep
        self.traces = self._traces() if traced and int8 and not exact else None

    def _traces(self) -> Traces:
        """Its few-token calls as traced graphs: the call with ``fixed``, over a cache of the given tensors."""
        n = len(self.layers)
        layers = [v for layer in self.layers for v in vars(layer).values()] + [self.head, self.rest_head]
        return Traces(lambda cache, tokens, positions, at, shortlist, hidden: self._forward(
                          cache, tokens, positions, at, shortlist, None, True, 0, hidden),
                      lambda ts: KVCache(*(ts[j * n:(j + 1) * n] for j in range(4))),
                      [self.decoder, self.final_norm, *(m for x in self.layers for m in (x.ln1, x.ln2, x.ln3))],
                      [x.packed for x in layers if isinstance(x, Int8) and x.cpu])

    @property
    def device(self) -> torch.device:
        return self.final_norm.weight.device

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
        ragged = lengths is not None and min(lengths) < encoder_out.shape[1]
        return KVCache(self_k, self_v, cross_k, cross_v, list(lengths) if ragged else None)

    @torch.inference_mode()
    def cross_kv(self, encoder_out: torch.Tensor, fixed: bool = False) -> CrossKV:
        """The cross-attention keys and values of encoder outputs [B, S, D], per layer [B, H, S, Dh]. A position's
        depend on its own output only, so a growing buffer's can be computed a piece at a time (streaming).
        ``fixed``: ``encoder_out``'s shape never changes (a stream engine's full windows, filled to a fixed number of
        rows): one product per layer, a position's bits depending on that shape only."""
        b = encoder_out.shape[0]
        encoder_out = encoder_out.to(self.dtype)
        keys, values = [], []
        for layer in self.layers:
            h, dh = layer.heads, layer.ca.k_proj.out_features // layer.heads
            split = lambda t: t.view(b, -1, h, dh).transpose(1, 2).contiguous()  # noqa: E731
            keys.append(split(layer.ca_k.fixed(encoder_out) if fixed else layer.ca_k(encoder_out)))
            values.append(split(layer.ca_v.fixed(encoder_out) if fixed else layer.ca_v(encoder_out)))
        return CrossKV(keys, values)

    @torch.inference_mode()
    def __call__(self, cache: KVCache, tokens: torch.Tensor, positions: torch.Tensor,
                 logits_at: torch.Tensor | None = None, shortlist: bool = False,
                 cross_scores: dict[int, Sequence[int] | torch.Tensor] | None = None, fixed: bool = False,
                 scores_from: int = 0, hidden: bool = False) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Feed ``tokens`` [B, T] at ``positions`` [B, T]; return logits [B, T', V] at the time
        indices ``logits_at`` [B, T'] (all T when None). ``cross_scores`` {layer: heads, ...}: each entry is
        replaced by those heads' cross-attention scores before the softmax of the queries from ``scores_from`` on
        [B, len(heads), T - scores_from, S] (word timing).
        ``fixed``: attend over the whole self-attention cache, masked (as an exact decoder does), so that no shape
        depends on the positions and the call never reads the device (a CUDA graph's capture). ``hidden``: also
        the final layer norm's output at those indices [B, T', D] (what :meth:`rest` reads)."""
        if self.traces is not None and cross_scores is None and self.traces.takes(cache, tokens, logits_at):
            return self.traces(cache, tokens, positions, logits_at, shortlist, hidden)
        return self._forward(cache, tokens, positions, logits_at, shortlist, cross_scores, fixed, scores_from, hidden)

    def _forward(self, cache: KVCache, tokens: torch.Tensor, positions: torch.Tensor,
                 logits_at: torch.Tensor | None, shortlist: bool,
                 cross_scores: dict[int, Sequence[int] | torch.Tensor] | None, fixed: bool,
                 scores_from: int, hidden: bool) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """:meth:`__call__`'s work, in Python."""
        b, t = tokens.shape
        dec = self.decoder
        pos = positions.clamp(max=self.max_positions - 1)
        x = (dec.embed_tokens(tokens) + dec.embed_positions.weight[pos]).to(self.dtype)
        keys = cache.self_k[0].shape[2] if self.exact or fixed else int(positions.max()) + 1
        mask = torch.arange(keys, device=tokens.device)[None, None, None, :] <= positions[:, None, :, None]
        pad = max(0, EXACT_QUERIES - t) if self.exact else 0
        if pad:  # zero queries that see every key; their outputs are dropped
            mask = torch.cat([mask, mask.new_ones(b, 1, pad, keys)], 2)
        def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, m: torch.Tensor | None) -> torch.Tensor:
            # an exact decoder's queries always contiguous: the kernel's products take another path for a strided view
            # (float32 on the CPU: other bits); a draft's as they come (a copy less: a kernel less on CUDA)
            q = F.pad(q, (0, 0, 0, pad)) if pad else q.contiguous() if self.exact else q
            return network.attend(q, k, v, m, exact=self.exact)[:, :, :t]

        def cross(q: torch.Tensor, i: int, heads: list[int] | None) -> torch.Tensor:
            """Cross-attention of layer i (with ``heads``, their scores before the softmax into ``cross_scores``). Each
            memory length's rows attend on their own (``KVCache.cross_groups``): an exact decoder's bits must not
            depend on the padding, and on a CPU a draft reads only its rows' own positions, not the longest row's
            (results.md, "Pass budget at batch 8"). A draft on CUDA, and any decoder over a cache with a kept mask
            (``static_mask``: a static decode's arena, or a padded decode's rows: their bits then depend on their own
            length and the fixed width only), masks instead: one call (a few kernels against a call per length)."""
            k, v = cache.cross_k[i], cache.cross_v[i]
            masked = cache.static_mask is not None or (not self.exact and q.is_cuda)
            scores = heads is not None
            if masked and not scores:  # one masked call, its output as it is
                return attend(q, k, v, cache.cross_mask)
            groups = [(k.shape[2], slice(None))] if masked else cache.cross_groups
            mask = cache.cross_mask if masked else None
            if not (self.exact or scores) and len(groups) == 1:  # one length: the draft's call, its output as it is
                n = groups[0][0]
                return attend(q, k, v, None) if n == k.shape[2] else attend(q, k[:, :, :n], v[:, :, :n], None)
            if scores:
                cross_scores[i] = torch.zeros(b, len(heads), t - scores_from, k.shape[2], device=q.device)
            out = torch.empty_like(q)
            for n, rows in groups:
                qg, kg = q[rows], k[rows, :, :n]
                out[rows] = attend(qg, kg, v[rows, :, :n], mask)
                if scores:
                    qh = qg[:, heads, scores_from:]
                    m = qh.shape[2]
                    qh = F.pad(qh, (0, 0, 0, max(0, EXACT_QUERIES - m))) if self.exact else qh
                    cross_scores[i][rows, :, :, :n] = (qh @ kg[:, heads].transpose(-1, -2))[:, :, :m].float()
            return out

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
            a = cross(q, i, list(cross_scores[i]) if cross_scores is not None and i in cross_scores else None)
            x = x + layer.ca_out(a.transpose(1, 2).reshape(b, t, -1))
            x = x + layer.fc2(F.gelu(layer.fc1(layer.ln3(x))))
        if logits_at is not None:
            x = x.gather(1, logits_at[:, :, None].expand(-1, -1, x.shape[-1]))
        x = self.final_norm(x)
        logits = self.head(x).float()
        if self.head_ids is None or shortlist:
            return (logits, x) if hidden else logits
        full = logits.new_full((*logits.shape[:-1], self.vocab_size), float("-inf"))
        full.index_copy_(-1, self.head_ids, logits)
        return (full, x) if hidden else full

    def rest(self, hidden: torch.Tensor) -> torch.Tensor:
        """Logits [N, len(rest_ids)] (float32) of the tokens outside the shortlist for hidden states [N, D]
        (``__call__``'s ``hidden``)."""
        return self.rest_head(hidden).float()
