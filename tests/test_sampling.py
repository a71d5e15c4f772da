"""Speculative sampling is distribution-exact: thousands of seeded rows decoded in one batch match the
target's own distribution (chi-square), and the same test catches deliberately broken acceptance rules."""
from __future__ import annotations

import pytest
import torch
from scipy.stats import chisquare
from transformers import WhisperConfig, WhisperForConditionalGeneration

from asr_spec.decoding.kv_decoder import StaticDecoder
from asr_spec.decoding.logits import LogitRules
from asr_spec.decoding.sampling import Rejection
from asr_spec.decoding.speculative import Decoders, RowStats, speculative_decode
from asr_spec.models.vocab import WhisperVocab

V = 48
VOCAB = WhisperVocab(size=V, eot=32, sot=33, sot_prev=34, no_speech=35, transcribe=36, translate=37,
                     no_timestamps=38, suppress=(33, 34, 35, 36, 37), suppress_begin=(32,))
PROMPT = [VOCAB.sot, VOCAB.no_timestamps]
N = 20000
FALSE_ALARM = 1e-3  # per chi-square test


def _model(seed: int, scale: float) -> StaticDecoder:
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
    return StaticDecoder(m.model.decoder, m.proj_out.weight)


TARGET = _model(1, 0.5)
DRAFT = _model(2, 0.5)
MEMORY = torch.randn(1, 4, 16, generator=torch.Generator().manual_seed(3))
RULES = LogitRules.whisper(VOCAB, timestamps=False)


def exact_joint(temperature: float) -> torch.Tensor:
    """P(t1, t2) of sampling the target alone, computed exactly: [V, V]."""
    first = torch.tensor([PROMPT + [t] for t in range(V)])
    cache = TARGET.new_cache(MEMORY.expand(V, -1, -1), 8)
    logits = TARGET(cache, first, torch.arange(3).expand(V, 3)).float()
    p1 = torch.softmax(RULES(logits[0, 1:2].clone(), [[]]) / temperature, -1)[0]
    p2 = torch.softmax(RULES(logits[:, 2].clone(), [[t] for t in range(V)]) / temperature, -1)
    return p1[:, None] * p2


def sampled_pairs(sampler: Rejection, k: int, seed: int, stop_below: float = 0.0, rows: int = N,
                  stats: list[RowStats] | None = None, draft: StaticDecoder = DRAFT,
                  hint: list[int] | None = None) -> torch.Tensor:
    """N samples, decoded in batches of ``rows`` (small batches let adaptive draft length vary per batch)."""
    generator = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(N // rows):
        out += speculative_decode(Decoders(TARGET, draft), MEMORY.expand(rows, -1, -1), MEMORY.expand(rows, -1, -1),
                                  [PROMPT] * rows, [0] * rows, RULES, sampler, k, VOCAB.eot, VOCAB.no_speech,
                                  sample_len=2, generator=generator, stop_below=stop_below,
                                  hints=[hint] * rows if hint else None)
    if stats is not None:
        stats += [r.stats for r in out]
    return torch.tensor([(r.tokens + [VOCAB.eot])[:2] for r in out])


def chi_square_pvalue(pairs: torch.Tensor, joint: torch.Tensor) -> float:
    counts = torch.zeros(V * V)
    counts.index_add_(0, pairs[:, 0] * V + pairs[:, 1], torch.ones(len(pairs)))
    joint = joint.double() / joint.double().sum()
    expected = joint.flatten() * len(pairs)
    big = expected >= 5  # pool the rare cells into one
    obs = torch.cat([counts[big], counts[~big].sum()[None]]).double()
    exp = torch.cat([expected[big], expected[~big].sum()[None]])
    pvalue = float(chisquare(obs.numpy(), exp.numpy()).pvalue)
    print(f"chi-square over {len(obs)} cells: p = {pvalue:.3g}")
    return pvalue


class AlwaysAccept(Rejection):
    """Broken: takes every draft, so the output follows the draft's distribution."""

    def verify(self, logits, drafts, q, generator):
        p = self.probs(logits)
        b, k = drafts.shape
        return drafts.new_full((b,), k), torch.multinomial(p[:, k], 1, generator=generator)[:, 0]


class ResampleFromTarget(Rejection):
    """Broken: after a rejection samples from p instead of the residual max(0, p - q)."""

    def residual(self, p, q):
        return p


def test_the_two_models_really_differ():
    joint = exact_joint(1.0)
    q1 = torch.softmax(RULES(DRAFT(DRAFT.new_cache(MEMORY, 8), torch.tensor([PROMPT]), torch.arange(2)[None])[0, 1:2]
                             .float().clone(), [[]]), -1)[0]
    tv = 0.5 * (joint.sum(1) - q1).abs().sum()
    assert tv > 0.3  # otherwise the acceptance rule would hardly be exercised


@pytest.mark.parametrize("k,temperature", [(0, 1.0), (1, 1.0), (3, 1.0), (3, 0.7)])
def test_speculative_sampling_matches_the_target_distribution(k, temperature):
    pairs = sampled_pairs(Rejection(temperature), k, seed=10 + k)
    assert chi_square_pvalue(pairs, exact_joint(temperature)) > FALSE_ALARM


def test_adaptive_draft_length_keeps_sampling_exact():
    """Batches of 8: whether a pass drafts 1, 2 or 3 tokens depends on the draft's own proposals."""
    stats: list[RowStats] = []
    pairs = sampled_pairs(Rejection(1.0), 3, seed=7, stop_below=0.4, rows=8, stats=stats)
    per_pass = sum(s.drafted for s in stats) / sum(s.target_passes for s in stats)
    assert 1.2 < per_pass < 2.8  # drafting really stopped early in some passes and not in others
    assert chi_square_pvalue(pairs, exact_joint(1.0)) > FALSE_ALARM


def test_a_reduced_vocabulary_draft_keeps_sampling_exact():
    """The draft proposes among 18 of the 48 tokens (its own columns); the target still gets p exactly."""
    ids = torch.tensor(sorted(set(range(0, V, 3)) | {VOCAB.eot, VOCAB.no_timestamps}))
    short = StaticDecoder(DRAFT.decoder, DRAFT.head_w[ids], head_ids=ids)
    pairs = sampled_pairs(Rejection(1.0), 3, seed=5, draft=short)
    assert set(pairs[:, 0].tolist()) - set(ids.tolist())  # the target's corrections reach other tokens
    assert chi_square_pvalue(pairs, exact_joint(1.0)) > FALSE_ALARM


def test_hint_tokens_keep_sampling_exact():
    """A fixed guess (a streaming hypothesis) is verified first, with one-hot proposal probabilities."""
    joint = exact_joint(1.0)
    likely = int(joint.sum(1).argmax())
    pairs = sampled_pairs(Rejection(1.0), 3, seed=3, hint=[likely, int(joint[likely].argmax())])
    assert chi_square_pvalue(pairs, joint) > FALSE_ALARM


@pytest.mark.parametrize("broken", [AlwaysAccept, ResampleFromTarget])
def test_the_same_check_fails_when_the_acceptance_rule_is_broken(broken):
    pairs = sampled_pairs(broken(1.0), 3, seed=99)
    assert chi_square_pvalue(pairs, exact_joint(1.0)) < FALSE_ALARM
