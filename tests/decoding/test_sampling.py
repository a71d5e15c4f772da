"""Speculative sampling is exact: the same seed gives the same tokens with and without the draft, at any
draft length; thousands of seeded rows decoded in one batch match the target's own distribution
(chi-square, outcomes the target cannot produce never seen); and the same checks catch deliberately
broken rules."""
from __future__ import annotations

import pytest
import torch
from conftest import fast_first
from scipy.stats import chisquare
from transformers import WhisperConfig, WhisperForConditionalGeneration

from asr_spec.decoding.costs import CostModel
from asr_spec.decoding.logits import LogitRules, SuppressAtBegin, SuppressTokens
from asr_spec.decoding.rows import DecodeOptions, Decoders, RowRequest, RowStats
from asr_spec.decoding.sampling import Sampler
from asr_spec.decoding.static import run_decode
from asr_spec.models.kv_decoder import CachedDecoder
from asr_spec.models.pair import Pair
from asr_spec.models.vocab import WhisperVocab

V = 48
VOCAB = WhisperVocab(size=V, eot=32, sot=33, sot_prev=34, no_speech=35, transcribe=36, translate=37,
                     no_timestamps=38, suppress=(33, 34, 35, 36, 37), suppress_begin=(32,))
PROMPT = [VOCAB.sot, VOCAB.no_timestamps]
TS_PROMPT = [VOCAB.sot]  # timestamps on: tokens 39..47 are <|0.00|> .. <|0.16|>
N = 20000
FALSE_ALARM = 1e-3  # per chi-square test


def _model(seed: int, scale: float) -> CachedDecoder:
    torch.manual_seed(seed)
    cfg = WhisperConfig(vocab_size=V, num_mel_bins=8, d_model=16, encoder_layers=1, decoder_layers=1,
                        encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=32,
                        decoder_ffn_dim=32, max_source_positions=4, max_target_positions=16,
                        pad_token_id=32, bos_token_id=32, eos_token_id=32, decoder_start_token_id=33)
    m = WhisperForConditionalGeneration(cfg).eval()
    with torch.no_grad():
        for p in m.parameters():
            if p.dim() == 2:
                p.normal_(0, scale)
    return CachedDecoder(m.model.decoder, m.proj_out.weight)


TARGET = _model(1, 0.5)
DRAFT = _model(2, 0.5)
MEMORY = torch.randn(1, 4, 16, generator=torch.Generator().manual_seed(3))
RULES = LogitRules.whisper(VOCAB, timestamps=False)
TS_RULES = LogitRules.whisper(VOCAB, timestamps=True)
FEW = [3, 7, 11, 19, 26, VOCAB.eot]  # a rule set allowing only these, so that 4-token outcomes can be counted
FEW_RULES = LogitRules([SuppressAtBegin([VOCAB.eot]), SuppressTokens([t for t in range(V) if t not in FEW])])


@torch.inference_mode()
def exact_joint(temperature: float, rules: LogitRules = RULES, prompt: list[int] = PROMPT,
                length: int = 2) -> dict[tuple[int, ...], float]:
    """P(t1 .. t_length) of sampling the target alone, computed exactly by enumerating every possible
    prefix (end-of-text ends a sequence: what follows it is end-of-text padding). Outcomes missing from
    the result are impossible."""
    joint: dict[tuple[int, ...], float] = {(): 1.0}
    for _ in range(length):
        ended = {s + (VOCAB.eot,): p for s, p in joint.items() if s and s[-1] == VOCAB.eot}
        live = [s for s in joint if not s or s[-1] != VOCAB.eot]
        seqs = torch.tensor([prompt + list(s) for s in live])
        width = seqs.shape[1]
        logits = TARGET(TARGET.new_cache(MEMORY.expand(len(live), -1, -1), width), seqs,
                        torch.arange(width).expand(len(live), width))[:, -1].float()
        probs = torch.softmax(rules(logits, [list(s) for s in live]) / temperature, -1).tolist()
        grown = {s + (t,): joint[s] * p for s, row in zip(live, probs) for t, p in enumerate(row) if p > 0}
        joint = {**ended, **grown}
    return joint


