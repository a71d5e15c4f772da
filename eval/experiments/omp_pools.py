"""What a second OpenMP pool costs a decoding thread: one stream's engine steps timed in the main thread, in a second
thread while the main thread keeps the pool it loaded the models with, and in a second thread after the main thread
released it (``asr_spec.threads.release_pool``, what ``serve`` does).

    python eval/experiments/omp_pools.py [--seconds 30] [--threads 2] [--dev DIR]

One engine as ``serve`` builds it (a fixed 0.5 s step), fed 0.5 s at a time as fast as it decodes; prints the engine's
busy milliseconds per step for each placement, twice in turn.
"""
from __future__ import annotations

import argparse
import threading
from dataclasses import replace

import torch
from asr_spec.server.settings import ServeSettings

from asr_spec.evaluation.harness import add_data_args, data
from asr_spec.models.loader import ModelOptions, load
from asr_spec.recognizer import Recognizer
from asr_spec.streaming.engine import Engine, stream_audios
from asr_spec.threads import release_pool


def steps_ms(models, audio, config) -> float:
    engine = Engine(Recognizer(*models), config)
    stream_audios(engine, [audio])
    return 1000 * engine.busy_s / max(engine.ticks, 1)


def in_thread(fn):
    out = []
    thread = threading.Thread(target=lambda: out.append(fn()))
    thread.start()
    thread.join()
    return out[0]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("--threads", type=int, default=2)
    add_data_args(ap)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    models = load(ModelOptions(compute_type="auto"))
    config = replace(ServeSettings().engine_config(), max_step_s=0.0)
    audio = data(args).session(args.seconds, 0).audio
    steps_ms(models, audio[:16000 * 5], config)  # warm-up in the main thread: it holds a pool from here on
    for rounds in range(2):
        main_ms = steps_ms(models, audio, config)
        beside_ms = in_thread(lambda: steps_ms(models, audio, config))
        release_pool()
        alone_ms = in_thread(lambda: steps_ms(models, audio, config))
        print(f"round {rounds + 1}: ms per step: main thread {main_ms:.1f}; a second thread beside the main thread's "
              f"pool {beside_ms:.1f}; a second thread after the main thread released its pool {alone_ms:.1f}",
              flush=True)


if __name__ == "__main__":
    main()
