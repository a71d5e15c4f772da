"""The host ceiling of the live engine: what N streams cost the machine around the model, with a negligible model.

    python eval/host_ceiling.py [--sessions 16,64,256] [--seconds 20] [--threads 2] [--device cuda] [--compute-type T]
                                [--model tiny.en] [--draft layers:0] [--dev DIR] [--out FILE.json]

A small model serves N streams of dev speech in-process, fed 0.5 s at a time as fast as the engine takes them (no
pacing, no server), with serve's compute type and engine settings (batch, load step): by default a tiny random Whisper
(benchkit.tiny: 2 decoder layers of width 32, no draft, which never ends a text: ~100 passes a window);
``--model tiny.en`` the real whisper-tiny.en from its PyPI package (it ends its texts, as real streams do), with
``--draft layers:0`` an untrained one-layer draft. Each row also counts the torch operations the engine issues per
step and per stream-step (``OpCount``: a static decode's pass or prefill counts one — a CUDA graph's replay; on a
CPU with ``ASR_SPEC_STATIC=on`` what a GPU would replay). The model's arithmetic is next to nothing, so the engine's
busy seconds per second of audio are
what the host spends per stream: scheduling, voice detection, log-mel, the decode loop's Python and small
operations, alignment. That is the limit the host puts on any accelerator: at 0.05 s per audio second, a GPU behind
this host serves at most 20 streams at real time whatever its speed.
"""
from __future__ import annotations

import argparse
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import torch
from asr_spec.server.settings import ServeSettings
from benchkit.streaming import OpCount
from benchkit.tiny import save_tiny

from asr_spec.evaluation.harness import add_data_args, data, write_results
from asr_spec.models.loader import load_draft, load_target
from asr_spec.recognizer import Recognizer
from asr_spec.streaming.engine import Engine, stream_audios

CHUNK_S = 0.5


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sessions", default="16,64,256")
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--device", default="cpu", help="torch device, as serve's --device (cuda: serve's CUDA defaults)")
    ap.add_argument("--compute-type", default=None, help="default: serve's (auto)")
    ap.add_argument("--model", default="", help="a model spec (tiny.en, a directory); default: the tiny random one")
    ap.add_argument("--draft", default=None, help="a draft spec for --model (layers:0: an untrained copy)")
    ap.add_argument("--out", type=Path)
    add_data_args(ap)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    dev = data(args)
    settings = ServeSettings(device=args.device, compute_type=args.compute_type or ServeSettings().compute_type)
    with tempfile.TemporaryDirectory() as tmp:  # at serve's compute type (auto: measured for this model here)
        spec = args.model or str(save_tiny(Path(tmp) / "tiny", seed=0))
        target = load_target(spec, args.device, settings.compute_type)
    draft = load_draft(args.draft, target) if args.draft else None
    rows = []
    for n in (int(x) for x in args.sessions.split(",") if x):
        engine = Engine(Recognizer(target, draft), replace(settings.engine_config(), draft=draft is not None))
        stream_audios(engine, [dev.session(3.0, 0).audio], chunk_s=CHUNK_S)  # warm-up
        engine = Engine(Recognizer(target, draft), replace(settings.engine_config(), draft=draft is not None))
        ops = OpCount(engine)
        audios = [dev.session(args.seconds, 5 * i).audio for i in range(n)]
        t0 = time.perf_counter()
        stream_audios(engine, audios, chunk_s=CHUNK_S)
        wall = time.perf_counter() - t0
        audio_s = sum(len(a) for a in audios) / 16000
        row = {"model": args.model or "tiny random", "draft": args.draft, "sessions": n, "audio_seconds": round(audio_s, 1),
               "wall_seconds": round(wall, 2), "engine_busy_seconds": round(engine.busy_s, 2), "decodes": engine.decodes,
               "ticks": engine.ticks, "engine_seconds_per_audio_second": round(engine.busy_s / audio_s, 5),
               **ops.figures()}
        rows.append(row)
        print(row, flush=True)
    if args.out:
        write_results(args.out, {"seconds": args.seconds, "chunk_s": CHUNK_S, "rows": rows}, args.threads, args.device)


if __name__ == "__main__":
    main()
