"""Beam search over Whisper windows, deciding as openai-whisper's ``BeamSearchDecoder`` does, plain or speculative.

Each window keeps ``size`` beams (rows of one batch, the window's cross-attention keys and values computed once and
shared). A step scores every beam's next token; Whisper's logit rules apply per beam with its own history; from each
beam the ``size + 1`` most likely tokens are candidates, scored by the beam's summed log-probability plus theirs
(summed in float32, as openai-whisper's tensor of sums does). Candidates are ranked by score (ties in the order they
were met: beam by beam, token by token); a candidate that ends the text is finished, the others become the next beams
until ``size`` are taken, and the caches and rule states follow their source beam. A window stops once
``round(size * patience)`` candidates have finished (openai-whisper stops a batch once all of its audio have: each
window here is decided as if it were alone, which is the same for ``patience`` >= 1); at the length limit its best
unfinished beams are finished. The finished candidate with the best score over its length penalty (``(5 + length) /
6`` to the power ``length_penalty``, or the length itself when None) is the result.

Speculative (a draft and ``k`` > 0): each beam drafts ``k`` tokens, and one target pass scores every beam's last
token and its drafts, the rules applied at each position with that position's own history. The search then takes
its steps from those log-probabilities for as long as every beam it keeps continues along the drafts its source beam
was scored on (a beam that is its source extended by the drafted token has its next distribution in the pass
already); the first step that keeps a beam off them ends the pass. Every step is taken from the target's own
log-probabilities of that beam's own history, which the target gives bit for bit alike in a pass of one position or
of k + 1 (its rows and positions are exact, ``kv_decoder``), so the result is the plain search's, token for token;
only the number of target passes changes.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from ..models.kv_decoder import CachedDecoder, KVCache
from .logits import LogitRules, RuleState
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
    """One window's search: its beams (tokens, summed log-probabilities, and where in the last pass each one's next
    distribution is: (row, position), None when it is not there), the candidates finished so far (in the order they
    finished) and how far it went."""
    first: int  # its first row
    beams: list[list[int]]
    sums: list[float]
    at: list[tuple[int, int] | None]
    no_speech: float
    limit: int  # most steps
    finished: dict[tuple[int, ...], float] = field(default_factory=dict)
    source: list[tuple[int, int]] = field(default_factory=list)  # each beam's source: (row, position) in the pass
    steps: int = 0
    passes: int = 1  # target passes it took (the prompt's is the first)
    done: bool = False


@torch.inference_mode()
def beam_search(target: CachedDecoder, memory: torch.Tensor, requests: list[RowRequest], rules: LogitRules,
                eot: int, no_speech: int, o: BeamOptions, lengths: list[int] | None = None,
                draft: CachedDecoder | None = None, k: int = 0) -> list[RowResult]:
    """Beam search for each window of ``memory`` [N, S, D] (the target's encoder outputs; ``lengths``: each window's
    own positions, when ragged) with its request's prompt; with ``draft`` and ``k``, speculatively (the draft reads
    the same encoder output, each request's ``draft_memory_length`` of it). Returns each window's continuation
    (tokens without end-of-text, its summed log-probability with end-of-text's, the no-speech probability at
    <|startoftranscript|>)."""
    if any(r.prefix or r.hint for r in requests):
        raise ValueError("beam search takes no prefix or hint")
    k = k if draft is not None else 0
    n, b = len(requests), o.size
    dev = target.device
    width = max(len(r.prompt) for r in requests)
    # each window's most steps: its sample length, within the decoder's positions after its own prompt
    limits = [min(r.sample_len, target.max_positions - len(r.prompt)) for r in requests]
    capacity = width + max(limits) + k + 2  # drafts past the last position are scored (clamped) and never taken
    rows = lambda values: [v for v in values for _ in range(b)]  # noqa: E731
    wide = memory.repeat_interleave(b, 0)
    t_cache = target.new_cache(wide, capacity, None if lengths is None else rows(lengths),
                               cross=target.cross_kv(memory).map(lambda t: t.repeat_interleave(b, 0)))
    prompts = torch.tensor(rows([r.prompt + [eot] * (width - len(r.prompt)) for r in requests]), device=dev)
    positions = torch.arange(width, device=dev).expand(n * b, -1)
    at = torch.tensor(rows([[r.sot_index, len(r.prompt) - 1] for r in requests]), device=dev)
    # the prompt, every beam alike (positions past a shorter prompt get stale entries, overwritten before read)
    logits = target(t_cache, prompts, positions, at)
    d_cache = None
    if k:
        full = memory.shape[1] if lengths is None else None
        seen = [r.draft_memory_length or (full or lengths[i]) for i, r in enumerate(requests)]
        d_cache = draft.new_cache(wide, capacity, rows(seen))
        draft(d_cache, prompts, positions, at[:, 1:], shortlist=True)
    speech = torch.softmax(logits[::b, 0].float(), dim=-1)[:, no_speech].tolist()
    windows = [_Window(i * b, [[] for _ in range(b)], [0.0] * b, [(i * b + j, 0) for j in range(b)], speech[i],
                       limits[i]) for i in range(n)]
    begins = torch.tensor(rows([len(r.prompt) for r in requests]), device=dev)  # each row's first sampled position
    state = rules.state([[]] * (n * b), dev)
    proposals = torch.zeros(n * b, 0, dtype=torch.long, device=dev)
    after = state.after(proposals, rules.begin)  # each row's rule state at each position of the last pass
    scored = logits[:, 1:2].float()
    while True:
        logprobs = torch.log_softmax(rules(scored.reshape(-1, scored.shape[-1]), _flat(after)), dim=-1)
        top = logprobs.topk(b + 1, dim=-1)
        values = top.values.view(n * b, -1, b + 1).tolist()
        tokens = top.indices.view(n * b, -1, b + 1).tolist()
        drafted = proposals.tolist()
        for w in windows:
            while not w.done and all(a is not None for a in w.at):
                w.steps += 1
                _step(w, values, tokens, drafted, eot, o)
                w.done = len(w.finished) >= o.candidates or w.steps >= w.limit
        if all(w.done for w in windows):
            break
        # every kept beam takes its source row's caches and the rule state at its place in the pass
        sources, depths, fed = list(range(n * b)), [0] * (n * b), [eot] * (n * b)
        lengths_now, before = [1] * (n * b), [eot] * (n * b)
        for i, w in enumerate(windows):
            for j, (row, depth) in enumerate(w.source):
                r = w.first + j
                sources[r], depths[r], fed[r], lengths_now[r] = row, depth, w.beams[j][-1], len(w.beams[j])
                before[r] = w.beams[j][-2] if len(w.beams[j]) > 1 else requests[i].prompt[-1]
        index = torch.tensor(sources, device=dev)
        _reorder(t_cache, index)
        if d_cache is not None:
            _reorder(d_cache, index)
        last = torch.tensor(fed, device=dev)
        state = after.select(index).take(torch.tensor(depths, device=dev)).push(last, rules.begin)
        # the next position of each row: its first sampled one plus its beam's length less the last token (unfed)
        p = begins + torch.tensor(lengths_now, device=dev) - 1
        if k:
            proposals = _propose(draft, d_cache, torch.tensor(before, device=dev), last, p, state, rules, k)
        else:
            proposals = proposals[:, :0]
        feed = torch.cat([last[:, None], proposals], dim=1)
        scored = target(t_cache, feed, p[:, None] + torch.arange(k + 1, device=dev)).float()
        after = state.after(proposals, rules.begin)
        for w in windows:
            w.at = [(w.first + j, 0) for j in range(b)]
            w.passes += not w.done
    return [_result(w, b, eot, o) for w in windows]


def _flat(states: RuleState) -> RuleState:
    return RuleState(*states.flat())


def _step(w: _Window, values: list, tokens: list, drafted: list[list[int]], eot: int, o: BeamOptions) -> None:
    """One step of window ``w`` (openai-whisper's ``BeamSearchDecoder.update``) from its beams' distributions in
    the last pass (``values``, ``tokens``: each row's and position's most likely), its newly finished candidates
    added; each new beam's own next distribution is in the pass where it extends its source by that source's
    drafted token."""
    scores: dict[tuple[int, ...], float] = {}
    sources: dict[tuple[int, ...], int] = {}
    for j in range(len(w.beams)):
        row, depth = w.at[j]
        prefix = tuple(w.beams[j])
        for value, token in zip(values[row][depth], tokens[row][depth]):
            seq = prefix + (token,)
            scores[seq] = float(np.float32(w.sums[j]) + np.float32(value))
            sources[seq] = j
    beams, sums, at, source, finished = [], [], [], [], {}
    for seq in sorted(scores, key=scores.get, reverse=True):
        if seq[-1] == eot:
            finished[seq] = scores[seq]
            continue
        row, depth = w.at[sources[seq]]
        beams.append(list(seq))
        sums.append(float(np.float32(scores[seq])))
        on_path = depth < len(drafted[row]) and drafted[row][depth] == seq[-1]
        at.append((row, depth + 1) if on_path else None)
        source.append((row, depth))
        if len(beams) == len(w.beams):
            break
    for seq in sorted(finished, key=finished.get, reverse=True):
        if len(w.finished) >= o.candidates:
            break
        w.finished[seq] = finished[seq]
    w.beams, w.sums, w.at, w.source = beams, sums, at, source


def _propose(draft: CachedDecoder, cache: KVCache, before: torch.Tensor, last: torch.Tensor, p: torch.Tensor,
             state: RuleState, rules: LogitRules, k: int) -> torch.Tensor:
    """Each row's ``k`` greedy drafts [rows, k] after its beam (whose last token ``last`` goes at position ``p``,
    ``before`` at ``p - 1``), under Whisper's rules. The draft first feeds those two: its cache may lack the one
    before the last (a beam kept at the end of the drafts it was scored on); one it has is fed again, harmlessly."""
    cols = draft.columns
    feed = torch.stack([before, last], 1)
    fpos = torch.stack([(p - 1).clamp(min=0), p], 1)
    at = torch.ones(len(last), 1, dtype=torch.long, device=last.device)
    out = []
    for j in range(k):
        logits = draft(cache, feed, fpos, at, shortlist=True)
        processed = rules(logits[:, 0].float(), state, cols)
        c = processed.argmax(dim=-1)
        x = c if cols.ids is None else cols.ids[c]
        out.append(x)
        state = state.push(x, rules.begin)
        feed, fpos, at = x[:, None], (p + j + 1)[:, None], torch.zeros_like(at)
    return torch.stack(out, 1)


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
    return RowResult(tokens, total, w.no_speech, RowStats(target_passes=w.passes, tokens=len(tokens)))
