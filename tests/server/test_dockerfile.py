"""The container image, tested where Docker cannot run: the Dockerfile installs with exactly the README's set-up
command, runs as a non-root user with a health check on /livez, and its entry point -- run as the image runs it,
``sh -c`` and all, with the image's environment -- starts `asr_spec serve`, answers the health check, and drains and
exits 0 on SIGTERM (what ``docker stop`` sends)."""
from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from server_proc import free_port, wait_serving

ROOT = Path(__file__).resolve().parents[2]


def instructions() -> list[tuple[str, str]]:
    """(instruction, arguments) of the Dockerfile, continuation lines joined, comments dropped."""
    text = re.sub(r"\\\n", " ", (ROOT / "Dockerfile").read_text())
    out = []
    for line in text.splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            word, _, rest = line.strip().partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def one(kind: str) -> str:
    found = [args for word, args in instructions() if word == kind]
    assert len(found) == 1, f"expected one {kind} in the Dockerfile, found {found}"
    return found[0]


def readme_set_up() -> str:
    """The README's set-up command: the first bash block of its Set-up section."""
    section = (ROOT / "README.md").read_text().split("## Set-up", 1)[1]
    return re.search(r"```bash\n(.*?)\n```", section, re.S).group(1).strip()


def image_env(port: int) -> dict[str, str]:
    """The environment the image's ENV gives (PATH: this test's environment, whose bin holds asr_spec)."""
    env = dict(os.environ)
    for name, value in re.findall(r"(\w+)=(\S+)", one("ENV")):
        if name != "PATH":
            env[name] = value.replace("$DEVICE", "cpu")
    env["ASR_SPEC_PORT"] = str(port)  # docker run -e ASR_SPEC_PORT=...: a free port here
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"
    return env


def test_the_image_installs_with_the_readmes_set_up_command_and_runs_unprivileged():
    steps = instructions()
    command = readme_set_up()
    assert command.startswith("python3 -m venv .venv") and "asr_spec transcribe --sample" in command, command
    install = [i for i, (word, args) in enumerate(steps) if word == "RUN" and command in args]
    assert len(install) == 1, f"no RUN holds the README's set-up command {command!r}: {steps}"
    assert re.match(r"python:3\.1[1-9]", one("FROM")), one("FROM")  # the README asks for Python >= 3.11
    words = [w for w, _ in steps]
    assert one("USER") not in ("root", "0"), one("USER")
    assert words.index("USER") < install[0] < words.index("ENTRYPOINT")  # installed and run as that user
    assert "/livez" in one("HEALTHCHECK") and one("HEALTHCHECK").split()[-1] != "NONE"  # liveness: not 503 when full
    assert "ARG DEVICE=cpu" in (ROOT / "Dockerfile").read_text()
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert {".venv", ".git", "build"} <= set(ignored), ignored


@pytest.mark.slow  # a real server, browser, subprocess or real weights
def test_the_entry_point_answers_health_and_drains_on_sigterm_as_the_image_runs_it(tmp_path):
    port = free_port()
    argv = json.loads(one("ENTRYPOINT"))
    assert argv[:2] == ["sh", "-c"] and "asr_spec serve" in argv[2] and "--host 0.0.0.0" in argv[2], argv
    log = open(tmp_path / "serve.log", "w+")
    proc = subprocess.Popen([*argv, "--max-sessions", "2"], env=image_env(port), stdout=log, stderr=subprocess.STDOUT,
                            cwd=tmp_path)
    try:
        wait_serving(port, proc, lambda: (log.seek(0), log.read())[1])
        health = one("HEALTHCHECK").split(" CMD ", 1)[1]
        check = subprocess.run(["sh", "-c", health], env=image_env(port), capture_output=True, text=True, timeout=30)
        assert check.returncode == 0, f"the health check failed: {check.stderr}"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0, "serve did not exit 0 on SIGTERM"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    log.seek(0)
    text = log.read()
    assert f"listening on ws://0.0.0.0:{port}" in text and "inference thread joined" in text, text[-2000:]
    wrong = subprocess.run(["sh", "-c", health], env=image_env(port), capture_output=True, text=True, timeout=30)
    assert wrong.returncode != 0, "the health check passed with the server stopped"
    assert shlex.split(health)[0] == "python"  # the image's venv python (on its PATH), no curl needed
