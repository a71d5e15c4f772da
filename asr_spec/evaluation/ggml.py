"""A transformers-format Whisper as whisper.cpp's ggml model file, for ``asr_spec eval``'s whisper.cpp peer.

The layout whisper.cpp's loader reads (its ``models/convert-h5-to-ggml.py`` writes the same from a transformers
folder): the magic ``ggml``; eleven int32 hyper-parameters; the mel filter bank (int32 rows, int32 columns, float32
values); the BPE vocabulary in id order (int32 count, then each token's bytes, int32-length-prefixed: whisper.cpp
names the special tokens after it itself); then every tensor under openai-whisper's name (int32 dimensions, name
length and type, the dimensions innermost first, the name, the data), matrices as float16 and vectors, the conv
biases (as [n, 1]) and the position tables as float32. The output layer is the token embedding (tied) and is not
written.
"""
from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np

from ..features import mel_filters
from ..models.network import Config, read_weights

MAGIC = 0x67676D6C
_PARTS = {"self_attn.q_proj": "attn.query", "self_attn.k_proj": "attn.key", "self_attn.v_proj": "attn.value",
          "self_attn.out_proj": "attn.out", "self_attn_layer_norm": "attn_ln",
          "encoder_attn.q_proj": "cross_attn.query", "encoder_attn.k_proj": "cross_attn.key",
          "encoder_attn.v_proj": "cross_attn.value", "encoder_attn.out_proj": "cross_attn.out",
          "encoder_attn_layer_norm": "cross_attn_ln", "fc1": "mlp.0", "fc2": "mlp.2", "final_layer_norm": "mlp_ln"}
_WHOLE = {"encoder.layer_norm": "encoder.ln_post", "encoder.embed_positions": "encoder.positional_embedding",
          "decoder.layer_norm": "decoder.ln", "decoder.embed_positions": "decoder.positional_embedding",
          "decoder.embed_tokens": "decoder.token_embedding"}
_FLOAT32 = {"encoder.conv1.bias", "encoder.conv2.bias", "encoder.positional_embedding",
            "decoder.positional_embedding"}


def openai_name(name: str) -> str | None:
    """openai-whisper's (and whisper.cpp's) name of a transformers Whisper parameter; None for the tied output layer.
    Position tables lose their ``.weight`` there."""
    if name == "proj_out.weight":
        return None
    path = name.removeprefix("model.")
    stem, leaf = path.rsplit(".", 1)
    parts = stem.split(".")
    if len(parts) > 2 and parts[1] == "layers":
        return ".".join([parts[0], "blocks", parts[2], _PARTS[".".join(parts[3:])], leaf])
    out = f"{_WHOLE.get(stem, stem)}.{leaf}"
    return out.removesuffix(".weight") if out.endswith("positional_embedding.weight") else out


def _byte_decoder() -> dict[str, int]:
    """GPT-2's byte-level BPE alphabet, character -> byte (each byte has a printable character of its own)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[chr(b)] = b
        else:
            chars[chr(256 + extra)] = b
            extra += 1
    return chars


def write_ggml(model: Path, out: Path) -> None:
    """Write ``model`` (a transformers Whisper folder with tokenizer.json) as a ggml model file at ``out``."""
    config = Config.from_dir(model)
    tensors = read_weights(model)
    vocab = json.loads((model / "tokenizer.json").read_text())["model"]["vocab"]
    decoder = _byte_decoder()
    with open(out, "wb") as f:
        f.write(struct.pack("<12i", MAGIC, config.vocab_size, config.max_source_positions, config.d_model,
                            config.encoder_attention_heads, config.encoder_layers, config.max_target_positions,
                            config.d_model, config.decoder_attention_heads, config.decoder_layers,
                            config.num_mel_bins, 1))
        filters = mel_filters(config.num_mel_bins).astype(np.float32)
        f.write(struct.pack("<2i", *filters.shape))
        f.write(filters.tobytes())
        f.write(struct.pack("<i", len(vocab)))
        for token, _ in sorted(vocab.items(), key=lambda kv: kv[1]):
            raw = bytes(decoder[c] for c in token)
            f.write(struct.pack("<i", len(raw)) + raw)
        for name, tensor in tensors.items():
            if (mapped := openai_name(name)) is None:
                continue
            data = tensor.float().numpy().squeeze()
            if mapped in ("encoder.conv1.bias", "encoder.conv2.bias"):
                data = data.reshape(-1, 1)
            half = data.ndim >= 2 and mapped not in _FLOAT32
            data = data.astype(np.float16 if half else np.float32)
            encoded = mapped.encode()
            f.write(struct.pack(f"<3i{data.ndim}i", data.ndim, len(encoded), int(half), *reversed(data.shape)))
            f.write(encoded)
            f.write(data.tobytes())
