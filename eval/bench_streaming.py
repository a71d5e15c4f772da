"""Streaming benchmarks (issues 5, 26): latency at real-time pace, simultaneous sessions, streaming WER.

    python eval/bench_streaming.py [--sessions 1,4,8] [--seconds 40] [--limit N] [--threads 2] [--device cpu]
                                   [--policy alignatt|local-agreement] [--step S] [--max-step S]
                                   [--encoder-windows audio,full] [--[no-]stream-draft]
                                   [--skip-wer] [--dev DIR] [--out eval/out/streaming]

What runs is what ``asr_spec serve`` runs with its own defaults (compute type, step, commit policy, engine
settings: read from serve's argument parser); ``--compute-type``, ``--step``, ``--policy`` and ``--[no-]stream-draft``
override them.

1. Streaming vs offline WER: every dev utterance and the long-form file streamed through the engine
   (0.5 s chunks, re-decoded every ``--step`` s of audio, the step fixed rather than grown with the load (which
   follows the machine's speed), as a real-time stream with instant decoding
   would be), against ``asr_spec transcribe``'s offline output of the same audio.
2. Latency and capacity: a real ``asr_spec serve`` (in-process, loopback) and N WebSocket clients (threads of one
   process of their own, as real clients are), each sending ``--seconds`` of dev speech (utterances joined by 0.6 s
   pauses) paced at real time. ``--device cuda`` runs serve's CUDA defaults. Each session's
   audio is also transcribed offline with word timestamps (Whisper's alignment); the streamed finals' words
   are aligned with those words. A word's partial latency is when it first appeared at its place in
   committed + partial text minus the time its audio ended, its final latency when it was committed minus
   that time. Beside it, for one run, the old yardstick: the end time estimated linearly in characters
   inside the offline segment (``*_linear_*``). Words missing: offline words with no counterpart in the
   finals. Sustained = the engine's busy time stays below the stream duration (RTF < 1). Where the time
   goes (shares of the wall time): the engine's own busy time; the inference thread inside the engine
   (``poll`` + ``step``); outside it while a stream was due (after a step, or a ``poll`` that found one)
   and while nothing was; and per decode how long its oldest audio had waited, the step's gathering included
   (``engine.queue_wait_s``). Cost vs offline: the engine's busy seconds per second of the sessions' audio against
   spec's seconds per second of the same utterances transcribed offline, each as a file, in the same run.
   The summary names the largest N with RTF < 1 and final latency median <= 3 s: to find the most
   sessions the machine serves, list candidates (``--sessions 4,6,8,10,12``).
"""
from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path
from typing import Callable

import torch
from asr_spec.server.config import ServerConfig
from asr_spec.server.settings import ServeSettings
from benchkit.streaming import (
    MAX_FINAL_LATENCY_S,
    OFFLINE,
    EngineProbe,
    Log,
    OpCount,
    TimedWord,
    cost_vs_offline,
    largest_real_time,
    missing_words,
    pct,
    run_clients,
    server_around,
    streamed_words,
    timed_words,
    word_latencies,
    words,
)

from asr_spec import streaming
from asr_spec.evaluation.data import DataSet, Session
from asr_spec.evaluation.harness import add_data_args, data, longform, write_results
from asr_spec.evaluation.metrics import wer
from asr_spec.models.loader import ModelOptions, load
from asr_spec.recognizer import Recognizer
from asr_spec.streaming.config import EngineConfig, StreamConfig, WordTiming
from asr_spec.streaming.encoding import WINDOWS
from asr_spec.streaming.engine import Engine, stream_audio
from asr_spec.streaming.policy import CommitPolicy, policy_named
from asr_spec.transcribe import TranscribeOptions, Transcriber

ROOT = Path(__file__).resolve().parents[1]
SERVE = ServeSettings()  # serve's own settings (its defaults, or ASR_SPEC_* as serve would read them)


# --- streaming WER -------------------------------------------------------------------------------------------

