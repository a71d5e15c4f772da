"""A speculative pass and a prefill, over a decode's device state (:class:`~asr_spec.decoding.slots.Slots`).

A pass, for ``b`` rows: the draft catches up on each row's last ``catch_up`` tokens and proposes up to ``k`` (``draft``),
or the rows' hints stand in for proposals; the target scores the last token and the proposals in one forward, Whisper's
rules apply at every position with that position's own history, acceptance picks each row's tokens (``verify``), each
row advances over them, cut at end-of-text and at its budget, and the pass packs what the host reads (``PassRead``).
The eager loop (speculative.py) calls these functions; the static decode (static.py) calls the very same at fixed
addresses, with a fixed draft length and a catch-up of two tokens, and captures each call as a CUDA graph. Nothing here
reads the host, except a draft's early stop where its caller asks for one.
"""
from __future__ import annotations

from typing import Callable, Sequence

import torch

from ..models.kv_decoder import CachedDecoder
from .budget import phase
from .judging import advance, judge
from .rows import DecodeOptions
from .slots import Slots

Noise = Callable[[int], "torch.Tensor | None"]  # the sampler's noise at the j-th position after each row's end
# A shortlist draft unsure of the text token it chose (its belief below REST_BELOW) proposes instead the best token
# outside its shortlist (``CachedDecoder.rest``: the target's output layer over the draft's last hidden state) when
# that token's logit is within REST_MARGIN of its choice's. Both chosen on training clips, never the dev set
# (docs/how-it-works.md §3, "Words outside the shortlist"). A distilled draft has them on CUDA only (loader.py).
REST_BELOW = 0.7
REST_MARGIN = 2.0


class PassRead:
    """The host's one read of a pass, a row per live row (float64: token ids and log-probabilities both exact):
    drafts accepted, tokens taken (``cut``), whether the row ended, the pass's ``width`` emitted tokens, their
    log-probabilities, and the no-speech probability at the pass's first position (a prompt that ends with
    <|startoftranscript|> reads it there)."""

    HEAD = 3  # accepted, cut, ended

    def __init__(self, values: list[float], width: int):
        self.accepted, self.cut, self.ended = int(values[0]), int(values[1]), values[2] > 0
        self.tokens = [int(t) for t in values[self.HEAD:self.HEAD + self.cut]]
        self.logprobs = values[self.HEAD + width:self.HEAD + width + self.cut]
        self.no_speech = values[self.HEAD + 2 * width]

    @staticmethod
    def columns(width: int) -> int:
        return PassRead.HEAD + 2 * width + 1

    @staticmethod
    def pack(accepted: torch.Tensor, cut: torch.Tensor, ended: torch.Tensor, emitted: torch.Tensor,
             token_lp: torch.Tensor, no_speech: torch.Tensor) -> torch.Tensor:
        return torch.cat([torch.stack([accepted, cut, ended.long()], 1).double(), emitted.double(), token_lp.double(),
                          no_speech[:, None].double()], 1)


def draft(decoder: CachedDecoder, s: Slots, k: int, o: DecodeOptions, catch_up: int, fixed: bool,
          noise: Noise | None = None, stop: Callable[[torch.Tensor], bool] | None = None,
          forced: tuple[torch.Tensor, torch.Tensor] | None = None
          ) -> tuple[torch.Tensor, list[torch.Tensor | None]]:
    """Up to ``k`` draft tokens per row [b, kk], chosen as the target chooses (the same rules, the same noise). The
    draft first feeds each row's last ``catch_up`` tokens (the positions its cache lacks; a row with a shorter gap
    re-feeds cached positions, which is harmless). ``fixed``: the decoder's shapes do not depend on the positions (a
    static decode's). ``stop`` (the draft's belief in each row's proposal [b]) -> True ends drafting early (it reads the
    host).
    ``forced`` (tokens [b, >= k], rows [b]): those rows propose these tokens instead of the draft's (a row's hint),
    and the draft reads them, so its cache holds what the row will hold if the target accepts them."""
    b, steps = s.n.shape[0], torch.arange(catch_up, device=s.n.device)
    fpos = (s.n[:, None] - catch_up + steps).clamp(min=0)
    feed, at = s.seq.gather(1, fpos), fpos.new_full((b, 1), catch_up - 1)
    cols, state, rest = decoder.columns, s.rule_state(), decoder.rest_ids is not None
    proposals, noises = [], []
    for j in range(k):
        with phase("draft"):
            logits, hidden = decoder(s.draft, feed, fpos, at, shortlist=True, fixed=fixed, hidden=True)
        with phase("rules"):
            processed = o.rules(logits[:, 0].float(), state, cols)
        nz = noise(j) if noise is not None else None
        noises.append(nz)
        with phase("acceptance"):
            c = o.sampler.choose(processed, nz if nz is None or cols.ids is None else nz[:, cols.ids])
            x = c if cols.ids is None else cols.ids[c]
            belief = torch.softmax(processed, dim=-1).gather(1, c[:, None])[:, 0] if rest or stop is not None else None
            if rest:
                x = outside_shortlist(decoder, hidden[:, 0], processed, c, x, belief, nz, o)
            if forced is not None:
                x = torch.where(forced[1], forced[0][:, j], x)
        proposals.append(x)
        if stop is not None and j + 1 < k and stop(belief):
            break
        state = state.push(x, o.rules.begin)
        feed, fpos, at = x[:, None], (s.n + j)[:, None], at.new_zeros(b, 1)
    return (torch.stack(proposals, 1) if proposals else s.n.new_empty(b, 0)), noises


