"""Runs one system over a manifest in its own process (so its peak memory is its own) and writes JSON.

    python -m asr_spec.evaluation.worker JOB.json RESULT.json
"""
from __future__ import annotations

import json
import resource
import sys
import time
from dataclasses import asdict

import torch

from ..audio import SAMPLE_RATE, load_audio
from ..models.loader import load_tokenizer
from .systems import Setup, SystemSpec, build, resolved_type


def main(job_path: str, out_path: str) -> None:
    job = json.loads(open(job_path).read())
    spec, setup = SystemSpec(**job["system"]), Setup(**job["setup"])
    torch.set_num_threads(setup.threads)
    t0 = time.perf_counter()
    transcribe = build(spec, setup)
    load_s = time.perf_counter() - t0
    audios = [load_audio(it["path"]) for it in job["items"]]
    if audios:  # one untimed warm-up run, so no system pays for first-call costs
        transcribe(audios[:1])
    items = {it["id"]: {"audio_seconds": len(a) / SAMPLE_RATE, "wall_s": [], "encoder_s": [], "decode_s": []}
             for it, a in zip(job["items"], audios)}
    run_wall: list[float] = []
    for r in range(job["repeat"]):  # the whole manifest per repeat: files in flight together when batched
        t0 = time.perf_counter()
        outputs = transcribe(audios)
        run_wall.append(time.perf_counter() - t0)
        for it, out in zip(job["items"], outputs):
            rec = items[it["id"]]
            rec["wall_s"].append(out.wall_s)
            if out.encoder_s is not None:
                rec["encoder_s"].append(out.encoder_s)
                rec["decode_s"].append(out.decode_s)
            rec["text"] = out.text
            if out.stats is not None:
                rec["stats"] = out.stats
        print(f"{spec.name}: repeat {r + 1}/{job['repeat']} in {run_wall[-1]:.1f} s", file=sys.stderr)
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
