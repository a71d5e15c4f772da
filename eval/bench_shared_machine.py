"""A new machine's first live session, hour-long uploads beside a short one, and admission after a neighbour's slow
spell: what issue 77 asked of a machine that several processes share.

    python eval/bench_shared_machine.py [--repeat 3] [--threads 2] [--out eval/results/shared-machine/results.json]

*first session*: ``asr_spec serve`` starts on a cache holding only the converted model (what a new machine's first
server finds: ``auto``'s type and where the draft pays not measured yet, so it starts ``asr_spec.measure`` in the
background) and the bundled JFK sample is streamed to it at real time as soon as it listens; then, on the same
server once that measurement has finished, the same stream again; then a server on the cache it filled (nothing
pending) gets the same two streams. Per stream the median of its words' final latency (a word committed minus its
audio's end, by the offline transcript's word times). *uploads*: eight 59-minute FLAC uploads (JFK then silence,
374 KB each) at once, then JFK's 11 s from another client (another loopback address): seconds until JFK's text
comes back, and how much the server's memory grew (its peak RSS less its RSS before). *admission*: one real-time
speaker, then a process spinning on each core for 10 s; seconds from the neighbour's end until a second speaker is
admitted (serve's defaults). ``--repeat`` runs each part that many times.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import soundfile as sf
from asr_spec.clients.stream import connect_session, stream_file
from benchkit.streaming import timed_words, word_latencies

from asr_spec.audio import SAMPLE, load_audio
from asr_spec.evaluation.harness import served, write_results
from asr_spec.measure import LOCK
from asr_spec.models.cache import locked
from asr_spec.models.loader import ModelOptions, load
from asr_spec.models.sources import embedded_dir
from asr_spec.transcribe import TranscribeOptions, Transcriber

ROOT = Path(__file__).resolve().parents[1]
LONG_S = 59 * 60


def stream(url: str, audio: np.ndarray) -> list:
    log, t0 = [], time.monotonic()
    stream_file(url, audio, 1.0, lambda e: log.append((time.monotonic() - t0, e)))
    return log


def pending(cache: Path) -> bool:
    """Whether the machine's measurement has not finished: ``auto``'s type or the draft widths not kept yet, or a
    measurement still holding the cache's lock."""
    if not list((cache / "auto").glob("*.json")) or not list((cache / "draft-widths").glob("*.json")):
        return True
    with locked(cache / LOCK, timeout=0) as free:
        return not free


def first_session(a, audio: np.ndarray, offline: list) -> dict:
    model = embedded_dir()
    cache = Path(tempfile.mkdtemp(prefix="asr_spec_first_"))
    shutil.copytree(model, cache / model.name)
    os.environ["ASR_SPEC_CACHE"] = str(cache)
    run = {}
    try:
        for mode in ("pending", "measured"):
            with served(["--threads", str(a.threads)]) as server:
                first = word_latencies(stream(server.ws, audio), offline)["final_latency"]
                still = pending(cache)
                deadline = time.monotonic() + a.wait
                while pending(cache) and time.monotonic() < deadline:
                    time.sleep(1.0)
                idle = word_latencies(stream(server.ws, audio), offline)["final_latency"]
            run[mode] = {"first_median_s": statistics.median(first), "idle_median_s": statistics.median(idle),
                         "ratio": statistics.median(first) / statistics.median(idle), "pending_after_first": still}
            print(f"first session, {mode}: final median {run[mode]['first_median_s']:.2f} s, once idle "
                  f"{run[mode]['idle_median_s']:.2f} s (measurement pending after the first: {still})", flush=True)
    finally:
        shutil.rmtree(cache, ignore_errors=True)
        os.environ.pop("ASR_SPEC_CACHE")
    return run


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:")) / 1024


def openai_client(port: int, address: str):
    """The ``openai`` client, connecting from ``address`` (another loopback address: another client)."""
    from openai import DefaultHttpxClient, OpenAI

    try:
        import httpx2 as httpx
    except ImportError:
        import httpx
    return OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0, timeout=3600,
                  http_client=DefaultHttpxClient(transport=httpx.HTTPTransport(local_address=address)))


