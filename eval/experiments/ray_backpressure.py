"""Does a fast sender's backpressure survive Ray Serve's proxy? One client streams ``--seconds`` of dev speech as fast
as the server lets it, to a single ``asr_spec serve`` and then to ``asr_spec serve --ray --replicas 1`` (same model and
options); for each: when the client had sent everything, when the ``closed`` event came, and how far ahead of the
decoding the sender got (audio sent minus audio decoded, sampled from the replica's metrics).

A server that is not read while a session holds ``max_backlog_s`` (40 s) of undecoded audio slows the sender down
through TCP: the client finishes sending about 40 s of decoding before ``closed``. A proxy that buffers what the
replica does not read lets the client finish sending at once, and holds the rest in its memory.

    python eval/experiments/ray_backpressure.py --seconds 120 [--dev DIR]    # whisper-base, serve's defaults
"""
from __future__ import annotations

import argparse
import json
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import numpy as np
from asr_spec.clients.stream import connect_session
from prometheus_client.parser import text_string_to_metric_families

from asr_spec.evaluation.harness import add_data_args, data, served, write_results

ROOT = Path(__file__).resolve().parents[2]
FRAME = 1600  # 100 ms frames, as asr_spec stream sends


def decoded_s(metrics_url: str) -> float:
    text = urllib.request.urlopen(metrics_url, timeout=5).read().decode()
    return sum(s.value for f in text_string_to_metric_families(text) for s in f.samples
               if s.name == "asr_spec_audio_decoded_seconds_total")


def run(url: str, metrics_url: str, audio: np.ndarray) -> dict:
    """Stream ``audio`` as fast as allowed; the times and the sender's greatest lead over the decoding."""
    sent_s, lead, done = [0.0], [0.0], threading.Event()

    def watch() -> None:
        while not done.is_set():
            try:
                lead[0] = max(lead[0], sent_s[0] - decoded_s(metrics_url))
            except OSError:
                pass
            time.sleep(0.25)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    t0 = time.monotonic()
    with connect_session(url, None) as ws:
        ws.send(json.dumps({"type": "start", "sample_rate": 16000, "encoding": "pcm_s16le", "channels": 1,
                            "language": "en"}))
        reader_done: list = []
        reader = threading.Thread(target=lambda: reader_done.extend(json.loads(m)["type"] for m in ws), daemon=True)
        reader.start()
        pcm = (np.clip(audio, -1, 1) * 32767).astype("<i2").tobytes()
        for i in range(0, len(pcm), 2 * FRAME):
            ws.send(pcm[i:i + 2 * FRAME])
            sent_s[0] = (i // 2 + FRAME) / 16000
        t_sent = time.monotonic() - t0
        ws.send(json.dumps({"type": "close"}))
        reader.join(600)
    t_closed = time.monotonic() - t0
    done.set()
    watcher.join(5)
    return {"sent_all_s": round(t_sent, 1), "closed_s": round(t_closed, 1), "max_lead_s": round(lead[0], 1),
            "closed": "closed" in reader_done}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=float, default=120.0)
    ap.add_argument("--port", type=int, default=8791)
    ap.add_argument("--metrics-port", type=int, default=9391)
    ap.add_argument("--out", default=str(ROOT / "eval" / "results" / "ray" / "backpressure.json"))
    ap.add_argument("serve_args", nargs="*", help="more options for both servers (after --)")
    add_data_args(ap)
    args = ap.parse_args()
    audio = data(args).session(args.seconds, 0).audio[: int(args.seconds * 16000)]
    results = {"seconds": args.seconds, "serve_args": args.serve_args}
    for name, extra, metrics_url in (
            ("serve", [], f"http://127.0.0.1:{args.port}/metrics"),
            ("serve --ray --replicas 1", ["--ray", "--replicas", "1", "--metrics-port", str(args.metrics_port)],
             f"http://127.0.0.1:{args.metrics_port}/metrics")):
        with served(extra + args.serve_args, port=args.port, ready=[metrics_url],
                    log=Path(tempfile.gettempdir()) / "serve.log") as server:
            results[name] = run(server.ws, metrics_url, audio)
        print(name, results[name], flush=True)
    write_results(Path(args.out), results, 0)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
