"""What the machine's CPUs are doing, from /proc: the CPU seconds every process has used, this process's own, and
so what the rest of the machine used over a span (another process's load slows this one's work: a measurement of
this machine waits for quiet, and the live engine does not count a step slowed by it as what a step costs)."""
from __future__ import annotations

import os
import time

_TICK = os.sysconf("SC_CLK_TCK")


def machine_seconds() -> float | None:
    """CPU seconds the whole machine has been busy since boot (all but idle and I/O wait), or None where /proc does
    not say."""
    try:
        with open("/proc/stat") as f:
            fields = f.readline().split()[1:]
        return (sum(int(x) for x in fields[:8]) - int(fields[3]) - int(fields[4])) / _TICK
    except (OSError, ValueError, IndexError):
        return None


def process_seconds(pid: int | None = None) -> float | None:
    """CPU seconds process ``pid`` (default: this one) has used, or None: it is gone, or /proc does not say."""
    try:
        with open(f"/proc/{pid or os.getpid()}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / _TICK
    except (OSError, ValueError, IndexError):
        return None


class Others:
    """Cores the rest of the machine kept busy since the last :meth:`cores` (or since this was made)."""

    def __init__(self):
        self._at = self._sample()

    @staticmethod
    def _sample() -> tuple[float, float | None, float]:
        return time.monotonic(), machine_seconds(), process_seconds()

    def cores(self) -> float:
        """Cores the other processes used on average since the last call; 0 where /proc does not say."""
        (t0, m0, own0), (t1, m1, own1) = self._at, (now := self._sample())
        self._at = now
        if m0 is None or m1 is None or own0 is None or own1 is None or t1 <= t0:
            return 0.0
        return max(0.0, (m1 - m0) - (own1 - own0)) / (t1 - t0)
