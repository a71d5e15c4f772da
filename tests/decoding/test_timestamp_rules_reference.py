"""The batched TimestampRules equal a plain per-row reading of openai/whisper's ApplyTimestampRules:
random logits and random histories, full vocabulary and shortlists, bit-identical results."""
from __future__ import annotations

import random
from dataclasses import replace
from typing import Sequence

import pytest
import torch

from asr_spec.decoding.logits import FULL, NEG_INF, RuleState, TimestampRules
from asr_spec.models.kv_decoder import Columns
from asr_spec.models.vocab import WhisperVocab

V = 100
VOCAB = WhisperVocab(size=V, eot=40, sot=41, sot_prev=42, no_speech=43, transcribe=44, translate=45,
                     no_timestamps=46, suppress=(41, 42, 43, 44, 45), suppress_begin=(40,),
                     max_initial_timestamp_index=5)
TB = VOCAB.timestamp_begin  # 47: 53 timestamps


def reference_apply(rules: TimestampRules, logits: torch.Tensor, sampled: Sequence[Sequence[int]],
                    cols: Columns) -> None:
    """The per-row loop TimestampRules.apply was before it was batched (whisper's decoding.py, row by row)."""
    begin = rules.begin
    tb, eot = cols.at(begin), cols.at(rules.eot)
    if at := cols.of([rules.no_timestamps]):
        logits[:, at] = NEG_INF
    for i, seq in enumerate(sampled):
        last_ts = len(seq) >= 1 and seq[-1] >= begin
        penultimate_ts = len(seq) < 2 or seq[-2] >= begin
        if last_ts:
            if penultimate_ts:
                logits[i, tb:] = NEG_INF  # a pair just closed: text (or eot) must follow
            else:
                logits[i, :eot] = NEG_INF  # an open timestamp: no text next
        stamps = [t for t in seq if t >= begin]
        if stamps:
            last = stamps[-1] if (last_ts and not penultimate_ts) else stamps[-1] + 1
            logits[i, tb:cols.at(last)] = NEG_INF
        if len(seq) == 0:
            logits[i, :tb] = NEG_INF
            if rules.max_initial is not None:
                logits[i, cols.at(begin + rules.max_initial + 1):] = NEG_INF
    logprobs = torch.log_softmax(logits.float(), dim=-1)
    ts_mass = logprobs[:, tb:].logsumexp(dim=-1)
    text_best = logprobs[:, :tb].max(dim=-1).values
    logits[ts_mass > text_best, :tb] = NEG_INF


def history(rng: random.Random) -> list[int]:
    """Text and non-decreasing timestamps, ending in text, one timestamp, a pair, or eot (or empty)."""
    if rng.random() < 0.15:
        return []
    seq: list[int] = []
    t = TB + rng.randrange(6)
    for _ in range(rng.randrange(1, 12)):
        if rng.random() < 0.3:
            t = min(V - 1, t + rng.randrange(4))
            seq += [t] * rng.choice([1, 1, 2])  # a lone stamp, or a pair (equal stamps close one segment)
        else:
            seq.append(rng.randrange(VOCAB.eot))
    ending = rng.choice(["text", "open", "pair", "eot", "as is"])
    t = min(V - 1, t + rng.randrange(3))
    return seq + {"text": [rng.randrange(VOCAB.eot)], "open": [t], "pair": [t, t], "eot": [VOCAB.eot],
                  "as is": []}[ending]


def shortlist(rng: random.Random) -> Columns:
    """A sorted random subset of the vocabulary; sometimes without eot, <|notimestamps|> or the first stamp."""
    ids = sorted(t for t in range(V) if rng.random() < 0.6)
    return Columns(torch.tensor(ids))


def compare(vocab: WhisperVocab, cols: Columns, n_cols: int, seed: int) -> tuple[int, int]:
    """Random logits and histories in one batch, new against reference; counts the rows the mass rule forced."""
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    sampled = [history(rng) for _ in range(rng.randrange(1, 33))]
    logits = torch.randn(len(sampled), n_cols, generator=gen) * rng.choice([0.5, 1.0, 3.0])
    logits[:, cols.at(TB):] += torch.randn(len(sampled), 1, generator=gen) * 3  # sometimes timestamps dominate
    want, got = logits.clone(), logits.clone()
    rules = TimestampRules(vocab)
    reference_apply(rules, want, sampled, cols)
    rules.apply(got, RuleState.of(sampled, TB), cols)
    assert torch.equal(torch.isinf(got), torch.isinf(want)), (seed, sampled)
    assert torch.equal(got, want), (seed, sampled)
    text_gone = torch.isinf(want[:, :cols.at(TB)]).all(dim=-1).tolist()
    return sum(g and len(s) > 0 for g, s in zip(text_gone, sampled)), len(sampled)  # (rows forced by mass, rows)


@pytest.mark.parametrize("max_initial", [5, None])
def test_batched_rules_equal_the_per_row_reference_on_the_full_vocabulary(max_initial):
    vocab = replace(VOCAB, max_initial_timestamp_index=max_initial)
    forced = total = 0
    for seed in range(120):
        f, n = compare(vocab, FULL, V, seed)
        forced, total = forced + f, total + n
    assert 0 < forced < total  # the timestamp-mass rule both fired and did not


@pytest.mark.parametrize("max_initial", [5, None])
def test_batched_rules_equal_the_per_row_reference_on_shortlists(max_initial):
    vocab = replace(VOCAB, max_initial_timestamp_index=max_initial)
    for seed in range(120):
        cols = shortlist(random.Random(10_000 + seed))
        compare(vocab, cols, len(cols.ids), seed)


def test_edge_histories_in_one_batch():
    """Every kind of ending side by side (per-row thresholds must not leak between rows)."""
    cols = Columns(torch.tensor([3, 9, VOCAB.eot, 41, TB + 1, TB + 3, TB + 4, TB + 9, V - 1]))
    sampled = [[], [TB], [TB, 5], [TB, 5, TB + 3], [TB, 5, TB + 3, TB + 3], [TB, 5, TB + 3, 7], [TB + 3, VOCAB.eot],
               [5, 6, 7], [V - 1, 5], [V - 1, 5, V - 1], [TB + 2, 5, TB + 2]]
    gen = torch.Generator().manual_seed(0)
    for c, n in ((FULL, V), (cols, len(cols.ids))):
        logits = torch.randn(len(sampled), n, generator=gen)
        want, got = logits.clone(), logits.clone()
        reference_apply(TimestampRules(VOCAB), want, sampled, c)
        TimestampRules(VOCAB).apply(got, RuleState.of(sampled, TB), c)
        assert torch.equal(got, want)
