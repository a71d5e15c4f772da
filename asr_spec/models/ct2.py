"""Read CTranslate2 Whisper checkpoints (``model.bin``, binary version 6) into transformers-named tensors and a
config (``sources.convert_ct2`` writes them as a transformers directory)."""
from __future__ import annotations

import io
import json
import re
import struct
from pathlib import Path
from typing import BinaryIO, Iterable

import numpy as np
import torch

_DTYPES = {0: np.float32, 1: np.int8, 2: np.int16, 3: np.int32, 4: np.float16, 5: np.uint16}  # 5: bf16 bits


class _Reader:
    def __init__(self, stream: BinaryIO):
        self.stream = stream

    def take(self, fmt: str) -> tuple:
        size = struct.calcsize(fmt)
        raw = self.stream.read(size)
        if len(raw) != size:
            raise ValueError("truncated CTranslate2 model.bin")
        return struct.unpack(fmt, raw)

    def string(self) -> str:
        (length,) = self.take("<H")
        return self.stream.read(length)[:-1].decode("utf-8")


class _Concat(io.RawIOBase):
    """A read-only stream over several files, as if they were one (split PyPI model packages)."""

    def __init__(self, paths: Iterable[Path]):
        self.files = [open(p, "rb") for p in paths]
        self.index = 0

    def readable(self) -> bool:
        return True

    def read(self, size: int = -1) -> bytes:
        out = b""
        while self.index < len(self.files) and (size < 0 or len(out) < size):
            chunk = self.files[self.index].read(-1 if size < 0 else size - len(out))
            if not chunk:
                self.index += 1
                continue
            out += chunk
        return out

    def close(self) -> None:
        for f in self.files:
            f.close()
        super().close()


def read_model_bin(parts: list[Path]) -> dict[str, np.ndarray]:
    """All variables of a CTranslate2 model.bin (given as one or more consecutive byte parts)."""
    stream = _Concat(parts)
    try:
        r = _Reader(stream)
        (version,) = r.take("<I")
        if version != 6:
            raise ValueError(f"unsupported CTranslate2 binary version {version} (expected 6)")
        spec = r.string()
        if spec != "WhisperSpec":
            raise ValueError(f"not a Whisper checkpoint: spec {spec!r}")
        r.take("<I")  # spec revision
        (count,) = r.take("<I")
        variables: dict[str, np.ndarray] = {}
        for _ in range(count):
            name = r.string()
            (ndim,) = r.take("<B")
            dims = r.take("<" + "I" * ndim) if ndim else ()
            (dtype,) = r.take("<B")
            (nbytes,) = r.take("<I")
            raw = stream.read(nbytes)
            if len(raw) != nbytes:
                raise ValueError(f"truncated CTranslate2 model.bin at {name}")
            array = np.frombuffer(raw, dtype=_DTYPES[dtype]).reshape(dims)
            if dtype == 5:
                array = (array.astype(np.uint32) << 16).view(np.float32)
            variables[name] = array
        (aliases,) = r.take("<I")
        for _ in range(aliases):
            alias, target = r.string(), r.string()
            variables[alias] = variables[target]
        return variables
    finally:
        stream.close()


def _t(a: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(a, dtype=np.float32))


def _linear(sd: dict, dst: str, v: dict, src: str, no_bias: bool = False) -> None:
    sd[f"{dst}.weight"] = _t(v[f"{src}/weight"])
    if not no_bias:
        sd[f"{dst}.bias"] = _t(v[f"{src}/bias"])


def _norm(sd: dict, dst: str, v: dict, src: str) -> None:
    sd[f"{dst}.weight"] = _t(v[f"{src}/gamma"])
    sd[f"{dst}.bias"] = _t(v[f"{src}/beta"])


def _split_rows(w: np.ndarray, parts: int) -> list[np.ndarray]:
    return np.split(w, parts, axis=0)


def _self_attention(sd: dict, dst: str, v: dict, src: str) -> None:
    q_w, k_w, v_w = _split_rows(v[f"{src}/linear_0/weight"], 3)
    q_b, _, v_b = _split_rows(v[f"{src}/linear_0/bias"], 3)
    sd[f"{dst}.q_proj.weight"], sd[f"{dst}.q_proj.bias"] = _t(q_w), _t(q_b)
    sd[f"{dst}.k_proj.weight"] = _t(k_w)
    sd[f"{dst}.v_proj.weight"], sd[f"{dst}.v_proj.bias"] = _t(v_w), _t(v_b)
    _linear(sd, f"{dst}.out_proj", v, f"{src}/linear_1")


