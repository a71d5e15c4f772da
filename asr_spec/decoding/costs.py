"""How many tokens to draft per pass: the draft length measured to give the most tokens per second.

What a pass drafting K tokens costs (K draft steps, a target pass over K+1 tokens, Whisper's rules and
the bookkeeping) and yields (accepted drafts + 1 per row) depends on the machine, the batch, the draft
and the audio, and models of it missed here (the cost of a target pass does not grow smoothly with its
width on this CPU, and drafting stops early on its own). So ``CostModel`` measures it: moving averages
of tokens per row and wall seconds per pass, for each K it has run. Each pass runs the K (0 included:
plain target decoding) with the most tokens per second, after trying every K a few times, and now and then
a neighbour of the best, so the choice follows a change (a better-matched stretch of speech, a busier
machine): ``PROBE_EVERY`` passes after the last probe, twice as long each time the best has stayed the same
since the previous probe (up to ``MAX_PROBE_EVERY``), so a settled choice costs next to nothing in probes.

A shared CPU slows every pass for a while (other processes, other requests), whatever its K. Seconds measured in a
slow stretch for one K and in a calm one for another would compare the machine's load, not the draft lengths: the
chooser then drifts to whichever K it ran last in the calm, often K = 0, and stays there (its probes come rarely).
So a pass's seconds are read as ``pace`` x the K's cost: ``pace``, how much slower than usual the machine runs now,
follows every pass quickly; the costs per K, in the machine's usual units, move slowly, and only by what the pace
does not explain. A slow stretch raises the pace, not one K's cost, and the choice stays. Greedy output does not
depend on K (the target verifies every token), so this only changes speed.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

import torch

PROBE_EVERY = 16  # passes between two tries of a draft length next to the best one (while the best changes)
MAX_PROBE_EVERY = 256  # ... and at most this many while it stays the same
FIRST_TRIES = 4  # passes each draft length runs before its measurement is trusted
PACE_RATE = 0.5  # weight of a pass in the machine's current pace (load comes and goes from one pass to the next)


@dataclass
class CostModel:
    """Tokens per row and seconds per pass, by draft length. One per decoder pair; shared by its decodes."""
    tokens: dict[int, float] = field(default_factory=dict)  # K -> tokens emitted per row per pass
    seconds: dict[int, float] = field(default_factory=dict)  # K -> wall seconds per pass at pace 1
    counts: dict[int, int] = field(default_factory=dict)  # K -> passes measured
    rate: float = 0.05  # weight of a new measurement once there are 1 / rate of them (a plain mean before)
    pace: float = 1.0  # how many times its usual time a pass takes now (a shared, busy machine: above 1)
    pace_rate: float = PACE_RATE  # 0: the pace stays 1 (seconds compared as measured, whenever measured)
    passes: int = 0
    probes: int = 0
    probe_every: int = PROBE_EVERY
    next_probe: int = PROBE_EVERY
    probed_best: int | None = None  # the best draft length at the last probe

    def record(self, k: int, tokens_per_row: float, seconds: float) -> None:
        self.counts[k] = self.counts.get(k, 0) + 1
        if self.counts[k] > FIRST_TRIES:  # the pace: this pass against its K's cost so far
            self.pace += self.pace_rate * (seconds / max(self.seconds[k], 1e-12) - self.pace)
        weight = max(self.rate, 1 / self.counts[k])
        for table, value in ((self.tokens, tokens_per_row), (self.seconds, seconds / self.pace)):
            table[k] = table.get(k, 0.0) + weight * (value - table.get(k, 0.0))

    def speed(self, k: int) -> float:
        """Measured tokens per second at draft length ``k`` (infinite until tried ``FIRST_TRIES`` times)."""
        if self.counts.get(k, 0) < FIRST_TRIES:
            return float("inf")
        return self.tokens[k] / max(self.seconds[k], 1e-9)

    def choose(self, k_max: int) -> int:
        """The draft length for the next pass: the fastest measured, or now and then a neighbour of it."""
        self.passes += 1
        best = max(range(k_max + 1), key=self.speed)
        if self.passes < self.next_probe or self.speed(best) == float("inf"):
            return best
        settled = best == self.probed_best
        self.probe_every = min(2 * self.probe_every, MAX_PROBE_EVERY) if settled else PROBE_EVERY
        self.probed_best, self.next_probe = best, self.passes + self.probe_every
        self.probes += 1
        near = [k for k in (best - 1, best + 1) if 0 <= k <= k_max]
        return near[self.probes % len(near)] if near else best


@dataclass
class BatchCosts:
    """A :class:`CostModel` per batch width: a pass over 8 rows costs and yields differently from a pass over one
    (on a CPU a wider verify pass costs more, and the chance that every row accepts falls), so the draft length
    is chosen for the live rows' count, rounded down to a power of two."""
    models: dict[int, CostModel] = field(default_factory=dict)

    def __call__(self, rows: int) -> CostModel:
        return self.models.setdefault(1 << (max(rows, 1).bit_length() - 1), CostModel())


def wall_clock(device: torch.device) -> Callable[[], float]:
    """``time.perf_counter`` once ``device``'s queued work is done (accelerators run asynchronously)."""
    def now() -> float:
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return time.perf_counter()
    return now