def outside_shortlist(decoder: CachedDecoder, hidden: torch.Tensor, processed: torch.Tensor, c: torch.Tensor,
                      x: torch.Tensor, belief: torch.Tensor, noise: torch.Tensor | None, o: DecodeOptions) -> torch.Tensor:
    """The draft's proposals ``x`` [b] (columns ``c`` of ``processed``, believed ``belief``), each unsure text token
    replaced by the best token outside the shortlist where that one scores within ``REST_MARGIN`` of it (perturbed
    alike when sampling). Every row is scored, without reading the device (a CUDA graph's capture)."""
    ids = decoder.rest_ids
    best, at = o.sampler.perturbed(decoder.rest(hidden), None if noise is None else noise[:, ids]).max(dim=-1)
    chosen = o.sampler.perturbed(processed.gather(1, c[:, None])[:, 0],
                                 None if noise is None else noise.gather(1, x[:, None])[:, 0])
    margin = REST_MARGIN if noise is None else REST_MARGIN / o.sampler.temperature
    return torch.where((belief < REST_BELOW) & (x < o.eot) & (best + margin > chosen), ids[at], x)


def verify(target: CachedDecoder, s: Slots, proposals: torch.Tensor, o: DecodeOptions,
           noise: torch.Tensor | None = None, live: torch.Tensor | None = None,
           scores: dict[int, Sequence[int] | torch.Tensor] | None = None) -> torch.Tensor:
    """The target over each row's last token and its ``proposals`` [b, kk]; acceptance; each row's advance over
    the tokens it takes, written in place into ``s`` (``live``: only the rows where it is True move; the others'
    writes land past their length, stale). ``noise`` [b, kk + 1, V]: the sampler's, at each position. ``scores``:
    {layer: heads} whose cross-attention scores are recorded, filled (``CachedDecoder``'s ``cross_scores``).
    Returns the pass's :class:`PassRead` rows [b, columns]."""
    kk = proposals.shape[1]
    steps = torch.arange(kk + 1, device=s.n.device)
    feed = torch.cat([s.seq.gather(1, (s.n - 1)[:, None]), proposals], dim=1)
    with phase("target"):
        logits = target(s.target, feed, (s.n - 1)[:, None] + steps, cross_scores=scores)
    no_speech = torch.softmax(logits[:, 0].float(), dim=-1)[:, o.no_speech]
    state = s.rule_state()
    accepted, emitted, token_lp = judge(logits, proposals, state, o, noise)
    cut, ended, new, n = advance(s.seq, s.n, state, s.sample_len, target.max_positions, accepted, emitted, o)
    s.n.copy_(n if live is None else torch.where(live, n, s.n))
    s.set_rules(new, live)
    return PassRead.pack(accepted, cut, ended, emitted, token_lp, no_speech)


def prefill(target: CachedDecoder, drafter: CachedDecoder | None, s: Slots, width: int, sot_at: torch.Tensor,
            o: DecodeOptions, fixed: bool, scores: dict[int, Sequence[int] | torch.Tensor] | None = None,
            scores_from: int = 0) -> torch.Tensor:
    """Both decoders over each row's first ``width`` tokens (``drafter`` None: the draft catches up in its first
    pass instead); returns each row's no-speech probability at its ``sot_at`` (``sot_at`` [b, 1]; returned [b]). Positions past a row's
    prompt get stale entries, which its passes overwrite before reading them. ``scores``, ``scores_from``: the
    recorded heads' cross-attention scores, as ``CachedDecoder``'s ``cross_scores`` and ``scores_from``."""
    b = s.n.shape[0]
    pos = torch.arange(width, device=s.n.device).expand(b, width)
    with phase("prefill"):
        first = target(s.target, s.seq[:, :width], pos, sot_at, cross_scores=scores, scores_from=scores_from)
        if drafter is not None:
            drafter(s.draft, s.seq[:, :width], pos, pos[:, :1], shortlist=True, fixed=fixed)
    return torch.softmax(first[:, 0].float(), dim=-1)[:, o.no_speech]