def sampled(sampler: Sampler, k: int, stop_below: float = 0.0, rows: int = N, stats: list[RowStats] | None = None,
            draft: CachedDecoder | None = DRAFT, hint: list[int] | None = None, rules: LogitRules = RULES,
            prompt: list[int] = PROMPT, length: int = 2, costs: CostModel | None = None) -> list[tuple[int, ...]]:
    """N sampled continuations of ``length`` tokens (end-of-text padded), row i keyed (i,), decoded in
    batches of ``rows`` (small batches let the draft length vary from batch to batch)."""
    options = DecodeOptions(rules, VOCAB.eot, VOCAB.no_speech, sampler, k, stop_below)
    out = []
    for start in range(0, N, rows):
        requests = [RowRequest(prompt, 0, hint=hint or [], sample_len=length, key=(start + i,)) for i in range(rows)]
        out += run_decode(Decoders(TARGET, draft, costs and (lambda _rows: costs)), Pair(MEMORY.expand(rows, -1, -1), MEMORY.expand(rows, -1, -1)), requests, options)
    if stats is not None:
        stats += [r.stats for r in out]
    return [tuple((r.tokens + [VOCAB.eot] * length)[:length]) for r in out]


def check(samples: list[tuple[int, ...]], joint: dict[tuple[int, ...], float]) -> tuple[float, int]:
    """Chi-square p-value of the samples against the exact joint (rare possible outcomes pooled), and how
    many samples are outcomes the target cannot produce (never pooled: there must be none)."""
    counts: dict[tuple[int, ...], int] = {}
    for s in samples:
        counts[s] = counts.get(s, 0) + 1
    impossible = sum(c for s, c in counts.items() if s not in joint)
    total = sum(joint.values())
    cells = sorted(joint, key=joint.get)
    expected = [joint[c] / total * len(samples) for c in cells]
    observed = [counts.get(c, 0) for c in cells]
    big = [i for i, e in enumerate(expected) if e >= 5]
    small = [i for i, e in enumerate(expected) if e < 5]
    obs = [observed[i] for i in big] + [sum(observed[i] for i in small)]
    exp = [expected[i] for i in big] + [sum(expected[i] for i in small)]
    obs[-1] += impossible  # so the totals agree; impossible outcomes are reported on their own
    pvalue = float(chisquare(obs, exp).pvalue)
    print(f"chi-square over {len(obs)} cells: p = {pvalue:.3g}; impossible outcomes seen: {impossible}")
    return pvalue, impossible


def assert_exact(samples, joint) -> None:
    pvalue, impossible = check(samples, joint)
    assert impossible == 0
    assert pvalue > FALSE_ALARM


class AlwaysAccept(Sampler):
    """Broken: takes every draft, so the output follows the draft's distribution."""

    def verify(self, logits, drafts, noise):
        k = drafts.shape[1]
        return drafts.new_full((drafts.shape[0],), k), self.choose(logits[:, k], None if noise is None else noise[:, k])


class SameNoiseEverywhere(Sampler):
    """Broken: one noise vector per row for all its positions, so the draws of a row are not independent."""

    def noise(self, keys, positions, size, device):
        return super().noise(keys, [0] * len(positions), size, device)


class IgnoresTemperature(Sampler):
    """Broken: perturbs the logits without dividing by the temperature (samples at temperature 1)."""

    def choose(self, logits, noise):
        return logits.argmax(dim=-1) if noise is None else (logits + noise).argmax(dim=-1)


def shortlisted(decoder: CachedDecoder, rest: bool = False) -> CachedDecoder:
    """``decoder``'s layers with an output layer over a third of the tokens (and end-of-text, no-timestamps);
    ``rest``: the text tokens outside it scored from its hidden state by its token embeddings (the tied output layer:
    with the target's own layers, the target's logits for them)."""
    ids = torch.tensor(sorted(set(range(0, V, 3)) | {VOCAB.eot, VOCAB.no_timestamps}))
    outside = torch.tensor([t for t in range(VOCAB.eot) if t not in ids]) if rest else None
    return CachedDecoder(decoder.decoder, decoder.decoder.embed_tokens.weight[ids], head_ids=ids, rest_ids=outside)


