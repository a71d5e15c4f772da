"""Proposal and exact acceptance: greedy, and speculative rejection sampling.

``verify`` gets the target's processed logits at K+1 positions (after the prefix, and after each of
the K drafts), the drafts, and the draft distributions they were sampled from. It returns how many
drafts each row accepts and the token that follows them (the correction, or the bonus when all K
are accepted). With K = 0 it is plain target decoding.
"""
from __future__ import annotations

import torch


class Greedy:
    temperature = 0.0

    def propose(self, logits: torch.Tensor, generator: torch.Generator | None) -> tuple[torch.Tensor, None]:
        return logits.argmax(dim=-1), None

    def verify(self, logits: torch.Tensor, drafts: torch.Tensor, q: torch.Tensor | None,
               generator: torch.Generator | None) -> tuple[torch.Tensor, torch.Tensor]:
        best = logits.argmax(dim=-1)  # [B, K+1]
        k = drafts.shape[1]
        accepted = (drafts == best[:, :k]).long().cumprod(dim=1).sum(dim=1)
        return accepted, best.gather(1, accepted[:, None])[:, 0]


class Rejection:
    """Leviathan et al. 2023, Algorithm 1: accept x with probability min(1, p(x)/q(x)); at the first
    rejection sample from norm(max(0, p - q)); when all are accepted sample the bonus from p."""

    def __init__(self, temperature: float):
        if temperature <= 0:
            raise ValueError("sampling needs a temperature > 0")
        self.temperature = temperature

    def probs(self, logits: torch.Tensor) -> torch.Tensor:
        return torch.softmax(logits.float() / self.temperature, dim=-1)

    def propose(self, logits: torch.Tensor, generator: torch.Generator | None) -> tuple[torch.Tensor, torch.Tensor]:
        q = self.probs(logits)
        return torch.multinomial(q, 1, generator=generator)[:, 0], q

    def residual(self, p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
        r = (p - q).clamp(min=0)
        total = r.sum(dim=-1, keepdim=True)
        return torch.where(total > 0, r / total.clamp(min=1e-30), p)  # p == q: any rejection is impossible

    def verify(self, logits: torch.Tensor, drafts: torch.Tensor, q: torch.Tensor | None,
               generator: torch.Generator | None) -> tuple[torch.Tensor, torch.Tensor]:
        p = self.probs(logits)  # [B, K+1, V]
        b, k = drafts.shape
        if k == 0:
            return drafts.new_zeros(b), torch.multinomial(p[:, 0], 1, generator=generator)[:, 0]
        px = p[:, :k].gather(2, drafts[:, :, None])[:, :, 0]
        qx = q.gather(2, drafts[:, :, None])[:, :, 0]
        u = torch.rand(b, k, generator=generator, device=p.device)
        accepted = (u * qx < px).long().cumprod(dim=1).sum(dim=1)
        rows = torch.arange(b, device=p.device)
        at = p[rows, accepted]  # [B, V]: p at the first rejected position, or the bonus position
        rejected = accepted < k
        q_at = q[rows, accepted.clamp(max=k - 1)]
        dist = torch.where(rejected[:, None], self.residual(at, q_at), at)
        return accepted, torch.multinomial(dist, 1, generator=generator)[:, 0]


def sampler_for(temperature: float) -> Greedy | Rejection:
    return Greedy() if temperature == 0 else Rejection(temperature)
