"""Live sessions while files are uploaded to the OpenAI-compatible API of the same server: how much later
the live finals arrive, with uploads yielding to due live streams (``--upload-yield``, the default) and without.

A real ``asr_spec serve`` subprocess per setting; one WebSocket client streams ``--seconds`` of the long-form
talk at real time while ``--uploaders`` threads each upload dev utterances one after another through the ``openai``
client until the stream ends. Reported per setting: the latency of the stream's finals (median, p90, max: when the
client received a final minus when the audio at its end was sent, the audio being paced at real time), how many
uploads finished meanwhile and how many were refused (503: the queue was full), and the server's peak memory.

    python eval/live_with_uploads.py --seconds 60 --threads 2 [--uploaders 4] --out eval/results/live-with-uploads
"""
from __future__ import annotations

import argparse
import json
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import openai

from asr_spec.audio import load_audio
from asr_spec.evaluation.provenance import provenance
from asr_spec.clients.stream import stream_file

DEV = Path(__file__).resolve().parents[2] / "shared" / "data" / "dev"


def serve(port: int, threads: int, upload_yield: float) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-m", "asr_spec", "serve", "--port", str(port), "--threads", str(threads),
                             "--upload-yield", str(upload_yield)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True)
    deadline = time.monotonic() + 300
    while True:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2)
            return proc
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                sys.exit(f"asr_spec serve did not start:\n{proc.stderr.read()}")
            time.sleep(0.3)


def peak_mb(pid: int) -> float:
    """A process's peak resident memory (VmHWM), MB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def run(setting: str, audio, uploads: list[Path], threads: int, uploaders: int) -> dict:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = serve(port, threads, 0.0 if setting == "uploads, no yield" else 5.0)
    done = threading.Event()
    finished: list[float] = []
    refused: list[int] = []

    def upload(first: int) -> None:
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="-", timeout=600, max_retries=0)
        i = first
        while not done.is_set():
            path = uploads[i % len(uploads)]
            t0 = time.monotonic()
            try:
                with open(path, "rb") as f:
                    client.audio.transcriptions.create(model="whisper-1", file=f, language="en")
                finished.append(time.monotonic() - t0)
            except openai.APIStatusError as e:
                refused.append(e.status_code)
                time.sleep(1.0)
            i += 1

    try:
        threads_up = [threading.Thread(target=upload, args=(n,), daemon=True) for n in range(uploaders)]
        if setting != "no uploads":
            for uploader in threads_up:
                uploader.start()
            time.sleep(2.0)  # uploads under way before the stream starts
        received: list[tuple[float, dict]] = []
        t0 = time.monotonic()
        events = stream_file(f"ws://127.0.0.1:{port}", audio, 1.0, lambda e: received.append((time.monotonic(), e)))
        wall = time.monotonic() - t0
        done.set()
        for uploader in threads_up:
            if uploader.is_alive():
                uploader.join(600)
        peak = peak_mb(proc.pid)
    finally:
        proc.terminate()
        proc.wait(30)
    lat = sorted(at - (t0 + e["end"]) for at, e in received if e["type"] == "final" and e["text"])
    return {"setting": setting, "stream_wall_s": round(wall, 1), "final_latency_median_s": round(lat[len(lat) // 2], 2),
            "final_latency_p90_s": round(lat[int(0.9 * len(lat))], 2), "final_latency_max_s": round(lat[-1], 2),
            "uploads_finished": len(finished), "uploads_refused": len(refused), "uploaders": uploaders,
            "server_peak_rss_mb": round(peak),
            "upload_seconds_median": round(sorted(finished)[len(finished) // 2], 2) if finished else None,
            "finals": sum(e["type"] == "final" and bool(e["text"]) for e in events)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--uploaders", type=int, default=1, help="threads uploading at once")
    ap.add_argument("--out", default="eval/out/live-with-uploads")
    a = ap.parse_args()
    meta = json.loads((DEV / "longform" / "manifest.jsonl").read_text().splitlines()[0])
    audio = load_audio(DEV / "longform" / meta["audio"])[: int(a.seconds * 16000)]
    manifest = [json.loads(line) for line in (DEV / "manifest.jsonl").read_text().splitlines() if line.strip()]
    uploads = [DEV / m["audio"] for m in manifest if m["duration_s"] >= 8][:10]
    rows = []
    for setting in ("no uploads", "uploads, yield (default)", "uploads, no yield"):
        rows.append(run(setting, audio, uploads, a.threads, a.uploaders))
        print(json.dumps(rows[-1]), flush=True)
    Path(a.out).mkdir(parents=True, exist_ok=True)
    doc = {"provenance": provenance(a.threads), "settings": rows}
    (Path(a.out) / "results.json").write_text(json.dumps(doc, indent=2) + "\n")


if __name__ == "__main__":
    main()