def streaming_wer(tr: Transcriber, ds: DataSet, step: float, policy: CommitPolicy, compare_hints: bool = False,
                  config: EngineConfig = EngineConfig()) -> dict:
    """Offline vs streamed WER; with ``compare_hints`` also the streaming cost without hint drafts."""
    offline, streamed = [], []
    cost: dict[bool, dict] = {}
    for use_hint in (True, False) if compare_hints else (True,):
        engine, passes, hinted, texts = Engine(tr, config), 0, 0, []
        for it in ds.items:
            stream = StreamConfig(step_s=step, use_hint=use_hint, policy=policy)
            events = stream_audio(engine, ds.audio(it), stream, stats=(st := []))
            passes += sum(s.decode.target_passes for s in st)
            hinted += sum(s.decode.hint_accepted for s in st)
            texts.append("".join(e.join + e.text for e in events if e.type == "final"))
        cost[use_hint] = {"engine_busy_s": round(engine.busy_s, 2), "target_passes": passes,
                          "hint_tokens_accepted": hinted}
        streamed = streamed or texts
    for it in ds.items:
        offline.append(tr.transcribe(ds.audio(it), TranscribeOptions(language="en")).text)
    refs = ds.texts()
    out = {"utterances": len(ds.items), "wer_offline": round(wer(refs, offline), 2),
           "wer_streaming": round(wer(refs, streamed), 2),
           "wer_streaming_vs_offline": round(wer(offline, streamed), 2), "with_hints": cost[True],
           "texts": dict(zip((it["id"] for it in ds.items), streamed))}  # each utterance's streamed text
    if compare_hints:
        out["without_hints"] = cost[False]
    return out


# --- capacity: a real server, real clients -------------------------------------------------------------------

def capacity(tr: Transcriber, engine: Engine, dev: DataSet, n: int, seconds: float, step: float,
             policy: CommitPolicy) -> dict:
    """One row: ``n`` real-time WebSocket sessions on a server around ``engine`` (a fresh one, as serve builds it)."""
    config = ServerConfig(port=0, max_sessions=n + 1, max_sessions_per_client=n + 1,
                          stream=StreamConfig(step_s=step, policy=policy))
    sessions = [dev.session(seconds, 7 * i) for i in range(n)]
    audios = [s.audio for s in sessions]
    with server_around(engine, config) as server:
        busy0, probe, ops = engine.busy_s, EngineProbe(engine), OpCount(engine)
        rec = engine.recognizer
        calls0, passes0, ticks0 = rec.encoder_calls, rec.decoder_passes, engine.ticks
        logs, wall = run_clients(f"ws://127.0.0.1:{server.port}", audios)
        ticks = max(1, engine.ticks - ticks0)
        shares = probe.shares(wall)
    busy, waits = engine.busy_s - busy0, list(engine.queue_wait_s)
    duration = max(len(a) for a in audios) / 16000
    row = {"sessions": n, "stream_seconds": round(duration, 1), "wall_seconds": round(wall, 1),
           "engine_busy_seconds": round(busy, 1), "rtf": round(busy / duration, 3),
           "engine_busy_share": round(busy / wall, 3), **shares,
           "queue_wait_median_s": pct(waits, 0.5), "queue_wait_p90_s": pct(waits, 0.9),
           "queue_wait_max_s": pct(waits, 1.0),
           # target-encoder forwards (retries included) and target passes per engine step that decoded
           "encoder_calls_per_tick": round((rec.encoder_calls - calls0) / ticks, 3),
           "decoder_passes_per_tick": round((rec.decoder_passes - passes0) / ticks, 3), "ticks": ticks,
           **ops.figures()}
    return row | session_words(tr, sessions, logs) | cost_vs_offline(tr, sessions, busy)



def offline_words(tr: Transcriber, s: Session) -> list[TimedWord]:
    """The session's offline transcript, utterance by utterance (data.py says why), its words timed in the session."""
    out = []
    for start, audio in s.pieces:
        segments = OFFLINE(tr, audio, word_timestamps=True)[1].segments
        out += [TimedWord(w.word, w.end + start, w.end_linear + start) for w in timed_words(segments)]
    return out


def session_words(tr: Transcriber, sessions: list[Session], logs: list[Log]) -> dict:
    """Latencies (both yardsticks), words missing against the offline transcript (those the reference has too; and
    those the offline decode invented, apart), and how long after its audio ended the last session was closed."""
    lat: dict[str, list[float]] = {}
    offline_total = missing = invented = 0
    lag = []
    for s, log in zip(sessions, logs):
        a, offline = s.audio, offline_words(tr, s)
        for key, xs in word_latencies(log, offline).items():
            lat.setdefault(key, []).extend(xs)
        offline_total += len(offline)
        said, heard = streamed_words(log)[0], [w.word for w in offline]
        real = missing_words(heard, said, words(" ".join(s.texts)))
        missing, invented = missing + real, invented + missing_words(heard, said) - real
        closed = [t for t, e in log if e["type"] == "closed"]
        lag.append(closed[-1] - len(a) / 16000 if closed else float("nan"))
    out = {"words": len(lat.get("final_latency", [])), "words_offline": offline_total, "words_missing": missing,
           "offline_words_not_streamed_nor_in_the_reference": invented}
    for key, xs in lat.items():
        out |= {f"{key}_median_s": pct(xs, 0.5), f"{key}_p90_s": pct(xs, 0.9)}
    return out | {"close_lag_max_s": round(max(lag), 2)}


