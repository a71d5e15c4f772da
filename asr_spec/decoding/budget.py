"""Instruments set from outside a decode, never passed through it: where its time goes, and what it ran.

``with timing(PassClock(device)) as clock:`` times each phase of every pass the process's decodes run meanwhile: the
target's forward, the draft's forwards, Whisper's logit rules, acceptance, host reads and the bookkeeping around them
(what is left of the pass); ``eval/pass_budget.py`` reads it. On an accelerator it waits for the device at each phase's
end, so a phase is charged its own kernels (which slows the decode a little: a budget run is for attribution, timings
come from runs without it). ``with Tally() as tally:`` counts the events decodes report meanwhile (``count``: a
static decode's arena runs, how the decodes that asked to be static ran). Without either a decode pays a test of a
module attribute: its phases are entered through one shared null context.
"""
from __future__ import annotations

import time
from collections import Counter, defaultdict
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, field

import torch

PHASES = ("prefill", "target", "draft", "rules", "acceptance", "host", "bookkeeping")
NULL = nullcontext()


@dataclass
class PassClock:
    """Seconds per phase, summed over the decodes it is given to, and the passes they ran."""
    device: torch.device = torch.device("cpu")
    seconds: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    passes: int = 0
    tokens: int = 0  # tokens emitted (all rows)
    rows: int = 0  # row-passes (a pass over m rows counts m)

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def phase(self, name: str) -> AbstractContextManager:
        return _Phase(self, name)

    def start_pass(self) -> float:
        self._sync()
        return time.perf_counter()

    def end_pass(self, started: float, rows: int, tokens: int) -> None:
        """Close a pass begun at ``started``: its time not charged to a phase is bookkeeping."""
        self._sync()
        total = time.perf_counter() - started
        charged = self._open_charged
        self.seconds["bookkeeping"] += max(0.0, total - charged)
        self._open_charged = 0.0
        self.passes += 1
        self.rows += rows
        self.tokens += tokens

    _open_charged: float = 0.0

    def table(self) -> dict[str, float]:
        """ms per pass of each phase, and of the whole pass."""
        per = {p: 1000 * self.seconds.get(p, 0.0) / max(self.passes, 1) for p in PHASES}
        per["pass"] = sum(v for k, v in per.items() if k != "prefill")
        return per


class _Phase:
    def __init__(self, clock: PassClock, name: str):
        self.clock, self.name = clock, name

    def __enter__(self) -> None:
        self.clock._sync()
        self.t0 = time.perf_counter()

    def __exit__(self, *exc) -> None:
        self.clock._sync()
        took = time.perf_counter() - self.t0
        self.clock.seconds[self.name] += took
        if self.name != "prefill":
            self.clock._open_charged += took


class _Probe:
    """What is set from outside: the clock timing passes, the tallies counting events (process-wide)."""
    clock: PassClock | None = None
    tallies: tuple[Counter, ...] = ()


PROBE = _Probe()


@contextmanager
def timing(clock: PassClock) -> Iterator[PassClock]:
    """Every pass run inside the block timed by ``clock``."""
    before, PROBE.clock = PROBE.clock, clock
    try:
        yield clock
    finally:
        PROBE.clock = before


class Tally(Counter):
    """The events ``count`` reports while it is open (``with Tally() as tally:``, or ``open``/``close``; tallies may
    overlap: each counts what it saw)."""

    def open(self) -> Tally:
        PROBE.tallies += (self,)
        return self

    def close(self) -> None:
        PROBE.tallies = tuple(t for t in PROBE.tallies if t is not self)

    def __enter__(self) -> Tally:
        return self.open()

    def __exit__(self, *exc) -> None:
        self.close()


def count(event: str) -> None:
    """Report one ``event`` to the open tallies (none open: nothing)."""
    for tally in PROBE.tallies:
        tally[event] += 1


def timed() -> bool:
    """Whether passes are being timed (a static decode is not: its phases are one graph)."""
    return PROBE.clock is not None


def phase(name: str) -> AbstractContextManager:
    """The clock's timer for phase ``name``, or a context that does nothing."""
    clock = PROBE.clock
    return NULL if clock is None else clock.phase(name)


def start_pass() -> float:
    return PROBE.clock.start_pass() if PROBE.clock is not None else 0.0


def end_pass(started: float, rows: int, tokens: int) -> None:
    if PROBE.clock is not None:
        PROBE.clock.end_pass(started, rows, tokens)
