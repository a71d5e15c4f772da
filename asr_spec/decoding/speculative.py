"""The draft/verify loop: speculative decoding of a batch of Whisper prompts.

Per pass, each row: the draft proposes up to K tokens, the target scores all K+1 positions in one forward
pass, the sampler accepts the drafts that match the target's own choice (greedy, or Gumbel-max with noise
keyed by position: see ``sampling``), and the row advances by accepted + 1 tokens. Rows advance by
different amounts (ragged) and leave the batch when they finish. Without a draft (or K = 0) the same loop
is plain target decoding. :class:`DecodingTask` owns one decode: ``prefill``, then passes of ``propose``,
``verify`` and ``commit``.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch

from .budget import PassClock, phase
from .costs import CostModel, wall_clock
from ..models.kv_decoder import CrossKV, StaticDecoder
from .logits import LogitRules
from .sampling import GREEDY, Sampler

HINT_K = 8  # most hint tokens verified per pass
SAMPLE_LEN = 224  # Whisper's most tokens per window (half the decoder's 448 positions)


@dataclass(frozen=True)
class DecodeOptions:
    """How one batch is decoded, the same for every row (after openai/whisper's ``DecodingOptions``)."""
    rules: LogitRules
    eot: int
    no_speech: int
    sampler: Sampler = GREEDY
    k: int = 0  # most drafted tokens per pass (0: the target alone)
    stop_below: float = 0.0  # a pass stops drafting once the draft believes every live row's proposal less than this
    keep_cross: bool = False  # each result keeps its row's cross-attention keys and values (word timestamps)
    # (layer, head) pairs whose cross-attention scores each result keeps, for every token it chose (word timing from
    # the decode itself: streaming's AlignAtt)
    attention_heads: tuple[tuple[int, int], ...] = ()


@dataclass(frozen=True)
class Request:
    """One row of a decode: its prompt and what bounds or guides its continuation."""
    prompt: list[int]
    sot_index: int  # where <|startoftranscript|> sits in the prompt (the no-speech probability is read there)
    prefix: list[int] = field(default_factory=list)  # forced start of the continuation (Whisper's prefix)
    hint: list[int] = field(default_factory=list)  # a guess of the continuation after the prefix (eot implied)
    sample_len: int = SAMPLE_LEN  # most tokens of the continuation, prefix included
    memory_length: int | None = None  # the row's encoder output is its first that many positions
    # the draft cross-attends to only the first that many positions (the window's audio and a little after): the
    # draft proposes and the target decides, so what the draft reads changes its speed, never the text
    draft_memory_length: int | None = None
    key: tuple[int, ...] = ()  # sampling: the row's noise key (the same key and seed give the same draws)
    # (tokens so far, how many of them are new) -> True to stop the row early: its caller discards such a result
    # (streaming and short windows: a decode that loops is decoded again on a padded window), so the tokens a loop
    # would add until ``sample_len`` are not worth their passes
    give_up: Callable[[list[int], int], bool] | None = None


def acceptance(accepted: int, rejected: int) -> float | None:
    """α: the share of judged drafts the target accepted (drafts after a rejection are not judged)."""
    return accepted / (accepted + rejected) if accepted + rejected else None


@dataclass
class RowStats:
    target_passes: int = 0
    drafted: int = 0
    accepted: int = 0
    rejected: int = 0
    tokens: int = 0
    hint_accepted: int = 0  # hint tokens accepted (streaming: the previous hypothesis, verified for free)
    accepted_at: list[int] = field(default_factory=list)  # accepted drafts per draft pass

    def add(self, other: "RowStats") -> None:
        for name in ("target_passes", "drafted", "accepted", "rejected", "tokens", "hint_accepted"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.accepted_at.extend(other.accepted_at)

    @property
    def acceptance(self) -> float:
        return acceptance(self.accepted, self.rejected) or 0.0


@dataclass
class RowResult:
    tokens: list[int]  # sampled tokens (prefix included), without the final end-of-text
    sum_logprob: float  # target log-probabilities of every sampled token (end-of-text included)
    no_speech_prob: float
    stats: RowStats
    cross: CrossKV | None = None  # with DecodeOptions.keep_cross
    # with DecodeOptions.attention_heads: [heads, len(tokens) + 1, S] scores before the softmax; row j is the query
    # that chose tokens[j], the last the one after the last token (when the decode ended with end-of-text)
    attention: torch.Tensor | None = None
    logprobs: list[float] = field(default_factory=list)  # the target's, of each token after the prefix

    @property
    def avg_logprob(self) -> float:
        return self.sum_logprob / (len(self.tokens) + 1)


@dataclass
class Decoders:
    target: StaticDecoder
    draft: StaticDecoder | None = None
    costs: Callable[[int], CostModel] | None = None  # the measured costs of a pass over n rows (None: always k)
    clock: PassClock | None = None  # times each phase of every pass (eval/pass_budget.py)


class DecodingTask:
    """One decode of a batch. Batch state (``seq``, ``n``, caches) holds the live rows in order; per-row
    lists are indexed by the row's place in ``requests``."""

    def __init__(self, decoders: Decoders, memories: tuple[torch.Tensor, torch.Tensor | None],
                 requests: list[Request], options: DecodeOptions,
                 cross: tuple[CrossKV | None, CrossKV | None] = (None, None)):
        o = self.o = options
        self.target = decoders.target
        self.draft = decoders.draft if o.k > 0 else None
        self.k = o.k if self.draft is not None else 0
        self.costs = decoders.costs if self.draft is not None else None
        self.clock = decoders.clock
        self.requests = requests
        dev = self.dev = self.target.device
        self.prompts = [r.prompt + r.prefix for r in requests]
        self.max_pos = self.target.max_positions
        if (longest := max(map(len, self.prompts))) > self.max_pos:
            raise ValueError(f"prompt + prefix of {longest} tokens exceeds the decoder's {self.max_pos} positions")
        b = len(requests)
        capacity = self.max_pos + max(self.k, HINT_K) + 2
        lengths = None
        if any(r.memory_length is not None for r in requests):
            lengths = [memories[0].shape[1] if r.memory_length is None else r.memory_length for r in requests]
        self.t_cache = self.target.new_cache(memories[0], capacity, lengths, cross[0])
        self.cross = (self.t_cache.cross_k, self.t_cache.cross_v, lengths) if o.keep_cross else None
        # the draft's cache is built on its first pass: a decode whose passes are all measured to pay best without
        # the draft (K = 0) costs what target-only decoding does
        self.d_cache = None
        self.d_memory = self._draft_view(memories[1], lengths), capacity
        self.d_cross = cross[1]
        self.seq = torch.full((b, capacity), o.eot, dtype=torch.long, device=dev)
        self.seq[:, :longest] = torch.tensor([p + [o.eot] * (longest - len(p)) for p in self.prompts])  # one copy
        self.n = torch.tensor([len(p) for p in self.prompts], device=dev)  # tokens in each live row
        self.dn = torch.zeros_like(self.n)  # tokens the draft's cache holds
        self.live = list(range(b))  # request index of each live row
        self.hints = [r.hint + [o.eot] if r.hint else [] for r in requests]  # a hypothesis ends
        self.sampled = [list(r.prefix) for r in requests]
        self.generated = [0] * b  # tokens sampled after the prefix
        self.following = [bool(h) for h in self.hints]  # the row's tokens so far match its hint
        self.sum_logprob = [0.0] * b
        self.no_speech_prob = [0.0] * b
        self.stats = [RowStats() for _ in range(b)]
        self.results: list[RowResult | None] = [None] * b
        self.sot_pending = [r for r, q in enumerate(requests) if q.sot_index == len(self.prompts[r]) - 1]
        self.logprobs: list[list[float]] = [[] for _ in requests]
        self.heads: dict[int, list[int]] = {}  # layer -> its heads whose cross-attention is recorded
        for layer, head in o.attention_heads:
            self.heads.setdefault(layer, []).append(head)
        self.attention: list[dict[int, torch.Tensor]] = [{} for _ in requests]  # per row: position -> [heads, S]

    def _draft_view(self, memory: torch.Tensor | None, lengths: list[int] | None
                    ) -> tuple[torch.Tensor | None, list[int] | None]:
        """The draft's memory and row lengths: each row's own length, or less where its ``draft_memory_length``
        says so; the memory cut to the longest of them."""
        if memory is None or all(r.draft_memory_length is None for r in self.requests):
            return memory, lengths
        full = lengths or [memory.shape[1]] * len(self.requests)
        view = [n if r.draft_memory_length is None else max(1, min(n, r.draft_memory_length))
                for r, n in zip(self.requests, full)]
        return memory[:, :max(view)], view

    def room(self, i: int) -> int:
        """Tokens live row i may still add: its sample_len counts the prefix, the target has max_pos positions."""
        r = self.live[i]
        return min(self.requests[r].sample_len - len(self.sampled[r]), self.max_pos + 1 - int(self.n[i]))

    def run(self) -> list[RowResult]:
        self.prefill()
        self.finish([(i, False) for i in range(len(self.live)) if self.room(i) <= 0])  # a prefix fills the room
        now = wall_clock(self.dev)
        while self.live:
            started = now() if self.costs is not None else 0.0
            t0, m = self.clock.start_pass() if self.clock else 0.0, len(self.live)
            costs = self.costs(len(self.live)) if self.costs is not None else None
            drafts, noise, chosen, hinted = self.propose(costs)
            accepted, emitted, token_lp = self.verify(drafts, noise)
            tokens = self.commit(drafts, accepted, emitted, token_lp, hinted, chosen or 0)
            if self.clock:
                self.clock.end_pass(t0, m, round(tokens * m))
            if costs is not None and chosen is not None and not any(hinted):
                costs.record(chosen, tokens, now() - started)
        return [r for r in self.results if r is not None]

    def prefill(self) -> None:
        """Everything but each prompt's last token (that one is fed with the first drafts). The no-speech
        probability is read at <|startoftranscript|>: here, or in the first pass when the prompt ends with it."""
        width = int((self.n - 1).max())
        if not width:
            return
        b = len(self.live)
        pos = torch.arange(width, device=self.dev).expand(b, width)
        at = torch.tensor([r.sot_index for r in self.requests], device=self.dev).clamp(max=width - 1)[:, None]
        scores = self._scores()
        with phase(self.clock, "prefill"):
            first = self.target(self.t_cache, self.seq[:, :width], pos, at, cross_scores=scores)
        self._record(scores, [range(len(r.prompt) - 1, len(p) - 1) for r, p in zip(self.requests, self.prompts)], 0)
        self.no_speech_prob = torch.softmax(first[:, 0].float(), dim=-1)[:, self.o.no_speech].tolist()

    def noise(self, step: int) -> torch.Tensor | None:
        """The sampler's noise for every live row's token ``step`` places after its current end."""
        keys = [self.requests[r].key for r in self.live]
        return self.o.sampler.noise(keys, (self.n + step).tolist(), self.target.vocab_size, self.dev)

    def propose(self, costs: CostModel | None
                ) -> tuple[torch.Tensor, list[torch.Tensor | None], int | None, list[bool]]:
        """The pass's proposals [m, kk]: the rows' hints while every live row still follows its own, else up to
        K draft tokens (as many as ``costs`` measures to pay most), the rows that still follow their hint proposing
        its next tokens instead; the sampler's noise at each of the kk + 1 positions the target will choose; the
        draft length chosen (None: hints only); which rows propose their hint."""
        rows = self.live
        hinted = [self.following[r] and len(self.hints[r]) > self.generated[r] for r in rows]
        if all(hinted):
            width = min(HINT_K, max(len(self.hints[r]) - self.generated[r] for r in rows))
            return self._hinted(torch.empty(len(rows), width, dtype=torch.long, device=self.dev), hinted), \
                [self.noise(j) for j in range(width + 1)], None, hinted
        want = self.k if costs is None else costs.choose(self.k)  # the draft length measured to pay most
        drafts, noise = self.draft_tokens(want) if want else (torch.empty(len(rows), 0, dtype=torch.long,
                                                                          device=self.dev), [])
        if any(hinted):  # a row's own hint is a better guess than the draft's (streaming: the last hypothesis)
            drafts = self._hinted(drafts, hinted)
        return drafts, noise + [self.noise(drafts.shape[1])], want, hinted

    def _hinted(self, drafts: torch.Tensor, hinted: list[bool]) -> torch.Tensor:
        """``drafts`` [m, kk] with the ``hinted`` rows' next kk hint tokens in place (end-of-text after the hint)."""
        kk, eot = drafts.shape[1], self.o.eot
        for i, r in enumerate(self.live):
            if hinted[i]:
                g = self.generated[r]
                drafts[i] = torch.tensor((self.hints[r][g:g + kk] + [eot] * kk)[:kk], device=self.dev)
        return drafts

    def draft_tokens(self, k: int) -> tuple[torch.Tensor, list[torch.Tensor | None]]:
        """Up to ``k`` draft tokens per live row [m, kk], chosen like the target chooses (same rules, same noise).
        The draft first catches up on the tokens its cache lacks (positions dn..n-1, ragged: rows with a
        shorter gap re-feed cached positions, which is harmless)."""
        draft, n, m = self.draft, self.n, len(self.live)
        if self.d_cache is None:  # the first draft pass: the draft catches up on every token from position 0
            (memory, lengths), capacity = self.d_memory
            rows = torch.tensor(self.live, dtype=torch.long, device=memory.device)
            cross = None if self.d_cross is None else \
                tuple([t[:, :, :memory.shape[1]].index_select(0, rows) for t in ts] for ts in self.d_cross)
            self.d_cache = draft.new_cache(memory.index_select(0, rows), capacity,
                                           [lengths[r] for r in self.live] if lengths else None, cross)
        width = int((n - self.dn).max())
        fpos = ((n - width)[:, None] + torch.arange(width, device=self.dev)).clamp(min=0)
        feed = self.seq.gather(1, fpos)
        cols = draft.columns  # the draft works in its own output columns (a shortlist, or all tokens)
        proposals: list[torch.Tensor] = []
        noises: list[torch.Tensor | None] = []
        for j in range(k):
            with phase(self.clock, "draft"):
                logits = draft(self.d_cache, feed, fpos, fpos.new_full((m, 1), feed.shape[1] - 1), shortlist=True)[:, 0]
            with phase(self.clock, "host"):
                so_far = torch.stack(proposals, 1).tolist() if j else [[]] * m
            with phase(self.clock, "rules"):
                processed = self.o.rules(logits.float(), [self.sampled[r] + x for r, x in zip(self.live, so_far)], cols)
            noise = self.noise(j)
            noises.append(noise)
            with phase(self.clock, "acceptance"):
                c = self.o.sampler.choose(processed, noise if noise is None or cols.ids is None else noise[:, cols.ids])
                x = c if cols.ids is None else cols.ids[c]
            proposals.append(x)
            if self.o.stop_below > 0 and j + 1 < k:
                with phase(self.clock, "acceptance"):
                    belief = torch.softmax(processed, dim=-1).gather(1, c[:, None])
                with phase(self.clock, "host"):
                    stop = bool((belief < self.o.stop_below).all())
                if stop:
                    break
            feed, fpos = x[:, None], (n + j)[:, None]
        return torch.stack(proposals, dim=1), noises

    def verify(self, drafts: torch.Tensor,
               noise: list[torch.Tensor | None]) -> tuple[list[int], list[list[int]], list[list[float]]]:
        """One target pass over the last token and the kk drafts: per row, the drafts accepted, the kk + 1
        tokens it would emit (accepted drafts, then the target's own) and their log-probabilities."""
        m, kk = drafts.shape
        n, rows = self.n, self.live
        feed = torch.cat([self.seq.gather(1, (n - 1)[:, None]), drafts], dim=1)
        scores = self._scores()
        with phase(self.clock, "target"):
            logits = self.target(self.t_cache, feed, (n - 1)[:, None] + torch.arange(kk + 1, device=self.dev),
                                 cross_scores=scores).float()
        if scores is not None:  # rejected positions are recorded again when the pass after feeds them
            self._record(scores, [range(p - 1, p + kk) for p in n.tolist()], None)
        place = {r: i for i, r in enumerate(rows)} if self.sot_pending else {}
        if pending := [r for r in self.sot_pending if r in place]:  # first pass of prompts ending with <|sot|>
            at = [place[r] for r in pending]
            for r, prob in zip(pending, torch.softmax(logits[at, 0], dim=-1)[:, self.o.no_speech].tolist()):
                self.no_speech_prob[r] = prob
        self.sot_pending = []
        with phase(self.clock, "host"):
            dlist = drafts.tolist()
        with phase(self.clock, "rules"):
            ctx = [self.sampled[r] + dlist[i][:j] for i, r in enumerate(rows) for j in range(kk + 1)]
            logits = self.o.rules(logits.view(m * (kk + 1), -1), ctx).view(m, kk + 1, -1)
        with phase(self.clock, "acceptance"):
            accepted, nxt = self.o.sampler.verify(logits, drafts, None if noise[0] is None else torch.stack(noise, 1))
            emitted = torch.cat([drafts, drafts.new_zeros(m, 1)], dim=1)
            emitted[torch.arange(m, device=self.dev), accepted] = nxt
            token_lp = torch.log_softmax(logits, dim=-1).gather(2, emitted[:, :, None])[:, :, 0]
        with phase(self.clock, "host"):
            return accepted.tolist(), emitted.tolist(), token_lp.tolist()

    def commit(self, drafts: torch.Tensor, accepted: list[int], emitted: list[list[int]],
               token_lp: list[list[float]], hinted: list[bool], drafted: int) -> float:
        """Append each row's accepted tokens (cut at end-of-text and at its room), keep the statistics, retire
        finished rows. ``hinted``: the rows that proposed their hint; ``drafted``: tokens the draft proposed this
        pass (its cache holds the rows' tokens up to their start). Returns the tokens emitted per row."""
        kk, eot = drafts.shape[1], self.o.eot
        done, total = [], 0
        n, dn = self.n.tolist(), self.dn.tolist()  # per-row bookkeeping in Python; the tensors written once below
        rows, cols, values = [], [], []
        for i, r in enumerate(self.live):
            a, left = accepted[i], min(self.requests[r].sample_len - len(self.sampled[r]), self.max_pos + 1 - n[i])
            new = emitted[i][: min(a + 1, left)]  # left: room(i)
            ended = eot in new
            if ended:
                new = new[: new.index(eot) + 1]
            st = self.stats[r]
            st.target_passes += 1
            judged = min(a, len(new))
            if hinted[i]:
                st.hint_accepted += judged
                if drafted:  # the draft caught up to the row's start; its proposals after it were not used
                    dn[i] = n[i]
            else:
                st.drafted += kk
                st.accepted += judged
                st.accepted_at.append(judged)
                if a < kk and len(new) == a + 1:
                    st.rejected += 1
                if kk:
                    dn[i] = n[i] + min(a, kk - 1)
            self.sum_logprob[r] += sum(token_lp[i][: len(new)])
            self.logprobs[r] += token_lp[i][: len(new)]
            rows += [i] * len(new)
            cols += range(n[i], n[i] + len(new))
            values += new
            n[i] += len(new)
            if self.following[r]:
                self.following[r] = self.hints[r][self.generated[r]:self.generated[r] + len(new)] == new
            self.sampled[r].extend(new)
            self.generated[r] += len(new)
            total += len(new)
            if ended or len(new) >= left or (self.requests[r].give_up is not None
                                             and self.requests[r].give_up(self.sampled[r], len(new))):
                done.append((i, ended))
        at = torch.tensor([rows, cols], dtype=torch.long, device=self.dev)
        self.seq[at[0], at[1]] = torch.tensor(values, dtype=self.seq.dtype, device=self.dev)
        self.n = torch.tensor(n, dtype=self.n.dtype, device=self.dev)
        self.dn = torch.tensor(dn, dtype=self.dn.dtype, device=self.dev)
        m = len(self.live)
        self.finish(done)
        return total / m

    def finish(self, done: list[tuple[int, bool]]) -> None:
        """Record the results of live rows ``done`` (index, ended with end-of-text) and drop them from the batch."""
        if not done:
            return
        for i, ended in done:
            r = self.live[i]
            tokens = self.sampled[r][:-1] if ended else list(self.sampled[r])
            self.stats[r].tokens = len(tokens)
            self.results[r] = RowResult(tokens, self.sum_logprob[r], self.no_speech_prob[r], self.stats[r],
                                        self._cross_of(r), self._attention_of(r, len(tokens)),
                                        self.logprobs[r][:len(tokens) - len(self.requests[r].prefix)])
        gone = {i for i, _ in done}
        keep = [i for i in range(len(self.live)) if i not in gone]
        idx = torch.tensor(keep, dtype=torch.long, device=self.dev)
        self.live = [self.live[i] for i in keep]
        self.seq, self.n, self.dn = self.seq[idx], self.n[idx], self.dn[idx]
        self.t_cache = self.t_cache.select(idx)
        if self.d_cache is not None:
            self.d_cache = self.d_cache.select(idx)


    def _scores(self) -> dict[int, torch.Tensor | None] | None:
        """What the target fills with the recorded layers' cross-attention scores (None: nothing recorded)."""
        return {layer: None for layer in self.heads} if self.heads else None

    def _record(self, scores: dict[int, torch.Tensor | None] | None, positions: list[range], first: int | None
                ) -> None:
        """Keep the recorded heads' scores of the queries at ``positions`` (per live row; the pass fed positions from
        ``first``, or from each range's start)."""
        if scores is None:
            return
        picked = torch.cat([scores[layer][:, heads] for layer, heads in self.heads.items()], dim=1)  # [m, h, T, S]
        for i, (r, where) in enumerate(zip(self.live, positions)):
            start = where.start if first is None else first
            for p in where:
                self.attention[r][p] = picked[i, :, p - start].clone()

    def _attention_of(self, r: int, tokens: int) -> torch.Tensor | None:
        """Row r's recorded scores [heads, tokens + 1 (or tokens), S] from the query that chose its prefix's first
        token (see ``RowResult.attention``)."""
        if not self.heads:
            return None
        rows, start = self.attention[r], len(self.requests[r].prompt) - 1
        kept = [rows[p] for p in range(start, start + tokens + 1) if p in rows]
        self.attention[r] = {}
        return torch.stack(kept, dim=1) if kept else None

    def _cross_of(self, r: int) -> CrossKV | None:
        if self.cross is None:
            return None
        ks, vs, lengths = self.cross
        end = lengths[r] if lengths else ks[0].shape[2]
        return [k[r:r + 1, :, :end] for k in ks], [v[r:r + 1, :, :end] for v in vs]


@torch.inference_mode()
def speculative_decode(decoders: Decoders, memories: tuple[torch.Tensor, torch.Tensor | None],
                       requests: list[Request], options: DecodeOptions,
                       cross: tuple[CrossKV | None, CrossKV | None] = (None, None)) -> list[RowResult]:
    """Decode one continuation per request. ``memories`` are the encoder outputs [B, S, D] the target and the
    draft cross-attend to (rows padded together when their ``memory_length`` differ). A pass drafts at most
    ``options.k`` tokens (fewer when ``decoders.costs`` measures fewer to pay, or the draft's belief falls
    below ``stop_below``); while every live row still follows its ``hint``, passes verify hint tokens
    instead (free drafts). The target verifies whatever was proposed, so none of this changes the output. ``cross``:
    the target's and the draft's cross-attention keys and values of ``memories``, where computed before."""
    return DecodingTask(decoders, memories, requests, options, cross).run()
