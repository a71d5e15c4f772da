"""The static-KV-cache decoder and the speculative loop on tiny random-weight models."""
from __future__ import annotations

import copy
import random

import pytest
import torch
from conftest import fast_first

from asr_spec.decoding.costs import FIRST_TRIES, MAX_PROBE_EVERY, PROBE_EVERY, CostModel
from asr_spec.decoding.logits import LogitRules
from asr_spec.decoding.rows import DecodeOptions, Decoders, RowRequest
from asr_spec.decoding.static import run_decode
from asr_spec.models.compute import int8_kernels
from asr_spec.models.kv_decoder import CachedDecoder
from asr_spec.models.loader import load_draft
from asr_spec.models.pair import Pair


def _memory(batch: int, width: int = 32, seed: int = 0) -> torch.Tensor:
    return torch.randn(batch, 20, width, generator=torch.Generator().manual_seed(seed))


def test_static_decoder_matches_transformers_on_a_ragged_batch(tiny_target, tiny_dir):
    from transformers import WhisperForConditionalGeneration

    hf, dec = WhisperForConditionalGeneration.from_pretrained(tiny_dir).eval(), tiny_target.decoder
    mem = _memory(3)
    seqs = [[50258, 50259, 50359, 50363, 11, 12, 13], [50258, 50259, 50359, 50363, 40], [50258, 50259, 50359]]
    cache = dec.new_cache(mem, 16)
    # feed a common first part, then each row's rest at its own positions (ragged, padded with junk)
    dec(cache, torch.tensor([s[:2] for s in seqs]), torch.arange(2).expand(3, 2))
    rest = [s[2:] for s in seqs]
    width = max(map(len, rest))
    tokens = torch.tensor([r + [7] * (width - len(r)) for r in rest])
    logits = dec(cache, tokens, 2 + torch.arange(width).expand(3, width))
    for i, s in enumerate(seqs):
        with torch.inference_mode():
            ref = hf(encoder_outputs=(mem[i:i + 1],), decoder_input_ids=torch.tensor([s])).logits[0, 2:]
        torch.testing.assert_close(logits[i, : len(s) - 2], ref, atol=1e-4, rtol=1e-4)


def test_rollback_is_just_a_position(tiny_target):
    dec = tiny_target.decoder
    mem = _memory(1)
    a = torch.tensor([[50258, 50259, 50359, 50363, 1, 2, 3, 4, 5]])
    b = torch.tensor([[9, 8, 7]])
    cache = dec.new_cache(mem, 16)
    dec(cache, a, torch.arange(9)[None])  # then roll back to 5 tokens and continue differently
    rolled = dec(cache, b, torch.arange(5, 8)[None])
    fresh_cache = dec.new_cache(mem, 16)
    fresh = dec(fresh_cache, torch.cat([a[:, :5], b], 1), torch.arange(8)[None])[:, 5:]
    torch.testing.assert_close(rolled, fresh, atol=1e-5, rtol=1e-5)


def test_reduced_head_gives_minus_inf_outside_the_shortlist(tiny_target):
    net = tiny_target.net
    ids = torch.tensor([5, 50, 220, 50257])
    dec = CachedDecoder(net.model.decoder, net.proj_out.weight[ids], head_ids=ids)
    full = tiny_target.decoder
    mem = _memory(1)
    tok, pos = torch.tensor([[50258, 50259]]), torch.arange(2)[None]
    small = dec(dec.new_cache(mem, 4), tok, pos)
    ref = full(full.new_cache(mem, 4), tok, pos)
    torch.testing.assert_close(small[..., ids], ref[..., ids], atol=1e-5, rtol=1e-5)
    mask = torch.ones(small.shape[-1], dtype=torch.bool)
    mask[ids] = False
    assert torch.isinf(small[..., mask]).all()


