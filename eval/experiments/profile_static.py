"""Where a static decode's time goes (decoding/static.py): per pass the replayed graph and the host's one read, per
decode the eager setup around the passes (prefill, the arena's claim, results); and the kernels a pass launches, its
draft step, its rules. Target-only (K = 0) and speculative (K = 3), batch 1, the first N dev files, whisper-base
with the shipped draft.

    python eval/experiments/profile_static.py [--files 8] [--device cuda] [--compute-type float16] [--out FILE.json]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import torch

from asr_spec.decoding import static
from asr_spec.evaluation.harness import add_data_args, data
from asr_spec.features import log_mel, window
from asr_spec.models.loader import default_draft, load_draft, load_target
from asr_spec.recognizer import Recognizer


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def per_call_ms(fn, device: str, n: int = 100, rounds: int = 5) -> float:
    """Median over ``rounds`` of the mean ms of ``n`` calls (synchronised at each round's end)."""
    times = []
    for _ in range(rounds):
        sync(device)
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        sync(device)
        times.append((time.perf_counter() - t0) / n * 1000)
    return statistics.median(times)


def kernels(fn, device: str) -> dict:
    """The device kernels one call of ``fn`` launches, and their summed device time (CUDA only)."""
    if device != "cuda":
        return {}
    from torch.profiler import ProfilerActivity, profile

    sync(device)
    with profile(activities=[ProfilerActivity.CUDA]) as p:
        fn()
        sync(device)
    events = [e for e in p.events() if e.device_type.name == "CUDA"]
    return {"kernels": len(events), "device_ms": sum(e.device_time for e in events) / 1000}


@torch.inference_mode()
def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--files", type=int, default=8)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--compute-type", default="float32")
    ap.add_argument("--out", default=None)
    add_data_args(ap)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    os.environ["ASR_SPEC_STATIC"] = "on"
    dev, device = data(args, args.files), args.device
    target = load_target("whisper-base", device, args.compute_type)
    rec = Recognizer(target, load_draft(default_draft("whisper-base"), target))
    memories = [rec.encode(window(log_mel(dev.audio(it), target.n_mels), 0)[None].to(device)) for it in dev.items]
    request = rec.prompt([], "en", "transcribe", True)
    report: dict = {"device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
                    "compute_type": target.precision.name, "files": len(memories), "k": {}}
    book, booked = static.StaticDecodingTask.book, [0.0]

    def timed_book(task, *a):
        t = time.perf_counter()
        try:
            return book(task, *a)
        finally:
            booked[0] += time.perf_counter() - t

    static.StaticDecodingTask.book = timed_book  # the host's bookkeeping after each pass's read
    for k in (0, 3):
        rec.decode(memories[0], [request], k=k, static=True)  # warm-up: the arena and its bucket-1 graphs
        sync(device)
        t0, passes, tokens, booked[0] = time.perf_counter(), 0, 0, 0.0
        for m in memories:
            r = rec.decode(m, [request], k=k, static=True)[0]
            passes, tokens = passes + r.stats.target_passes, tokens + len(r.tokens)
        sync(device)
        decode_ms = (time.perf_counter() - t0) * 1000
        arena = next(a for a in static.arenas(target.decoder).values() if a.k == k)
        arena.m.fill_(0)  # no live row: a pass changes nothing, costs what a pass costs
        graph = arena.graphs.get((1,))
        replay = (lambda: graph.replay()) if graph is not None else (lambda: arena._pass(1))  # noqa: E731
        pass_ms = per_call_ms(replay, device)
        read_ms = per_call_ms(lambda: (replay(), arena.out[:1].tolist()), device)
        eager_ms = per_call_ms(lambda: arena._pass(1), device, n=20)
        row = {"decode_ms": decode_ms, "passes": passes, "tokens": tokens, "tokens_per_pass": tokens / passes,
               "decode_ms_per_pass": decode_ms / passes, "pass_ms (replayed)": pass_ms, "pass + read ms": read_ms,
               "eager pass ms": eager_ms, "bookkeeping ms per pass": booked[0] * 1000 / passes,
               "setup ms per decode": (decode_ms - passes * read_ms - booked[0] * 1000) / len(memories),
               "pass kernels": kernels(lambda: arena._pass(1), device)}
        if k:
            d, cols = arena.draft, arena.draft.columns
            pos = torch.zeros(1, 1, dtype=torch.long, device=device)
            tok = torch.full((1, 1), rec.vocab.sot, dtype=torch.long, device=device)
            step = lambda: d(arena.slots.draft.rows(1), tok, pos, pos, shortlist=True, fixed=True)  # noqa: E731
            logits = step()[:, 0].float()
            rules = lambda: arena.o.rules(logits.clone(), arena.rule_state(1), cols)  # noqa: E731
            row |= {"draft step kernels": kernels(step, device), "draft rules kernels": kernels(rules, device),
                    "draft step eager ms": per_call_ms(step, device, n=20)}
        report["k"][k] = row
        print(k, json.dumps(row, indent=1), flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
