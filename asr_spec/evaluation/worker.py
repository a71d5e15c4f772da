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
from tqdm import tqdm

from ..audio import SAMPLE_RATE, load_audio
from ..models.loader import load_tokenizer
from .systems import Setup, SystemSpec, build


def main(job_path: str, out_path: str) -> None:
    job = json.loads(open(job_path).read())
    spec, setup = SystemSpec(**job["system"]), Setup(**job["setup"])
    torch.set_num_threads(setup.threads)
    t0 = time.perf_counter()
    transcribe = build(spec, setup)
    load_s = time.perf_counter() - t0
    if job["items"]:  # one untimed warm-up run, so no system pays for first-call costs
        transcribe(load_audio(job["items"][0]["path"]))
    items: dict[str, dict] = {}
    bar = tqdm(total=len(job["items"]) * job["repeat"], desc=spec.name, unit="utt", file=sys.stderr)
    for it in job["items"]:
        audio = load_audio(it["path"])
        rec: dict = {"audio_seconds": len(audio) / SAMPLE_RATE, "wall_s": [], "encoder_s": [], "decode_s": []}
        for _ in range(job["repeat"]):
            out = transcribe(audio)
            rec["wall_s"].append(out.wall_s)
            if out.encoder_s is not None:
                rec["encoder_s"].append(out.encoder_s)
                rec["decode_s"].append(out.decode_s)
            bar.update()
        rec["text"] = out.text
        if out.stats is not None:
            rec["stats"] = out.stats
        items[it["id"]] = rec
    bar.close()
    tokenizer = load_tokenizer(setup.model)
    for rec in items.values():
        rec["text_tokens"] = len(tokenizer.encode(rec["text"]))
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    result = {"system": asdict(spec), "load_s": round(load_s, 2), "peak_rss_mb": round(peak, 1), "items": items}
    with open(out_path, "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main(*sys.argv[1:3])
