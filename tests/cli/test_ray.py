"""``asr_spec transcribe --ray`` on a real local Ray cluster the test starts (``ray start``, 2 CPUs, 2 workers):
the outputs equal those of a local run, a bad file is reported and the rest is transcribed; without Ray the
flag says how to install it; an interrupted run's temporary files are removed."""
from __future__ import annotations

import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import DEV
from test_cli import run

from asr_spec import cli
from asr_spec.scaleout import INSTALL_HINT, remove_partials

FILES = ["jfk-inaugural-1961-ask-not.wav", "LJ001-0001.wav", "LJ001-0002.wav", "LJ001-0003.wav",
         "LJ001-0004.wav", "LJ001-0005.wav"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# 'ray start' clusters use token authentication (Ray >= 2.59): the test's cluster and driver share a token of
# their own, so nothing on the machine (~/.ray/auth_token) is needed or touched
AUTH = {**os.environ, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32)}


def _ray_cli(*args: str, timeout: int) -> subprocess.CompletedProcess:
    ray = shutil.which("ray", path=str(Path(sys.executable).parent)) or shutil.which("ray")
    assert ray, "the ray command is missing: pip install 'asr_spec[ray]'"
    try:
        return subprocess.run([ray, *args], capture_output=True, text=True, timeout=timeout, env=AUTH)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"ray {' '.join(args)} still running after {timeout} s: {e.stdout!r} {e.stderr!r}")


@pytest.fixture()
def ray_cluster(tmp_path):
    """A head node with 2 CPUs on loopback, stopped afterwards; its address."""
    port = _free_port()
    r = _ray_cli("start", "--head", "--node-ip-address", "127.0.0.1", "--port", str(port), "--num-cpus", "2",
                 "--num-gpus", "0", "--include-dashboard", "false", "--object-store-memory", str(300 * 2**20),
                 "--disable-usage-stats", timeout=180)
    assert r.returncode == 0, r.stdout + r.stderr
    try:
        yield f"127.0.0.1:{port}"
    finally:
        _ray_cli("stop", "--force", timeout=120)


@pytest.mark.slow
def test_ray_run_writes_the_same_outputs_as_a_local_run(tmp_path, ray_cluster):
    (tmp_path / "broken.wav").write_bytes(b"RIFF not really a wav file")
    inputs = [str(DEV / f) for f in FILES] + [str(tmp_path / "broken.wav")]
    common = ["--format", "all", "--language", "en"]
    local = run(*inputs, "--output-dir", str(tmp_path / "local"), "--threads", "2", *common, timeout=600)
    on_ray = run(*inputs, "--output-dir", str(tmp_path / "ray"), "--ray", ray_cluster, "--workers", "2",
                 "--threads", "1", "--batch-size", "2", *common, timeout=600, env=AUTH)
    for r in (local, on_ray):
        assert r.returncode == 1, r.stderr  # the broken file
        assert "1 of 7 file(s) failed" in r.stderr, r.stderr
        assert any(ln.startswith("error:") and "broken.wav" in ln for ln in r.stderr.splitlines()), r.stderr
    assert "ray: 2 worker(s) x 1 thread(s)" in on_ray.stderr, on_ray.stderr
    assert sorted(on_ray.stdout.splitlines()) == sorted(local.stdout.splitlines())
    names = sorted(p.name for p in (tmp_path / "local").iterdir())
    assert len(names) == 4 * len(FILES)
    assert sorted(p.name for p in (tmp_path / "ray").iterdir()) == names  # no temporary files left either
    for name in names:
        mine, theirs = ((tmp_path / d / name).read_text() for d in ("local", "ray"))
        if name.endswith(".json"):  # timings and acceptance differ between runs; everything else is equal
            mine, theirs = json.loads(mine), json.loads(theirs)
            assert mine.pop("statistics")["tokens"] == theirs.pop("statistics")["tokens"], name
        assert mine == theirs, name


def test_without_ray_the_flag_says_how_to_install_it(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray raises ImportError
    code = cli.main(["transcribe", str(DEV / "LJ001-0002.wav"), "--ray", "--quiet"])
    assert code == 1
    assert INSTALL_HINT in capsys.readouterr().err


@pytest.mark.slow  # tiny models, but over a second: the whole suite runs it, the fast loop the quicker checks
def test_an_address_nobody_listens_on_is_a_clear_error_at_once(monkeypatch, capsys):
    code = cli.main(["transcribe", str(DEV / "LJ001-0002.wav"), "--ray", f"127.0.0.1:{_free_port()}", "--quiet"])
    assert code == 1
    assert "error: cannot join the Ray cluster at 127.0.0.1:" in capsys.readouterr().err


def test_an_interrupted_ray_run_leaves_no_temporary_files(tmp_path):
    kept = [tmp_path / "a.txt", tmp_path / ".b.txt", tmp_path / ".other.txt.123.part"]
    for p in kept:
        p.write_text("x")
    for p in (tmp_path / ".a.txt.0f0f.part", tmp_path / ".a.json.1234.part", tmp_path / ".[x].srt.99.part"):
        p.write_text("partial")
    remove_partials(tmp_path, ["a", "[x]"], ["txt", "json", "srt"])
    assert sorted(tmp_path.iterdir()) == sorted(kept)
