"""Beam search over Whisper windows, deciding as openai-whisper's ``BeamSearchDecoder`` does.

Each window keeps ``size`` beams (rows of one batch, the window's cross-attention keys and values computed once and
shared). A step scores every beam's next token in one forward of the target; Whisper's logit rules apply per beam
with its own history; from each beam the ``size + 1`` most likely tokens are candidates, scored by the beam's summed
log-probability plus theirs (summed in float32, as openai-whisper's tensor of sums does). Candidates are ranked by
score (ties in the order they were met: beam by beam, token by token); a candidate that ends the text is finished,
the others become the next beams until ``size`` are taken, and the caches and rule states follow their source beam.
A window stops once ``round(size * patience)`` candidates have finished (openai-whisper stops a batch once all of its
audio have: each window here is decided as if it were alone, which is the same for ``patience`` >= 1); at the
length limit its best unfinished beams are finished. The finished candidate with the best score over its length
penalty (``(5 + length) / 6`` to the power ``length_penalty``, or the length itself when None) is the result.

The target's rows are exact (``kv_decoder``): a beam's log-probabilities do not depend on the other beams or
windows of the batch, so a window's result does not either.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ..models.kv_decoder import CachedDecoder, KVCache
from .logits import LogitRules
from .rows import RowRequest, RowResult, RowStats


@dataclass(frozen=True)
class BeamOptions:
    """openai-whisper's ``beam_size``, ``patience`` and ``length_penalty``."""
    size: int = 5
    patience: float = 1.0
    length_penalty: float | None = None

    def __post_init__(self) -> None:
        if self.size < 2:
            raise ValueError("a beam search takes at least 2 beams (1 is greedy decoding)")
        if self.patience <= 0:
            raise ValueError("patience must be above 0")

    @property
    def candidates(self) -> int:
        """Finished candidates a window collects before it stops."""
        return max(1, round(self.size * self.patience))

    def score(self, sum_logprob: float, length: int) -> float:
        penalty = length if self.length_penalty is None else ((5 + length) / 6) ** self.length_penalty
        return sum_logprob / penalty


@dataclass
class _Window:
    """One window's search: its beams' rows in the batch, their tokens and summed log-probabilities, the
    candidates finished so far (in the order they finished) and whether it is done."""
    first: int  # its first row
    beams: list[list[int]]
    sums: list[float]
    finished: dict[tuple[int, ...], float]
    no_speech: float
    steps: int = 0
    done: bool = False


