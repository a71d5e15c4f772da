"""What the ``eval/`` scripts share: the data options every script takes (``--dev``, ``--manifest``), writing a
results JSON with its provenance, and a real ``asr_spec serve`` subprocess on a loopback port for the scripts that
measure a served server (started with a deadline, stopped however the script ends).

A script's data: ``--dev DIR`` is the dev set's folder (default ``$ASR_SPEC_DEV``, else ``../shared/data/dev``
beside the checkout: :func:`asr_spec.evaluation.data.dev_dir`); ``--manifest FILE`` a manifest to read instead of
the dev set's ``manifest.jsonl``. Long-form audio is the dev set's ``longform/manifest.jsonl``.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from .data import DataSet, dev_dir, dev_set, longform_set
from .provenance import provenance


def add_data_args(ap: argparse.ArgumentParser, manifest: bool = True) -> None:
    """``--dev`` (and, with ``manifest``, ``--manifest``) on a script's parser."""
    ap.add_argument("--dev", type=Path, default=None,
                    help=f"the dev set's folder (default: $ASR_SPEC_DEV, else {dev_dir()})")
    if manifest:
        ap.add_argument("--manifest", type=Path, default=None,
                        help="JSON lines of id, audio (relative to the file), text (default: the dev set's)")


def data(args: argparse.Namespace, limit: int = 0) -> DataSet:
    """The utterances the options name: ``--manifest``, else the dev set's (the first ``limit`` when given)."""
    if getattr(args, "manifest", None):
        return DataSet.read(args.manifest, limit)
    return dev_set(args.dev, limit)


def longform(args: argparse.Namespace) -> DataSet:
    """The long-form talk(s) of the dev set the options name."""
    return longform_set(args.dev)


def write_results(path: Path, results: dict, threads: int, device: str = "cpu", indent: int = 1) -> dict:
    """``results`` with ``provenance`` first, written as JSON to ``path`` (its folder made); returns what was
    written."""
    doc = {"provenance": provenance(threads, device), **results}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=indent) + "\n")
    return doc


def free_port() -> int:
    """A loopback TCP port nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass(frozen=True)
class Served:
    """A running ``asr_spec serve``: its process and loopback port."""
    proc: subprocess.Popen
    port: int

    @property
    def http(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def ws(self) -> str:
        return f"ws://127.0.0.1:{self.port}"


@contextmanager
def served(options: Sequence[str] = (), port: int | None = None, ready: Sequence[str] = (),
           deadline_s: float = 300.0, stop_s: float = 90.0, log: Path | None = None) -> Iterator[Served]:
    """``python -m asr_spec serve --port PORT *options`` (``port``: a free one when not given) in a process group of
    its own, once ``/health`` and every ``ready`` URL answer; stopped on leaving (SIGINT, as Ctrl-C: a Ray server
    shuts its cluster down; killed after ``stop_s``). Output goes to ``log`` (default: a temporary file, removed
    after), whose tail is in the error when the server exits or misses the ``deadline_s`` before it answers."""
    port = port or free_port()
    temporary = log is None
    log = log or Path(tempfile.mkstemp(prefix="asr_spec_serve_", suffix=".log")[1])
    cmd = [sys.executable, "-m", "asr_spec", "serve", "--port", str(port), *options]
    with log.open("w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    server = Served(proc, port)
    try:
        deadline = time.monotonic() + deadline_s
        for url in (f"{server.http}/health", *ready):
            while not _answers(url):
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"{' '.join(cmd)} did not start:\n{log.read_text()[-3000:]}")
                time.sleep(0.5)
        yield server
    finally:
        _stop(proc, stop_s)
        if temporary:
            log.unlink(missing_ok=True)


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=3):
            return True
    except OSError:
        return False


def _stop(proc: subprocess.Popen, wait_s: float) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(wait_s)
            return
        except subprocess.TimeoutExpired:
            pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # the server and whatever it started (Ray's workers)
    except ProcessLookupError:
        pass
    proc.wait(30)
