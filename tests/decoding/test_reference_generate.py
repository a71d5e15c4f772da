"""Greedy speculative decoding equals transformers' own greedy ``generate`` on tiny random Whisper models.

The reference shares nothing with our loop: ``WhisperForConditionalGeneration.generate`` runs the HF
decoder with its own KV cache, stopping and padding. Every Whisper-specific logit rule is off on both
sides (our ``LogitRules([])``; no forced ids, suppress lists or timestamps there), both stop at the same
end-of-text, and both read the same encoder output. Ours runs without a draft (K = 0), with drafts that
agree with the target only part of the time (K = 1 and 3), one of them with its own encoder memory and
one with a reduced vocabulary: the tokens must be the very same, row for row.

(``super(WhisperForConditionalGeneration, m).generate`` would still be Whisper's generate, from
``WhisperGenerationMixin``; the generic loop is ``GenerationMixin.generate``. Whisper's is used here: with
``decoder_input_ids`` and a clean config it adds no tokens and no logit processing, which the first test checks.)
"""
from __future__ import annotations

import copy
from types import SimpleNamespace

import pytest
import torch
from transformers import GenerationConfig, WhisperConfig, WhisperForConditionalGeneration
from transformers.modeling_outputs import BaseModelOutput

from asr_spec.decoding.logits import LogitRules
from asr_spec.decoding.rows import DecodeOptions, Decoders, RowRequest, RowResult
from asr_spec.decoding.static import run_decode
from asr_spec.models.kv_decoder import CachedDecoder
from asr_spec.models.pair import Pair

V, SOT, NO_SPEECH, EOT = 80, 1, 2, 3
N = 48  # most new tokens per row: generate's max_new_tokens, our sample_len
SEED = 7  # with it (and EOT = 3) rows 1 and 3 end on end-of-text mid-way and rows 0 and 2 run to N


def _ours(target: CachedDecoder, draft: CachedDecoder | None, target_memory: torch.Tensor,
          draft_memory: torch.Tensor | None, prompts: list[list[int]], k: int, sample_len: int) -> list[RowResult]:
    """Our greedy decode with no logit rules: the one call of ``run_decode`` in this file."""
    requests = [RowRequest(p, 0, sample_len=sample_len) for p in prompts]
    return run_decode(Decoders(target, draft), Pair(target_memory, draft_memory), requests,
                              DecodeOptions(LogitRules([]), EOT, NO_SPEECH, k=k))


def _whisper(seed: int, d_model: int, layers: int) -> WhisperForConditionalGeneration:
    """A tiny random Whisper; weights scaled up so greedy has clear, varied winners."""
    cfg = WhisperConfig(vocab_size=V, num_mel_bins=8, d_model=d_model, encoder_layers=1, decoder_layers=layers,
                        encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=2 * d_model,
                        decoder_ffn_dim=2 * d_model, max_source_positions=8, max_target_positions=64,
                        pad_token_id=EOT, bos_token_id=EOT, eos_token_id=EOT, decoder_start_token_id=SOT,
                        suppress_tokens=None, begin_suppress_tokens=None)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        m = WhisperForConditionalGeneration(cfg).eval()
        with torch.no_grad():
            for p in m.parameters():
                if p.dim() == 2:
                    p.normal_(0, 0.5)
    return m


def _noisy_copy(m: WhisperForConditionalGeneration, sigma: float, seed: int) -> CachedDecoder:
    """The target's decoder with every matrix perturbed: a draft that agrees with it part of the time."""
    dec = copy.deepcopy(m.model.decoder)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in dec.parameters():
            if p.dim() == 2:
                p.add_(torch.randn(p.shape, generator=g) * sigma)
    return CachedDecoder(dec, dec.embed_tokens.weight)  # Whisper ties its output layer to the embedding


@pytest.fixture(scope="module")
def setup():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny matrices: on a busy machine extra OpenMP threads make this 100x slower
    try:
        yield _build()
    finally:
        torch.set_num_threads(threads)