def uploads(a, long_flac: Path) -> dict:
    with served(["--threads", str(a.threads)]) as server:
        pid, port = server.proc.pid, server.port
        before = rss_mb(pid)
        with open(SAMPLE, "rb") as f:  # once alone: what any first upload costs (its buffers, caches)
            openai_client(port, "127.0.0.2").audio.transcriptions.create(model="whisper-1", file=f)
        alone = rss_mb(pid) - before
        peak, done = [before], threading.Event()

        def watch() -> None:
            while not done.is_set():
                peak[0] = max(peak[0], rss_mb(pid))
                time.sleep(0.1)

        def send_long() -> None:
            with open(long_flac, "rb") as f, contextlib.suppress(Exception):  # stopped with the server
                openai_client(port, "127.0.0.1").audio.transcriptions.create(model="whisper-1", file=f)

        threading.Thread(target=watch, daemon=True).start()
        pool = ThreadPoolExecutor(8)
        for _ in range(8):
            pool.submit(send_long)
        time.sleep(2.0)
        with open(SAMPLE, "rb") as f:
            t0 = time.monotonic()
            openai_client(port, "127.0.0.2").audio.transcriptions.create(model="whisper-1", file=f)
            took = time.monotonic() - t0
        time.sleep(5.0)  # the long ones go on meanwhile
        done.set()
        pool.shutdown(wait=False, cancel_futures=True)
    out = {"jfk_answer_s": took, "rss_growth_mb": peak[0] - before, "rss_growth_one_upload_mb": alone}
    print(f"uploads: JFK answered in {took:.1f} s beside eight 59-minute uploads; the server grew by "
          f"{out['rss_growth_mb']:.0f} MB (one upload alone: {alone:.0f} MB)", flush=True)
    return out


def opens(url: str) -> bool:
    with connect_session(url, None) as ws:
        ws.send(json.dumps({"type": "start"}))
        return json.loads(ws.recv(timeout=30))["type"] == "ready"


def admission(a) -> dict:
    jfk = load_audio(SAMPLE)
    speech = np.tile(jfk, 8)
    with served(["--threads", str(a.threads)]) as server:
        def speak() -> None:
            with contextlib.suppress(Exception):  # the server shuts down under it at the end
                stream_file(server.ws, speech, 1.0)

        speaker = threading.Thread(target=speak, daemon=True)
        speaker.start()
        time.sleep(20.0)  # the engine measures its steps
        spin = "import time\nend = time.monotonic() + 10\nwhile time.monotonic() < end: pass"
        for p in [subprocess.Popen([sys.executable, "-c", spin]) for _ in range(os.cpu_count() or 2)]:
            p.wait(60)
        t0, tries = time.monotonic(), 0
        while not opens(server.ws) and time.monotonic() - t0 < 120:
            tries += 1
            time.sleep(0.5)
        took = time.monotonic() - t0
    print(f"admission: a second speaker admitted {took:.1f} s after 10 s of a neighbour ({tries} refusals)", flush=True)
    return {"admitted_after_s": took, "refusals": tries}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--wait", type=float, default=900.0, help="most seconds to wait for the measurement to finish")
    p.add_argument("--out", type=Path, default=ROOT / "eval/results/shared-machine/results.json")
    a = p.parse_args()
    audio = load_audio(SAMPLE)
    target, _ = load(ModelOptions(draft=None, threads=a.threads))
    offline = timed_words(Transcriber(target).transcribe(audio, TranscribeOptions(language="en",
                                                                                 word_timestamps=True)).segments)
    del target
    long_flac = Path(tempfile.mkdtemp(prefix="asr_spec_long_")) / "hour.flac"
    hour = np.zeros(LONG_S * 16000, np.float32)
    hour[:len(audio)] = audio
    sf.write(long_flac, hour, 16000, format="FLAC", subtype="PCM_16")
    runs = {"first_session": [], "uploads": [], "admission": []}
    for _ in range(a.repeat):
        runs["first_session"].append(first_session(a, audio, offline))
        runs["uploads"].append(uploads(a, long_flac))
        runs["admission"].append(admission(a))
    med = lambda xs: statistics.median(xs)  # noqa: E731
    summary = {
        "first_session": {mode: {k: med([r[mode][k] for r in runs["first_session"]])
                                 for k in ("first_median_s", "idle_median_s", "ratio")}
                          for mode in ("pending", "measured")},
        "uploads": {k: med([r[k] for r in runs["uploads"]]) for k in runs["uploads"][0]},
        "admission": {k: med([r[k] for r in runs["admission"]]) for k in runs["admission"][0]}}
    write_results(a.out, {"summary": summary, "runs": runs}, a.threads)
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