@pytest.mark.skipif(not int8_kernels("cpu"), reason="no int8 CPU kernels here")
def test_an_int8_draft_stays_close_to_its_float32_weights(tiny_target):
    """Int8 draft layers change a draft's logits by quantisation noise only (its proposals, never the text:
    the target verifies every token; see the int8 case of the exactness test below)."""
    mem = _memory(2)
    tok, pos = torch.tensor([[50258, 50259, 50359, 5, 6], [50258, 50259, 50359, 7, 8]]), torch.arange(5).expand(2, 5)
    fp32, int8 = (load_draft("layers:0,1", tiny_target, int8=q).decoder for q in (False, True))
    assert int8.int8 and not fp32.int8
    a, b = (d(d.new_cache(mem, 8), tok, pos) for d in (fp32, int8))
    assert not torch.equal(a, b)  # really quantised
    assert ((a - b).abs().max() / a.abs().max()).item() < 0.2  # 7-bit inputs, 32-wide random layers
    assert (a.argmax(-1) == b.argmax(-1)).float().mean().item() >= 0.8


PROMPTS = [[50258, 50259, 50359], [50258, 50259, 50359, 50363], [50361, 100, 200, 50258, 50259, 50359],
           [50258, 50259, 50358, 50363]]


_REFERENCES: dict = {}
_DRAFTS: dict = {}


def _reference(model, prompts, timestamps, sample_len=40):
    """Target-only greedy decoding (no draft, K = 0) of ``prompts``: deterministic, so each distinct call is decoded
    once and shared by the tests that compare against it (the model is session-wide and never changed)."""
    key = (id(model), tuple(map(tuple, prompts)), timestamps, sample_len)
    if key not in _REFERENCES:
        _REFERENCES[key] = _decode(model, None, prompts, timestamps, 0, sample_len)
    return copy.deepcopy(_REFERENCES[key])


def _draft(spec, model, int8=None):
    """``load_draft(spec, model, int8)``, built once per module: a draft holds weights only (each decode makes its
    own caches), so the tests that decode with the same one share it."""
    key = (spec, id(model), int8)
    if key not in _DRAFTS:
        _DRAFTS[key] = load_draft(spec, model, int8=int8)
    return _DRAFTS[key]


def _decode(model, draft, prompts, timestamps, k, sample_len=40, stop_below=0.0, prefixes=None, hints=None, costs=None,
            draft_view=None):
    v = model.vocab
    mem = _memory(len(prompts))
    limits = sample_len if isinstance(sample_len, list) else [sample_len] * len(prompts)
    requests = [RowRequest(p, p.index(v.sot), prefixes[i] if prefixes else [], hints[i] if hints else [], limits[i],
                        draft_memory_length=draft_view[i] if draft_view else None)
                for i, p in enumerate(prompts)]
    options = DecodeOptions(LogitRules.whisper(v, timestamps), v.eot, v.no_speech, k=k, stop_below=stop_below)
    return run_decode(Decoders(model.decoder, draft.decoder if draft else None, costs and (lambda _rows: costs)), Pair(mem, mem), requests,
                              options)


@pytest.mark.parametrize("timestamps", fast_first([True, False]))
@pytest.mark.parametrize("k", fast_first([3, 1, 6]))
@pytest.mark.parametrize("draft_spec", fast_first(["layers:0", "layers:0,1"]))
@pytest.mark.parametrize("int8", fast_first([False, True]))
def test_speculative_greedy_equals_target_greedy_tiny(tiny_target, timestamps, k, draft_spec, int8):
    prompts = [p for p in PROMPTS if timestamps != (50363 in p)] * 2
    ref = _reference(tiny_target, prompts, timestamps)
    spec = _decode(tiny_target, _draft(draft_spec, tiny_target, int8), prompts, timestamps, k)
    for r, s in zip(ref, spec):
        assert s.tokens == r.tokens
        assert s.no_speech_prob == pytest.approx(r.no_speech_prob, abs=1e-5)
        assert s.sum_logprob == pytest.approx(r.sum_logprob, abs=1e-3)
        assert s.stats.target_passes <= r.stats.target_passes
    if draft_spec == "layers:0,1" and not int8:  # the draft is the target itself: every draft is accepted
        assert all(s.stats.rejected == 0 and s.stats.accepted > 0 for s in spec)


