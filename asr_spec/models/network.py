"""Whisper's networks in plain torch, read from and written to transformers' directory format.

The parameter names are transformers' (``model.encoder.layers.0.self_attn.q_proj.weight``, ``proj_out.weight``), so a
transformers Whisper directory (``config.json`` + ``model.safetensors``) loads here and what we write loads there.
transformers itself is not imported: it costs ~4 s of a process's start (AMD EPYC, 2 cores), more than a short
file's whole transcription. The encoder's forward is transformers' (eager and SDPA) operation for operation, so its
bits are the same (tests/models/test_models.py), except bfloat16 attention on CPUs without AMX (:func:`attend`); the
decoder's inference runs in :class:`~asr_spec.models.kv_decoder.CachedDecoder`, which reads these modules' weights;
:meth:`Decoder.forward` (causal, whole sequences) is what ``asr_spec distill`` trains.
"""
from __future__ import annotations

import functools
import json
from contextlib import nullcontext
from dataclasses import dataclass, field, fields
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel

from .compute import amx

WEIGHTS = "model.safetensors"
Device = str | torch.device | None
BLOCK = 256  # queries per block of :func:`blocked_attention`'s products
_FUSED_BFLOAT16 = amx()  # PyTorch's fused CPU attention computes bfloat16 in bfloat16 products only with AMX
# The attention kernels every model here may use on CUDA. Left to choose, torch picks cuDNN's attention for float16,
# and cuDNN plans anew for every new shape: 2-3 ms a call with a stream's changing lengths (H100, the decoder: 70 % of
# the live engine's time; H200, the streaming encoder's per-buffer calls: 1.5 ms each, 62 % of it). The
# memory-efficient kernel takes masks too and plans nothing.
CUDA_ATTENTION = [SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None,
           causal: bool = False, exact: bool = False) -> torch.Tensor:
    """Attention of scaled queries ``q`` [B, H, T, d] over keys and values [B, H, S, d]; ``mask`` [T, S] or
    [B, 1, T, S] (or [B, 1, 1, S]): True where a query may attend; ``causal``: each query to the keys up to its own
    position. PyTorch's fused kernel, except bfloat16 on a CPU without AMX (:func:`blocked_attention`), where the
    fused kernel computes in float32 products; on CUDA one of :data:`CUDA_ATTENTION`. ``exact`` (an exact decoder's
    call): a query's bits must not depend on the other queries of the call, so the blocks are taken only where this
    CPU's products were found to keep rows apart (:func:`rows_apart`)."""
    if q.dtype == torch.bfloat16 and q.device.type == "cpu" and not causal and not _FUSED_BFLOAT16 \
            and (not exact or rows_apart(torch.get_num_threads())):
        return blocked_attention(q, k, v, mask)
    with sdpa_kernel(CUDA_ATTENTION) if q.is_cuda else nullcontext():
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=1.0, is_causal=causal and q.shape[2] > 1)


