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
With nothing frozen, a step computes exactly what :func:`~asr_spec.models.loader.encoder_forward` does.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

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


@torch.inference_mode()
def encode_tail(encoder: nn.Module, mel: torch.Tensor, cache: EncoderCache, freeze: int,
                audio: int | None = None) -> torch.Tensor:
    """The encoder output [1, S, D] (float32) of a buffer whose log-mel frames from ``2 * cache.frozen - 4`` on are
    ``mel`` [1, n_mels, M] (``first_frame(cache)`` says where ``mel`` must start; frames before it are not read):
    positions ``cache.frozen`` .. S are computed, those before come from the cache. Positions up to ``freeze`` (of
    those computed) join the frozen ones; with ``audio`` (the positions that hold audio; silence pads the rest) they
    attend to audio only, so that what they keep does not depend on the padding (a stream pads a different length
    of silence at each step). ``encoder``: a transformers ``WhisperEncoder`` (its linear layers may be int8 ones:
    they are exact per row, so a position's numbers do not depend on the others computed with it)."""
    frozen = cache.frozen
    dtype = encoder.conv1.weight.dtype
    x = F.gelu(encoder.conv1(mel.to(dtype)))
    x = F.gelu(encoder.conv2(x)).permute(0, 2, 1)
    x = x[:, frozen - first_frame(cache) // 2:]  # the positions before ``frozen`` read the start's zero padding
    end = frozen + x.shape[1]
    x = x + encoder.embed_positions.weight[frozen:end]
    n = max(0, min(freeze, end) - frozen)
    mask = None
    if n and audio is not None and audio < end:
        mask = torch.ones(end - frozen, end, dtype=torch.bool, device=x.device)
        mask[:n, audio:] = False
    fresh: list[tuple[torch.Tensor, torch.Tensor]] = []
    for i, layer in enumerate(encoder.layers):
        attn = layer.self_attn
        h = layer.self_attn_layer_norm(x)
        b, t, _ = h.shape
        split = lambda y: y.view(b, t, attn.num_heads, attn.head_dim).transpose(1, 2)  # noqa: E731
        q, k, v = split(attn.q_proj(h) * attn.scaling), split(attn.k_proj(h)), split(attn.v_proj(h))
        fresh.append((k, v))
        if frozen:
            k, v = torch.cat([cache.keys[i], k], 2), torch.cat([cache.values[i], v], 2)
        a = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=1.0)
        x = x + attn.out_proj(a.transpose(1, 2).reshape(b, t, -1))
        x = x + layer.fc2(F.gelu(layer.fc1(layer.final_layer_norm(x))))
    out = encoder.layer_norm(x)
    whole = torch.cat([cache.out, out], 1) if frozen else out
    if n:
        for i, (k, v) in enumerate(fresh):
            k, v = k[:, :, :n], v[:, :, :n]
            if frozen:
                cache.keys[i], cache.values[i] = torch.cat([cache.keys[i], k], 2), torch.cat([cache.values[i], v], 2)
            else:
                cache.keys.append(k.contiguous())
                cache.values.append(v.contiguous())
        cache.out = whole[:, :frozen + n].contiguous()
    return whole.float()


def first_frame(cache: EncoderCache) -> int:
    """The first log-mel frame :func:`encode_tail` reads for ``cache``: its convolutions' context before the first
    position it computes (position p reads frames 2p - 2 .. 2p + 2; frames before 2p - 2 only feed positions that
    are not kept)."""
    return max(0, 2 * cache.frozen - CONV_CONTEXT)