# --- main ----------------------------------------------------------------------------------------------------

def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sessions", default="1,4,8", help="comma-separated session counts (empty: none)")
    ap.add_argument("--seconds", type=float, default=40.0, help="audio per session in the capacity runs")
    ap.add_argument("--step", type=float, default=SERVE.step, help=f"as serve's --step (default {SERVE.step}, serve's)")
    ap.add_argument("--max-step", type=float, default=SERVE.max_step,
                    help=f"as serve's --max-step (default {SERVE.max_step}, serve's)")
    ap.add_argument("--policy", default=SERVE.commit_policy, choices=streaming.POLICIES,
                    help=f"as serve's --commit-policy (default {SERVE.commit_policy}, serve's)")
    ap.add_argument("--limit", type=int, default=0, help="dev utterances for the WER part (0 = all)")
    ap.add_argument("--skip-wer", action="store_true")
    ap.add_argument("--alignment", default=SERVE.alignment, choices=tuple(WordTiming),
                    help=f"as serve's --alignment (default {SERVE.alignment}, serve's)")
    ap.add_argument("--compare-hints", action="store_true",
                    help="stream the long-form talk again without draft hints, to show what the hints save")
    ap.add_argument("--encoder-windows", default="",
                    help="how streams' buffers are encoded for the WER part, comma-separated (streaming/encoding.py): "
                    f"{', '.join(WINDOWS)} (default: serve's on --device: full on CUDA, {WINDOWS[0]} on a CPU)")
    ap.add_argument("--pad", type=float, default=None,
                    help="seconds of silence the streaming encoder encodes after each step's audio (default: the "
                    "engine's, 3)")
    ap.add_argument("--stream-draft", action=argparse.BooleanOptionalAction, default=SERVE.stream_draft,
                    help=f"as serve's --stream-draft (default {SERVE.stream_draft}, serve's)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--device", default="cpu", help="torch device, as serve's --device (cuda: serve's CUDA defaults)")
    ap.add_argument("--compute-type", default=SERVE.compute_type,
                    help=f"as serve's --compute-type (default {SERVE.compute_type}, serve's)")
    ap.add_argument("--out", default=str(ROOT / "eval" / "out" / "streaming"))
    add_data_args(ap)
    return ap.parse_args()


def engine_config(settings: ServeSettings, args: argparse.Namespace) -> EngineConfig:
    """serve's engine configuration from ``settings``, with ``--stream-draft`` and ``--pad`` where given."""
    config = replace(settings.engine_config(), draft=args.stream_draft)
    return config if args.pad is None else replace(config, pad_s=args.pad)


def wer_part(tr: Transcriber, args: argparse.Namespace) -> dict:
    results = {}
    dev, talks = data(args, args.limit), longform(args)
    serve = SERVE.model_copy(update={"device": args.device, "alignment": args.alignment})
    for win in args.encoder_windows.split(","):
        # a fixed step: the load step follows the machine's speed, which would make the text depend on it
        config = replace(engine_config(serve, args), encoder_window=win, max_step_s=0.0)
        tag = "" if win == WINDOWS[0] else f"_{win}_window"
        results["wer_dev" + tag] = streaming_wer(tr, dev, args.step, policy_named(args.policy), config=config)
        print("dev", win, results["wer_dev" + tag], flush=True)
        results["wer_longform" + tag] = streaming_wer(tr, talks, args.step, policy_named(args.policy),
                                                      compare_hints=args.compare_hints and win == "audio", config=config)
        print("long-form", win, results["wer_longform" + tag], flush=True)
    return results


def spread(r: dict, key: str) -> str:
    return f"{r[key + '_median_s']} / {r[key + '_p90_s']}"


