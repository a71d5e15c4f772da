"""The draft's output layer: which text tokens it can propose (its shortlist), chosen from what the target said on
the training audio first, then the text corpus; and a continued draft's layer widened to more of them."""
from __future__ import annotations

from collections import Counter
from pathlib import Path

import torch

from ..models.loader import Whisper
from .data import Example


def ranked_text_tokens(target: Whisper, train: list[Example], text: tuple[Path, ...]) -> list[int]:
    """Text tokens by how much a draft needs them: first those of the target's own labels (most frequent first: what
    it says on real speech), then the most frequent tokens of the ``text`` corpus."""
    said: Counter[int] = Counter(t for ex in train for t in ex.labels)
    corpus: Counter[int] = Counter()
    for f in text:
        for line in Path(f).read_text().splitlines():
            if line.strip():
                corpus.update(target.tokenizer.encode(" " + line.strip()))
    ranked = [t for t, _ in said.most_common()] + [t for t, _ in corpus.most_common() if t not in said]
    return [t for t in ranked if t < target.vocab.eot]


def choose_shortlist(target: Whisper, train: list[Example], text: tuple[Path, ...], size: int) -> list[int] | None:
    """``size`` text tokens ranked by :func:`ranked_text_tokens`, plus end-of-text and every timestamp token (0: the
    whole vocabulary, None). Tokens outside it are sure misses for the draft; the target still verifies."""
    if not size:
        return None
    v = target.vocab
    return sorted(set(ranked_text_tokens(target, train, text)[:size]) | {v.eot} | set(range(v.timestamp_begin, v.size)))


def widened(target: Whisper, train: list[Example], text: tuple[Path, ...], size: int, head_ids: list[int],
            head: torch.Tensor) -> tuple[list[int], torch.Tensor]:
    """A draft's shortlist and output layer widened to ``size`` text tokens (unchanged when it has as many): the
    tokens it lacks taken in :func:`ranked_text_tokens`' order, each new row the target's own embedding of the token
    (the target's output layer, as a fresh draft's starts); the trained rows kept."""
    have = set(head_ids)
    count = sum(t < target.vocab.eot for t in head_ids)
    new = [t for t in ranked_text_tokens(target, train, text) if t not in have][: max(0, size - count)]
    if not new:
        return head_ids, head
    ids = sorted(have | set(new))
    rows = dict(zip(head_ids, head))
    emb = target.net.model.decoder.embed_tokens.weight.detach()
    return ids, torch.stack([rows[t] if t in rows else emb[t].to(head) for t in ids])


def restricted(head_ids: list[int], head: torch.Tensor, keep: list[int]) -> tuple[list[int], torch.Tensor]:
    """A draft's output layer cut to the tokens ``keep`` (each in its shortlist): fewer rows read at each draft step,
    the kept rows as trained. The other way from :func:`widened`: a draft trained with a wide layer served with a
    narrow one."""
    where = {t: i for i, t in enumerate(head_ids)}
    missing = [t for t in keep if t not in where]
    if missing:
        raise ValueError(f"{len(missing)} tokens to keep are not in the draft's shortlist (first: {missing[0]})")
    ids = sorted(set(keep))
    return ids, head[[where[t] for t in ids]]
