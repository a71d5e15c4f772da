"""How many tokens to draft per pass, from measured costs and the running acceptance.

A pass that drafts K tokens costs K draft steps plus a target pass over K+1 tokens and yields, with
acceptance rate α, E(K) = (1 - α^(K+1)) / (1 - α) tokens on average. ``CostModel.best_k`` picks the K
(0 included: plain target decoding) with the most tokens per second. The costs are measured in the
loop (moving averages of wall time, synchronised on accelerators), so the choice follows the machine,
the batch and the draft: a draft that does not pay is not run. Greedy output does not depend on K (the
target verifies every token), so this only changes speed.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

PRIOR_VERIFY_SLOPE = 0.12  # a target pass over t tokens ~ (1 + 0.12 (t - 1)) target steps (eval/bench_steps.py)
PRIOR_DRAFT = 0.25  # a draft step ~ 0.25 target steps (eval/bench_steps.py, the shipped two-layer draft)
PROBE_EVERY = 32  # passes without drafting before one pass drafts a token again (α may have changed)


@dataclass
class CostModel:
    """Moving averages of what passes cost here. One per decoder pair; shared by its decodes."""
    alpha: float = 0.7  # acceptance over the recent decodes (the start of each decode's estimate)
    verify_s: dict[int, float] = field(default_factory=dict)  # target pass over t tokens -> seconds
    draft_s: float | None = None  # one draft step (forward, rules, proposal)
    rate: float = 0.1  # weight of a new measurement

    def _ema(self, old: float | None, new: float) -> float:
        return new if old is None else old + self.rate * (new - old)

    def record_verify(self, tokens: int, seconds: float) -> None:
        self.verify_s[tokens] = self._ema(self.verify_s.get(tokens), seconds)

    def record_draft(self, steps: int, seconds: float) -> None:
        if steps:
            self.draft_s = self._ema(self.draft_s, seconds / steps)

    def record_alpha(self, alpha: float) -> None:
        self.alpha = self._ema(self.alpha, alpha)

    def verify(self, tokens: int) -> float:
        """Estimated seconds of a target pass over ``tokens`` tokens (relative units before any measurement)."""
        if tokens in self.verify_s:
            return self.verify_s[tokens]
        seen = sorted(self.verify_s)
        if len(seen) >= 2:  # linear through the nearest two measured sizes
            lo, hi = (seen[0], seen[1]) if tokens < seen[0] else (seen[-2], seen[-1])
            slope = (self.verify_s[hi] - self.verify_s[lo]) / (hi - lo)
            return max(self.verify_s[lo] + slope * (tokens - lo), 1e-9)
        if seen:
            t = seen[0]
            return self.verify_s[t] * (1 + PRIOR_VERIFY_SLOPE * (tokens - 1)) / (1 + PRIOR_VERIFY_SLOPE * (t - 1))
        return 1 + PRIOR_VERIFY_SLOPE * (tokens - 1)

    def draft(self) -> float:
        return self.draft_s if self.draft_s is not None else PRIOR_DRAFT * self.verify(1)

    def best_k(self, alpha: float, k_max: int) -> int:
        """The draft length with the most expected tokens per second."""
        def rate(k: int) -> float:
            expected = k + 1 if alpha >= 1 else (1 - alpha ** (k + 1)) / (1 - alpha)
            return expected / (k * self.draft() + self.verify(k + 1))
        return max(range(k_max + 1), key=rate)


class Stopwatch:
    """Wall time of a piece of work on ``device`` (waits for an accelerator's queued work at both ends)."""

    def __init__(self, device: torch.device):
        self.sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)

    def __enter__(self) -> "Stopwatch":
        self.sync()
        self.t0 = time.perf_counter()
        return self

    def __exit__(self, *exc) -> None:
        self.sync()
        self.seconds = time.perf_counter() - self.t0
