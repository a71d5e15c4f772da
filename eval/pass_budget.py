"""The pass budget: where a decode's time goes per target pass, phase by phase (target forward, draft forwards,
Whisper's logit rules, acceptance, host reads, bookkeeping), at each compute type, target-only and speculative
(a fixed K, the default, and the adaptive draft length). How every change to the decode loop is judged (issue 39).

    python eval/pass_budget.py [--compute-type float32,int8] [--files 16] [--batch 1] [--k 3] [--threads 2]
                               [--device cuda] [--dev DIR | --manifest FILE] [--out FILE.json]

Decodes the first ``--files`` dev (or ``--manifest``) utterances (English, timestamps, Whisper's window loop) with a
``PassClock`` set around them (``budget.timing``). On a GPU every phase waits for the device at its end (attribution, not speed).
``decode s`` is the clocked decode; ``pass`` the mean wall time of a pass; ``loop`` everything but the decoders'
forwards.
"""
from __future__ import annotations

import argparse
from pathlib import Path

import torch

from asr_spec.decoding.budget import PHASES, PassClock, timing
from asr_spec.evaluation.harness import add_data_args, data, write_results
from asr_spec.models.loader import default_draft, load_draft, load_target
from asr_spec.transcribe import TranscribeOptions, Transcriber

SYSTEMS = {"target": dict(use_draft=False), "spec": dict(adaptive_k=False), "spec-adaptive": dict(adaptive_k=True)}


def budget(tr: Transcriber, audios: list, system: str, k: int, batch: int, device: str) -> dict:
    """One system's pass budget over ``audios`` (after a warm-up on the first)."""
    use_draft = SYSTEMS[system].get("use_draft", True)
    options = TranscribeOptions(language="en", k=k, adaptive_k=SYSTEMS[system].get("adaptive_k", False))

    def run() -> list:
        return list(tr.transcribe_many([(i, lambda a=a: a) for i, a in enumerate(audios)], options, batch, use_draft))

    tr.transcribe(audios[0], options, use_draft)  # warm-up (first calls, the draft-length chooser's first tries)
    with timing(PassClock(torch.device(device))) as clock:
        results = run()
    decode_s = sum(t.stats.decode_seconds for _, t in results)
    per = clock.table()
    forwards = per["target"] + per["draft"]
    return {"system": system, "decode_s": round(decode_s, 3), "passes": clock.passes,
            "tokens_per_row_pass": round(clock.tokens / max(clock.rows, 1), 3),
            "ms_per_pass": {p: round(v, 3) for p, v in per.items()},
            "loop_ms_per_pass": round(per["pass"] - forwards, 3),
            "loop_share": round((per["pass"] - forwards) / max(per["pass"], 1e-9), 3)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--compute-type", default="float32,int8")
    ap.add_argument("--files", type=int, default=16)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--k", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--systems", default="target,spec,spec-adaptive")
    ap.add_argument("--out", type=Path)
    add_data_args(ap)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    dev = data(args, args.files)
    audios = [dev.audio(it) for it in dev.items]
    rows = []
    for ct in args.compute_type.split(","):
        target = load_target("whisper-base", args.device, ct)
        tr = Transcriber(target, load_draft(default_draft("whisper-base"), target))
        for system in args.systems.split(","):
            r = budget(tr, audios, system, args.k, args.batch, args.device) | {"compute_type": target.precision.name}
            rows.append(r)
            ms = r["ms_per_pass"]
            print(f"{r['compute_type']:14s} {system:10s} decode {r['decode_s']:6.2f} s  {r['passes']:5d} passes  "
                  f"{r['tokens_per_row_pass']:.2f} tok/pass  pass {ms['pass']:6.2f} ms = "
                  + "  ".join(f"{p} {ms[p]:.2f}" for p in PHASES if p != "prefill")
                  + f"  | loop {r['loop_ms_per_pass']:.2f} ms ({100 * r['loop_share']:.0f} %)", flush=True)
    if args.out:
        write_results(args.out, {"files": args.files, "batch": args.batch, "k": args.k, "rows": rows}, args.threads,
                      args.device)


if __name__ == "__main__":
    main()