def test_a_draft_reading_part_of_the_encoder_output_changes_speed_not_text(tiny_target):
    """The draft may read fewer encoder positions than the target (only the window's audio): per-row views, the
    memory cut to the longest; the text stays the target's and the draft's proposals change."""
    draft = _draft("layers:0,1", tiny_target, False)  # the target itself: a full view accepts everything
    ref = _reference(tiny_target, PROMPTS, True)
    full = _decode(tiny_target, draft, PROMPTS, True, 3)
    part = _decode(tiny_target, draft, PROMPTS, True, 3, draft_view=[3, 5, None, 2])
    assert [p.tokens for p in part] == [f.tokens for f in full] == [r.tokens for r in ref]
    assert all(f.stats.rejected == 0 for f in full)
    assert sum(p.stats.rejected for p in part) > 0  # it did read less


@pytest.mark.parametrize("single_row", [True, False])
def test_adaptive_draft_length_stops_early_and_stays_exact(tiny_target, single_row):
    prompts = PROMPTS[:1] if single_row else PROMPTS
    draft = _draft("layers:0,1", tiny_target)
    ref = _reference(tiny_target, prompts, True)
    full = _decode(tiny_target, draft, prompts, True, 6)
    adaptive = _decode(tiny_target, draft, prompts, True, 6, stop_below=0.05)
    for r, f, a in zip(ref, full, adaptive):
        assert a.tokens == f.tokens == r.tokens
        assert a.stats.drafted < f.stats.drafted  # some passes stopped drafting early
        assert a.stats.target_passes >= f.stats.target_passes


def test_rows_finish_independently_and_respect_sample_len(tiny_target):
    prompts = PROMPTS[:2]
    for k in (0, 4):
        out = _decode(tiny_target, _draft("layers:0,1", tiny_target), prompts, True, k, sample_len=7)
        assert all(len(r.tokens) <= 7 for r in out)
        assert [r.tokens for r in out] == [r.tokens for r in _reference(tiny_target, prompts, True, 7)]


@pytest.mark.parametrize("k", [0, 4])
def test_each_row_may_have_its_own_sample_len(tiny_target, k):
    """Streaming caps a short piece's row at what its audio can hold: each row stops at its own limit and
    is the prefix of what it would have been with a larger one (the other rows are not affected)."""
    prompts = PROMPTS[:3]
    draft = _draft("layers:0,1", tiny_target)
    longest = [r.tokens for r in _reference(tiny_target, prompts, True, 40)]
    limits = [5, 40, 9]
    out = [r.tokens for r in _decode(tiny_target, draft, prompts, True, k, sample_len=limits)]
    for tokens, full, limit in zip(out, longest, limits):
        assert len(tokens) <= limit
        assert tokens == full[:len(tokens)] and (tokens == full or len(tokens) == limit)
    assert any(len(full) > limit for full, limit in zip(longest, limits))  # some row was really cut


