"""Per-step costs of the decoders at each compute type: a target step (1 new token), a verify pass (K+1 tokens)
and a draft step, with the caches of one 30 s window at a realistic length; and the encoder on one window. The
numbers behind the speed-up formula S = E / (K c + v + o) (E tokens per pass, c a draft step, v a verify pass,
o per-pass overhead), all as multiples of the target step at the same compute type.

    python eval/bench_steps.py [--compute-type float32,int8] [--draft DIR] [--threads 2] [--batch 1]
                               [--draft-frames 400] [--out FILE.json]

The draft is timed as ``transcribe`` runs it (int8 linear layers on a CPU, reading only ``--draft-frames``
encoder positions: the window's audio and 1 s after it; 400 frames = a 7 s utterance, the dev set's median)
and with the whole window.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from asr_spec.evaluation.provenance import cpu_name, provenance
from asr_spec.models.loader import default_draft, load_draft, load_target

NEW_TOKENS = (1, 2, 3, 4, 5, 6, 9)


def timed(fn, rounds: int = 7, repeat: int = 10) -> float:
    """Median over rounds of the mean ms per call (this VM's timings are noisy)."""
    fn()
    means = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(repeat):
            fn()
        means.append((time.perf_counter() - t0) / repeat * 1000)
    return statistics.median(means)


def bench(compute_type: str, spec: str, b: int, n: int, frames: int) -> dict:
    """ms per call of the target and the draft for 1..9 new tokens, and of the encoder, at one compute type."""
    target = load_target(compute_type=compute_type)
    draft = load_draft(spec, target)
    mel = torch.zeros(b, target.n_mels, 3000)
    encoder_ms = timed(lambda: target.encode(mel), rounds=3, repeat=1)
    memory = target.encode(mel)
    tokens = torch.randint(0, 50000, (b, n + 9))
    pos = torch.arange(n + 9).expand(b, -1)
    runs = {"target": (target.decoder, memory), "draft": (draft.decoder, memory[:, :frames]),
            "draft, whole window": (draft.decoder, memory)}
    ms: dict[str, dict[int, float]] = {}
    for name, (dec, mem) in runs.items():
        cache = dec.new_cache(mem, 460)
        dec(cache, tokens[:, :n], pos[:, :n])
        at = (lambda t: None) if name == "target" else (lambda t: torch.full((b, 1), t - 1))
        ms[name] = {t: timed(lambda t=t: dec(cache, tokens[:, n:n + t], pos[:, n:n + t], at(t))) for t in NEW_TOKENS}
    return {"compute_type": target.precision.name, "encoder_ms": encoder_ms, "ms": ms}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--compute-type", default="float32,int8", help="comma list of compute types")
    ap.add_argument("--draft", default=None)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--prefix", type=int, default=40, help="tokens already in the cache")
    ap.add_argument("--draft-frames", type=int, default=400, help="encoder positions of the draft's audio-only view")
    ap.add_argument("--out", help="also write the figures as JSON here")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    spec = args.draft or default_draft("whisper-base") or "layers:0,5"
    results = [bench(ct, spec, args.batch, args.prefix, args.draft_frames) for ct in args.compute_type.split(",")]
    base = results[0]["ms"]["target"][1]
    print(f"batch {args.batch}, {args.threads} threads, {args.prefix} cached tokens; draft {spec}; {cpu_name()}")
    for r in results:
        step = r["ms"]["target"][1]
        print(f"\n{r['compute_type']}: target step {step:.2f} ms ({step / base:.2f}x of {results[0]['compute_type']}), "
              f"encoder (one 30 s window) {r['encoder_ms']:.0f} ms")
        print("new tokens | " + " | ".join(f"{k} ms (x target step)" for k in r["ms"]))
        for t in NEW_TOKENS:
            print(f"{t:10d} | " + " | ".join(f"{v[t]:6.2f} ({v[t] / step:4.2f})" for v in r["ms"].values()))
    if args.out:
        doc = {"threads": args.threads, "batch": args.batch, "prefix": args.prefix, "draft": spec,
               "provenance": provenance(args.threads), "results": results}
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(doc, indent=1))


if __name__ == "__main__":
    main()
