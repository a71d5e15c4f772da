"""Shared fixtures: tiny random-weight Whisper models (fast) and the real embedded whisper-base."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from tiny import save_tiny

from asr_spec.models.loader import embedded_dir, load_target

DEV = Path(__file__).resolve().parents[2] / "shared" / "data" / "dev"
if not DEV.exists():  # CI clones next to shared/ as well; allow an override
    import os

    DEV = Path(os.environ.get("ASR_SPEC_DEV", DEV))


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory) -> Path:
    return save_tiny(tmp_path_factory.mktemp("tiny_target"), seed=0)


@pytest.fixture(scope="session")
def tiny_target(tiny_dir):
    return load_target(str(tiny_dir))


@pytest.fixture(scope="session")
def base_model():
    """The embedded whisper-base, converted from its PyPI CTranslate2 packages (cached)."""
    embedded_dir()
    return load_target("whisper-base")


@pytest.fixture(scope="session")
def dev_manifest() -> list[dict]:
    f = DEV / "manifest.jsonl"
    if not f.exists():
        pytest.fail(f"dev set missing: {f} (set ASR_SPEC_DEV)")
    return [json.loads(line) for line in f.read_text().splitlines() if line.strip()]


def default_sigint() -> None:
    """``preexec_fn`` for children that must react to Ctrl-C: a shell's background job inherits SIGINT ignored,
    and Python then installs no KeyboardInterrupt handler."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_DFL)