@pytest.mark.slow  # tiny models, but over a second: the whole suite runs it, the fast loop the quicker checks
@pytest.mark.parametrize("k", [0, 3])
def test_hints_are_free_drafts_and_never_change_the_output(tiny_target, k):
    """Streaming re-decodes verify the previous hypothesis first: right, half right or wrong hints,
    with or without a draft after them, give the target's own greedy tokens."""
    prompts = PROMPTS[:2]
    draft = _draft("layers:0", tiny_target) if k else None
    ref = _reference(tiny_target, prompts, True)
    truth = [r.tokens for r in ref]
    for hints in (truth, [t[: len(t) // 2] + [5, 6, 7] for t in truth], [[9, 9, 9]] * 2, [truth[0], []]):
        out = _decode(tiny_target, draft, prompts, True, k, hints=hints)
        assert [r.tokens for r in out] == truth
    mixed = _decode(tiny_target, draft, prompts, True, k, hints=[truth[0], []])
    if k:  # the row with a hint proposes it while the other drafts: its hint is used, not the draft's guesses
        assert mixed[0].stats.hint_accepted >= len(truth[0]) // 2 and mixed[1].stats.hint_accepted == 0
    out = _decode(tiny_target, draft, prompts, True, k, hints=truth)
    # every token (and the end-of-text) is an accepted hint or the one token each target pass adds
    assert all(r.stats.hint_accepted + r.stats.target_passes == len(r.tokens) + 1 for r in out)
    assert all(r.stats.target_passes < x.stats.target_passes for r, x in zip(out, ref))


def test_a_prefix_is_forced_and_continued_like_the_target_would(tiny_target):
    prompts = PROMPTS[:2]
    full = _reference(tiny_target, prompts, True)
    prefixes = [r.tokens[:3] for r in full]
    out = _decode(tiny_target, _draft("layers:0,1", tiny_target), prompts, True, 3, prefixes=prefixes)
    assert [r.tokens for r in out] == [r.tokens for r in full]  # greedy: forcing its own start changes nothing


@pytest.mark.parametrize("k", [0, 3])
def test_a_prefix_longer_than_sample_len_ends_the_row(tiny_target, k):
    """Regression: a forced prefix that fills ``sample_len`` left a negative room and the loop spun for ever."""
    prompts = PROMPTS[:2]
    prefixes = [[100 + i for i in range(12)], [300, 301]]  # row 0's prefix alone exceeds sample_len=7
    out = _guarded(lambda: _decode(tiny_target, _draft("layers:0,1", tiny_target) if k else None, prompts,
                                   True, k, sample_len=7, prefixes=prefixes))
    assert out[0].tokens == prefixes[0]  # nothing was added to a full row
    assert out[1].tokens[:2] == prefixes[1] and len(out[1].tokens) <= 7


@pytest.mark.slow  # tiny models, but over a second: the whole suite runs it, the fast loop the quicker checks
@pytest.mark.parametrize("k", [0, 3])
def test_prompt_and_prefix_at_the_position_limit(tiny_target, k):
    """Prompt + prefix filling all 448 positions: at most the one token the last position predicts, then the
    row ends; one position more is refused with a clear error instead of a hang or a crash."""
    v, max_pos = tiny_target.vocab, tiny_target.decoder.max_positions
    prompt = PROMPTS[0]
    prefix = [200] * (max_pos - len(prompt))
    draft = _draft("layers:0,1", tiny_target) if k else None
    out = _guarded(lambda: _decode(tiny_target, draft, [prompt, PROMPTS[1]], True, k, sample_len=10_000,
                                   prefixes=[prefix, []]))
    assert out[0].tokens[:len(prefix)] == prefix and len(out[0].tokens) <= len(prefix) + 1
    assert len(out[1].tokens) >= 1
    with pytest.raises(ValueError, match="positions"):
        _decode(tiny_target, draft, [prompt], True, k, prefixes=[prefix + [200]])
    assert v.eot not in out[0].tokens


def _guarded(fn, seconds: float = 120.0):
    """Run ``fn`` under a deadline: a decode that never ends kills the run with every thread's traceback
    (faulthandler) instead of hanging it."""
    import faulthandler

    faulthandler.dump_traceback_later(seconds, exit=True)
    try:
        return fn()
    finally:
        faulthandler.cancel_dump_traceback_later()


def test_the_cost_model_tries_every_length_then_runs_the_fastest_and_probes_its_neighbours():
    costs = CostModel(rate=0.0)
    tried = []
    for _ in range(4 * FIRST_TRIES):
        tried.append(k := costs.choose(3))
        costs.record(k, tokens_per_row=[1.0, 1.8, 2.3, 2.6][k], seconds=[10.0, 12.0, 16.0, 20.0][k])
    assert sorted(tried) == sorted(list(range(4)) * FIRST_TRIES)  # each a few times, in whatever order
    picks = [costs.choose(3) for _ in range(4 * PROBE_EVERY)]  # passes 17..80: probes at 17, 33 and 65
    assert picks.count(1) == len(picks) - 3 and set(picks) == {0, 1, 2}  # K = 1 is fastest; 0 and 2 probed
    picks = [costs.choose(3) for _ in range(2000)]  # the best stays K = 1: probes 128, 256, 256, ... passes apart
    assert 1 + (2000 - 128 - 256) // MAX_PROBE_EVERY <= len(picks) - picks.count(1) <= 2 + 2000 // MAX_PROBE_EVERY
    costs.tokens[2], costs.seconds[2] = 2.3, 1.0  # K = 2 is suddenly the fastest
    costs.passes, costs.next_probe = 0, 0
    assert costs.choose(3) in (1, 3) and costs.probe_every == PROBE_EVERY  # a new best: probing often again
    costs = CostModel(rate=1.0)
    for _ in range(FIRST_TRIES):
        costs.record(0, 1.0, 10.0)
        costs.record(3, 2.6, 30.0)  # a draft that does not pay: plain target decoding
    assert costs.choose(3) in (1, 2)  # not tried yet
    for _ in range(FIRST_TRIES):
        costs.record(1, 1.1, 14.0)
        costs.record(2, 1.2, 18.0)
    assert costs.choose(3) == 0


def _chosen_under_load(costs: CostModel, seed: int) -> tuple[list[int], list[int]]:
    """3000 passes of a machine where K = 3 pays most (2.8 tokens for 1.75 time units against K = 0's 1 for 1). From
    pass 500 to 1500 other processes share the CPU: every pass, whatever its K, is 3x slower in bursts of 40
    passes, and one in ten stalls 10x or 30x. The draft lengths chosen under that load, and in the last 1000 passes."""
    rng = random.Random(seed)
    loaded, calm = [], []
    for n in range(3000):
        k = costs.choose(3)
        load = 500 <= n < 1500
        slow = (rng.choice([10.0, 30.0]) if rng.random() < 0.1 else 3.0 if (n // 40) % 2 else 1.0) if load else 1.0
        costs.record(k, tokens_per_row=1.0 + 0.6 * k, seconds=slow * (1.0 + 0.25 * k) * (1 + 0.05 * (n % 3)))
        (loaded if load else calm if n >= 2000 else []).append(k)
    return loaded, calm


@pytest.mark.parametrize("seed", [0, 2])
def test_the_chooser_keeps_drafting_through_a_busy_spell_and_after_it(seed):
    """A busy machine slows every pass, whatever its K: the pace takes it, so K = 3 stays the choice under the load
    and after it. Without the pace (seconds compared as measured, whenever measured) the stalls land on the K being
    run, the choice wanders off K = 3 and here stays on K = 2 long after the load is gone."""
    loaded, calm = _chosen_under_load(CostModel(), seed)
    assert loaded.count(3) >= 0.95 * len(loaded) and calm.count(3) >= 0.95 * len(calm)
    loaded, calm = _chosen_under_load(CostModel(pace_rate=0.0), seed)
    assert loaded.count(3) < 0.5 * len(loaded) and calm.count(3) < 0.5 * len(calm)


@pytest.mark.parametrize("fastest", [0, 3])
def test_a_decode_with_the_cost_model_is_exact_and_follows_it(tiny_target, fastest):
    """Whatever draft length the cost model picks, greedy output is the target's own; a draft length
    measured slow is run only on the probe passes."""
    draft = _draft("layers:0,1", tiny_target, False)  # the target itself: every draft is accepted
    prompts = PROMPTS[:2]
    ref = _reference(tiny_target, prompts, True, 60)
    costs = CostModel(tokens={k: 1.0 + k for k in range(4)}, seconds={k: 1.0 if k == fastest else 100.0 for k in range(4)},
                      counts={k: 10**9 for k in range(4)}, rate=0.0)  # as if measured for ever: they stay put
    out = _decode(tiny_target, draft, prompts, True, 3, sample_len=60, costs=costs)
    assert [r.tokens for r in out] == [r.tokens for r in ref]
    passes, drafted = out[0].stats.target_passes, out[0].stats.drafted
    if fastest == 0:
        assert drafted <= passes // PROBE_EVERY + 1
    else:
        assert drafted >= 2 * passes  # K = 3 on all but the probe passes


def test_a_row_that_gives_up_stops_early_and_alone(tiny_target):
    """``RowRequest.give_up`` ends a row as soon as its tokens so far satisfy it (streaming: a loop, whose result is
    decoded again anyway); the other rows of the batch go on to the tokens they decode alone."""
    from dataclasses import replace

    v = tiny_target.vocab
    mem = _memory(2)
    rules = DecodeOptions(LogitRules.whisper(v, True), v.eot, v.no_speech)
    requests = [RowRequest(p, p.index(v.sot), sample_len=30) for p in PROMPTS[:2]]
    alone = run_decode(Decoders(tiny_target.decoder), Pair(mem, mem), requests, rules)
    assert len(alone[0].tokens) > 5
    stop = [replace(requests[0], give_up=lambda tokens, new: len(tokens) >= 5), requests[1]]
    out = run_decode(Decoders(tiny_target.decoder), Pair(mem, mem), stop, rules)
    assert out[0].tokens == alone[0].tokens[:5] and out[1].tokens == alone[1].tokens


def test_looping_is_what_suspect_finds_as_it_happens(tiny_target):
    """``Recognizer.looping`` finds, in the newest tokens, what ``suspect`` finds in a whole result: a phrase of 4+
    tokens repeated at once, or a timestamp past the audio's encoder positions."""
    from asr_spec.recognizer import Recognizer

    r, tb = Recognizer(tiny_target), tiny_target.vocab.timestamp_begin
    phrase = [11, 12, 13, 14]
    assert r.looping([tb, 5, *phrase, *phrase], 1, 100)  # the repeat completes with the newest token
    assert r.looping([tb, 5, *phrase, *phrase, 9], 3, 100)  # ... or one of the newest
    assert not r.looping([tb, 5, *phrase, *phrase, 9], 1, 100)  # it completed earlier: found then
    assert not r.looping([tb, 5, 11, 12, 13, 11, 12, 13], 1, 100)  # 3 tokens: Whisper's own rhythm, not a loop
    assert r.looping([tb, 5, 6, tb + 120], 1, 100) and not r.looping([tb, 5, 6, tb + 90], 1, 100)


def test_overrun_is_where_a_suspect_decode_went_wrong(tiny_target):
    """``Recognizer.overrun``: the index of the first timestamp past the audio, or of the second copy of the first
    phrase repeated at once (a partial that loops is kept up to there instead of decoded again on 30 s)."""
    from asr_spec.recognizer import Recognizer

    r, tb = Recognizer(tiny_target), tiny_target.vocab.timestamp_begin
    phrase = [11, 12, 13, 14]
    assert r.overrun([tb, 5, *phrase, *phrase, *phrase], 100) == 6  # the second copy starts at index 6
    assert r.overrun([tb, 5, 6, tb + 50, tb + 50, 7, tb + 120, 8], 100) == 6  # the timestamp past 100 positions
    assert r.overrun([tb, *phrase, tb + 30, tb + 30, *phrase, *phrase], 20) == 5  # the earlier of the two
    assert r.overrun([tb, 5, 11, 12, 13, 11, 12, 13, tb + 90], 100) is None  # nothing went wrong
    assert r.overrun([tb + 120, 5, 6], 100) == 0  # at the very start


def test_a_looping_partial_is_kept_up_to_where_it_went_wrong(tiny_target):
    """Streaming's cut (instead of a re-decode on 30 s): the tokens before the overrun, never fewer than the prefix,
    with their log-probabilities; a decode that went wrong at its first token keeps only its prefix."""
    from asr_spec.decoding.rows import RowResult, RowStats
    from asr_spec.recognizer import Recognizer
    from asr_spec.streaming.decode import _cut_overrun

    r, tb = Recognizer(tiny_target), tiny_target.vocab.timestamp_begin
    phrase = [11, 12, 13, 14]
    def result(tokens: list[int], prefix: int) -> RowResult:
        return RowResult(tokens, -0.5 * (len(tokens) - prefix + 1), 0.0, RowStats(), logprobs=[-0.5] * (len(tokens) - prefix))

    cut = _cut_overrun(r, result([tb, 5, *phrase, *phrase, *phrase], 1), 100, 1)
    assert cut.tokens == [tb, 5, *phrase] and cut.logprobs == [-0.5] * 5 and cut.sum_logprob == -2.5
    assert _cut_overrun(r, result([tb + 120, 5, 6], 0), 100, 0).tokens == []  # wrong from its first token
    assert _cut_overrun(r, result([tb + 120, 5, 6], 2), 100, 2).tokens == [tb + 120, 5]  # the prefix stays
    assert _cut_overrun(r, result([tb, 5, 6, tb + 90], 1), 100, 1).tokens == [tb, 5, 6, tb + 90]  # nothing wrong


def test_hotwords_come_before_the_previous_text_in_every_window_prompt(tiny_target):
    """faster-whisper's ``hotwords``: after <|startofprev|>, before the previous text, in every window (with no
    previous text too); they keep their place in Whisper's budget of half the context and the text gets the rest."""
    from asr_spec.recognizer import Recognizer

    r, v = Recognizer(tiny_target), tiny_target.vocab
    sot = v.sot_sequence("en", "transcribe")
    budget = tiny_target.decoder.max_positions // 2 - 1
    assert r.prompt([5], "en", "transcribe", True).prompt == [v.sot_prev, 5, *sot]  # none: Whisper's prompt
    assert r.prompt([], "en", "transcribe", True).prompt == sot
    assert r.prompt([], "en", "transcribe", True, [7, 8]).prompt == [v.sot_prev, 7, 8, *sot]
    assert r.prompt([5, 6], "en", "transcribe", True, [7, 8]).prompt == [v.sot_prev, 7, 8, 5, 6, *sot]
    previous = list(range(1000, 1000 + 2 * budget))
    prompt = r.prompt(previous, "en", "transcribe", True, [7, 8]).prompt
    assert prompt == [v.sot_prev, 7, 8, *previous[-(budget - 2):], *sot]
    many = list(range(2000, 2000 + 2 * budget))
    assert r.prompt(previous, "en", "transcribe", True, many).prompt == [v.sot_prev, *many[:budget], *sot]


def test_language_detection_chooses_among_the_languages_it_is_given(tiny_target):
    """``detect_language(..., among=...)``: per window, the most likely of its allowed languages (Realtime's
    ``languages``); an empty set allows any, as without it."""
    import torch

    from asr_spec.recognizer import Recognizer

    r = Recognizer(tiny_target)
    memory = tiny_target.encode(torch.randn(3, 80, 3000, generator=torch.Generator().manual_seed(2)))
    free = r.detect_language(memory)
    assert r.detect_language(memory, among=[(), (), ()]) == free
    others = [tuple(c for c in ("en", "de", "fr", "es") if c != lang)[:2] for lang in free]
    chosen = r.detect_language(memory, among=others)
    assert all(c in allowed and c != f for c, allowed, f in zip(chosen, others, free))
    assert r.detect_language(memory, among=[("ja",), (), ("de",)]) == ["ja", free[1], "de"]
