"""Real servers for tests: an `asr_spec serve` subprocess on a free loopback port, or a server in this process
(its own thread and event loop); and reading a WebSocket's events with a deadline."""
from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from contextlib import contextmanager

import pytest


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_serving(port: int, proc: subprocess.Popen, stderr, seconds: float = 180) -> None:
    """Wait until the server on ``port`` answers /livez; kill it and raise with ``stderr()`` if it exits or
    does not answer within ``seconds``."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/livez", timeout=2)
            return
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                raise RuntimeError(f"asr_spec serve did not start (exit code {proc.poll()}):\n{stderr()}") from None
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


@contextmanager
def in_process(engine, config, files=None):
    """A server around ``engine`` in this process; yield it, stop it afterwards (each within a deadline)."""
    from asr_spec.server.app import Server

    srv = Server(engine, config, files)
    ready = threading.Event()
    thread = threading.Thread(target=lambda: asyncio.run(srv.serve_forever(ready)), daemon=True)
    thread.start()
    assert ready.wait(60), "the server did not start within 60 s"
    try:
        yield srv
    finally:
        srv.stop()
        thread.join(20)
        assert not thread.is_alive(), "the server did not stop within 20 s of stop()"


def recv(ws, seen: list, timeout: float = 10.0) -> dict:
    """The next JSON event of a websockets sync client, appended to ``seen``; fails with what was seen if none comes
    within ``timeout`` seconds or the connection closes."""
    from websockets.exceptions import ConnectionClosed

    try:
        event = json.loads(ws.recv(timeout=timeout))
    except TimeoutError:
        pytest.fail(f"no event within {timeout} s; events so far: {seen}")
    except ConnectionClosed as e:
        pytest.fail(f"connection closed ({e.rcvd}) while waiting for an event; events so far: {seen}")
    seen.append(event)
    return event
