"""A real `asr_spec serve` subprocess on a free loopback port, for client tests."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from contextlib import contextmanager


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_serving(port: int, proc: subprocess.Popen, stderr, seconds: float = 180) -> None:
    """Wait until the server on ``port`` answers /healthz; kill it and raise with ``stderr()`` if it exits or
    does not answer within ``seconds``."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2)
            return
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                raise RuntimeError(f"asr_spec serve did not start (exit code {proc.poll()}):\n{stderr()}")
            time.sleep(0.3)


@contextmanager
def serve(*args: str, env: dict[str, str] | None = None):
    """Yield the ws:// URL of a running server (``env``: added to its environment); stop it afterwards."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "asr_spec.cli", "serve", "--port", str(port), *args],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, **(env or {})})
    wait_serving(port, proc, proc.stderr.read)
    try:
        yield f"ws://127.0.0.1:{port}"
    finally:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
