"""Whisper's logit rules, one behaviour at a time, and applied at every verified position."""
from __future__ import annotations

import torch

from asr_spec.decoding.logits import FULL, LogitRules, RuleState, TimestampRules
from asr_spec.models.kv_decoder import Columns
from asr_spec.models.vocab import WhisperVocab

V = 60
VOCAB = WhisperVocab(size=V, eot=30, sot=31, sot_prev=32, no_speech=33, transcribe=34, translate=35,
                     no_timestamps=36, suppress=(31, 32, 33, 34, 35), suppress_begin=(30, 5),
                     max_initial_timestamp_index=3)
TB = VOCAB.timestamp_begin  # 37


def allowed(sampled: list[int], logits: torch.Tensor | None = None) -> set[int]:
    x = torch.zeros(1, V) if logits is None else logits.clone()[None]
    TimestampRules(VOCAB).apply(x, RuleState.of([sampled], TB), FULL)
    return set(torch.nonzero(torch.isfinite(x[0])).flatten().tolist())


def test_first_token_is_an_early_timestamp():
    assert allowed([]) == {TB, TB + 1, TB + 2, TB + 3}


def test_a_leading_timestamp_is_followed_by_text():
    assert allowed([TB + 2]) == set(range(VOCAB.no_timestamps))


def test_a_closing_timestamp_is_followed_by_end_or_a_timestamp_not_earlier():
    logits = torch.zeros(V)
    logits[VOCAB.eot] = 5.0  # more likely than all timestamps together, so not forced to a timestamp
    got = allowed([TB, 7, 8, TB + 5], logits)
    assert got == set(range(VOCAB.eot, VOCAB.no_timestamps)) | set(range(TB + 5, V))  # specials: SuppressTokens


def test_closed_pair_forces_text_or_end():
    got = allowed([TB, 7, TB + 5, TB + 5])  # a pair: no timestamp may follow
    assert all(t < TB for t in got) and VOCAB.eot in got


def test_timestamps_never_decrease_after_text():
    got = allowed([TB + 4, 9, 10])
    assert {t for t in got if t >= TB} == set(range(TB + 5, V))


def test_timestamp_mass_beating_every_text_token_forces_a_timestamp():
    logits = torch.zeros(V)
    logits[9] = 2.0  # the best text token, but 23 timestamps at 0 carry more total mass
    got = allowed([TB, 7], logits)
    assert got and all(t >= TB for t in got if t != VOCAB.eot) and 9 not in got


def test_suppression_and_blank_at_the_first_sampled_position_only():
    rules = LogitRules.whisper(VOCAB, timestamps=False)
    x = rules(torch.zeros(2, V), [[], [7]])
    assert torch.isinf(x[0, [30, 5, 31, 35]]).all()
    assert torch.isfinite(x[1, [30, 5]]).all() and torch.isinf(x[1, [31, 35]]).all()


def test_rules_at_verified_positions_use_each_positions_own_prefix(tiny_target):
    """The verify pass edits K+1 rows at once; each must equal the rules applied to that prefix alone."""
    rules = LogitRules.whisper(VOCAB, timestamps=True)
    drafts = [TB, 7, TB + 3, TB + 3]
    logits = torch.randn(len(drafts) + 1, V, generator=torch.Generator().manual_seed(0))
    batched = rules(logits.clone(), [drafts[:j] for j in range(len(drafts) + 1)])
    for j in range(len(drafts) + 1):
        alone = rules(logits[j:j + 1].clone(), [drafts[:j]])
        assert torch.equal(batched[j:j + 1], alone)


def test_rules_on_a_shortlist_equal_full_vocabulary_rules_restricted_to_it():
    """A reduced-vocabulary draft applies the rules in shortlist columns; the result must be the full
    vocabulary's, with everything outside the shortlist -inf."""
    rules = LogitRules.whisper(VOCAB, timestamps=True)
    ids = torch.tensor([3, 5, 7, 9, 30, 31, 36] + list(range(TB, V, 2)))
    cols = Columns(ids)
    gen = torch.Generator().manual_seed(1)
    for sampled in ([], [TB], [TB, 7], [TB, 7, TB + 4], [TB, 7, TB + 4, TB + 4], [TB + 6, 9, 3]):
        small = torch.randn(1, len(ids), generator=gen)
        full = torch.full((1, V), float("-inf"))
        full[0, ids] = small[0]
        want = rules(full, [sampled])[0, ids]
        got = rules(small.clone(), [sampled], cols)[0]
        assert torch.equal(got, want), sampled
    assert cols.of([VOCAB.eot, 4, 36]) == [4, 6] and cols.at(TB) == 7


def test_a_pass_reads_each_positions_history_from_the_rows_state_on_the_device():
    """``RuleState.after`` (the states a verify pass's positions read), ``take`` (the state after the accepted
    tokens) and ``push`` (a draft step's) equal the states of the histories themselves, for histories from empty
    to several timestamps and tokens of every kind."""
    import random

    rng = random.Random(0)
    tokens = list(range(10)) + [VOCAB.eot] + list(range(TB, V))
    histories = [[rng.choice(tokens) for _ in range(rng.randrange(0, 6))] for _ in range(40)]
    added = torch.tensor([[rng.choice(tokens) for _ in range(4)] for _ in histories])
    base = RuleState.of(histories, TB)
    after = base.after(added, TB)
    want = RuleState.of([h + added[i, :j].tolist() for i, h in enumerate(histories) for j in range(5)], TB)
    assert all(torch.equal(a, w) for a, w in zip(after.flat(), want.flat()))
    cut = torch.tensor([rng.randrange(5) for _ in histories])
    taken = RuleState.of([h + added[i, :int(cut[i])].tolist() for i, h in enumerate(histories)], TB)
    assert all(torch.equal(a, w) for a, w in zip(after.take(cut).flat(), taken.flat()))
    pushed = RuleState.of([h + added[i, :1].tolist() for i, h in enumerate(histories)], TB)
    assert all(torch.equal(a, w) for a, w in zip(base.push(added[:, 0], TB).flat(), pushed.flat()))
