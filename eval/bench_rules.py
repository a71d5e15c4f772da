"""Cost of Whisper's timestamp rule per decode pass: the batched TimestampRules.apply against the per-row
loop it replaced (kept as the reference in tests/test_logit_rules.py), on full-vocabulary float32 logits.
Each row has a ~40-token history holding a few timestamps and is verified at K+1 = 4 positions as in a
verify pass; one row in 8 has timestamps whose total mass beats every text token. The last column is the
log_softmax over [N, vocab] that both versions need for that rule (with its fresh output allocation).

    python eval/bench_rules.py [--repeats 200] [--threads 2]
"""
from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Callable

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from test_logit_rules import reference_apply  # noqa: E402

from asr_spec.decoding.logits import FULL, TimestampRules  # noqa: E402
from asr_spec.models.vocab import WhisperVocab  # noqa: E402

VOCAB = WhisperVocab(size=51865, sot=50258, eot=50257, sot_prev=50361, no_speech=50362, transcribe=50359,
                     translate=50358, no_timestamps=50363, max_initial_timestamp_index=50)
TB = VOCAB.timestamp_begin
K = 3


def histories(rows: int, rng: random.Random) -> list[list[int]]:
    """Per row a ~40-token history (segments of text between timestamp pairs) and its K+1 draft prefixes."""
    out = []
    for _ in range(rows):
        seq, t = [], TB + rng.randrange(20)
        while len(seq) < 40:
            seq += [t] + [rng.randrange(VOCAB.eot) for _ in range(rng.randrange(5, 15))]
            t += rng.randrange(50, 200)
            seq.append(t)
        drafts = rng.choice([[1, 2, 3], [t + 5, 4, 5], [6, 7, t + 40]])
        out += [seq + drafts[:j] for j in range(K + 1)]
    return out


def per_call_ms(fn: Callable[[torch.Tensor], None], logits: torch.Tensor, repeats: int) -> float:
    """Median ms of one call on a fresh copy of ``logits`` (the copy is not timed)."""
    times = []
    for _ in range(repeats + 5):
        x = logits.clone()
        t0 = time.perf_counter()
        fn(x)
        times.append(time.perf_counter() - t0)
    return statistics.median(times[5:]) * 1000


def log_softmax(x: torch.Tensor) -> None:
    """The log_softmax over [N, vocab] that both versions need for the timestamp-mass rule (the floor)."""
    torch.log_softmax(x.float(), dim=-1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=200)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    rules = TimestampRules(VOCAB)
    rng = random.Random(0)
    print(f"TimestampRules.apply, float32 [N, {VOCAB.size}], {args.threads} threads, median of {args.repeats}")
    print(f"{'N':>4} {'old loop ms':>12} {'batched ms':>11} {'speed-up':>9} {'log_softmax alone ms':>21}")
    for n in (4, 32):
        sampled = histories(n // (K + 1), rng)
        logits = torch.randn(n, VOCAB.size, generator=torch.Generator().manual_seed(n)) * 2
        logits[:, TB:] -= 10  # text usually wins; every 8th row's timestamps carry more mass than any text token
        logits[::8, TB:] += 20
        want, got = logits.clone(), logits.clone()
        reference_apply(rules, want, sampled, FULL)
        rules.apply(got, sampled, FULL)
        assert torch.equal(want, got)
        old = per_call_ms(lambda x: reference_apply(rules, x, sampled, FULL), logits, args.repeats)
        new = per_call_ms(lambda x: rules.apply(x, sampled, FULL), logits, args.repeats)
        floor = per_call_ms(log_softmax, logits, args.repeats)
        print(f"{n:>4} {old:>12.3f} {new:>11.3f} {old / new:>8.2f}x {floor:>21.3f}")


if __name__ == "__main__":
    main()
