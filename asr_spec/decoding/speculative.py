"""The draft/verify loop: speculative decoding of a batch of Whisper prompts.

Per pass, each row: the draft proposes up to K tokens, the target scores all K+1 positions in one forward pass,
the sampler accepts the drafts that match the target's own choice (greedy, or Gumbel-max with noise keyed by
position: see ``sampling``), and the row advances by accepted + 1 tokens. Rows advance by different amounts (ragged)
and leave the batch when they finish. Without a draft (or K = 0) the same loop is plain target decoding.
:class:`DecodingTask` owns one decode: ``prefill``, then passes of ``propose``, ``verify`` and ``commit``.

The loop's own work stays on the device: Whisper's rules read each row's history as a :class:`RuleState` (no token
lists), acceptance, the end-of-text cut and the caches' new lengths are tensor operations, and a pass reads the host
once (``commit``: each row's accepted count, new tokens and their log-probabilities, in one transfer). The host
keeps the rows' token lists and statistics from that read.
"""
from __future__ import annotations

import torch

from ..models.kv_decoder import CrossKV
from ..models.pair import Pair
from .budget import phase
from .costs import CostModel, wall_clock
from .joining import JoinRows, move_rows
from .judging import advance, host_row, judge
from .recording import HeadRecorder
from .rows import DecodeOptions, Decoders, RowRequest, RowResult, RowStats

HINT_K = 8  # most hint tokens verified per pass


def decode_capacity(max_pos: int, k: int) -> int:
    """Positions a decode's caches hold: the decoder's, and a pass's widest overrun (K drafts or HINT_K hints)."""
    return max_pos + max(k, HINT_K) + 2


