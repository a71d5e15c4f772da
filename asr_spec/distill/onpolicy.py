"""On-policy distillation data (after DistillSpec): contexts the draft itself produces, labelled by the target.

Teacher forcing shows the draft only the target's own paths. When serving, the draft continues its own proposals, and
after its first miss the target corrects it; what it learns to propose after its own tokens is what
``on_policy`` adds: each example's labels are cut at a random point, the draft proposes ``steps`` tokens greedily
from there, and the target says what it would emit at every one of those positions (its greedy token and its top-k
distribution), so the draft learns the target's distribution on the draft's path.
"""
from __future__ import annotations

import random

import torch

from ..models.loader import Whisper
from ..models.network import Network
from .data import Example


@torch.no_grad()
def on_policy(draft: Network, head: torch.Tensor, head_ids: list[int] | None, target: Whisper, batch: list[Example],
              steps: int, top_k: int, rng: random.Random) -> list[Example]:
    """Examples on the draft's own paths from ``batch`` (see the module's docstring); ``inputs`` are the draft's
    tokens, ``labels`` the target's choice at each of them."""
    dev = head.device
    ids = torch.tensor(head_ids, device=dev) if head_ids else None
    cuts = [rng.randrange(len(ex.labels)) for ex in batch]
    prefixes = [ex.prompt + ex.labels[:c] for ex, c in zip(batch, cuts)]
    memory = torch.stack([ex.memory for ex in batch]).to(dev).float()
    eot = target.vocab.eot
    seqs = [list(p) for p in prefixes]
    for _ in range(steps):  # the draft's greedy proposals, a whole-sequence forward each (two small layers)
        width = max(map(len, seqs))
        x = torch.tensor([s + [eot] * (width - len(s)) for s in seqs], device=dev)
        h = draft.model.decoder(x, memory)
        last = h[torch.arange(len(seqs)), torch.tensor([len(s) - 1 for s in seqs])]
        choice = (last @ head.T).argmax(-1)
        tokens = (ids[choice] if ids is not None else choice).tolist()
        for s, t in zip(seqs, tokens):
            s.append(t)
    dec = target.decoder
    width = max(map(len, seqs))
    x = torch.tensor([s + [eot] * (width - len(s)) for s in seqs], device=dec.device)
    logits = dec(dec.new_cache(memory.to(dec.device), width), x,
                 torch.arange(width, device=dec.device).expand(len(seqs), -1))
    out = []
    for ex, p, s, j in zip(batch, prefixes, seqs, range(len(seqs))):
        lp = torch.log_softmax(logits[j, len(p) - 1:len(s)].float(), dim=-1)  # the target after each draft token
        top = lp.topk(top_k, dim=-1)
        labels = lp.argmax(-1).tolist()
        out.append(Example(f"{ex.id}~policy", "policy", ex.memory, p, labels, top.indices.to(torch.int32).cpu(),
                           top.values.to(torch.float16).cpu(), inputs=s[len(p):]))
    return out
