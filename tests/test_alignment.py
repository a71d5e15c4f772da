"""Word timestamps: the vectorised DTW against a cell-by-cell reference, and word times on a real utterance."""
from __future__ import annotations

import numpy as np
import pytest
from conftest import DEV

from asr_spec.alignment import dtw
from asr_spec.audio import load_audio
from asr_spec.transcribe import TranscribeOptions, Transcriber


def _reference_dtw(cost: np.ndarray) -> tuple[list[int], list[int]]:
    n, m = cost.shape
    total = np.full((n + 1, m + 1), np.inf)
    total[0, 0] = 0
    for i in range(1, n + 1):
        for j in range(1, m + 1):
            total[i, j] = cost[i - 1, j - 1] + min(total[i - 1, j - 1], total[i - 1, j], total[i, j - 1])
    i, j, rows, cols = n, m, [], []
    while i > 0 and j > 0:
        rows.append(i - 1)
        cols.append(j - 1)
        diag, up, left = total[i - 1, j - 1], total[i - 1, j], total[i, j - 1]
        if diag <= up and diag <= left:
            i, j = i - 1, j - 1
        elif up <= left:
            i -= 1
        else:
            j -= 1
    return rows[::-1], cols[::-1]


@pytest.mark.parametrize("shape", [(1, 5), (4, 4), (7, 30), (20, 300)])
def test_dtw_matches_the_cell_by_cell_recurrence(shape):
    cost = np.random.default_rng(sum(shape)).normal(size=shape)
    rows, cols = dtw(cost)
    ref_rows, ref_cols = _reference_dtw(cost)
    assert list(rows) == ref_rows and list(cols) == ref_cols
    assert rows[0] == 0 and cols[0] == 0 and rows[-1] == shape[0] - 1 and cols[-1] == shape[1] - 1


@pytest.mark.slow
def test_word_times_on_a_real_utterance(base_model):
    """JFK: the same text with and without word timestamps; words in order, inside their segments, and the
    pause after "ask" (2.1 s to 3.7 s in the recording) falls inside that word's span or between words."""
    audio = load_audio(DEV / "jfk-inaugural-1961-ask-not.wav")
    tr = Transcriber(base_model)
    plain, worded = tr.transcribe(audio), tr.transcribe(audio, TranscribeOptions(word_timestamps=True))
    assert worded.text == plain.text
    words = [w for s in worded.segments for w in s.words]
    assert "".join(w.word for w in words).strip() == worded.text
    assert all(a.start <= b.start for a, b in zip(words, words[1:]))
    for s in worded.segments:
        assert all(s.start <= w.start <= w.end <= s.end for w in s.words)
    country = [w for w in words if w.word.strip(" .,") == "country"]
    assert len(country) == 2 and 5.5 < country[0].start < 6.5 and 9.5 < country[1].start < 10.5
