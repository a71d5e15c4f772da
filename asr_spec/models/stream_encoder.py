"""A Whisper encoder for a growing buffer that encodes each audio frame a bounded number of times.

Whisper's encoder is bidirectional: every position of a window attends to every other, so re-encoding a buffer as
it grows costs the whole buffer at every step. Here the positions of a buffer are split in two:
- frozen: encoded once, when they were ``lookahead`` positions or more from the buffer's end; their self-attention
  keys and values (per layer) and their output are kept;
- the tail: the newest positions and the silence padded after them, re-encoded at every step; they attend to the
  frozen keys and values and to each other (the frozen positions do not see the audio that came after them).

So a step costs the tail, not the buffer. The frozen positions were encoded hearing only ``lookahead`` of what
followed them, which changes what the decoder reads a little (its streaming WER: README, "what changes the text"). Positions
are counted from the buffer's start: a buffer trimmed at its start is encoded afresh (:meth:`EncoderCache.truncate` to 0).
With nothing frozen, a step computes exactly what :meth:`~asr_spec.models.network.Encoder.forward` does.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from .network import attend

CONV_CONTEXT = 4  # mel frames before the first re-encoded position that its two convolutions read


@dataclass
class EncoderCache:
    """The frozen positions of one buffer: per layer, their self-attention keys and values [1, H, F, Dh], and their
    output [1, F, D]."""
    keys: list[torch.Tensor] = field(default_factory=list)
    values: list[torch.Tensor] = field(default_factory=list)
    out: torch.Tensor | None = None

    @property
    def frozen(self) -> int:
        return 0 if self.out is None else self.out.shape[1]

    def truncate(self, positions: int) -> None:
        """Keep the first ``positions`` frozen positions only (they are what a shorter buffer would have frozen)."""
        if positions <= 0:
            self.keys, self.values, self.out = [], [], None
        elif positions < self.frozen:
            self.keys = [k[:, :, :positions] for k in self.keys]
            self.values = [v[:, :, :positions] for v in self.values]
            self.out = self.out[:, :positions]


@dataclass
class Tail:
    """What one buffer's step gives :func:`encode_tails`: its log-mel frames from ``first_frame(cache)`` on
    ([n_mels, M]), its cache, the positions to freeze and the positions that hold audio (None: all)."""
    mel: torch.Tensor
    cache: EncoderCache
    freeze: int
    audio: int | None = None


@torch.inference_mode()
def encode_tail(encoder: nn.Module, mel: torch.Tensor, cache: EncoderCache, freeze: int,
                audio: int | None = None) -> torch.Tensor:
    """One buffer's step (:func:`encode_tails` of one): ``mel`` [1, n_mels, M]."""
    return encode_tails(encoder, [Tail(mel[0], cache, freeze, audio)])[0]


@torch.inference_mode()
def encode_tails(encoder: nn.Module, tails: list[Tail]) -> list[torch.Tensor]:
    """Each buffer's encoder output [1, S, D] (float32), all buffers in one forward: the positions from
    ``cache.frozen`` on are computed (their log-mel frames from ``first_frame(cache)`` on are ``mel``; frames before it
    are not read), those before come from the cache. Positions up to ``freeze`` (of those computed) join the frozen
    ones; with ``audio`` (the positions that hold audio; silence pads the rest) they attend to audio only, so that what
    they keep does not depend on the padding (a stream pads a different length of silence at each step).

    The buffers' new positions go through each linear layer together (one call per layer for all of them); each
    buffer attends over its own frozen and new positions alone, and its convolutions read its own frames. So a
    buffer's numbers are those it gets encoded alone wherever the linear layers are row-exact (int8 ones: one scale
    per row; bfloat16 on the CPUs measured), else within the float's rounding. ``encoder``: a
    ``network.Encoder`` (its linear layers may be int8 ones)."""
    dtype = encoder.conv1.weight.dtype
    xs, spans, masks = [], [], []
    for t in tails:
        frozen = t.cache.frozen
        x = F.gelu(encoder.conv1(t.mel[None].to(dtype)))
        x = F.gelu(encoder.conv2(x)).permute(0, 2, 1)[0]
        x = x[frozen - first_frame(t.cache) // 2:]  # the positions before ``frozen`` read the start's zero padding
        end = frozen + x.shape[0]
        xs.append(x + encoder.embed_positions.weight[frozen:end])
        n = max(0, min(t.freeze, end) - frozen)
        mask = None
        if n and t.audio is not None and t.audio < end:
            mask = torch.ones(end - frozen, end, dtype=torch.bool, device=x.device)
            mask[:n, t.audio:] = False
        spans.append((frozen, x.shape[0], n))
        masks.append(mask)
    x = torch.cat(xs)  # [sum of new positions, D]: the rows of every linear layer's one call
    fresh: list[list[tuple[torch.Tensor, torch.Tensor]]] = [[] for _ in tails]
    for i, layer in enumerate(encoder.layers):
        attn = layer.self_attn
        h = layer.self_attn_layer_norm(x)
        heads = lambda y: y.view(-1, attn.num_heads, attn.head_dim).transpose(0, 1)[None]  # noqa: E731
        q, k, v = attn.q_proj(h) * attn.scaling, attn.k_proj(h), attn.v_proj(h)
        out, row = [], 0
        for j, (t, (frozen, new, _)) in enumerate(zip(tails, spans)):
            qj, kj, vj = (heads(y[row:row + new]) for y in (q, k, v))
            fresh[j].append((kj, vj))
            if frozen:
                kj, vj = torch.cat([t.cache.keys[i], kj], 2), torch.cat([t.cache.values[i], vj], 2)
            a = attend(qj, kj, vj, masks[j])
            out.append(a[0].transpose(0, 1).reshape(new, -1))
            row += new
        x = x + attn.out_proj(torch.cat(out))
        x = x + layer.fc2(F.gelu(layer.fc1(layer.final_layer_norm(x))))
    x = encoder.layer_norm(x)
    outs, row = [], 0
    for t, (frozen, new, n), kept in zip(tails, spans, fresh):
        out = x[row:row + new][None]
        row += new
        whole = torch.cat([t.cache.out, out], 1) if frozen else out
        if n:
            cache = t.cache
            for i, (k, v) in enumerate(kept):
                k, v = k[:, :, :n], v[:, :, :n]
                if frozen:
                    cache.keys[i], cache.values[i] = torch.cat([cache.keys[i], k], 2), torch.cat([cache.values[i], v], 2)
                else:
                    cache.keys.append(k.contiguous())
                    cache.values.append(v.contiguous())
            cache.out = whole[:, :frozen + n].contiguous()
        outs.append(whole.float())
    return outs


def first_frame(cache: EncoderCache) -> int:
    """The first log-mel frame :func:`encode_tail` reads for ``cache``: its convolutions' context before the first
    position it computes (position p reads frames 2p - 2 .. 2p + 2; frames before 2p - 2 only feed positions that
    are not kept)."""
    return max(0, 2 * cache.frozen - CONV_CONTEXT)