COLUMNS: list[tuple[str, Callable[[dict], object]]] = [
    ("sessions", lambda r: r["sessions"]),
    ("RTF (engine busy / stream)", lambda r: r["rtf"]),
    ("engine busy / inside the engine / idle while a stream is due / idle (share of wall)",
     lambda r: " / ".join(str(r[f"engine_{k}_share"]) for k in ("busy", "inside", "idle_while_due", "idle"))),
    ("audio's wait for its decode median / p90 / max s (step included)",
     lambda r: f"{spread(r, 'queue_wait')} / {r['queue_wait_max_s']}"),
    ("partial latency median / p90 s", lambda r: spread(r, "partial_latency")),
    ("final latency median / p90 s", lambda r: spread(r, "final_latency")),
    ("old yardstick (linear in characters): partial median / p90 s", lambda r: spread(r, "partial_latency_linear")),
    ("old: final median / p90 s", lambda r: spread(r, "final_latency_linear")),
    ("encoder calls / decoder passes per tick", lambda r: f"{r.get('encoder_calls_per_tick', '—')} / "
                                                          f"{r.get('decoder_passes_per_tick', '—')}"),
    ("torch operations per tick / per stream-step", lambda r: f"{r.get('ops_per_tick', '—')} / "
                                                               f"{r.get('ops_per_stream_step', '—')}"),
    ("decodes per tick: static / eager of those that could be static (sampling fallbacks, a busy arena; none where "
     "ASR_SPEC_STATIC is off)",
     lambda r: f"{r.get('static_decodes_per_tick', '—')} / {r.get('eager_decodes_per_tick', '—')}"),
    ("engine s per stream s / offline s per audio s (cost vs offline)",
     lambda r: f"{r['engine_s_per_stream_s']} / {r['offline_s_per_audio_s']} ({r['cost_vs_offline']}x)"),
    ("words timed", lambda r: r["words"]),
    ("words missing / offline", lambda r: f"{r['words_missing']} / {r['words_offline']}"),
    ("close lag max s", lambda r: r["close_lag_max_s"]),
]


def capacity_lines(rows: list[dict]) -> list[str]:
    lines = ["| " + " | ".join(head for head, _ in COLUMNS) + " |", "|---" * len(COLUMNS) + "|"]
    lines += ["| " + " | ".join(str(cell(r)) for _, cell in COLUMNS) + " |" for r in rows]
    best = largest_real_time(rows)
    tried = ", ".join(str(r["sessions"]) for r in rows)
    return lines + ["", "Largest number of sessions at real time (RTF < 1) with final latency median <= "
                    f"{MAX_FINAL_LATENCY_S:g} s: " + (str(best) if best is not None else f"none of {tried}")]


def wer_lines(results: dict) -> list[str]:
    return [f"- {key}: {r['utterances']} file(s), WER offline {r['wer_offline']} %, streaming {r['wer_streaming']} %, "
            f"streaming vs offline {r['wer_streaming_vs_offline']} %; with hints {r['with_hints']}"
            + (f", without {r['without_hints']}" if "without_hints" in r else "")
            for key, r in results.items() if key.startswith("wer_")]


def report(results: dict, args: argparse.Namespace) -> str:
    lines = ["# Streaming benchmark", "", f"`python eval/bench_streaming.py` · serve's defaults unless told: "
             f"step {args.step} s (up to {args.max_step} s under load) · policy {args.policy} · compute type {results['compute_type']} · "
             f"{args.threads} threads"]
    for part in (wer_lines(results), capacity_lines(results["capacity"]) if results["capacity"] else []):
        lines += ["", *part] if part else []
    return "\n".join(lines) + "\n"


def main() -> None:
    args = parse_args()
    serve = SERVE.model_copy(update={"device": args.device})  # serve's defaults on that device
    args.encoder_windows = args.encoder_windows or serve.window()
    torch.set_num_threads(args.threads)
    # serve's model and draft defaults
    target, draft = load(ModelOptions(device=args.device, compute_type=args.compute_type))
    tr = Transcriber(target, draft)
    results: dict = {"step_s": args.step, "max_step_s": args.max_step,
                     "policy": args.policy, "encoder_windows": args.encoder_windows, "alignment": args.alignment,
                     "pad_s": engine_config(SERVE, args).pad_s, "stream_draft": args.stream_draft,
                     "threads": args.threads, "compute_type": target.precision.name}
    if not args.skip_wer:
        results |= wer_part(tr, args)
    results["capacity"] = []
    out = Path(args.out + ("" if args.compute_type == SERVE.compute_type else f"-{args.compute_type}"))
    dev = data(args)
    for n in (int(x) for x in args.sessions.split(",") if x):
        settings = serve.model_copy(update={"max_step": args.max_step, "alignment": args.alignment})
        row = capacity(tr, Engine(Recognizer(target, draft), engine_config(settings, args)), dev, n, args.seconds, args.step,
                       policy_named(args.policy))
        print(row, flush=True)
        results["capacity"].append(row)
        results["largest_real_time_sessions"] = largest_real_time(results["capacity"])
        # written after every count: a run cut short (a larger count that never finishes) keeps the counts before it
        write_results(out / "results.json", results, args.threads, args.device)
    results["largest_real_time_sessions"] = largest_real_time(results["capacity"])
    results = write_results(out / "results.json", results, args.threads, args.device)
    (out / "report.md").write_text(text := report(results, args))
    print(text)


if __name__ == "__main__":
    main()
