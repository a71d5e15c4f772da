"""Latency through the OpenAI Realtime endpoint against the native protocol (issue 27).

    python eval/bench_realtime.py [--sessions 1,4] [--seconds 40] [--repeat 2] [--threads 2] [--dev DIR]
                                  [--out eval/out/realtime]

The same server as ``asr_spec serve`` runs it (its defaults: compute type, step, commit policy, engine), the same
audio (dev speech, as bench_streaming's: utterances joined by 0.6 s pauses) sent as 24 kHz pcm16 in 100 ms messages
paced at real time, and the same stream options through each protocol (language en; voice detection as the native
start's: threshold 0.5, 300 ms padding, 600 ms of silence ends an utterance), N sessions at once, the two protocols
taking turns (``--repeat`` runs each, each on a fresh server). Per word, aligned with the offline transcript's word
timestamps as in bench_streaming: final latency = when the word was committed (a native ``final``, a realtime
transcription ``delta``) minus when its audio ended. End lag: from the end of the audio to the session's last
transcript (native: ``closed``; realtime: the ``completed`` of the commit sent at the end).
"""
from __future__ import annotations

import argparse
import base64
import json
import statistics
import threading
import time
from pathlib import Path

import numpy as np
import soxr
import torch
from asr_spec.clients.stream import connect_session
from asr_spec.server.config import ServerConfig
from asr_spec.server.settings import ServeSettings
from benchkit.streaming import (
    Log,
    missing_words,
    pct,
    serve_engine,
    server_around,
    streamed_words,
    timed_words,
    word_latencies,
)

from asr_spec.evaluation.harness import add_data_args, data, write_results
from asr_spec.models.loader import ModelOptions, load
from asr_spec.streaming.config import StreamConfig
from asr_spec.streaming.policy import policy_named
from asr_spec.transcribe import TranscribeOptions, Transcriber

ROOT = Path(__file__).resolve().parents[1]
SERVE = ServeSettings()  # serve's own settings (its defaults, or ASR_SPEC_* as serve would read them)

RATE, FRAME = 24000, 2400  # 100 ms messages
VAD = {"type": "server_vad", "threshold": 0.5, "prefix_padding_ms": 300, "silence_duration_ms": 600}  # native's
PROTOCOLS = ("native", "realtime")


def pcm24(audio: np.ndarray) -> bytes:
    return (np.clip(soxr.resample(audio, 16000, RATE), -1, 1) * 32767).astype("<i2").tobytes()


def paced(send, data: bytes) -> None:
    t0 = time.monotonic()
    for i, start in enumerate(range(0, len(data), 2 * FRAME)):
        time.sleep(max(0.0, t0 + i * FRAME / RATE - time.monotonic()))
        send(data[start:start + 2 * FRAME])


def native(url: str, data: bytes, log: Log, t0: float) -> None:
    with connect_session(url + "/", None) as ws:
        ws.send(json.dumps({"type": "start", "sample_rate": RATE, "encoding": "pcm_s16le", "language": "en"}))
        reader = threading.Thread(target=lambda: [log.append((time.monotonic() - t0, json.loads(m))) for m in ws])
        reader.start()
        paced(ws.send, data)
        ws.send(json.dumps({"type": "close"}))
        reader.join()


def realtime(url: str, data: bytes, log: Log, t0: float) -> None:
    """The realtime session's deltas logged as finals (a turn's first delta joined to the text before by a space);
    ``closed`` once the commit sent at the end is transcribed. A no-op ``session.update`` after that commit marks
    where its ``committed`` (or its ``input_audio_buffer_commit_empty`` error) has been sent."""
    update = {"type": "session.update", "session": {"type": "transcription", "audio": {"input": {
        "format": {"type": "audio/pcm", "rate": RATE}, "transcription": {"language": "en"}, "turn_detection": VAD}}}}
    with connect_session(url + "/v1/realtime?intent=transcription", None) as ws:
        ws.send(json.dumps(update))

        def read() -> None:
            items, committed, updates, last = {}, None, 0, None
            for message in ws:
                e, t = json.loads(message), time.monotonic() - t0
                if e["type"] == "conversation.item.input_audio_transcription.delta":
                    join = " " if e["item_id"] not in items and any(items.values()) else ""
                    items[e["item_id"]] = items.get(e["item_id"], "") + e["delta"]
                    log.append((t, {"type": "final", "join": join, "text": e["delta"]}))
                elif e["type"] == "input_audio_buffer.committed":
                    committed = e["item_id"]
                elif e["type"] == "session.updated" and (updates := updates + 1) == 2:
                    last = committed
                elif e["type"] == "error" and e["error"]["event_id"] == "end":
                    committed = None
                elif e["type"] == "error":
                    raise RuntimeError(f"realtime error: {e}")
                if updates == 2 and (last is None or (e["type"].endswith(".completed") and e["item_id"] == last)):
                    log.append((t, {"type": "closed"}))
                    return

        reader = threading.Thread(target=read)
        reader.start()
        paced(lambda x: ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": base64.b64encode(x).decode()})),
              data)
        ws.send(json.dumps({"type": "input_audio_buffer.commit", "event_id": "end"}))
        ws.send(json.dumps({"type": "session.update", "session": {"type": "transcription"}}))
        reader.join(600)