@functools.cache
def rows_apart(threads: int) -> bool:
    """Whether :func:`blocked_attention` in bfloat16 gives a query the same bits alone and beside other queries and
    batch rows (1-33 queries, 1-8 rows, 4 and 1500 keys) with this many threads: the CPU's products decide, so it is
    tried once per process (on an AVX512-BF16 EPYC: yes)."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(8, 8, n, 64, generator=g).bfloat16() for n in (33, 1500, 1500))
    for s in (4, 1500):
        one = blocked_attention(q[:1, :, :1], k[:1, :, :s], v[:1, :, :s])
        if not all(torch.equal(blocked_attention(q[:b, :, :m], k[:b, :, :s], v[:b, :, :s])[:1, :, :1], one)
                   for b in (1, 8) for m in (4, 5, 33)):
            return False
    return True


def blocked_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None,
                      block: int = BLOCK) -> torch.Tensor:
    """:func:`attend` in the inputs' type per block of ``block`` queries, its softmax taken apart: the scores'
    exponentials (no maximum subtracted: a scaled Whisper score is far inside float's range), their product with
    the values and their sum, then one division per output (the scores, the exponentials and the sums rounded to
    the type; a block's numbers stay in cache). A row whose exponentials' sum is out of range (an overflow, or all
    of them vanishing) is computed again the usual way (:func:`_softmax_block`). With bfloat16 on an AVX512-BF16
    CPU (AMD EPYC, 2 threads) a whisper-base encoder layer's attention takes 8.1-8.5 ms against 24-25 with the
    fused kernel (11.8 with PyTorch's softmax in these blocks); its output is
    within bfloat16's rounding of float32's. Each row's result depends on its own inputs only, as the fused
    kernel's."""
    kt = k.transpose(-1, -2)
    if q.shape[2] <= block:  # a decoder's call: one block
        return _block(q, kt, v, mask)
    out = torch.empty_like(q)
    for i in range(0, q.shape[2], block):
        _block(q[:, :, i:i + block], kt, v, None if mask is None else mask[..., i:i + block, :], out[:, :, i:i + block])
    return out


# the sums of exponentials taken as they are within e^±69: below, precision is lost (float's smallest normal number
# is 1.2e-38); above, an exponential or a product with the values may overflow (float's largest number is 3.4e38)
_LOG_SUMS = 69.0


def _block(q: torch.Tensor, kt: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None,
           out: torch.Tensor | None = None) -> torch.Tensor:
    """One block of :func:`blocked_attention` (into ``out`` if given)."""
    p = torch.matmul(q, kt)
    if mask is not None:
        p.masked_fill_(~mask, float("-inf"))
    p.exp_()
    total = p.sum(-1, keepdim=True)
    o = torch.div(torch.matmul(p, v), total, out=out)
    spread = total.log_().abs_()  # each row's |log sum|, in the sums' place (no longer needed)
    if spread.amax().item() > _LOG_SUMS:  # rare: those rows the usual way
        o.copy_(torch.where(spread > _LOG_SUMS, _softmax_block(q, kt, v, mask), o))
    return o


def _softmax_block(q: torch.Tensor, kt: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """One block's attention with PyTorch's softmax (its maximum subtracted)."""
    scores = torch.matmul(q, kt)
    if mask is not None:
        scores.masked_fill_(~mask, float("-inf"))
    return torch.matmul(scores.softmax(-1), v)


@dataclass(frozen=True)
class Config:
    """A Whisper's shape (transformers' ``WhisperConfig`` names and defaults); ``extra`` keeps every other key of
    ``config.json`` (token ids, architectures) for writing it back."""

    vocab_size: int = 51865
    num_mel_bins: int = 80
    d_model: int = 384
    encoder_layers: int = 4
    decoder_layers: int = 4
    encoder_attention_heads: int = 6
    decoder_attention_heads: int = 6
    encoder_ffn_dim: int = 1536
    decoder_ffn_dim: int = 1536
    max_source_positions: int = 1500
    max_target_positions: int = 448
    extra: dict = field(default_factory=dict, compare=False)

    @classmethod
    def from_dict(cls, d: dict) -> Config:
        names = {f.name for f in fields(cls)} - {"extra"}
        if d.get("activation_function", "gelu") != "gelu":
            raise ValueError(f"activation {d['activation_function']!r}: Whisper's is gelu")
        return cls(**{k: d[k] for k in names if k in d}, extra={k: v for k, v in d.items() if k not in names})

    @classmethod
    def from_dir(cls, path: Path) -> Config:
        return cls.from_dict(json.loads((path / "config.json").read_text()))

    def to_dict(self) -> dict:
        return {"model_type": "whisper", **self.extra,
                **{f.name: getattr(self, f.name) for f in fields(self) if f.name != "extra"}}

    def with_decoder_layers(self, layers: int) -> Config:
        d = self.to_dict()
        return Config.from_dict({**d, "decoder_layers": layers, "architectures": ["WhisperForCausalLM"]})


class Table(nn.Module):
    """An embedding table (``nn.Embedding``'s ``weight`` and lookup). Not ``nn.Embedding`` itself: building one
    imports ``torch._dynamo`` on this torch (2.13), ~1 s of every process's start."""

    def __init__(self, rows: int, width: int, device: Device = None):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(rows, width, device=device))
        if self.weight.device.type != "meta":
            nn.init.normal_(self.weight)

    @property
    def num_embeddings(self) -> int:
        return self.weight.shape[0]

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(ids, self.weight)


class Attention(nn.Module):
    """Multi-head attention with Whisper's projections (the key projection has no bias)."""

    def __init__(self, width: int, heads: int, device: Device = None):
        super().__init__()
        self.num_heads, self.head_dim = heads, width // heads
        self.scaling = self.head_dim ** -0.5
        self.k_proj = nn.Linear(width, width, bias=False, device=device)
        self.v_proj = nn.Linear(width, width, device=device)
        self.q_proj = nn.Linear(width, width, device=device)
        self.out_proj = nn.Linear(width, width, device=device)

    def forward(self, x: torch.Tensor, memory: torch.Tensor | None = None, causal: bool = False) -> torch.Tensor:
        """``x`` [B, T, D] attending to itself (``causal``: each position to those before it) or to ``memory``."""
        b, t, _ = x.shape
        src = x if memory is None else memory
        heads = lambda y: y.view(b, -1, self.num_heads, self.head_dim).transpose(1, 2).contiguous()  # noqa: E731
        q = heads(self.q_proj(x) * self.scaling)  # scaled before the product, as openai/whisper and transformers
        a = attend(q, heads(self.k_proj(src)), heads(self.v_proj(src)), causal=causal)
        return self.out_proj(a.transpose(1, 2).contiguous().reshape(b, t, -1).contiguous())


class EncoderLayer(nn.Module):
    def __init__(self, c: Config, device: Device = None):
        super().__init__()
        self.self_attn = Attention(c.d_model, c.encoder_attention_heads, device)
        self.self_attn_layer_norm = nn.LayerNorm(c.d_model, device=device)
        self.fc1 = nn.Linear(c.d_model, c.encoder_ffn_dim, device=device)
        self.fc2 = nn.Linear(c.encoder_ffn_dim, c.d_model, device=device)
        self.final_layer_norm = nn.LayerNorm(c.d_model, device=device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.self_attn_layer_norm(x))
        x = x + self.fc2(F.gelu(self.fc1(self.final_layer_norm(x))))
        if x.dtype == torch.float16:  # as transformers: keep float16 activations finite
            bound = torch.finfo(x.dtype).max - 1000
            x = x.clamp(-bound, bound)
        return x


class DecoderLayer(nn.Module):
    def __init__(self, c: Config, device: Device = None):
        super().__init__()
        self.self_attn = Attention(c.d_model, c.decoder_attention_heads, device)
        self.self_attn_layer_norm = nn.LayerNorm(c.d_model, device=device)
        self.encoder_attn = Attention(c.d_model, c.decoder_attention_heads, device)
        self.encoder_attn_layer_norm = nn.LayerNorm(c.d_model, device=device)
        self.fc1 = nn.Linear(c.d_model, c.decoder_ffn_dim, device=device)
        self.fc2 = nn.Linear(c.decoder_ffn_dim, c.d_model, device=device)
        self.final_layer_norm = nn.LayerNorm(c.d_model, device=device)

    def forward(self, x: torch.Tensor, memory: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.self_attn_layer_norm(x), causal=True)
        x = x + self.encoder_attn(self.encoder_attn_layer_norm(x), memory)
        return x + self.fc2(F.gelu(self.fc1(self.final_layer_norm(x))))


class Encoder(nn.Module):
    def __init__(self, c: Config, device: Device = None):
        super().__init__()
        self.conv1 = nn.Conv1d(c.num_mel_bins, c.d_model, kernel_size=3, padding=1, device=device)
        self.conv2 = nn.Conv1d(c.d_model, c.d_model, kernel_size=3, stride=2, padding=1, device=device)
        self.embed_positions = Table(c.max_source_positions, c.d_model, device)
        self.layers = nn.ModuleList(EncoderLayer(c, device) for _ in range(c.encoder_layers))
        self.layer_norm = nn.LayerNorm(c.d_model, device=device)

    def forward(self, mel: torch.Tensor) -> torch.Tensor:
        """Encoder output [B, frames / 2, D] for log-mel [B, n_mels, frames], any even number of frames up to a
        30 s window's 3000: the positional embeddings are sliced to the input's length (on 3000 frames exactly
        transformers' computation; on fewer, whisper.cpp's ``audio_ctx``, which changes the text a little)."""
        x = F.gelu(self.conv1(mel))
        x = F.gelu(self.conv2(x)).permute(0, 2, 1)
        # in rows, once: the sum would keep the permuted layout, and every layer after it would copy its input
        # (layer norms) or add across strides (residuals): the same bits, 6-14 % of an encoder's time on a CPU
        x = (x + self.embed_positions.weight[: x.shape[1]]).contiguous()
        for layer in self.layers:
            x = layer(x)
        return self.layer_norm(x)


class Decoder(nn.Module):
    def __init__(self, c: Config, device: Device = None):
        super().__init__()
        self.embed_tokens = Table(c.vocab_size, c.d_model, device)
        self.embed_positions = Table(c.max_target_positions, c.d_model, device)
        self.layers = nn.ModuleList(DecoderLayer(c, device) for _ in range(c.decoder_layers))
        self.layer_norm = nn.LayerNorm(c.d_model, device=device)

    def forward(self, tokens: torch.Tensor, memory: torch.Tensor) -> torch.Tensor:
        """Hidden states [B, T, D] of whole token sequences [B, T] (from position 0) over encoder outputs."""
        x = self.embed_tokens(tokens) + self.embed_positions.weight[: tokens.shape[1]]
        for layer in self.layers:
            x = layer(x, memory)
        return self.layer_norm(x)


class _Parts(nn.Module):
    def __init__(self, c: Config, encoder: bool, device: Device):
        super().__init__()
        if encoder:
            self.encoder = Encoder(c, device)
        self.decoder = Decoder(c, device)


class Network(nn.Module):
    """A whole Whisper (``encoder=True``: transformers' ``WhisperForConditionalGeneration``) or a decoder alone
    (distil-Whisper's drafts: ``WhisperForCausalLM``), its output layer tied to the token embeddings. ``device``
    "meta": nothing allocated or drawn (for weights loaded next)."""

    def __init__(self, config: Config, encoder: bool = True, device: Device = None):
        super().__init__()
        self.config = config
        self.model = _Parts(config, encoder, device)
        self.proj_out = nn.Linear(config.d_model, config.vocab_size, bias=False, device=device)
        self.proj_out.weight = self.model.decoder.embed_tokens.weight

    @property
    def dtype(self) -> torch.dtype:
        return self.model.decoder.embed_tokens.weight.dtype

    @property
    def has_encoder(self) -> bool:
        return hasattr(self.model, "encoder")


def read_weights(path: Path, device: str | torch.device = "cpu") -> dict[str, torch.Tensor]:
    """A transformers directory's tensors: ``model.safetensors``, its shards (``model.safetensors.index.json``) or
    ``pytorch_model.bin``."""
    from safetensors.torch import load_file

    if (path / WEIGHTS).exists():
        return load_file(str(path / WEIGHTS), device=str(device))
    if (index := path / f"{WEIGHTS}.index.json").exists():
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        return {k: v for shard in shards for k, v in load_file(str(path / shard), device=str(device)).items()}
    if (path / "pytorch_model.bin").exists():
        return torch.load(path / "pytorch_model.bin", map_location=device, weights_only=True)
    raise FileNotFoundError(f"{path}: no {WEIGHTS} (or shards, or pytorch_model.bin)")


def load_network(path: Path, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu") -> Network:
    """The network of a transformers Whisper directory, in ``dtype`` on ``device``, for inference."""
    config = Config.from_dir(path)
    arch = (config.extra.get("architectures") or ["WhisperForConditionalGeneration"])[0]
    tensors = read_weights(path, device)
    tensors = {k.removeprefix("model.") if k.startswith("model.model.") else k: v for k, v in tensors.items()}
    net = Network(config, encoder=arch != "WhisperForCausalLM", device="meta")
    tensors.setdefault("proj_out.weight", tensors["model.decoder.embed_tokens.weight"])
    missing, unexpected = net.load_state_dict(tensors, strict=False, assign=True)
    if missing or unexpected:
        raise ValueError(f"weights do not fit a Whisper of this config: missing {missing[:5]}, unexpected "
                         f"{unexpected[:5]}")
    net.proj_out.weight = net.model.decoder.embed_tokens.weight  # tied again after assign
    return net.to(device=device, dtype=dtype).eval().requires_grad_(False)


def save_network(config: Config, tensors: dict[str, torch.Tensor], path: Path) -> None:
    """``config.json`` and ``model.safetensors`` (the tied output layer not repeated), as transformers writes them."""
    from safetensors.torch import save_file

    path.mkdir(parents=True, exist_ok=True)
    doc = {"architectures": ["WhisperForConditionalGeneration"], "tie_word_embeddings": True,
           "activation_function": "gelu", **config.to_dict()}
    (path / "config.json").write_text(json.dumps(doc, indent=1))
    kept = {k: v.contiguous() for k, v in tensors.items() if k != "proj_out.weight"}
    save_file(kept, str(path / WEIGHTS), metadata={"format": "pt"})
