"""Exact token choice, plain or speculative: greedy, and keyed Gumbel-max sampling.

Sampling at temperature T picks ``argmax(logits / T + G)`` with G standard Gumbel noise, which is exactly
a draw from ``softmax(logits / T)`` (the Gumbel-max trick). The noise of a position is a function of
(seed, row key, position) only, never of what was drafted, so the draft proposes with the same noise and
the target verifies greedily on its own perturbed logits: a speculative decode returns the very tokens
target-only sampling returns for the same seed and keys, and hence exactly the target's distribution.
Greedy is the same rule without noise.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

_MASK = (1 << 64) - 1


def _mix(*values: int) -> int:
    """A 63-bit seed from a few integers (splitmix64 steps): nearby keys give unrelated noise."""
    h = 0x9E3779B97F4A7C15
    for v in values:
        h = ((h ^ (v & _MASK)) * 0xBF58476D1CE4E5B9) & _MASK
        h = ((h ^ (h >> 27)) * 0x94D049BB133111EB) & _MASK
        h ^= h >> 31
    return h >> 1


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
        out = torch.empty(len(keys), size, device=device)
        generator = torch.Generator(device=device)
        for i, (key, pos) in enumerate(zip(keys, positions)):
            out[i].exponential_(generator=generator.manual_seed(_mix(self.seed, *key, pos)))
        return out.clamp_(min=torch.finfo(out.dtype).tiny).log_().neg_()  # -log Exp(1) is Gumbel(0, 1)

    def choose(self, logits: torch.Tensor, noise: torch.Tensor | None) -> torch.Tensor:
        """The token of every row (and position): the argmax of the logits, perturbed when sampling."""
        return logits.argmax(dim=-1) if noise is None else (logits / self.temperature + noise).argmax(dim=-1)

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
