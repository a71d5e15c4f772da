"""The draft/verify loop: speculative decoding of a batch of Whisper prompts.

Per pass, each row: the draft proposes K tokens, the target scores all K+1 positions in one forward
pass, ``sampler.verify`` accepts a prefix (exactly: greedy argmax match, or rejection sampling), and the
row advances by accepted + 1 tokens. Rows advance by different amounts (ragged) and leave the batch
when they finish. Without a draft (or K = 0) the same loop is plain target decoding.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .costs import CostModel, wall_clock
from .kv_decoder import StaticDecoder
from .logits import LogitRules
from .sampling import Greedy, Rejection


@dataclass
class RowStats:
    target_passes: int = 0
    drafted: int = 0
    accepted: int = 0
    rejected: int = 0
    tokens: int = 0
    hint_drafted: int = 0  # hint tokens verified (streaming: the previous hypothesis)
    hint_accepted: int = 0
    accepted_at: list[int] = field(default_factory=list)  # accepted drafts per draft pass

    def add(self, other: "RowStats") -> None:
        for name in ("target_passes", "drafted", "accepted", "rejected", "tokens", "hint_drafted", "hint_accepted"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.accepted_at.extend(other.accepted_at)

    @property
    def alpha(self) -> float:
        judged = self.accepted + self.rejected
        return self.accepted / judged if judged else 0.0


@dataclass
class RowResult:
    tokens: list[int]  # sampled tokens, without the final end-of-text
    sum_logprob: float  # target log-probabilities of every sampled token (end-of-text included)
    no_speech_prob: float
    stats: RowStats

    @property
    def avg_logprob(self) -> float:
        return self.sum_logprob / (len(self.tokens) + 1)


@dataclass
class Decoders:
    target: StaticDecoder
    draft: StaticDecoder | None = None
    costs: CostModel | None = None  # pick each pass's draft length by cost (greedy only); None: always k


def _gather(seq: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    return seq.gather(1, index)


HINT_K = 8  # most hint tokens verified per pass
SAMPLE_LEN = 224  # Whisper's most tokens per window (half the decoder's 448 positions)


def _draft_proposals(draft: StaticDecoder, d_cache, seq: torch.Tensor, n: torch.Tensor, dn: torch.Tensor,
                     rows: list[int], sampled: list[list[int]], rules: LogitRules, sampler, k: int,
                     stop_below: float, vocab_size: int, generator) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Up to ``k`` draft tokens per row [m, kk] and their distributions over the vocabulary (sampling).
    The draft first catches up on the tokens its cache lacks (positions dn..n-1, ragged: rows with a
    shorter gap re-feed cached positions, which is harmless)."""
    m = len(rows)
    width = int((n - dn).max())
    fpos = ((n - width)[:, None] + torch.arange(width, device=n.device)).clamp(min=0)
    feed = _gather(seq, fpos)
    cols = draft.columns  # the draft works in its own output columns (a shortlist, or all tokens)
    proposals, dists = [], []
    for j in range(k):
        logits = draft(d_cache, feed, fpos, fpos.new_full((m, 1), feed.shape[1] - 1), shortlist=True)[:, 0]
        ctx = [sampled[r] + x for r, x in zip(rows, torch.stack(proposals, 1).tolist())] if j else [sampled[r] for r in rows]
        processed = rules(logits.float(), ctx, cols)
        c, dist = sampler.propose(processed, generator)
        x = c if cols.ids is None else cols.ids[c]
        proposals.append(x)
        dists.append(dist)
        if stop_below > 0 and j + 1 < k:
            belief = torch.softmax(processed, dim=-1).gather(1, c[:, None])
            if bool((belief < stop_below).all()):
                break
        feed, fpos = x[:, None], (n + j)[:, None]
    q = None
    if dists[0] is not None:
        q = torch.stack(dists, dim=1)
        if cols.ids is not None:
            q = q.new_zeros(*q.shape[:2], vocab_size).index_copy_(2, cols.ids, q)
    return torch.stack(proposals, dim=1), q


