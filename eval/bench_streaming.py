"""Streaming benchmarks (issue 5): latency at real-time pace, simultaneous sessions, streaming WER.

    python eval/bench_streaming.py [--sessions 1,4,8] [--seconds 40] [--limit N] [--threads 2]
                                   [--encoder-windows audio,full] [--skip-wer] [--out eval/out/streaming]

1. Streaming vs offline WER: every dev utterance and the long-form file streamed through the engine
   (0.5 s chunks, re-decoded every ``--step`` s of audio, as a real-time stream with instant decoding
   would be), against ``asr_spec transcribe``'s offline output of the same audio.
2. Latency and capacity: a real ``asr_spec serve`` (in-process, loopback) and N WebSocket clients, each
   sending ``--seconds`` of dev speech (utterances joined by 0.6 s pauses) paced at real time. For every
   word of the final transcript: its end time is estimated inside its final segment (Whisper gives
   segment, not word, times: linear in characters), its partial latency is when it first appeared at
   its position in committed + partial text minus that time, its final latency when it was committed.
   Sustained = the engine's busy time stays below the stream duration (RTF < 1) for N streams at once.
"""
from __future__ import annotations

import argparse
import asyncio
import difflib
import json
import re
import threading
import time
from pathlib import Path

import jiwer
import numpy as np
import torch
from whisper_normalizer.english import EnglishTextNormalizer

from asr_spec.audio import load_audio
from asr_spec.clients.stream import stream_file
from asr_spec.evaluation.provenance import provenance
from asr_spec.models.loader import ModelOptions, load
from asr_spec.server.app import Server
from asr_spec.server.config import ServerConfig
from asr_spec.streaming.engine import Engine, EngineConfig, stream_audio
from asr_spec.streaming.stream import StreamConfig
from asr_spec.transcribe import TranscribeOptions, Transcriber

ROOT = Path(__file__).resolve().parents[1]
DEV = ROOT.parent / "shared" / "data" / "dev"
normalize = EnglishTextNormalizer()


def words(text: str) -> list[str]:
    return re.findall(r"[a-z0-9']+", text.lower())


def wer_pair(ref: list[str], hyp: list[str]) -> float:
    refs = [normalize(r) for r in ref]
    keep = [i for i, r in enumerate(refs) if r.strip()]
    return jiwer.wer([refs[i] for i in keep], [normalize(hyp[i]) for i in keep])


def streaming_wer(tr: Transcriber, items: list[dict], root: Path, step: float, compare_hints: bool = False,
                  config: EngineConfig = EngineConfig()) -> dict:
    """Offline vs streamed WER; with ``compare_hints`` also the streaming cost without hint drafts."""
    refs, offline, streamed = [], [], []
    cost: dict[bool, dict] = {}
    for use_hint in (True, False) if compare_hints else (True,):
        engine, passes, hinted, texts = Engine(tr, config), 0, 0, []
        for it in items:
            audio = load_audio(root / it["audio"])
            events = stream_audio(engine, audio, StreamConfig(step_s=step, use_hint=use_hint), stats=(st := []))
            passes += sum(s.decode.target_passes for s in st)
            hinted += sum(s.decode.hint_accepted for s in st)
            texts.append("".join(e.join + e.text for e in events if e.type == "final"))
        cost[use_hint] = {"engine_busy_s": round(engine.busy_s, 2), "target_passes": passes, "hint_tokens_accepted": hinted}
        streamed = streamed or texts
    for it in items:
        refs.append(it["text"])
        offline.append(tr.transcribe(load_audio(root / it["audio"]), TranscribeOptions(language="en")).text)
    out = {"utterances": len(items), "wer_offline": round(100 * wer_pair(refs, offline), 2),
           "wer_streaming": round(100 * wer_pair(refs, streamed), 2),
           "wer_streaming_vs_offline": round(100 * wer_pair(offline, streamed), 2), "with_hints": cost[True]}
    if compare_hints:
        out["without_hints"] = cost[False]
    return out


def speech(items: list[dict], seconds: float, offset: int) -> np.ndarray:
    parts, total, i = [], 0.0, offset
    while total < seconds:
        a = load_audio(DEV / items[i % len(items)]["audio"])
        parts += [a, np.zeros(int(0.6 * 16000), np.float32)]
        total += len(a) / 16000 + 0.6
        i += 1
    return np.concatenate(parts)


def client(url: str, audio: np.ndarray, log: list) -> None:
    """Stream ``audio`` at real time; log (seconds since the stream started, event)."""
    t0 = time.monotonic()
    stream_file(url, audio, 1.0, lambda e: log.append((time.monotonic() - t0, e)))


def word_times(tr: Transcriber, audio: np.ndarray) -> list[tuple[str, float]]:
    """(word, estimated end time) from the offline transcript: linear in characters inside each segment."""
    out = []
    for seg in tr.transcribe(audio, TranscribeOptions(language="en")).segments:
        w = words(seg.text)
        total, acc = sum(len(x) for x in w) or 1, 0
        for x in w:
            acc += len(x)
            out.append((x, seg.start + (seg.end - seg.start) * acc / total))
    return out


def word_latencies(log: list, timed: list[tuple[str, float]]) -> tuple[list[float], list[float]]:
    """(partial latencies, final latencies) of the final transcript's words that align with the offline
    transcript's words (which carry the time estimates)."""
    committed, first_seen, final_at = [], {}, {}
    for t, e in log:
        if e["type"] == "final":
            for x in words(e["text"]):
                final_at[len(committed)] = t
                committed.append(x)
            hyp = committed
        elif e["type"] == "partial":
            hyp = committed + words(e["text"])
        else:
            continue
        for i, x in enumerate(hyp):
            first_seen.setdefault((i, x), t)
    partial, final = [], []
    match = difflib.SequenceMatcher(a=committed, b=[w for w, _ in timed], autojunk=False)
    for block in match.get_matching_blocks():
        for d in range(block.size):
            i, end = block.a + d, timed[block.b + d][1]
            partial.append(first_seen[(i, committed[i])] - end)
            final.append(final_at[i] - end)
    return partial, final


