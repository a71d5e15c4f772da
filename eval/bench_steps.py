"""Per-step costs of the decoders at each compute type: a target step (1 new token), a verify pass (K+1 tokens)
and a draft step, with the caches of one 30 s window at a realistic length; and the encoder on one window. The
numbers behind the speed-up formula S = E / (K c + v + o) (E tokens per pass, c a draft step, v a verify pass,
o per-pass overhead), all as multiples of the target step at the same compute type.

    python eval/bench_steps.py [--compute-type float32,int8] [--draft DIR] [--threads 2] [--batch 1]
                               [--draft-frames 400] [--device cuda [--cuda-graphs]] [--out FILE.json]

The draft is timed as ``transcribe`` runs it (int8 linear layers on a CPU, its steps traced as a long file's are,
reading only ``--draft-frames`` encoder positions: the window's audio and 1 s after it; 400 frames = a 7 s utterance,
the dev set's median) and with the whole window. ``--cuda-graphs`` also times each call replayed as a CUDA graph (the same kernels without
the host's per-operation work: what graphs would buy; the draft with the static shapes of an exact decoder).
"""
from __future__ import annotations

import argparse
import copy
import json
import statistics
import time
from pathlib import Path

import torch

from asr_spec.decoding.static import capture
from asr_spec.evaluation.provenance import cpu_name, provenance
from asr_spec.models.loader import default_draft, load_draft, load_target
from asr_spec.models.traced_step import TRACE_AFTER

NEW_TOKENS = (1, 2, 3, 4, 5, 6, 9)


def timed(fn, rounds: int = 7, repeat: int = 10, device: str = "cpu") -> float:
    """Median over rounds of the mean ms per call (this VM's timings are noisy); on a GPU, to the end of its work."""
    gpu = device.startswith("cuda")
    sync = torch.cuda.synchronize if gpu else (lambda: None)
    for _ in range(50 if gpu else 1):  # a GPU's clocks rise with its load
        fn()
    means = []
    for _ in range(rounds):
        sync()
        t0 = time.perf_counter()
        for _ in range(repeat):
            fn()
        sync()
        means.append((time.perf_counter() - t0) / repeat * 1000)
    return statistics.median(means)


def graphed(call) -> callable:
    """``call`` (static shapes, static inputs) captured as a CUDA graph; returns its replay."""
    return capture(call, warm_ups=3).replay


def bench(compute_type: str, spec: str, b: int, n: int, frames: int, device: str = "cpu", graphs: bool = False) -> dict:
    """ms per call of the target and the draft for 1..9 new tokens, and of the encoder, at one compute type."""
    target = load_target(device=device, compute_type=compute_type)
    draft = load_draft(spec, target)
    mel = torch.zeros(b, target.n_mels, 3000, device=device)
    encoder_ms = timed(lambda: target.encode(mel), rounds=3, repeat=1, device=device)
    memory = target.encode(mel)
    tokens = torch.randint(0, 50000, (b, n + 9), device=device)
    pos = torch.arange(n + 9, device=device).expand(b, -1)
    runs = {"target": (target.decoder, memory), "draft": (draft.decoder, memory[:, :frames]),
            "draft, whole window": (draft.decoder, memory)}
    if graphs:  # a graph needs static shapes: each decoder as an exact one (the whole self-attention cache)
        static = {name: copy.copy(dec) for name, dec in (("target", target.decoder), ("draft", draft.decoder))}
        for dec in static.values():
            dec.exact = True
        runs |= {"target, CUDA graph": (static["target"], memory), "draft, CUDA graph": (static["draft"], memory[:, :frames])}
    ms: dict[str, dict[int, float]] = {}
    for name, (dec, mem) in runs.items():
        cache = dec.new_cache(mem, 460)
        dec(cache, tokens[:, :n], pos[:, :n])
        at = (lambda t: None) if name.startswith("target") else (lambda t: torch.full((b, 1), t - 1, device=device))
        calls = {t: (lambda t=t, a=at(t): dec(cache, tokens[:, n:n + t], pos[:, n:n + t], a)) for t in NEW_TOKENS}
        if name.endswith("CUDA graph"):
            calls = {t: graphed(call) for t, call in calls.items()}
        elif name.startswith("draft") and dec.traces is not None:  # as a long file's steps run: traced (models/traced_step.py)
            for call in calls.values():
                for _ in range(TRACE_AFTER):
                    call()
        ms[name] = {t: timed(call, device=device) for t, call in calls.items()}
    return {"compute_type": target.precision.name, "encoder_ms": encoder_ms, "ms": ms}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--compute-type", default="float32,int8", help="comma list of compute types")
    ap.add_argument("--draft", default=None)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--prefix", type=int, default=40, help="tokens already in the cache")
    ap.add_argument("--draft-frames", type=int, default=400, help="encoder positions of the draft's audio-only view")
    ap.add_argument("--device", default="cpu", help="torch device (cpu, cuda, ...)")
    ap.add_argument("--cuda-graphs", action="store_true", help="also time each call replayed as a CUDA graph")
    ap.add_argument("--out", help="also write the figures as JSON here")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    spec = args.draft or default_draft("whisper-base") or "layers:0,5"
    results = [bench(ct, spec, args.batch, args.prefix, args.draft_frames, args.device, args.cuda_graphs)
               for ct in args.compute_type.split(",")]
    base = results[0]["ms"]["target"][1]
    print(f"batch {args.batch}, {args.threads} threads, {args.prefix} cached tokens; draft {spec}; {cpu_name()}"
          + (f"; {torch.cuda.get_device_name(torch.device(args.device))}" if args.device.startswith("cuda") else ""))
    for r in results:
        step = r["ms"]["target"][1]
        print(f"\n{r['compute_type']}: target step {step:.2f} ms ({step / base:.2f}x of {results[0]['compute_type']}), "
              f"encoder (one 30 s window) {r['encoder_ms']:.0f} ms")
        print("new tokens | " + " | ".join(f"{k} ms (x target step)" for k in r["ms"]))
        for t in NEW_TOKENS:
            print(f"{t:10d} | " + " | ".join(f"{v[t]:6.2f} ({v[t] / step:4.2f})" for v in r["ms"].values()))
    if args.out:
        doc = {"threads": args.threads, "batch": args.batch, "prefix": args.prefix, "draft": args.draft or "auto",
               "provenance": provenance(args.threads, args.device), "results": results}
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(doc, indent=1))


if __name__ == "__main__":
    main()