def _hint_proposals(hints: list[list[int]], generated: list[int], rows: list[int], eot: int,
                    vocab_size: int, with_q: bool, device) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The next hint tokens of every row (padded with end-of-text); as proposals they are deterministic,
    so their "distribution" is one-hot, which keeps rejection sampling exact."""
    width = min(HINT_K, max(len(hints[r]) - generated[r] for r in rows))
    drafts = torch.tensor([(hints[r][generated[r]:generated[r] + width] + [eot] * width)[:width] for r in rows],
                          dtype=torch.long, device=device)
    q = None
    if with_q:
        q = torch.zeros(*drafts.shape, vocab_size, device=device).scatter_(2, drafts[:, :, None], 1.0)
    return drafts, q


@torch.inference_mode()
def speculative_decode(
    decoders: Decoders,
    target_memory: torch.Tensor,
    draft_memory: torch.Tensor | None,
    prompts: list[list[int]],
    sot_index: list[int],
    rules: LogitRules,
    sampler: Greedy | Rejection,
    k: int,
    eot: int,
    no_speech: int,
    sample_len: int | list[int] = SAMPLE_LEN,
    generator: torch.Generator | None = None,
    stop_below: float = 0.0,
    prefixes: list[list[int]] | None = None,
    hints: list[list[int]] | None = None,
    memory_lengths: list[int] | None = None,
) -> list[RowResult]:
    """Decode one continuation per prompt. ``*_memory`` are the encoder outputs [B, S, D] the target
    and the draft cross-attend to; ``sot_index[b]`` is where <|startoftranscript|> sits in prompt b.
    Adaptive draft length: a pass drafts at most ``k`` tokens and stops early once the draft gives
    every live row's proposal a probability below ``stop_below`` (the target verifies whatever was
    drafted, so the output does not depend on it). ``prefixes[b]`` forces the start of row b's
    continuation (Whisper's prefix): appended to the prompt, seen by the rules as already sampled, and
    included in the result's tokens. ``hints[b]`` is a guess of row b's continuation after the prefix
    (a streaming re-decode's previous hypothesis, end-of-text implied): while every live row still
    follows its hint, passes verify hint tokens instead of running the draft (free drafts; exact all
    the same). ``memory_lengths[b]``: row b's encoder output is its first that many positions (a batch
    of different-length memories padded together). ``sample_len``: the most tokens a row holds (prefix
    included), one for all rows or one per row."""
    target, draft = decoders.target, decoders.draft if k > 0 else None
    dev = target.device
    b = len(prompts)
    prefixes = prefixes or [[] for _ in prompts]
    hints = [h + [eot] if h else [] for h in hints] if hints else [[] for _ in prompts]  # a hypothesis ends
    prompts = [p + f for p, f in zip(prompts, prefixes)]
    k = k if draft is not None else 0
    limits = list(sample_len) if isinstance(sample_len, list) else [sample_len] * b
    max_pos = target.max_positions
    if (longest := max(map(len, prompts))) > max_pos:
        raise ValueError(f"prompt + prefix of {longest} tokens exceeds the decoder's {max_pos} positions")
    capacity = max_pos + max(k, HINT_K) + 2
    t_cache = target.new_cache(target_memory, capacity, memory_lengths)
    d_cache = draft.new_cache(draft_memory, capacity, memory_lengths) if draft is not None else None

    seq = torch.full((b, capacity), eot, dtype=torch.long, device=dev)
    for i, p in enumerate(prompts):
        seq[i, : len(p)] = torch.tensor(p)
    n = torch.tensor([len(p) for p in prompts], device=dev)
    sampled: list[list[int]] = [list(f) for f in prefixes]
    generated = [0] * b  # tokens sampled after the prefix
    following = [bool(h) for h in hints]  # the row's tokens so far match its hint
    sum_logprob = [0.0] * b
    stats = [RowStats() for _ in range(b)]
    results: list[RowResult | None] = [None] * b

    # Prefill everything but each prompt's last token (that one is fed with the first drafts).
    # The no-speech probability is read at <|startoftranscript|>: here, or in the first pass when
    # the prompt ends with it.
    no_speech_prob = [0.0] * b
    width = int((n - 1).max())
    if width:
        pos = torch.arange(width, device=dev).expand(b, width)
        at = torch.tensor(sot_index, device=dev).clamp(max=width - 1)[:, None]
        first = target(t_cache, seq[:, :width], pos, at)
        no_speech_prob = torch.softmax(first[:, 0].float(), dim=-1)[:, no_speech].tolist()
        if d_cache is not None:
            draft(d_cache, seq[:, :width], pos, pos.new_zeros(b, 0))
    dn = n - 1  # positions the draft's cache holds
    sot_last = [i for i in range(b) if sot_index[i] == len(prompts[i]) - 1]

    def room(i: int, r: int) -> int:
        """Tokens row r (batch index i) may still add: sample_len counts the prefix, the target has max_pos positions."""
        return min(limits[r] - len(sampled[r]), max_pos + 1 - int(n[i]))

    costs = decoders.costs
    adaptive = costs is not None and draft is not None and isinstance(sampler, Greedy)
    now = wall_clock(dev)
    live = torch.arange(b, device=dev)  # original row ids of the rows still decoding
    full = [r for r in range(b) if room(r, r) <= 0]  # a prefix that fills the room: nothing left to decode
    for r in full:
        stats[r].tokens = len(sampled[r])
        results[r] = RowResult(list(sampled[r]), 0.0, no_speech_prob[r], stats[r])
    if full:
        idx = torch.tensor([r for r in range(b) if results[r] is None], dtype=torch.long, device=dev)
        live, seq, n, dn = live[idx], seq[idx], n[idx], dn[idx]
        t_cache = t_cache.select(idx)
        if d_cache is not None:
            d_cache = d_cache.select(idx)
        sot_last = [r for r in idx.tolist() if r in sot_last]
    while live.numel():
        started = now() if adaptive else 0.0
        rows = live.tolist()
        m = len(rows)
        drafts = torch.empty(m, 0, dtype=torch.long, device=dev)
        q = None
        hinted = all(following[r] and len(hints[r]) > generated[r] for r in rows)
        if hinted:
            drafts, q = _hint_proposals(hints, generated, rows, eot, target.vocab_size,
                                        isinstance(sampler, Rejection), dev)
        elif d_cache is not None:
            want = costs.choose(k) if adaptive else k  # adaptive: the draft length measured to pay most
            if want:
                drafts, q = _draft_proposals(draft, d_cache, seq, n, dn, rows, sampled, rules, sampler, want,
                                             stop_below, target.vocab_size, generator)

        kk = drafts.shape[1]
        vfeed = torch.cat([_gather(seq, (n - 1)[:, None]), drafts], dim=1)
        vpos = (n - 1)[:, None] + torch.arange(kk + 1, device=dev)
        logits = target(t_cache, vfeed, vpos).float()
        if sot_last:  # first pass only: row ids of the rows still live
            at = [rows.index(r) for r in sot_last]
            probs = torch.softmax(logits[at, 0], dim=-1)[:, no_speech].tolist()
            for r, prob in zip(sot_last, probs):
                no_speech_prob[r] = prob
            sot_last = []
        dlist = drafts.tolist()
        ctx = [sampled[r] + dlist[i][:j] for i, r in enumerate(rows) for j in range(kk + 1)]
        logits = rules(logits.view(m * (kk + 1), -1), ctx).view(m, kk + 1, -1)
        accepted, nxt = sampler.verify(logits, drafts, q, generator)
        logprobs = torch.log_softmax(logits, dim=-1)

        emitted_all = torch.cat([drafts, drafts.new_zeros(m, 1)], dim=1)
        emitted_all[torch.arange(m, device=dev), accepted] = nxt
        token_lp = logprobs.gather(2, emitted_all[:, :, None])[:, :, 0].tolist()
        acc_list, em_list = accepted.tolist(), emitted_all.tolist()
        keep, emitted = [], 0
        for i, r in enumerate(rows):
            a = acc_list[i]
            left = room(i, r)
            new = em_list[i][: min(a + 1, left)]
            ended = eot in new
            if ended:
                new = new[: new.index(eot) + 1]
            st = stats[r]
            st.target_passes += 1
            judged_accepts = min(a, len(new))
            if hinted:
                st.hint_drafted += kk
                st.hint_accepted += judged_accepts
            else:
                st.drafted += kk
                st.accepted += judged_accepts
                st.accepted_at.append(judged_accepts)
                if a < kk and len(new) == a + 1:
                    st.rejected += 1
                dn[i] = n[i] + min(a, kk - 1) if kk else dn[i]
            sum_logprob[r] += sum(token_lp[i][: len(new)])
            seq[i, int(n[i]): int(n[i]) + len(new)] = torch.tensor(new, device=dev)
            n[i] += len(new)
            if following[r]:
                following[r] = hints[r][generated[r]:generated[r] + len(new)] == new
            sampled[r].extend(new)
            emitted += len(new)
            generated[r] += len(new)
            if ended or len(new) >= left:
                toks = sampled[r][:-1] if ended else sampled[r]
                st.tokens = len(toks)
                results[r] = RowResult(toks, sum_logprob[r], no_speech_prob[r], st)
            else:
                keep.append(i)
        if adaptive and not hinted:
            costs.record(want, emitted / m, now() - started)
        if len(keep) < m:
            idx = torch.tensor(keep, dtype=torch.long, device=dev)
            live, seq, n, dn = live[idx], seq[idx], n[idx], dn[idx]
            t_cache = t_cache.select(idx)
            if d_cache is not None:
                d_cache = d_cache.select(idx)
    return [r for r in results if r is not None]
