"""A pass's device arithmetic after the target's forward, shared by the eager loop and the static one: Whisper's
rules at every verified position, acceptance, the tokens each row emits (``judge``), and each row's advance over its
new tokens, cut at end-of-text and at its room (``advance``). Tensor operations only: nothing here reads the host."""
from __future__ import annotations

import torch

from .budget import phase
from .logits import RuleState
from .rows import DecodeOptions


def judge(logits: torch.Tensor, drafts: torch.Tensor, state: RuleState, o: DecodeOptions,
          noise: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The target's logits [m, kk + 1, V] at the last token and after each of the kk ``drafts`` [m, kk]: per row the
    drafts accepted [m], the kk + 1 tokens it would emit (accepted drafts, then the target's own) and their
    log-probabilities (after Whisper's rules, each position with its own history: ``state`` and the drafts before)."""
    m, kk = drafts.shape
    with phase("rules"):
        states = state.after(drafts, o.rules.begin)  # position j: the row's history + drafts[:j]
        logits = o.rules(logits.reshape(m * (kk + 1), -1), states).view(m, kk + 1, -1)
    with phase("acceptance"):
        accepted, nxt = o.sampler.verify(logits, drafts, noise)
        emitted = torch.cat([drafts, drafts.new_zeros(m, 1)], dim=1).scatter_(1, accepted[:, None], nxt[:, None])
        token_lp = torch.log_softmax(logits, dim=-1).gather(2, emitted[:, :, None])[:, :, 0]
    return accepted, emitted, token_lp


def advance(seq: torch.Tensor, n: torch.Tensor, state: RuleState, sample_len: torch.Tensor, max_pos: int,
            accepted: torch.Tensor, emitted: torch.Tensor, o: DecodeOptions
            ) -> tuple[torch.Tensor, torch.Tensor, RuleState, torch.Tensor]:
    """Each row takes its accepted tokens and the target's next (no more than its room: ``sample_len`` counts the
    tokens sampled, the decoder has ``max_pos`` positions; through end-of-text at most). Writes the ``emitted``
    tokens [m, w] into ``seq`` [m, capacity] from each row's length ``n`` on (past the cut they are stale). Returns
    per row the tokens taken (``cut``), whether it ended, its new rule state and its new length."""
    steps = torch.arange(emitted.shape[1], device=emitted.device)
    left = torch.minimum(sample_len - state.count, max_pos + 1 - n)
    take = torch.minimum(accepted + 1, left)
    eot = (emitted == o.eot) & (steps < take[:, None])
    ended = eot.any(dim=1)
    cut = torch.where(ended, eot.long().argmax(dim=1) + 1, take)
    seq.scatter_(1, n[:, None] + steps, emitted)
    return cut, ended, state.after(emitted, o.rules.begin).take(cut), n + cut
