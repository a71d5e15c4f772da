"""The cross-attention a decode records for word timing from the decode itself (streaming's AlignAtt): the scores
of chosen (layer, head) pairs, for the query that chose each token."""
from __future__ import annotations

from typing import Sequence

import torch


class HeadRecorder:
    """Keeps, per request, the recorded heads' scores [heads, S] by the position of the query that produced them."""

    def __init__(self, heads: tuple[tuple[int, int], ...], rows: int):
        self.heads: dict[int, list[int]] = {}  # layer -> its heads whose cross-attention is recorded
        for layer, head in heads:
            self.heads.setdefault(layer, []).append(head)
        self.kept: list[dict[int, torch.Tensor]] = [{} for _ in range(rows)]  # per request: position -> [heads, S]

    def scores(self) -> dict[int, Sequence[int] | torch.Tensor] | None:
        """What the target fills with the recorded heads' cross-attention scores, {layer: its recorded heads} (the
        decoder's ``cross_scores``; None: nothing recorded)."""
        return dict(self.heads) if self.heads else None

    def record(self, scores: dict[int, Sequence[int] | torch.Tensor] | None, live: list[int], positions: list[range],
               first: int | None) -> None:
        """Keep the scores of the queries at ``positions`` (per live row, the request indices ``live``; the pass fed
        positions from ``first``, or from each range's start). A position recorded again (a rejected draft fed
        again by the next pass) keeps its newest scores."""
        if scores is None:
            return
        for i, (r, where) in enumerate(zip(live, positions)):
            if not where:
                continue
            at = where.start - (where.start if first is None else first)  # the pass's query of the first position
            picked = torch.cat([scores[layer][i, :, at:at + len(where)] for layer in self.heads])  # [h, len, S]
            for j, p in enumerate(where):
                self.kept[r][p] = picked[:, j]

    def result(self, r: int, start: int, tokens: int) -> torch.Tensor | None:
        """Request r's scores [heads, tokens + 1 (or tokens), S] from position ``start`` (the query that chose its
        prefix's first token); forgets them."""
        if not self.heads:
            return None
        rows = self.kept[r]
        kept = [rows[p] for p in range(start, start + tokens + 1) if p in rows]
        self.kept[r] = {}
        return torch.stack(kept, dim=1) if kept else None
