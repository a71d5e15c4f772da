"""Test-only model layouts over benchkit.tiny's tiny random Whisper."""
from __future__ import annotations

import json
from pathlib import Path

from asr_spec.models.vocab import WhisperTokenizer, generation_config_for


def as_large_v3_vocabulary(path: Path) -> Path:
    """Give the model saved at ``path`` whisper-large-v3's vocabulary layout: the base tokenizer with large-v3's
    100th language token <|yue|> after <|su|> (every special token after it one id later: 51866 tokens with the
    timestamps), and the generation config built from it."""
    data = json.loads((path / "tokenizer.json").read_text())
    added = data["added_tokens"]
    su = next(t["id"] for t in added if t["content"] == "<|su|>")
    for t in added:
        if t["id"] > su:
            t["id"] += 1
    added.append(dict(next(t for t in added if t["content"] == "<|su|>"), id=su + 1, content="<|yue|>"))
    added.sort(key=lambda t: t["id"])
    (path / "tokenizer.json").write_text(json.dumps(data))
    tok = WhisperTokenizer.from_dir(path, {"suppress_tokens": [], "begin_suppress_tokens": [220, 50257]}, 51866)
    (path / "generation_config.json").write_text(json.dumps(generation_config_for(tok.vocab)))
    return path