def _build() -> SimpleNamespace:
    hf = _whisper(SEED, 32, 2)
    g = torch.Generator().manual_seed(SEED)
    features = torch.randn(4, 8, 16, generator=g)  # [batch, mel bins, 2 * max_source_positions]
    prompts = [[SOT] + torch.randint(10, V, (3,), generator=g).tolist() for _ in range(4)]
    with torch.inference_mode():
        memory = hf.model.encoder(features).last_hidden_state

    # A clean config on the model as well: generate fills every None of the config it is given from
    # model.generation_config, so None there does not switch a rule off (WhisperConfig's defaults would
    # put begin_suppress_tokens [220, 50256] in it; _whisper builds it without).
    gc = GenerationConfig(max_new_tokens=N, do_sample=False, num_beams=1, eos_token_id=EOT, pad_token_id=EOT,
                          decoder_start_token_id=SOT, forced_decoder_ids=None, suppress_tokens=None,
                          begin_suppress_tokens=None, return_dict_in_generate=True, output_scores=True,
                          output_logits=True)
    hf.generation_config = copy.deepcopy(gc)
    with torch.inference_mode():  # Whisper's generate: with decoder_input_ids given it adds no prompt tokens
        out = hf.generate(encoder_outputs=BaseModelOutput(last_hidden_state=memory),
                          decoder_input_ids=torch.tensor(prompts), generation_config=gc)
    assert out.sequences[:, :4].tolist() == prompts
    new = out.sequences[:, 4:].tolist()
    ended = [EOT in s for s in new]
    tokens = [s[: s.index(EOT)] if e else s for s, e in zip(new, ended)]
    logprobs = torch.log_softmax(torch.stack(out.logits, 1).float(), -1)  # [batch, steps, V]
    sum_logprob = [float(logprobs[i, torch.arange(len(t) + e), t + [EOT] * e].sum())
                   for i, (t, e) in enumerate(zip(tokens, ended))]

    other = _whisper(SEED + 100, 16, 1)  # an unrelated, narrower draft with its own encoder and memory
    with torch.inference_mode():
        other_memory = other.model.encoder(features).last_hidden_state
    noisy = _noisy_copy(hf, 0.02, SEED + 1)
    ids = torch.tensor(sorted(set(range(0, V, 2)) | {EOT}))
    drafts = {
        "noisy": (noisy, memory),
        "unrelated": (CachedDecoder(other.model.decoder, other.proj_out.weight), other_memory),
        "shortlist": (CachedDecoder(noisy.decoder, noisy.decoder.embed_tokens.weight[ids], head_ids=ids), memory),
    }
    return SimpleNamespace(target=CachedDecoder(hf.model.decoder, hf.proj_out.weight), memory=memory,
                           prompts=prompts, out=out, tokens=tokens, ended=ended, sum_logprob=sum_logprob,
                           drafts=drafts, shortlist=set(ids.tolist()))


def test_the_reference_is_plain_greedy_and_not_trivial(setup):
    out = setup.out
    # generate processed no logits at all (no Whisper rule crept in): its scores are the raw logits
    assert len(out.scores) == len(out.logits) > 0
    assert all(torch.equal(s, raw) for s, raw in zip(out.scores, out.logits))
    # some rows end on end-of-text, the others run into the length limit; all are long and varied
    assert any(setup.ended) and not all(setup.ended)
    assert all(len(t) == N for t, e in zip(setup.tokens, setup.ended) if not e)
    assert all(len(t) >= 20 and len(set(t)) >= 8 for t in setup.tokens)
    assert len({tuple(t) for t in setup.tokens}) == len(setup.tokens)
    # the target's tokens reach outside the shortlist draft's vocabulary: corrections must supply them
    assert set(sum(setup.tokens, [])) - setup.shortlist


@pytest.mark.parametrize("draft,k", [(None, 0), ("noisy", 1), ("noisy", 3), ("unrelated", 1), ("unrelated", 3),
                                     ("shortlist", 1), ("shortlist", 3)])
def test_speculative_greedy_equals_transformers_generate(setup, draft, k):
    d, d_memory = setup.drafts[draft] if draft else (None, None)
    rows = _ours(setup.target, d, setup.memory, d_memory, setup.prompts, k, N)
    assert [r.tokens for r in rows] == setup.tokens
    for r, ref in zip(rows, setup.sum_logprob):
        assert r.sum_logprob == pytest.approx(ref, abs=1e-3)
    stats = [r.stats for r in rows]
    assert all(s.tokens == len(t) for s, t in zip(stats, setup.tokens))
    if k == 0:
        assert all(s.drafted == 0 and s.target_passes == s.tokens + e for s, e in zip(stats, setup.ended))
        return
    accepted, rejected = sum(s.accepted for s in stats), sum(s.rejected for s in stats)
    assert sum(s.drafted for s in stats) > 0 and rejected > 0  # the draft disagrees: acceptance below 1
    if draft != "unrelated":  # and agrees at times: passes accept none, some and (K = 3) all of the drafts
        assert {0, 1, k} <= {a for s in stats for a in s.accepted_at}
        assert sum(s.target_passes for s in stats) < sum(s.tokens for s in stats)
    print(f"{draft} K={k}: accepted {accepted}, rejected {rejected}, "
          f"alpha {accepted / max(1, accepted + rejected):.2f}")