def test_the_two_models_really_differ():
    p1 = torch.tensor([sum(p for s, p in exact_joint(1.0).items() if s[0] == t) for t in range(V)])
    logits = DRAFT(DRAFT.new_cache(MEMORY, 8), torch.tensor([PROMPT]), torch.arange(2)[None])[0, 1:2].float()
    q1 = torch.softmax(RULES(logits.clone(), [[]]), -1)[0]
    assert 0.5 * (p1 - q1).abs().sum() > 0.3  # otherwise acceptance would hardly be exercised


def test_the_same_seed_gives_the_same_tokens_at_any_draft_length():
    """Target alone, K = 1 and 3, drafting stopped early, a chosen draft length, a shortlist draft and hints:
    row for row the same 6 sampled tokens; another seed gives other tokens."""
    short = shortlisted(DRAFT)
    memory = Pair(MEMORY.expand(64, -1, -1), MEMORY.expand(64, -1, -1))

    def run(draft, k, seed=5, hint=(), stop_below=0.0, costs=None):
        requests = [RowRequest(TS_PROMPT, 0, hint=list(hint), sample_len=6, key=(i,)) for i in range(64)]
        o = DecodeOptions(TS_RULES, VOCAB.eot, VOCAB.no_speech, Sampler(0.8, seed), k, stop_below)
        return [r.tokens for r in run_decode(Decoders(TARGET, draft, costs and (lambda _rows: costs)), memory, requests, o)]

    alone = run(None, 0)
    assert len({tuple(t) for t in alone}) > 20  # the rows really sample
    costs = CostModel(tokens={0: 1.0, 1: 1.5, 2: 9.0, 3: 1.0}, seconds=dict.fromkeys(range(4), 1.0),
                      counts=dict.fromkeys(range(4), 10**9), rate=0.0)
    for out in (run(DRAFT, 1), run(DRAFT, 3), run(DRAFT, 3, stop_below=0.4), run(DRAFT, 3, costs=costs),
                run(short, 3), run(shortlisted(DRAFT, rest=True), 3), run(shortlisted(TARGET, rest=True), 3),
                run(DRAFT, 3, hint=alone[0][:3] + [7]), run(TARGET, 3)):
        assert out == alone
    assert run(DRAFT, 3, seed=6) != alone


@pytest.mark.parametrize("k,temperature", fast_first([(3, 1.0), (0, 1.0), (1, 1.0), (3, 0.7)]))
def test_speculative_sampling_matches_the_target_distribution(k, temperature):
    assert_exact(sampled(Sampler(temperature, seed=10 + k), k), exact_joint(temperature))


@pytest.mark.slow  # tiny models, but over a second: the whole suite runs it, the fast loop the quicker checks
def test_the_bonus_token_after_three_accepted_drafts_is_exact():
    """Four tokens at K = 3: the first pass can accept all three drafts and add the bonus token (the
    rules allow 5 text tokens and end-of-text, so every 4-token outcome is counted)."""
    stats: list[RowStats] = []
    samples = sampled(Sampler(1.0, seed=4), 3, rules=FEW_RULES, length=4, stats=stats, draft=TARGET)
    assert sum(s.accepted_at.count(3) for s in stats) > N // 2  # the bonus position was really reached
    assert_exact(samples, exact_joint(1.0, FEW_RULES, length=4))


@pytest.mark.slow  # tiny models, but over a second: the whole suite runs it, the fast loop the quicker checks
def test_sampling_with_timestamp_rules_is_exact():
    """Timestamps on: the first token is a timestamp, then text, then text or a later timestamp."""
    samples = sampled(Sampler(1.0, seed=8), 2, rules=TS_RULES, prompt=TS_PROMPT, length=3)
    assert {s[0] for s in samples} <= set(range(VOCAB.timestamp_begin, V))
    assert_exact(samples, exact_joint(1.0, TS_RULES, TS_PROMPT, length=3))