def _cross_attention(sd: dict, dst: str, v: dict, src: str) -> None:
    _linear(sd, f"{dst}.q_proj", v, f"{src}/linear_0")
    k_w, v_w = _split_rows(v[f"{src}/linear_1/weight"], 2)
    _, v_b = _split_rows(v[f"{src}/linear_1/bias"], 2)
    sd[f"{dst}.k_proj.weight"] = _t(k_w)
    sd[f"{dst}.v_proj.weight"], sd[f"{dst}.v_proj.bias"] = _t(v_w), _t(v_b)
    _linear(sd, f"{dst}.out_proj", v, f"{src}/linear_2")


def _ffn(sd: dict, dst: str, v: dict, src: str) -> None:
    _linear(sd, f"{dst}.fc1", v, f"{src}/linear_0")
    _linear(sd, f"{dst}.fc2", v, f"{src}/linear_1")
    _norm(sd, f"{dst}.final_layer_norm", v, f"{src}/layer_norm")


def _count_layers(v: dict, prefix: str) -> int:
    return len({m.group(1) for k in v if (m := re.match(rf"{prefix}/layer_(\d+)/", k))})


def ct2_state_dict(v: dict[str, np.ndarray]) -> tuple[dict[str, torch.Tensor], dict]:
    """Map CTranslate2 Whisper variables to a WhisperForConditionalGeneration state dict + config."""
    sd: dict[str, torch.Tensor] = {}
    enc_layers, dec_layers = _count_layers(v, "encoder"), _count_layers(v, "decoder")
    for name in ("conv1", "conv2"):
        _linear(sd, f"model.encoder.{name}", v, f"encoder/{name}")
    sd["model.encoder.embed_positions.weight"] = _t(v["encoder/position_encodings/encodings"])
    _norm(sd, "model.encoder.layer_norm", v, "encoder/layer_norm")
    for i in range(enc_layers):
        dst, src = f"model.encoder.layers.{i}", f"encoder/layer_{i}"
        _self_attention(sd, f"{dst}.self_attn", v, f"{src}/self_attention")
        _norm(sd, f"{dst}.self_attn_layer_norm", v, f"{src}/self_attention/layer_norm")
        _ffn(sd, dst, v, f"{src}/ffn")
    sd["model.decoder.embed_tokens.weight"] = _t(v["decoder/embeddings/weight"])
    sd["model.decoder.embed_positions.weight"] = _t(v["decoder/position_encodings/encodings"])
    _norm(sd, "model.decoder.layer_norm", v, "decoder/layer_norm")
    for i in range(dec_layers):
        dst, src = f"model.decoder.layers.{i}", f"decoder/layer_{i}"
        _self_attention(sd, f"{dst}.self_attn", v, f"{src}/self_attention")
        _norm(sd, f"{dst}.self_attn_layer_norm", v, f"{src}/self_attention/layer_norm")
        _cross_attention(sd, f"{dst}.encoder_attn", v, f"{src}/attention")
        _norm(sd, f"{dst}.encoder_attn_layer_norm", v, f"{src}/attention/layer_norm")
        _ffn(sd, dst, v, f"{src}/ffn")
    sd["proj_out.weight"] = sd["model.decoder.embed_tokens.weight"]

    vocab, d_model = v["decoder/embeddings/weight"].shape
    config = {
        "vocab_size": int(vocab),
        "num_mel_bins": int(v["encoder/conv1/weight"].shape[1]),
        "d_model": int(d_model),
        "encoder_layers": enc_layers,
        "decoder_layers": dec_layers,
        "encoder_attention_heads": int(v["encoder/num_heads"]),
        "decoder_attention_heads": int(v["decoder/num_heads"]),
        "encoder_ffn_dim": int(v["encoder/layer_0/ffn/linear_0/weight"].shape[0]),
        "decoder_ffn_dim": int(v["decoder/layer_0/ffn/linear_0/weight"].shape[0]),
        "max_source_positions": int(v["encoder/position_encodings/encodings"].shape[0]),
        "max_target_positions": int(v["decoder/position_encodings/encodings"].shape[0]),
    }
    return sd, config


def load_ct2_config(path: Path) -> dict:
    return json.loads(path.read_text()) if path.exists() else {}
