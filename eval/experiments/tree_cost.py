"""What a small tree's extra candidates cost the target's verify on this machine (issue 78, item 2): the verify of one
row over t tokens (the last token and t - 1 drafts) against the same with a second row (a fork: the row's copy with
one draft replaced by a candidate, its own cache, the same memory); the one row's cost as its width grows is what
candidates cost where the verify attends them as positions of the row. Every figure in target steps (one row,
one token) of the same round; rounds alternate the three, medians over rounds.

    python eval/experiments/tree_cost.py [--compute-type bfloat16] [--prefix 120] [--rounds 9] [--threads 2]
                                         [--device cpu] [--out FILE.json]
                                         [--eval RESULTS.json --misses MISSES.json]

The verify's memory is one 30 s window (1,500 encoder positions; what the target attends in transcribe's loop).
With ``--eval`` (an ``asr_spec eval`` run's results.json with a speculative system) and ``--misses``
(``draft_misses.py``'s JSON) it projects what a tree of the draft's best 2 (or 4) at each rejected position would
buy that run: the draft's next 1 (3) guesses at each position it drafts, at most one token more per pass that a
rejection ended, where the target's token is among the draft's best 2 (4) as often as ``--misses`` found it among all
of its misses; each pass then costing the run's pass cost and the extra candidates' (a fork row each, or a position
each in the row). An upper bound: a candidate's own continuation is not drafted, and the costs of choosing the
candidates, of their rules and of attending each at its own position are left out.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from asr_spec.evaluation.provenance import provenance
from asr_spec.models.auto import K
from asr_spec.models.loader import load_target

TOKENS = (1, 2, 3, 4, 5, 7, 9, 13)
VERIFIED = K + 1  # a pass's verified tokens at the default K: the costs the projection reads


def timed(fn, repeat: int, device: str) -> float:
    """Mean ms per call over ``repeat`` calls (on a GPU, to the end of its work)."""
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    sync()
    t0 = time.perf_counter()
    for _ in range(repeat):
        fn()
    sync()
    return (time.perf_counter() - t0) / repeat * 1000


@torch.inference_mode()
def measure(compute_type: str, prefix: int, rounds: int, repeat: int, device: str) -> dict:
    target = load_target(device=device, compute_type=compute_type)
    dec = target.decoder
    memory = target.encode(torch.zeros(1, target.n_mels, 3000, device=device))
    calls = {}
    for rows in (1, 2):
        cache = dec.new_cache(memory.expand(rows, -1, -1).contiguous(), prefix + max(TOKENS) + 8)
        tokens = torch.randint(0, 50000, (1, prefix + max(TOKENS)), device=device).expand(rows, -1)
        pos = torch.arange(prefix + max(TOKENS), device=device).expand(rows, -1)
        dec(cache, tokens[:, :prefix], pos[:, :prefix])
        for t in TOKENS:
            calls[(rows, t)] = (lambda c=cache, tk=tokens, p=pos, t=t: dec(c, tk[:, prefix:prefix + t],
                                                                          p[:, prefix:prefix + t]))
    calls = {key: calls[key] for key in sorted(calls, key=lambda k: (k[1], k[0]))}  # each width's two in turn
    for _ in range(2):  # warm-up: the first calls of each shape choose and prepare kernels
        for call in calls.values():
            call()
    # each round's figures relative to that round's target step: this VM's speed drifts within a run
    ratios: dict[tuple[int, int], list[float]] = {key: [] for key in calls}
    steps = []
    for _ in range(rounds):
        got = {key: timed(call, repeat, device) for key, call in calls.items()}
        steps.append(got[(1, 1)])
        for key, v in got.items():
            ratios[key].append(v / got[(1, 1)])
    med = {key: statistics.median(v) for key, v in ratios.items()}
    rows = [{"tokens": t, "one_row_steps": med[(1, t)], "with_a_fork_row_steps": med[(2, t)],
             "fork_row_extra_steps": statistics.median(b - a for a, b in zip(ratios[(1, t)], ratios[(2, t)])),
             }
            for t in TOKENS]
    step = statistics.median(steps)
    return {"compute_type": target.precision.name, "target_step_ms": step, "rows": rows}


def along(curve: list[tuple[int, float]], t: float) -> float:
    """The measured verify cost (target steps) at ``t`` tokens, linear between the widths measured."""
    for (t0, c0), (t1, c1) in zip(curve, curve[1:]):
        if t <= t1:
            return c0 + (c1 - c0) * (t - t0) / (t1 - t0)
    raise ValueError(f"{t:.1f} tokens is past the widths measured")


def projection(run: dict, misses: dict, costs: dict) -> dict:
    """A top-2 and a top-4 tree's projected decode speed against the chain's in the ``run`` (``--eval``), at the
    extra candidates' costs measured here at the run's compute type."""
    name, spec = next((n, s) for n, s in run["systems"].items() if s.get("drafted"))
    kinds = misses["by_corpus"]["all"]["kinds"].values()
    missed = sum(k["misses"] for k in kinds)
    share = {w: sum(k.get("misses_the_draft", {}).get(f"target's among its best {w}", 0) for k in kinds) / missed
             for w in (2, 4)}
    tokens, passes, pass_cost = spec["decoded_tokens"], spec["target_passes"], run["pass_cost_vs_target"][name]
    at = next(r for r in costs["rows"] if r["tokens"] == VERIFIED)
    curve = [(r["tokens"], r["one_row_steps"]) for r in costs["rows"]]
    out = {"system": name, "tokens_per_pass": tokens / passes, "pass_cost": pass_cost,
           "rejections": spec["rejected"], "share_of_misses_in_best": share, "trees": []}
    drafts = spec["drafted"] / passes  # a candidate list at each drafted position: a rejection anywhere is covered
    out["drafts_per_pass"] = drafts
    for width in (2, 4):
        extra = (width - 1) * drafts
        more = share[width] * spec["rejected"] / passes  # tokens a pass, at most
        for way, cost in (("a fork row each", extra * at["fork_row_extra_steps"]),
                          ("a position each in the row", along(curve, VERIFIED + extra) - along(curve, VERIFIED))):
            gain = (tokens / passes + more) / (tokens / passes) * pass_cost / (pass_cost + cost)
            out["trees"].append({"best": width, "candidates": extra, "way": way, "extra_tokens_per_pass": more,
                                 "extra_pass_cost": cost, "decode_speed_vs_chain": gain})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--compute-type", default="bfloat16", help="comma list of compute types")
    ap.add_argument("--prefix", type=int, default=120, help="tokens already in the cache (a prompted window's)")
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--repeat", type=int, default=10, help="calls per timing")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--out", help="also write the figures as JSON here")
    ap.add_argument("--eval", help="an asr_spec eval results.json to project a tree's speed for")
    ap.add_argument("--misses", help="draft_misses.py's JSON of the same audio (with --eval)")
    a = ap.parse_args()
    if bool(a.eval) != bool(a.misses):
        ap.error("--eval and --misses go together")
    torch.set_num_threads(a.threads)
    results = [measure(ct, a.prefix, a.rounds, a.repeat, a.device) for ct in a.compute_type.split(",")]
    for r in results:
        print(f"{r['compute_type']}: target step {r['target_step_ms']:.2f} ms")
        print("tokens | one row (steps) | + a fork row (steps)")
        for row in r["rows"]:
            print(f"{row['tokens']:6d} | {row['one_row_steps']:.2f} | {row['fork_row_extra_steps']:+.2f}")
    projected = None
    if a.eval:
        run = json.loads(Path(a.eval).read_text())
        kind = next(s["compute_type"] for s in run["systems"].values() if s.get("drafted"))
        costs = next(r for r in results if r["compute_type"] == kind)
        projected = projection(run, json.loads(Path(a.misses).read_text()), costs)
        print(f"\n{a.eval} ({projected['system']}, {kind}): {projected['tokens_per_pass']:.2f} tokens a pass at "
              f"{projected['pass_cost']:.2f} target passes, {projected['drafts_per_pass']:.2f} drafts; misses with the target's token in the draft's best 2 / 4: "
              f"{projected['share_of_misses_in_best'][2]:.0%} / {projected['share_of_misses_in_best'][4]:.0%}")
        for t in projected["trees"]:
            print(f"best {t['best']} ({t['candidates']:.1f} candidates), {t['way']}: +{t['extra_tokens_per_pass']:.2f} tokens a pass at most, "
                  f"+{t['extra_pass_cost']:.2f} target steps a pass: {t['decode_speed_vs_chain']:.2f}x the chain's decode")
    if a.out:
        doc = {"prefix": a.prefix, "rounds": a.rounds, "repeat": a.repeat,
               "provenance": provenance(a.threads, a.device), "results": results, "projection": projected}
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        Path(a.out).write_text(json.dumps(doc, indent=1))


if __name__ == "__main__":
    main()
