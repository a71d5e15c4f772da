"""Per-step costs of the decoders: a target step (1 new token), a verify pass (K+1 tokens) and a draft step,
with the caches of one 30 s window at a realistic length. The numbers behind the speed-up formula
S = E / (K c + v + o) (E tokens per pass, c a draft step, v a verify pass, o per-pass overhead).

    python eval/bench_steps.py [--draft DIR] [--threads 2] [--batch 1] [--draft-frames 400]

The int8 draft is also timed reading only ``--draft-frames`` encoder positions (what ``transcribe`` gives it: the
window's audio and 1 s after it; 400 frames = a 7 s utterance, the dev set's median).
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

from asr_spec.models.loader import default_draft, load_draft, load_target


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


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--draft", default=None)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--prefix", type=int, default=40, help="tokens already in the cache")
    ap.add_argument("--draft-frames", type=int, default=400, help="encoder positions of the draft's audio-only view")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    target = load_target()
    spec = args.draft or default_draft("whisper-base") or "layers:0,5"
    int8 = load_draft(spec, target, int8=True)
    drafts = {"draft fp32": load_draft(spec, target, int8=False), "draft int8": int8,
              f"draft int8, {args.draft_frames} frames": int8}
    b, n = args.batch, args.prefix
    memory = target.encode(torch.zeros(b, target.n_mels, 3000))
    view = {f"draft int8, {args.draft_frames} frames": memory[:, :args.draft_frames]}
    tokens = torch.randint(0, 50000, (b, n + 9))
    pos = torch.arange(n + 9).expand(b, -1)
    rows = {}
    for name, dec in (("target", target.decoder), *((k, d.decoder) for k, d in drafts.items())):
        cache = dec.new_cache(view.get(name, memory), 460)
        dec(cache, tokens[:, :n], pos[:, :n])
        for t in (1, 2, 3, 4, 5, 6, 9):
            rows[(name, t)] = timed(lambda: dec(cache, tokens[:, n:n + t], pos[:, n:n + t],
                                                None if name == "target" else torch.full((b, 1), t - 1)))
    step = rows[("target", 1)]
    print(f"batch {b}, {args.threads} threads, {n} cached tokens; draft {spec}")
    print("new tokens | target ms (x step) | " + " | ".join(f"{k} ms (x target step)" for k in drafts))
    for t in (1, 2, 3, 4, 5, 6, 9):
        print(f"{t:10d} | {rows[('target', t)]:7.2f} ({rows[('target', t)] / step:4.2f}) | "
              + " | ".join(f"{rows[(k, t)]:6.2f} ({rows[(k, t)] / step:4.2f})" for k in drafts))


if __name__ == "__main__":
    main()
