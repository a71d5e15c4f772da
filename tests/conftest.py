"""Shared fixtures: tiny random-weight Whisper models (fast) and the real embedded whisper-base."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from benchkit.tiny import save_tiny

from asr_spec.models.loader import load_target
from asr_spec.models.sources import embedded_dir

# what a machine has not measured (auto's type, where the draft pays) is guessed, never measured in the background:
# a measurement finishing mid-suite would change what later tests load (tests of the measurement enable it)
os.environ["ASR_SPEC_MEASURE"] = "off"

DEV = Path(__file__).resolve().parents[2] / "shared" / "data" / "dev"
if not DEV.exists():  # CI clones next to shared/ as well; allow an override
    DEV = Path(os.environ.get("ASR_SPEC_DEV", DEV))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """Fast tests (tiny random models) run torch on one thread. Their matrices are a few dozen wide, so a second
    OpenMP thread buys nothing, and on a 2-core machine where anything else runs each operation waits for a
    descheduled worker thread (measured: a 0.8 s test took 7-16 s with 2 threads, the fast loop 29 minutes instead
    of about 3). The code under test is the same either way. `slow` tests (real weights) keep the process's count;
    the count in force before a test is restored after its teardown."""
    before = torch.get_num_threads()
    if item.get_closest_marker("slow") is None:
        torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def fast_first(values: list) -> list:
    """Parameters of a matrix of tiny-model cases: the first runs in the fast loop (``-m "not slow"``), each other
    only in the whole suite (marked ``slow``), so that the fast loop keeps one case of every matrix within its
    minute while CI runs them all. A tuple is one case of several parameters."""
    return [v if i == 0 else pytest.param(*(v if isinstance(v, tuple) else (v,)), marks=pytest.mark.slow)
            for i, v in enumerate(values)]


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory) -> Path:
    return save_tiny(tmp_path_factory.mktemp("tiny_target"), seed=0)


@pytest.fixture(scope="session")
def tiny_target(tiny_dir):
    return load_target(str(tiny_dir))


@pytest.fixture(scope="session")
def short_target(tmp_path_factory):
    """A tiny random Whisper like ``tiny_target`` with 32 decoder positions: a window decodes a few tokens where
    ``tiny_target`` runs on to 224, so tests of what surrounds the decoder (audio, the window loop, workers) are
    quick. Shared by every test: none may change it."""
    return load_target(str(save_tiny(tmp_path_factory.mktemp("short_target"), seed=0, max_target_positions=32)))


@pytest.fixture(scope="session")
def base_model():
    """The embedded whisper-base, converted from its PyPI CTranslate2 packages (cached)."""
    embedded_dir()
    return load_target("whisper-base")


@pytest.fixture(scope="session")
def base_transcriber(base_model):
    """The embedded whisper-base with its shipped draft, as `asr_spec serve` pairs them."""
    from asr_spec.models.loader import default_draft, load_draft
    from asr_spec.transcribe import Transcriber

    return Transcriber(base_model, load_draft(default_draft("whisper-base"), base_model))


def under_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


def pytest_runtest_setup(item):
    """A test that reads the dev set (``dev_manifest``, or its module uses ``DEV``) skips where the dev set is absent,
    saying why, except under CI (``.ci/run``), where it fails: CI always has the dev set beside the checkout."""
    uses_dev = "dev_manifest" in getattr(item, "fixturenames", ()) or getattr(item.module, "DEV", None) is DEV
    if uses_dev and not (DEV / "manifest.jsonl").exists():
        message = f"needs the dev set at {DEV} (../shared/data/dev beside the checkout, or ASR_SPEC_DEV)"
        if under_ci():
            pytest.fail(message + " (required under CI)")
        pytest.skip(message)


@pytest.fixture(scope="session")
def dev_manifest() -> list[dict]:
    f = DEV / "manifest.jsonl"
    return [json.loads(line) for line in f.read_text().splitlines() if line.strip()]


def system_tool(*names: str, install: str) -> str:
    """The path of the first of ``names`` on PATH. Missing: the test skips with the install command, except
    under CI (``CI=true``, as ``.ci/run`` runs), where a missing tool fails the test instead of hiding it."""
    import shutil

    for name in names:
        if path := shutil.which(name):
            return path
    message = f"needs {' or '.join(names)}: {install}"
    if under_ci():
        pytest.fail(message + " (required under CI)")
    pytest.skip(message)


def wait_for_line(stream, needle: str, timeout: float) -> list[str]:
    """Read lines from a child's pipe until one contains ``needle``; fail with what was read if none does
    within ``timeout`` seconds (or the pipe closes) — never block past the deadline."""
    import select
    import time

    seen: list[str] = []
    deadline = time.monotonic() + timeout
    while (left := deadline - time.monotonic()) > 0:
        if not select.select([stream], [], [], left)[0]:
            break
        line = stream.readline()
        if not line:
            break
        seen.append(line)
        if needle in line:
            return seen
    pytest.fail(f"no line with {needle!r} within {timeout:.0f} s; the child wrote: {''.join(seen)[-3000:]!r}")


def default_sigint() -> None:
    """``preexec_fn`` for children that must react to Ctrl-C: a shell's background job inherits SIGINT ignored,
    and Python then installs no KeyboardInterrupt handler."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_DFL)