@pytest.mark.slow  # tiny models, but over a second: the whole suite runs it, the fast loop the quicker checks
def test_adaptive_draft_length_keeps_sampling_exact():
    """Batches of 100: whether a pass drafts 1, 2 or 3 tokens depends on the draft's own proposals."""
    stats: list[RowStats] = []
    samples = sampled(Sampler(1.0, seed=7), 3, stop_below=0.4, rows=100, stats=stats)
    per_pass = sum(s.drafted for s in stats) / sum(s.target_passes for s in stats)
    assert 1.2 < per_pass < 2.8  # drafting really stopped early in some passes and not in others
    assert_exact(samples, exact_joint(1.0))


@pytest.mark.slow  # tiny models, but over a second: the whole suite runs it, the fast loop the quicker checks
@pytest.mark.parametrize("rest", [False, True])
def test_a_reduced_vocabulary_draft_keeps_sampling_exact(rest):
    """The draft proposes among 18 of the 48 tokens (its own columns), and with ``rest`` a token outside them where
    it is unsure of its own and that one scores close (passes.outside_shortlist); the target still gets p exactly."""
    short = shortlisted(DRAFT, rest)
    samples = sampled(Sampler(1.0, seed=5), 3, draft=short)
    assert {s[0] for s in samples} - set(short.head_ids.tolist())  # the target's corrections reach other tokens
    assert_exact(samples, exact_joint(1.0))


@pytest.mark.parametrize("static", ["off", "on"])
def test_a_shortlist_draft_proposes_the_words_it_lacks(static, monkeypatch):
    """The target's own layers behind a shortlist of a third of the tokens: alone, the shortlist can never propose
    the other two thirds; scoring them with the target's output layer where it is unsure (greedy and sampling, the
    eager loop and the static decode's fixed shapes) it proposes and has accepted more, and every row's tokens are
    the target's own."""
    monkeypatch.setenv("ASR_SPEC_STATIC", static)
    memory = torch.randn(32, 4, 16, generator=torch.Generator().manual_seed(4))
    for sampler in (Sampler(), Sampler(1.0, seed=2)):
        options = DecodeOptions(TS_RULES, VOCAB.eot, VOCAB.no_speech, sampler, 3, 0.3, static=True)

        def run(draft):
            requests = [RowRequest(TS_PROMPT, 0, sample_len=8, key=(i,)) for i in range(32)]
            return run_decode(Decoders(TARGET, draft), Pair(memory, memory), requests, options)

        alone, plain, rest = run(None), run(shortlisted(TARGET)), run(shortlisted(TARGET, rest=True))
        assert [r.tokens for r in plain] == [r.tokens for r in rest] == [r.tokens for r in alone]
        accepted = [sum(r.stats.accepted for r in out) for out in (plain, rest)]
        assert accepted[1] > 1.2 * accepted[0], accepted


@pytest.mark.slow  # tiny models, but over a second: the whole suite runs it, the fast loop the quicker checks
def test_hint_tokens_keep_sampling_exact():
    """A fixed guess (a streaming hypothesis) is verified first."""
    joint = exact_joint(1.0)
    likely = max(joint, key=joint.get)
    assert_exact(sampled(Sampler(1.0, seed=3), 3, hint=list(likely)), joint)


@pytest.mark.parametrize("broken,temperature", fast_first([(AlwaysAccept, 1.0), (SameNoiseEverywhere, 1.0),
                                                           (IgnoresTemperature, 0.7)]))
def test_the_same_check_fails_when_a_rule_is_broken(broken, temperature):
    pvalue, impossible = check(sampled(broken(temperature, seed=99), 3), exact_joint(temperature))
    assert pvalue < FALSE_ALARM or impossible > 0