@torch.inference_mode()
def beam_search(target: CachedDecoder, memory: torch.Tensor, requests: list[RowRequest], rules: LogitRules,
                eot: int, no_speech: int, o: BeamOptions, lengths: list[int] | None = None) -> list[RowResult]:
    """Beam search for each window of ``memory`` [N, S, D] (the target's encoder outputs; ``lengths``: each window's
    own positions, when ragged) with its request's prompt; returns each window's chosen continuation (tokens
    without end-of-text, its summed log-probability with end-of-text's, the no-speech probability at
    <|startoftranscript|>)."""
    if any(r.prefix or r.hint for r in requests):
        raise ValueError("beam search takes no prefix or hint")
    n, b = len(requests), o.size
    dev = target.device
    width = max(len(r.prompt) for r in requests)
    limit = min(r.sample_len for r in requests)
    cross = target.cross_kv(memory).map(lambda t: t.repeat_interleave(b, 0))
    cache = target.new_cache(memory.repeat_interleave(b, 0), min(target.max_positions, width + limit + 1),
                             None if lengths is None else [m for m in lengths for _ in range(b)], cross=cross)
    # the prompt, every beam alike (positions past a shorter prompt get stale entries, overwritten before read)
    prompts = torch.tensor([r.prompt + [eot] * (width - len(r.prompt)) for r in requests for _ in range(b)], device=dev)
    at = torch.tensor([[r.sot_index, len(r.prompt) - 1] for r in requests for _ in range(b)], device=dev)
    logits = target(cache, prompts, torch.arange(width, device=dev).expand(n * b, -1), at)
    speech = torch.softmax(logits[::b, 0].float(), dim=-1)[:, no_speech].tolist()
    windows = [_Window(i * b, [[] for _ in range(b)], [0.0] * b, {}, speech[i]) for i in range(n)]
    ends = torch.tensor([len(r.prompt) for r in requests for _ in range(b)], device=dev)  # each row's next position
    state = rules.state([[]] * (n * b), dev)
    last = logits[:, 1].float()
    for step in range(limit):
        logprobs = torch.log_softmax(rules(last, state), dim=-1)
        top = logprobs.topk(b + 1, dim=-1)
        values, tokens = top.values.tolist(), top.indices.tolist()
        sources, fed = list(range(n * b)), [eot] * (n * b)
        for w in windows:
            if w.done:
                continue
            w.steps += 1
            chosen = _step(w, values, tokens, b, eot, o)
            for j, (source, token) in enumerate(chosen):
                sources[w.first + j], fed[w.first + j] = source, token
            w.done = len(w.finished) >= o.candidates
        if all(w.done for w in windows) or step + 1 == limit:
            break
        index = torch.tensor(sources, device=dev)
        _reorder(cache, index)
        x = torch.tensor(fed, device=dev)
        state = state.select(index).push(x, rules.begin)
        positions = (ends + step)[:, None]
        last = target(cache, x[:, None], positions)[:, 0].float()
    return [_result(w, b, eot, o) for w in windows]


def _step(w: _Window, values: list[list[float]], tokens: list[list[int]], b: int, eot: int,
          o: BeamOptions) -> list[tuple[int, int]]:
    """One step of window ``w`` (openai-whisper's ``BeamSearchDecoder.update``): its next beams as (source row,
    token), its newly finished candidates added."""
    scores: dict[tuple[int, ...], float] = {}
    sources: dict[tuple[int, ...], int] = {}
    for j in range(b):
        row = w.first + j
        prefix = tuple(w.beams[j])
        for value, token in zip(values[row], tokens[row]):
            seq = prefix + (token,)
            scores[seq] = float(np.float32(w.sums[j]) + np.float32(value))
            sources[seq] = j
    beams, sums, chosen, finished = [], [], [], {}
    for seq in sorted(scores, key=scores.get, reverse=True):
        if seq[-1] == eot:
            finished[seq] = scores[seq]
            continue
        beams.append(list(seq))
        sums.append(float(np.float32(scores[seq])))
        chosen.append((w.first + sources[seq], seq[-1]))
        if len(beams) == b:
            break
    for seq in sorted(finished, key=finished.get, reverse=True):
        if len(w.finished) >= o.candidates:
            break
        w.finished[seq] = finished[seq]
    w.beams, w.sums = beams, sums
    return chosen


def _reorder(cache: KVCache, index: torch.Tensor) -> None:
    """Each row's self-attention cache becomes its source row's (the cross-attention is one window's for all of its
    beams)."""
    for t in (*cache.self_k, *cache.self_v):
        t.copy_(t.index_select(0, index))


def _result(w: _Window, b: int, eot: int, o: BeamOptions) -> RowResult:
    """The window's choice (openai-whisper's ``finalize`` and ``MaximumLikelihoodRanker``)."""
    finished = dict(w.finished)
    if len(finished) < b:  # the length limit came first: its best beams finish there
        for j in np.argsort(np.array(w.sums, dtype=np.float32))[::-1]:
            finished[tuple(w.beams[j]) + (eot,)] = w.sums[j]
            if len(finished) >= b:
                break
    seqs = [(list(seq[:-1]), s) for seq, s in finished.items()]
    best = int(np.argmax([o.score(s, len(t)) for t, s in seqs]))
    tokens, total = seqs[best]
    return RowResult(tokens, total, w.no_speech, RowStats(target_passes=w.steps, tokens=len(tokens)))