def pct(xs: list[float], q: float) -> float | None:
    xs = sorted(xs)
    return round(xs[min(len(xs) - 1, int(q * len(xs)))], 3) if xs else None


def capacity(tr: Transcriber, items: list[dict], n: int, seconds: float, step: float) -> dict:
    server = Server(Engine(tr), ServerConfig(port=0, max_sessions=n + 1, max_sessions_per_client=n + 1, step_s=step))
    ready = threading.Event()
    th = threading.Thread(target=lambda: asyncio.run(server.serve_forever(ready)), daemon=True)
    th.start()
    ready.wait(30)
    url = f"ws://127.0.0.1:{server.port}"
    logs = [[] for _ in range(n)]
    audios = [speech(items, seconds, 7 * i) for i in range(n)]
    t0 = time.monotonic()
    clients = [threading.Thread(target=client, args=(url, a, log)) for a, log in zip(audios, logs)]
    for c in clients:
        c.start()
    for c in clients:
        c.join()
    wall = time.monotonic() - t0
    busy = server.engine.busy_s
    server.stop()
    th.join(10)
    partial, final, lag = [], [], []
    for a, log in zip(audios, logs):
        p, f = word_latencies(log, word_times(tr, a))
        partial += p
        final += f
        closed = [t for t, e in log if e["type"] == "closed"]
        lag.append(closed[-1] - len(a) / 16000 if closed else float("nan"))
    duration = max(len(a) for a in audios) / 16000
    return {"sessions": n, "stream_seconds": round(duration, 1), "wall_seconds": round(wall, 1),
            "engine_busy_seconds": round(busy, 1), "rtf": round(busy / duration, 3),
            "words": len(final), "partial_latency_median_s": pct(partial, 0.5), "partial_latency_p90_s": pct(partial, 0.9),
            "final_latency_median_s": pct(final, 0.5), "final_latency_p90_s": pct(final, 0.9),
            "close_lag_max_s": round(max(lag), 2)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sessions", default="1,4,8", help="comma-separated session counts (empty: none)")
    ap.add_argument("--seconds", type=float, default=40.0, help="audio per session in the capacity runs")
    ap.add_argument("--step", type=float, default=StreamConfig.step_s)
    ap.add_argument("--limit", type=int, default=0, help="dev utterances for the WER part (0 = all)")
    ap.add_argument("--skip-wer", action="store_true")
    ap.add_argument("--encoder-windows", default="audio,full",
                    help="streamed WER with the encoder on the buffer's audio (the default) and on padded 30 s windows")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--compute-type", default="auto", help="as serve's --compute-type (default auto, serve's own)")
    ap.add_argument("--out", default=str(ROOT / "eval" / "out" / "streaming"))
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    target, draft = load(ModelOptions(compute_type=args.compute_type))
    tr = Transcriber(target, draft)
    items = [json.loads(x) for x in (DEV / "manifest.jsonl").read_text().splitlines()]
    results: dict = {"provenance": provenance(args.threads), "step_s": args.step, "threads": args.threads,
                     "compute_type": target.precision.name}
    if not args.skip_wer:
        dev = items[: args.limit] if args.limit else items
        long_items = [json.loads(x) for x in (DEV / "longform" / "manifest.jsonl").read_text().splitlines()]
        for win in args.encoder_windows.split(","):
            config, tag = EngineConfig(encoder_window=win), "" if win == "audio" else f"_{win}_window"
            results["wer_dev" + tag] = streaming_wer(tr, dev, DEV, args.step, config=config)
            print("dev", win, results["wer_dev" + tag], flush=True)
            results["wer_longform" + tag] = streaming_wer(tr, long_items, DEV / "longform", args.step,
                                                          compare_hints=win == "audio", config=config)
            print("long-form", win, results["wer_longform" + tag], flush=True)
    results["capacity"] = []
    for n in (int(x) for x in args.sessions.split(",") if x):
        row = capacity(tr, items, n, args.seconds, args.step)
        print(row, flush=True)
        results["capacity"].append(row)
    out = Path(args.out + ("" if args.compute_type == "auto" else f"-{args.compute_type}"))
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(results, indent=1))
    lines = ["# Streaming benchmark", "", f"`python eval/bench_streaming.py` · step {args.step} s · {args.threads} threads"
             f" · compute type {target.precision.name}", ""]
    for key in [k for k in results if k.startswith("wer_")]:
        r = results[key]
        lines.append(f"- {key}: {r['utterances']} file(s), WER offline {r['wer_offline']} %, streaming "
                     f"{r['wer_streaming']} %, streaming vs offline {r['wer_streaming_vs_offline']} %; "
                     f"with hints {r['with_hints']}" + (f", without {r['without_hints']}" if "without_hints" in r else ""))
    lines += ["", "| sessions | RTF (engine busy / stream) | partial latency median / p90 s | final latency median / p90 s "
              "| words | close lag max s |", "|---|---|---|---|---|---|"]
    for r in results["capacity"]:
        lines.append(f"| {r['sessions']} | {r['rtf']} | {r['partial_latency_median_s']} / {r['partial_latency_p90_s']} | "
                     f"{r['final_latency_median_s']} / {r['final_latency_p90_s']} | {r['words']} | {r['close_lag_max_s']} |")
    (out / "report.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
