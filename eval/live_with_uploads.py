"""Live sessions while files are uploaded to the OpenAI-compatible API of the same server: how much later
the live finals arrive, with uploads yielding to due live streams (``--upload-yield``, the default) and without.

A real ``asr_spec serve`` subprocess per setting; one WebSocket client streams ``--seconds`` of the long-form
talk at real time while ``--uploaders`` threads each upload dev utterances one after another through the ``openai``
client until the stream ends. Reported per setting: the latency of the stream's finals (median, p90, max: when the
client received a final minus when the audio at its end was sent, the audio being paced at real time), how many
uploads finished meanwhile and how many were refused (503: the queue was full), and the server's peak memory.

    python eval/live_with_uploads.py --seconds 60 --threads 2 [--uploaders 4] [--dev DIR]
                                     --out eval/results/live-with-uploads
"""
from __future__ import annotations

import argparse
import json
import threading
import time
from pathlib import Path

import openai
from asr_spec.clients.stream import stream_file

from asr_spec.evaluation.harness import add_data_args, data, longform, served, write_results


def peak_mb(pid: int) -> float:
    """A process's peak resident memory (VmHWM), MB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def run(setting: str, audio, uploads: list[Path], threads: int, uploaders: int) -> dict:
    done = threading.Event()
    finished: list[float] = []
    refused: list[int] = []
    upload_yield = 0.0 if setting == "uploads, no yield" else 5.0
    with served(["--threads", str(threads), "--upload-yield", str(upload_yield)]) as server:
        def upload(first: int) -> None:
            client = openai.OpenAI(base_url=f"{server.http}/v1", api_key="-", timeout=600, max_retries=0)
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

        threads_up = [threading.Thread(target=upload, args=(n,), daemon=True) for n in range(uploaders)]
        if setting != "no uploads":
            for uploader in threads_up:
                uploader.start()
            time.sleep(2.0)  # uploads under way before the stream starts
        received: list[tuple[float, dict]] = []
        t0 = time.monotonic()
        events = stream_file(server.ws, audio, 1.0, lambda e: received.append((time.monotonic(), e)))
        wall = time.monotonic() - t0
        done.set()
        for uploader in threads_up:
            if uploader.is_alive():
                uploader.join(600)
        peak = peak_mb(server.proc.pid)
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
    add_data_args(ap, manifest=False)
    a = ap.parse_args()
    talks, dev = longform(a), data(a)
    audio = talks.audio(talks.items[0])[: int(a.seconds * 16000)]
    uploads = [dev.audio_path(m) for m in dev.items if m["duration_s"] >= 8][:10]
    rows = []
    for setting in ("no uploads", "uploads, yield (default)", "uploads, no yield"):
        rows.append(run(setting, audio, uploads, a.threads, a.uploaders))
        print(json.dumps(rows[-1]), flush=True)
    write_results(Path(a.out) / "results.json", {"settings": rows}, a.threads, indent=2)


if __name__ == "__main__":
    main()