class DecodingTask(JoinRows):
    """One decode of a batch. Batch state (``seq``, ``n``, ``state``, caches; ``n_host``, ``dn``) holds the live
    rows in order; per-row lists are indexed by the row's place in ``requests``."""

    def __init__(self, decoders: Decoders, memories: Pair[torch.Tensor], requests: list[RowRequest],
                 options: DecodeOptions, cross: Pair[CrossKV | None] = Pair(None), room: int = 0):
        o = self.o = options
        self.target = decoders.target
        self.draft = decoders.draft if o.k > 0 else None
        self.k = o.k if self.draft is not None else 0
        self.costs = decoders.costs if self.draft is not None else None
        self.clock = decoders.clock
        self.decoders = decoders
        self.requests = list(requests)
        dev = self.dev = self.target.device
        self.prompts = [r.prompt + r.prefix for r in requests]
        self.max_pos = self.target.max_positions
        if (longest := max(map(len, self.prompts))) > self.max_pos:
            raise ValueError(f"prompt + prefix of {longest} tokens exceeds the decoder's {self.max_pos} positions")
        b = len(requests)
        capacity = decode_capacity(self.max_pos, self.k)
        lengths = None
        if any(r.memory_length is not None for r in requests):
            lengths = [memories.target.shape[1] if r.memory_length is None else r.memory_length for r in requests]
        self.capacity = capacity
        # the caches hold ``room`` rows (rows join into the rows after the live ones); the live rows are the first
        self.room_rows = max(b, room)
        self.t_room = self.target.new_cache(memories.target, capacity, lengths, cross.target).grown(self.room_rows)
        self.t_cache = self.t_room.rows(b)
        # the draft's cache is built on its first pass: a decode whose passes are all measured to pay best without
        # the draft (K = 0) costs what target-only decoding does
        self.d_room = self.d_cache = None
        self.d_memory, self.d_lengths = self._draft_view(memories.draft, lengths)
        self.d_cross = cross.draft
        self.steps = torch.arange(capacity, device=dev)
        self.seq = torch.full((b, capacity), o.eot, dtype=torch.long, device=dev)
        self.seq[:, :longest] = torch.tensor([p + [o.eot] * (longest - len(p)) for p in self.prompts])  # one copy
        self.n_host = [len(p) for p in self.prompts]  # tokens in each live row (the host's copy of ``n``)
        self.n = torch.tensor(self.n_host, device=dev)
        self.dn = [0] * b  # tokens the draft's cache holds, per live row
        self.state = o.rules.state([r.prefix for r in requests], dev)  # what the rules read of each live row
        self.sample_len = torch.tensor([r.sample_len for r in requests], device=dev)
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
        self.recorder = HeadRecorder(o.attention_heads, b)
        self.built = 0.0  # seconds of this pass spent building the draft's cache (once per decode)
        self.ended: list[int] = []  # requests finished since ``collect`` was last called

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
        return min(self.requests[r].sample_len - len(self.sampled[r]), self.max_pos + 1 - self.n_host[i])

    @torch.inference_mode()
    def run(self) -> list[RowResult]:
        """The whole decode: ``start``, then passes until every row has finished."""
        self.start()
        while self.live:
            self.step()
        return [r for r in self.results if r is not None]

    @torch.inference_mode()
    def start(self) -> None:
        self.prefill()
        self.finish([(i, False) for i in range(len(self.live)) if self.room(i) <= 0])  # a prefix fills the room

    @torch.inference_mode()
    def step(self) -> None:
        """One pass over the live rows (rows that finish in it: ``collect``)."""
        if self.live:
            self.one_pass()

    def one_pass(self) -> None:
        now = wall_clock(self.dev)
        started = now() if self.costs is not None else 0.0
        self.built = 0.0
        t0, m = (self.clock.start_pass() if self.clock else 0.0), len(self.live)
        costs = self.costs(m) if self.costs is not None else None
        drafts, noise, chosen, hinted = self.propose(costs)
        accepted, emitted, token_lp = self.verify(drafts, noise)
        tokens = self.commit(accepted, emitted, token_lp, hinted, chosen or 0)
        if costs is not None and chosen is not None and not any(hinted):  # a pass's cost, not the decode's setup
            costs.record(chosen, tokens, now() - started - self.built)
        if self.clock:
            self.clock.end_pass(t0, m, round(tokens * m))

    def collect(self) -> list[tuple[int, RowResult]]:
        """The requests that finished since the last call and their results (which the decode then forgets: one
        that rows keep joining holds only its live rows' tensors)."""
        ended, self.ended = self.ended, []
        taken = [(r, self.results[r]) for r in ended]
        for r in ended:
            self.results[r] = None
        return taken

    def close(self) -> None:
        """The decode is over (a static decode gives its arena back)."""

    def fresh(self, memories: Pair[torch.Tensor], requests: list[RowRequest]) -> "DecodingTask":
        """A decode of other rows with these decoders and options (rows to join this one)."""
        return DecodingTask(self.decoders, memories, requests, self.o)

    def prefill(self) -> None:
        """Everything but each prompt's last token (that one is fed with the first drafts). The no-speech
        probability is read at <|startoftranscript|>: here, or in the first pass when the prompt ends with it."""
        width = max(self.n_host) - 1
        if not width:
            return
        b = len(self.live)
        pos = self.steps[:width].expand(b, width)
        at = torch.tensor([r.sot_index for r in self.requests], device=self.dev).clamp(max=width - 1)[:, None]
        scores = self.recorder.scores()
        with phase(self.clock, "prefill"):
            first = self.target(self.t_cache, self.seq[:, :width], pos, at, cross_scores=scores)
        self.recorder.record(scores, self.live,
                             [range(len(r.prompt) - 1, len(p) - 1) for r, p in zip(self.requests, self.prompts)], 0)
        self.no_speech_prob = torch.softmax(first[:, 0].float(), dim=-1)[:, self.o.no_speech].tolist()

    def noise(self, step: int) -> torch.Tensor | None:
        """The sampler's noise for every live row's token ``step`` places after its current end."""
        keys = [self.requests[r].key for r in self.live]
        return self.o.sampler.noise(keys, [n + step for n in self.n_host], self.target.vocab_size, self.dev)

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
        draft, m, o = self.draft, len(self.live), self.o
        if self.d_cache is None:  # the first draft pass: the draft catches up on every token from position 0
            now = wall_clock(self.dev)
            t0 = now()
            self.build_draft_cache()
            self.built = now() - t0  # once per decode: not what a draft length costs
        width = max(n - d for n, d in zip(self.n_host, self.dn))
        fpos = ((self.n - width)[:, None] + self.steps[:width]).clamp(min=0)
        feed = self.seq.gather(1, fpos)
        cols = draft.columns  # the draft works in its own output columns (a shortlist, or all tokens)
        proposals = torch.empty(m, k, dtype=torch.long, device=self.dev)
        noises: list[torch.Tensor | None] = []
        state, drafted = self.state, k
        for j in range(k):
            with phase(self.clock, "draft"):
                logits = draft(self.d_cache, feed, fpos, fpos.new_full((m, 1), feed.shape[1] - 1), shortlist=True)[:, 0]
            with phase(self.clock, "rules"):
                processed = o.rules(logits.float(), state, cols)
            noise = self.noise(j)
            noises.append(noise)
            with phase(self.clock, "acceptance"):
                c = o.sampler.choose(processed, noise if noise is None or cols.ids is None else noise[:, cols.ids])
                x = c if cols.ids is None else cols.ids[c]
                proposals[:, j] = x
            if o.stop_below > 0 and j + 1 < k:
                with phase(self.clock, "acceptance"):
                    belief = torch.softmax(processed, dim=-1).gather(1, c[:, None])
                with phase(self.clock, "host"):
                    stop = bool((belief < o.stop_below).all())
                if stop:
                    drafted = j + 1
                    break
            state = state.push(x, o.rules.begin)
            feed, fpos = x[:, None], (self.n + j)[:, None]
        return proposals[:, :drafted], noises

    def build_draft_cache(self) -> None:
        """The draft's caches of the live rows, empty (it catches up from position 0)."""
        memory, lengths = self.d_memory, self.d_lengths
        rows = torch.tensor(self.live, dtype=torch.long, device=memory.device)
        cross = None if self.d_cross is None else \
            self.d_cross.map(lambda t: t[:, :, :memory.shape[1]].index_select(0, rows))
        with phase(self.clock, "draft"):
            self.d_room = self.draft.new_cache(memory.index_select(0, rows), self.capacity,
                                               [lengths[r] for r in self.live] if lengths else None,
                                               cross).grown(self.room_rows)
            self.d_cache = self.d_room.rows(len(self.live))

    def verify(self, drafts: torch.Tensor, noise: list[torch.Tensor | None]
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """One target pass over the last token and the kk drafts: per row (device tensors), the drafts accepted
        [m], the kk + 1 tokens it would emit (accepted drafts, then the target's own) and their log-probabilities."""
        kk = drafts.shape[1]
        n, o = self.n, self.o
        feed = torch.cat([self.seq.gather(1, (n - 1)[:, None]), drafts], dim=1)
        scores = self.recorder.scores()
        with phase(self.clock, "target"):
            logits = self.target(self.t_cache, feed, (n - 1)[:, None] + self.steps[:kk + 1], cross_scores=scores)
        # rejected positions are recorded again when the pass after feeds them
        self.recorder.record(scores, self.live, [range(p - 1, p + kk) for p in self.n_host], None)
        if self.sot_pending:  # first pass of prompts ending with <|sot|>
            place = {r: i for i, r in enumerate(self.live)}
            pending = [r for r in self.sot_pending if r in place]
            probs = torch.softmax(logits[[place[r] for r in pending], 0], dim=-1)[:, o.no_speech].tolist()
            for r, prob in zip(pending, probs):
                self.no_speech_prob[r] = prob
            self.sot_pending = []
        return judge(logits, drafts, self.state, o, None if noise[0] is None else torch.stack(noise, 1), self.clock)

    def commit(self, accepted: torch.Tensor, emitted: torch.Tensor, token_lp: torch.Tensor, hinted: list[bool],
               drafted: int) -> float:
        """Append each row's accepted tokens (cut at end-of-text and at its room), keep the statistics, retire
        finished rows. ``hinted``: the rows that proposed their hint; ``drafted``: tokens the draft proposed this
        pass (its cache holds the rows' tokens up to their start). Returns the tokens emitted per row."""
        # on the device: how many tokens each row takes (its room, end-of-text), its tokens into ``seq`` (past them
        # only stale positions), its new length and rule state
        cut, ended, self.state, self.n = advance(self.seq, self.n, self.state, self.sample_len, self.max_pos,
                                                 accepted, emitted, self.o)
        with phase(self.clock, "host"):  # the pass's one read: per row accepted, cut, ended, tokens, log-probabilities
            read = host_row(accepted, cut, ended, emitted, token_lp).tolist()
        return self.book(read, hinted, drafted, emitted.shape[1])

    def book(self, read: list[list[float]], hinted: list[bool], drafted: int, width: int) -> float:
        """The host's part of a pass from its one read (per live row: accepted, cut, ended, the ``width`` tokens
        emitted, their log-probabilities): each row's tokens and statistics; rows that are done leave. Returns the
        tokens emitted per row."""
        m, kk = len(read), width - 1
        done, total = [], 0
        for i, r in enumerate(self.live):
            a, c, end = int(read[i][0]), int(read[i][1]), read[i][2] > 0
            if c < 1:  # every pass gives a live row a token: a row that took none would never finish
                raise RuntimeError(f"a decode pass gave row {r} no token (its state on the device is not its own)")
            left_i = min(self.requests[r].sample_len - len(self.sampled[r]), self.max_pos + 1 - self.n_host[i])
            new = [int(t) for t in read[i][3:3 + c]]
            lps = read[i][3 + width:3 + width + c]
            st = self.stats[r]
            st.target_passes += 1
            judged = min(a, c)
            if hinted[i]:
                st.hint_accepted += judged
                if drafted:  # the draft caught up to the row's start; its proposals after it were not used
                    self.dn[i] = self.n_host[i]
            else:
                st.drafted += kk
                st.accepted += judged
                st.accepted_at.append(judged)
                if a < kk and c == a + 1:
                    st.rejected += 1
                if kk:
                    self.dn[i] = self.n_host[i] + min(a, kk - 1)
            self.sum_logprob[r] += sum(lps)
            self.logprobs[r] += lps
            self.n_host[i] += c
            if self.following[r]:
                self.following[r] = self.hints[r][self.generated[r]:self.generated[r] + c] == new
            self.sampled[r].extend(new)
            self.generated[r] += c
            total += c
            give_up = self.requests[r].give_up
            if end or c >= left_i or (give_up is not None and give_up(self.sampled[r], c)):
                done.append((i, end))
        self.finish(done)
        return total / m

    def finish(self, done: list[tuple[int, bool]]) -> None:
        """Record the results of live rows ``done`` (index, ended with end-of-text) and drop them from the batch."""
        if not done:
            return
        for i, ended in done:
            r = self.live[i]
            self.ended.append(r)
            tokens = self.sampled[r][:-1] if ended else list(self.sampled[r])
            self.stats[r].tokens = len(tokens)
            self.results[r] = RowResult(tokens, self.sum_logprob[r], self.no_speech_prob[r], self.stats[r],
                                        self._cross_of(i),
                                        self.recorder.result(r, len(self.requests[r].prompt) - 1, len(tokens)),
                                        self.logprobs[r][:len(tokens) - len(self.requests[r].prefix)])
        gone = {i for i, _ in done}
        k = len(self.live) - len(gone)
        keep = list(range(k))  # the rows after the live ones move into the places of those that leave
        for hole, row in zip([i for i in range(k) if i in gone], [i for i in range(k, len(self.live)) if i not in gone]):
            keep[hole] = row
        if not keep:
            self.live = []
            return
        self.live = [self.live[i] for i in keep]
        self.n_host, self.dn = [self.n_host[i] for i in keep], [self.dn[i] for i in keep]
        self.keep(keep)

    def keep(self, rows: list[int]) -> None:
        """Only the batch rows ``rows`` stay in the device state, as its rows 0, 1, ... (the caches move only the rows
        whose place changes)."""
        idx = torch.tensor(rows, dtype=torch.long, device=self.dev)
        self.seq, self.n, self.sample_len = self.seq[idx], self.n[idx], self.sample_len[idx]
        self.state = self.state.select(idx)
        for room in (self.t_room, self.d_room):
            if room is not None:
                move_rows(room.tensors(), rows)
                if room.cross_lengths is not None:
                    room.cross_lengths[:len(rows)] = [room.cross_lengths[i] for i in rows]
        self.t_cache = self.t_room.rows(len(rows))
        self.d_cache = None if self.d_room is None else self.d_room.rows(len(rows))

    def _cross_of(self, i: int) -> CrossKV | None:
        """Live row i's cross-attention keys and values (a copy: its row's place is taken by others)."""
        if not self.o.keep_cross:
            return None
        end = self.t_cache.cross_lengths[i] if self.t_cache.cross_lengths else self.t_cache.cross_k[0].shape[2]
        return CrossKV(self.t_cache.cross_k, self.t_cache.cross_v).map(lambda t: t[i:i + 1, :, :end].clone())


@torch.inference_mode()
def speculative_decode(decoders: Decoders, memories: Pair[torch.Tensor], requests: list[RowRequest],
                       options: DecodeOptions, cross: Pair[CrossKV | None] = Pair(None)) -> list[RowResult]:
    """Decode one continuation per request. ``memories`` are the encoder outputs [B, S, D] the target and the
    draft cross-attend to (rows padded together when their ``memory_length`` differ). A pass drafts at most
    ``options.k`` tokens (fewer when ``decoders.costs`` measures fewer to pay, or the draft's belief falls
    below ``stop_below``); while every live row still follows its ``hint``, passes verify hint tokens
    instead (free drafts). The target verifies whatever was proposed, so none of this changes the output. ``cross``:
    the target's and the draft's cross-attention keys and values of ``memories``, where computed before."""
    return DecodingTask(decoders, memories, requests, options, cross).run()