def run(protocol: str, target, draft, audios: list[np.ndarray], step: float) -> dict:
    """N sessions of one protocol on a fresh server: their logs, engine busy time, wall time."""
    engine = serve_engine(target, draft, SERVE)
    config = ServerConfig(port=0, max_sessions=len(audios) + 1, max_sessions_per_client=len(audios) + 1,
                          stream=StreamConfig(step_s=step, policy=policy_named(SERVE.commit_policy)))
    with server_around(engine, config) as server:
        logs: list[Log] = [[] for _ in audios]
        t0 = time.monotonic()
        clients = [threading.Thread(target=native if protocol == "native" else realtime,
                                    args=(f"ws://127.0.0.1:{server.port}", pcm24(a), log, t0))
                   for a, log in zip(audios, logs)]
        for c in clients:
            c.start()
        for c in clients:
            c.join()
        wall = time.monotonic() - t0
    return {"logs": logs, "busy": engine.busy_s, "wall": wall}


def summary(runs: list[dict], audios: list[np.ndarray], offline: list) -> dict:
    final, lag, missing = [], [], 0
    for r in runs:
        for a, log, words in zip(audios, r["logs"], offline):
            final += word_latencies(log, words)["final_latency"]
            closed = [t for t, e in log if e["type"] == "closed"]
            lag.append(closed[-1] - len(a) / 16000 if closed else float("nan"))
            missing += missing_words([w.word for w in words], streamed_words(log)[0])
    duration = max(len(a) for a in audios) / 16000
    return {"runs": len(runs), "words": len(final), "final_latency_median_s": pct(final, 0.5),
            "final_latency_p90_s": pct(final, 0.9), "end_lag_max_s": round(max(lag), 2),
            "end_lag_median_s": round(statistics.median(lag), 2), "words_missing_per_run": missing / len(runs),
            "rtf": round(statistics.median(r["busy"] for r in runs) / duration, 3)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sessions", default="1,4", help="comma-separated session counts")
    ap.add_argument("--seconds", type=float, default=40.0, help="audio per session")
    ap.add_argument("--repeat", type=int, default=2, help="runs of each protocol per session count (taking turns)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default=str(ROOT / "eval" / "out" / "realtime"))
    add_data_args(ap)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    target, draft = load(ModelOptions(compute_type=SERVE.compute_type))
    tr = Transcriber(target, draft)
    dev = data(args)
    results = {"compute_type": target.precision.name, "step_s": SERVE.step,
               "policy": SERVE.commit_policy, "seconds": args.seconds, "rows": []}
    for n in (int(x) for x in args.sessions.split(",") if x):
        audios = [dev.session(args.seconds, 7 * i).audio for i in range(n)]
        offline = [timed_words(tr.transcribe(a, TranscribeOptions(language="en", word_timestamps=True)).segments)
                   for a in audios]
        runs: dict[str, list[dict]] = {p: [] for p in PROTOCOLS}
        for rep in range(args.repeat):
            for protocol in PROTOCOLS if rep % 2 == 0 else PROTOCOLS[::-1]:
                runs[protocol].append(run(protocol, target, draft, audios, SERVE.step))
                print(n, protocol, rep, summary(runs[protocol][-1:], audios, offline), flush=True)
        row = {"sessions": n, **{p: summary(runs[p], audios, offline) for p in PROTOCOLS}}
        row["final_latency_median_ratio"] = round(row["realtime"]["final_latency_median_s"]
                                                  / row["native"]["final_latency_median_s"], 3)
        results["rows"].append(row)
        print(row, flush=True)
    out = Path(args.out)
    write_results(out / "results.json", results, args.threads)
    lines = ["# Realtime endpoint vs native protocol", "", f"`python eval/bench_realtime.py` · {args.seconds:g} s per "
             f"session · {args.repeat} run(s) each · compute type {results['compute_type']} · step {SERVE.step} s · "
             f"policy {SERVE.commit_policy} · {args.threads} threads", "",
             "| sessions | protocol | final latency median / p90 s | end lag median / max s | words | missing words "
             "per run | RTF |", "|---|---|---|---|---|---|---|"]
    for row in results["rows"]:
        for p in PROTOCOLS:
            r = row[p]
            lines.append(f"| {row['sessions']} | {p} | {r['final_latency_median_s']} / {r['final_latency_p90_s']} | "
                         f"{r['end_lag_median_s']} / {r['end_lag_max_s']} | {r['words']} | "
                         f"{r['words_missing_per_run']:g} | {r['rtf']} |")
    lines += ["", *(f"- {row['sessions']} session(s): realtime / native final latency median = "
                    f"{row['final_latency_median_ratio']}" for row in results["rows"])]
    (out / "report.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
