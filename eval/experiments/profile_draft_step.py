"""Where one draft step's time goes on this machine: its products, its attention, its other operations and the Python
between them, with the draft's memory as long as a clip's view and a recording's whole 30 s window (one row, one new
token, the shortlist output layer, as ``passes.draft`` calls it).

    python eval/experiments/profile_draft_step.py [--compute-type bfloat16] [--frames 100,400,1500] [--threads 2]
                                                  [--rounds 9] [--out FILE.json]

A step's wall time is the median over rounds of 50 steps; the split comes from torch's profiler over 100 more steps
(each operator's own time), scaled to that wall time: the profiler's operators that multiply weights are
*products*, its attention kernels *attention*, every other operator *other operations*, and what the profiler does
not see of the wall time (what runs between the operators: TorchScript's interpreter once the step is traced, as a
long file's steps are; Python before) *host*.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from asr_spec.evaluation.provenance import provenance
from asr_spec.models.loader import default_draft, load_draft, load_target
from asr_spec.models.traced_step import TRACE_AFTER

PRODUCTS = ("quantized::linear_dynamic", "aten::addmm", "aten::mm", "aten::linear", "aten::matmul", "aten::bmm")
ATTENTION = ("aten::_scaled_dot_product_flash_attention_for_cpu", "aten::scaled_dot_product_attention",
             "aten::_scaled_dot_product_attention_math")
CACHED = 60  # tokens already in the draft's cache


def split(frames: int, target, draft, rounds: int) -> dict:
    """One draft step's wall ms and its split with a memory of ``frames`` encoder positions."""
    dec = draft.decoder
    memory = target.encode(torch.zeros(1, target.n_mels, 3000))[:, :frames]
    cache = dec.new_cache(memory, CACHED + 8)
    tokens = torch.randint(0, 50000, (1, CACHED + 1))
    pos = torch.arange(CACHED + 1)[None]
    dec(cache, tokens[:, :CACHED], pos[:, :CACHED])
    at = torch.zeros(1, 1, dtype=torch.long)

    def step() -> None:
        dec(cache, tokens[:, CACHED:], pos[:, CACHED:], at, shortlist=True)

    for _ in range(TRACE_AFTER + 20):  # as a long file's steps run: traced (models/traced_step.py)
        step()
    means = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(50):
            step()
        means.append((time.perf_counter() - t0) / 50 * 1000)
    wall = statistics.median(means)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(100):
            step()
    own = {e.key: e.self_cpu_time_total / 1000 / 100 for e in prof.key_averages()}  # ms a step
    profiled = sum(own.values())
    kinds = {"products": sum(v for k, v in own.items() if k in PRODUCTS),
             "attention": sum(v for k, v in own.items() if k in ATTENTION)}
    kinds["other operations"] = profiled - kinds["products"] - kinds["attention"]
    scale = min(1.0, wall / profiled) if profiled else 1.0  # the profiler's own cost inflates what it times
    ms = {k: round(v * scale, 3) for k, v in kinds.items()}
    ms["host"] = round(max(0.0, wall - sum(ms.values())), 3)
    return {"frames": frames, "step_ms": round(wall, 3), "ms": ms,
            "share": {k: round(v / wall, 3) for k, v in ms.items()}}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--compute-type", default="bfloat16")
    ap.add_argument("--frames", default="100,400,1500", help="comma list of the draft's memory lengths")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    target = load_target(compute_type=args.compute_type)
    draft = load_draft(default_draft("whisper-base"), target)
    rows = [split(int(f), target, draft, args.rounds) for f in args.frames.split(",")]
    print(f"one draft step, {target.precision.name}, {args.threads} threads (ms; share of the step)")
    for r in rows:
        print(f"{r['frames']:5d} encoder positions: {r['step_ms']:.2f} ms = "
              + ", ".join(f"{k} {v:.2f} ({r['share'][k]:.0%})" for k, v in r["ms"].items()))
    if args.out:
        doc = {"provenance": provenance(args.threads, "cpu"), "compute_type": target.precision.name,
               "draft": "auto", "cached_tokens": CACHED, "rows": rows}
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    main()
