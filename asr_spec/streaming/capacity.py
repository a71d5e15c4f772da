"""How many real-time streams the engine carries, from what its steps have cost: what a server asks before it
admits one more speaker.

A step decodes a batch of due streams; its time is fitted as ``fixed + per_row * rows + per_audio * new audio``
(least squares over the last ``WINDOW`` steps, no term below 0). Under load a stream's step lengthens (the engine's
load step, up to ``max_step_s``), so N real-time streams cost, per ``step`` seconds of audio, ``ceil(N / max_batch)``
steps' fixed part, N rows, and N x ``step`` seconds of new audio. The engine carries N while that is at most
``share`` of ``step`` (``--max-load``). One stream alone (steps of one row) cannot tell the fixed part from the
row's; the fit then charges it all to the row, which under-counts capacity (never over-counts it).

A step during which other processes kept at least ``CONTENDED_CORES`` busy (``asr_spec.cpu``: a neighbour's build, a
benchmark) measured that neighbour as much as the engine: the fit leaves such steps out while the window holds
``MIN_STEPS`` others, so a slow spell of a few seconds does not make the engine look as if it carried no one (on a
machine that is always shared, every step is contended and all of them count).
"""
from __future__ import annotations

import math
from collections import deque

import numpy as np

WINDOW = 200  # steps the fit reads
MIN_STEPS = 6  # steps before there is an estimate
MOST = 4096  # streams counted at most
CONTENDED_CORES = 0.5  # other processes' load during a step that makes it a measurement of them too


class Capacity:
    def __init__(self, window: int = WINDOW):
        # (rows, new audio s, seconds, cores other processes used meanwhile)
        self.steps: deque[tuple[int, float, float, float]] = deque(maxlen=window)

    def add(self, rows: int, audio_s: float, seconds: float, others: float = 0.0) -> None:
        self.steps.append((rows, audio_s, seconds, others))

    def fit(self) -> tuple[float, float, float] | None:
        """(fixed, per_row, per_audio) seconds, or None before ``MIN_STEPS`` steps: the non-negative least-squares
        fit among the models that charge each row (with or without a fixed part, with or without new audio), over
        the steps no other process slowed when there are enough of them."""
        if len(self.steps) < MIN_STEPS:
            return None
        quiet = [s for s in self.steps if s[3] < CONTENDED_CORES]
        data = np.array(quiet if len(quiet) >= MIN_STEPS else self.steps, dtype=np.float64)[:, :3]
        rows, audio, seconds = data[:, 0], data[:, 1], data[:, 2]
        columns = {0: np.ones_like(rows), 1: rows, 2: audio}
        best: tuple[float, dict[int, float]] | None = None
        for terms in ((1,), (0, 1), (1, 2), (0, 1, 2)):
            if 0 in terms and np.ptp(rows) == 0:
                continue  # one row count: the fixed part and the row's are one unknown, charged to the row
            if 2 in terms and np.ptp(audio) == 0:
                continue
            design = np.stack([columns[t] for t in terms], 1)
            x, *_ = np.linalg.lstsq(design, seconds, rcond=None)
            if (x < 0).any():
                continue
            residual = float(((design @ x - seconds) ** 2).sum())
            if best is None or residual < best[0] - 1e-12:
                best = residual, dict(zip(terms, x.tolist()))
        coef = best[1] if best is not None else {1: float(np.mean(seconds / np.maximum(rows, 1)))}
        return coef.get(0, 0.0), coef.get(1, 0.0), coef.get(2, 0.0)

    def streams(self, step_s: float, max_batch: int, share: float = 1.0) -> int | None:
        """Real-time streams the engine carries at steps of ``step_s`` seconds (None: not measured yet)."""
        if (f := self.fit()) is None:
            return None
        fixed, per_row, per_audio = f
        if fixed + per_row + per_audio <= 0:
            return MOST
        budget = share * step_s
        n = 0
        while n < MOST and math.ceil((n + 1) / max_batch) * fixed + (n + 1) * (per_row + per_audio * step_s) <= budget:
            n += 1
        return n
