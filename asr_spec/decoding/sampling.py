"""Exact token choice, plain or speculative: greedy, and keyed Gumbel-max sampling.

Sampling at temperature T picks ``argmax(logits / T + G)`` with G standard Gumbel noise, which is exactly
a draw from ``softmax(logits / T)`` (the Gumbel-max trick). The noise of a position is a function of
(seed, row key, position) only, never of what was drafted, so the draft proposes with the same noise and
the target verifies greedily on its own perturbed logits: a speculative decode returns the very tokens
target-only sampling returns for the same seed and keys, and hence exactly the target's distribution.
The noise is counter-based (a splitmix64 stream per position, indexed by token id): whole [rows, vocabulary]
blocks in a few integer tensor operations, the same numbers on every device. Greedy is the same rule
without noise.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

_MASK = (1 << 64) - 1
_GOLDEN, _M1, _M2 = 0x9E3779B97F4A7C15, 0xBF58476D1CE4E5B9, 0x94D049BB133111EB  # splitmix64's constants


def _mix(*values: int) -> int:
    """A 63-bit stream start from a few integers (splitmix64 steps): nearby keys give unrelated noise."""
    h = _GOLDEN
    for v in values:
        h = ((h ^ (v & _MASK)) * _M1) & _MASK
        h = ((h ^ (h >> 27)) * _M2) & _MASK
        h ^= h >> 31
    return h >> 1


def _signed(c: int) -> int:
    return c - (1 << 64) if c >= 1 << 63 else c


def _shr(x: torch.Tensor, s: int) -> torch.Tensor:
    """Logical right shift of int64 values (torch shifts signed integers arithmetically)."""
    return (x >> s) & ((1 << (64 - s)) - 1)


def _mix_rows(rows: list[tuple[int, ...]], device: torch.device) -> torch.Tensor:
    """``_mix`` of every row at once (rows of one length; int64 arithmetic wraps as the 64-bit masks do)."""
    try:  # values that fit int64 are their own 64 bits
        x = torch.tensor(rows, dtype=torch.long, device=device)
    except (OverflowError, RuntimeError, ValueError):
        x = torch.tensor([[_signed(v & _MASK) for v in row] for row in rows], dtype=torch.long, device=device)
    h = torch.full((len(rows),), _signed(_GOLDEN), dtype=torch.long, device=device)
    for j in range(x.shape[1]):
        h = (h ^ x[:, j]) * _signed(_M1)
        h = (h ^ _shr(h, 27)) * _signed(_M2)
        h = h ^ _shr(h, 31)
    return _shr(h, 1)


def _uniform(starts: torch.Tensor, size: int) -> torch.Tensor:
    """[rows, size] uniforms in (0, 1): the first ``size`` outputs of the splitmix64 stream at each start
    (int64 arithmetic wraps around, as the generator needs, on every device)."""
    x = starts[:, None] + torch.arange(1, size + 1, device=starts.device) * _signed(_GOLDEN)
    x = (x ^ _shr(x, 30)) * _signed(_M1)
    x = (x ^ _shr(x, 27)) * _signed(_M2)
    x = x ^ _shr(x, 31)
    return (_shr(x, 40).float() + 0.5) * 2.0 ** -24  # the top 24 bits, centred: never 0 or 1


@dataclass(frozen=True)
class Sampler:
    """Greedy at temperature 0, else exact sampling at ``temperature`` with noise keyed by ``seed``."""
    temperature: float = 0.0
    seed: int = 0

    def __post_init__(self):
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def noise(self, keys: list[tuple[int, ...]], positions: list[int], size: int,
              device: torch.device) -> torch.Tensor | None:
        """Gumbel noise [rows, size] for the token at ``positions[i]`` of the row keyed ``keys[i]`` (None: greedy)."""
        if self.greedy:
            return None
        rows = [(self.seed, *key, pos) for key, pos in zip(keys, positions)]
        if len(rows) > 128 and len({len(r) for r in rows}) == 1:  # many rows (keys of one length): as columns
            starts = _mix_rows(rows, device)
        else:
            starts = torch.tensor([_mix(*r) for r in rows], device=device)
        return _uniform(starts, size).log_().neg_().log_().neg_()  # -log(-log U) is Gumbel(0, 1)

    def perturbed(self, logits: torch.Tensor, noise: torch.Tensor | None) -> torch.Tensor:
        """The scores whose argmax is the token: the logits, perturbed when sampling."""
        return logits if noise is None else logits / self.temperature + noise

    def choose(self, logits: torch.Tensor, noise: torch.Tensor | None) -> torch.Tensor:
        """The token of every row (and position): the argmax of the logits, perturbed when sampling."""
        return self.perturbed(logits, noise).argmax(dim=-1)

    def verify(self, logits: torch.Tensor, drafts: torch.Tensor,
               noise: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """The target's logits at K+1 positions [B, K+1, V] (after the prefix and after each draft) and the
        K drafts [B, K]: how many drafts each row accepts, and the target's token after them (the
        correction, or the bonus when all K are accepted). With K = 0 it is plain target decoding."""
        best = self.choose(logits, noise)  # [B, K+1]
        k = drafts.shape[1]
        accepted = (drafts == best[:, :k]).long().cumprod(dim=1).sum(dim=1)
        return accepted, best.gather(1, accepted[:, None])[:, 0]


GREEDY = Sampler()
