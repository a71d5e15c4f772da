"""Runs one system once over a manifest in its own process (so its peak memory is its own) and writes JSON
(one round of ``asr_spec eval``).

    python -m asr_spec.evaluation.worker JOB.json RESULT.json
"""
from __future__ import annotations

import json
import os
import resource
import signal
import sys
import time
from dataclasses import asdict

import torch

from ..audio import SAMPLE_RATE, load_audio
from ..measure import on_parent_death
from ..models.loader import load_tokenizer
from .systems import Setup, SystemSpec, build, resolved_type

WARM_UP_S = 30  # seconds of the first file decoded untimed first (one window: the first calls of every path)


def main(job_path: str, out_path: str) -> None:
    parent = os.getppid()
    on_parent_death(signal.SIGKILL)  # an eval killed mid-round takes its worker along, not left to skew later timings
    if os.getppid() != parent:  # it died before the line above
        sys.exit(1)
    job = json.loads(open(job_path).read())
    spec, setup = SystemSpec(**job["system"]), Setup(**job["setup"])
    torch.set_num_threads(setup.threads)
    t0 = time.perf_counter()
    transcribe = build(spec, setup)
    load_s = time.perf_counter() - t0
    audios = [load_audio(it["path"]) for it in job["items"]]
    if audios:  # one untimed warm-up run (a window of the first file), so no system pays for first-call costs
        transcribe([audios[0][:WARM_UP_S * SAMPLE_RATE]])
    t0 = time.perf_counter()
    outputs = transcribe(audios)  # the whole manifest at once: files in flight together when batched
    run_wall = [time.perf_counter() - t0]
    items = {}
    for it, a, out in zip(job["items"], audios, outputs):
        timed = out.encoder_s is not None
        items[it["id"]] = {"audio_seconds": len(a) / SAMPLE_RATE, "wall_s": [out.wall_s], "text": out.text,
                           "encoder_s": [out.encoder_s] if timed else [], "decode_s": [out.decode_s] if timed else [],
                           **({"stats": out.stats} if out.stats is not None else {})}
    print(f"{spec.name}: {run_wall[0]:.1f} s", file=sys.stderr)
    tokenizer = load_tokenizer(setup.model)
    for rec in items.values():
        rec["text_tokens"] = len(tokenizer.encode(rec["text"]))
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    result = {"system": asdict(spec), "compute_type": resolved_type(spec, setup), "load_s": round(load_s, 2), "peak_rss_mb": round(peak, 1),
              "run_wall_s": [round(w, 3) for w in run_wall], "items": items}
    with open(out_path, "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main(*sys.argv[1:3])
