"""What does voice detection cost per stream second, the streams detected together (``asr_spec.vad.probabilities``)
against Silero's own model called per chunk and stream (what the engine ran before)?

    python eval/experiments/bench_vad.py [--streams 1,4,16,64] [--steps 0.5,2.0] [--threads 2] [--out FILE.json]

Each row: S streams of dev speech, each receiving ``step`` seconds (an engine tick's new audio), detected together
and one by one with the package's model; milliseconds per stream second (median of 5), and the flags of both ways
compared over the whole dev set.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from importlib.resources import files

import numpy as np
import torch

from asr_spec.evaluation.harness import add_data_args, data
from asr_spec.vad import VoiceActivity, probabilities


def silero() -> torch.jit.ScriptModule:
    return torch.jit.load(str(files("silero_vad") / "data" / "silero_vad.jit"), map_location="cpu").eval()


@torch.inference_mode()
def one_by_one(model: torch.jit.ScriptModule, audio: np.ndarray) -> list[float]:
    """The package's model over ``audio`` chunk by chunk (its own state and context), as the engine ran it before."""
    return [float(model(torch.from_numpy(audio[i:i + 512].copy())[None], 16000)) for i in range(0, len(audio) - 511, 512)]


def timed(fn, repeats: int = 5) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--streams", default="1,4,16,64")
    ap.add_argument("--steps", default="0.5,2.0")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out")
    add_data_args(ap)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    ds = data(args)
    audios = [ds.audio(it) for it in ds.items]
    model = silero()
    theirs, ours = [], []
    for a in audios:
        model.reset_states()
        theirs += [p >= 0.5 for p in one_by_one(model, a)]
        ours += [p >= 0.5 for p in probabilities([(VoiceActivity(), a)])[0]]
    rows = []
    for s in (int(x) for x in args.streams.split(",")):
        for step in (float(x) for x in args.steps.split(",")):
            pieces = [audios[i % len(audios)][:int(step * 16000)] for i in range(s)]
            together = timed(lambda: probabilities([(VoiceActivity(), p) for p in pieces]))

            def alone() -> None:
                for p in pieces:
                    model.reset_states()
                    one_by_one(model, p)

            before = timed(alone)
            rows.append({"streams": s, "step_s": step, "ms_per_stream_s_together": round(together / s / step * 1e3, 2),
                         "ms_per_stream_s_one_by_one": round(before / s / step * 1e3, 2),
                         "speed_up": round(before / together, 1)})
            print(rows[-1], flush=True)
    out = {"threads": args.threads, "chunks": len(ours), "flags_differing": sum(a != b for a, b in zip(ours, theirs)),
           "rows": rows}
    print(json.dumps({k: v for k, v in out.items() if k != "rows"}))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
