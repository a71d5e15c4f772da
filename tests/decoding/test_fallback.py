"""Whisper's temperature-fallback decision, in openai/whisper's order: a silent window never falls back."""
from __future__ import annotations

import pytest

from asr_spec.decoding.rows import RowResult, RowStats
from asr_spec.recognizer import Checks, Recognizer

LOOP = [100, 200, 300] * 30  # compression ratio far above 2.4
PLAIN = [100, 200, 300, 400, 500]


def _row(tokens: list[int], avg_logprob: float, no_speech_prob: float) -> RowResult:
    return RowResult(tokens, avg_logprob * (len(tokens) + 1), no_speech_prob, RowStats())


@pytest.mark.parametrize("tokens,logprob,no_speech,expected", [
    (PLAIN, -0.2, 0.1, False),  # fine
    (LOOP, -0.2, 0.1, True),  # repetitive
    (PLAIN, -1.5, 0.1, True),  # unlikely
    (LOOP, -1.5, 0.9, False),  # repetitive but silent: Whisper keeps it (and then skips the window)
    (PLAIN, -1.5, 0.9, False),  # unlikely but silent
    (LOOP, -0.2, 0.9, True),  # repetitive, no-speech high but likely text: not silent
])
def test_fallback_follows_whisper_and_silence_wins(tiny_target, tokens, logprob, no_speech, expected):
    tr = Recognizer(tiny_target)
    assert tr.needs_fallback(_row(tokens, logprob, no_speech), Checks()) is expected


def test_fallback_thresholds_can_be_switched_off(tiny_target):
    tr = Recognizer(tiny_target)
    assert not tr.needs_fallback(_row(LOOP, -0.2, 0.1), Checks(compression_ratio_threshold=None))
    assert tr.needs_fallback(_row(LOOP, -1.5, 0.9), Checks(no_speech_threshold=None))
    assert not tr.needs_fallback(_row(PLAIN, -1.5, 0.1), Checks(logprob_threshold=None))
