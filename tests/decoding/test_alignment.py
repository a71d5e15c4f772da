"""Word timestamps: the vectorised DTW against a cell-by-cell reference, and word times on a real utterance."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from conftest import DEV

from asr_spec.alignment import Word, dtw, held
from asr_spec.audio import load_audio
from asr_spec.models.pair import Pair
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
    assert held(words) == len(words)  # the audio holds every word it says


def test_a_run_of_words_the_audio_does_not_hold_is_found():
    """Whisper's word anomaly measure: words piled on one frame after real ones (a hallucinated copy of the last
    sentence) are not held, from the run's first word; a lone short word, a few quick ones, or unlikely but
    well-timed words are; quick and unlikely words together are not."""
    def words(*spans: tuple[float, float], probability: float = 0.9) -> list[Word]:
        return [Word(f" w{i}", a, b, probability, 1) for i, (a, b) in enumerate(spans)]

    said = [(0.0, 0.4), (0.4, 0.9), (0.9, 1.3)]
    assert held(words(*said, (1.3, 1.3), (1.3, 1.3), (1.3, 1.35))) == 3
    assert held(words(*said, (1.3, 1.3), (1.3, 1.3), (1.3, 1.6), (1.6, 2.0))) == 3  # a run inside the text
    assert held(words(*said, (1.3, 1.3))) == 4  # one word squeezed at the end of the audio (2 of 3)
    assert held(words(*said, (1.3, 1.4), (1.4, 1.5), (1.5, 1.6), (1.6, 1.7))) == 7  # quick words (4 x 0.5)
    assert held(words(*said, probability=0.1)) == 3  # unlikely words that the audio holds
    assert held(words(*said, (1.3, 1.4), (1.4, 1.5), (1.5, 1.6), probability=0.1)) == 3  # 3 x (0.5 + 1)
    assert held(words((0.0, 0.0), (0.0, 0.0))) == 0
    assert held([]) == 0


@pytest.mark.parametrize("compute_type", ["float32", "bfloat16"])
def test_windows_aligned_together_get_the_words_each_gets_alone(tiny_dir, compute_type):
    """``align_many`` reads several windows' text in one pass (rows padded, each attending to its own encoder
    positions, the decode's cross-attention keys and values reused): the same words and times as ``align`` on each
    alone; ``scored=1`` skips the output layer for the first segment (its words get probability 0) and leaves
    the later segments' words as they were. Memories of two lengths, one of them in two rows apart (the exact
    decoder attends each length's rows together), at float32 and bfloat16."""
    import torch

    from asr_spec.alignment import Alignment, align, align_many
    from asr_spec.models.kv_decoder import CrossKV
    from asr_spec.models.loader import load_target

    tiny_target = load_target(str(tiny_dir), compute_type=compute_type)
    dim = tiny_target.config.d_model
    memories = [torch.randn(1, n, dim, generator=torch.Generator().manual_seed(s)) for n, s in ((20, 1), (14, 2), (20, 3))]
    enc = tiny_target.tokenizer.encode
    segments = [[enc(" and so my"), enc(" fellow Americans")], [enc(" ask not"), enc(" what your country can")],
                [enc(" ask what"), enc(" you can do")]]
    alone = [align(tiny_target, m, 2 * m.shape[1], "en", "transcribe", s) for m, s in zip(memories, segments)]
    together = align_many(tiny_target, [Alignment(m, 2 * m.shape[1], "en", "transcribe", s)
                                        for m, s in zip(memories, segments)])
    cross = [tiny_target.decoder.new_cache(m, 1) for m in memories]
    scored = align_many(tiny_target, [Alignment(m, 2 * m.shape[1], "en", "transcribe", s, CrossKV(c.cross_k, c.cross_v), 1)
                                      for m, s, c in zip(memories, segments, cross)])
    as_tuples = lambda ws: [(w.word, w.start, w.end, w.tokens) for w in ws]  # noqa: E731
    for a, b, c in zip(alone, together, scored):
        assert [as_tuples(x) for x in a] == [as_tuples(x) for x in b] == [as_tuples(x) for x in c]
        assert [w.probability for w in b[1]] == pytest.approx([w.probability for w in a[1]], abs=1e-5)
        assert [w.probability for w in c[1]] == pytest.approx([w.probability for w in a[1]], abs=1e-5)
        assert all(w.probability == 0.0 for w in c[0])


@pytest.mark.parametrize("compute_type", ["float32", "bfloat16"])
def test_windows_padded_to_a_width_get_their_words_whatever_their_company(tiny_dir, compute_type):
    """With ``width`` (a static decode's padded memories: every row attends the whole width under its mask, one call
    a layer) a window's words and times are the same alone and beside others of other lengths, bit for bit; and
    its words the same as those of the unpadded pass (times may move by a frame where two paths nearly tie: not on
    these)."""
    import torch

    from asr_spec.alignment import Alignment, align_many
    from asr_spec.models.loader import load_target

    tiny_target = load_target(str(tiny_dir), compute_type=compute_type)
    dim = tiny_target.config.d_model
    memories = [torch.randn(1, n, dim, generator=torch.Generator().manual_seed(s)) for n, s in ((20, 1), (14, 2), (9, 3))]
    enc = tiny_target.tokenizer.encode
    segments = [[enc(" and so my"), enc(" fellow Americans")], [enc(" ask not"), enc(" what your country can")],
                [enc(" ask what"), enc(" you can do")]]
    windows = [Alignment(m, 2 * m.shape[1], "en", "transcribe", s, scored=1) for m, s in zip(memories, segments)]
    together = align_many(tiny_target, windows, width=24)
    alone = [align_many(tiny_target, [w], width=24)[0] for w in windows]
    unpadded = [align_many(tiny_target, [w])[0] for w in windows]
    as_tuples = lambda ws: [(w.word, w.start, w.end, w.tokens, w.probability) for w in ws]  # noqa: E731
    for a, b, c in zip(alone, together, unpadded):
        assert [as_tuples(x) for x in a] == [as_tuples(x) for x in b]
        assert [[w.word for w in x] for x in a] == [[w.word for w in x] for x in c]
        assert [[(w.start, w.end) for w in x] for x in a] == [[(w.start, w.end) for w in x] for x in c]


def test_a_decode_records_the_cross_attention_of_every_token_it_chose(tiny_target):
    """With ``attention_heads`` a decode keeps, for each token it chose (its prefix's included), the heads' scores
    of the query that chose it: the same scores one pass over the whole text gives; and the target's
    log-probability of each token after the prefix. Words timed from them cover the continuation's text."""
    import torch

    from asr_spec.alignment import decoded_words
    from asr_spec.recognizer import Recognizer

    rec, dec = Recognizer(tiny_target), tiny_target.decoder
    memory = torch.randn(1, 40, tiny_target.config.d_model, generator=torch.Generator().manual_seed(0))
    prefix = tiny_target.tokenizer.encode(" and so")
    request = replace(rec.prompt([], "en", "transcribe", timestamps=False), prefix=prefix, sample_len=12)
    heads = ((0, 1), (1, 0))
    result = rec.decode(Pair(memory), [request], timestamps=False, attention_heads=heads)[0]
    cont = result.tokens[len(prefix):]
    assert cont and len(result.logprobs) == len(cont)
    seq = request.prompt + result.tokens
    scores: dict = {0: [1], 1: [0]}
    dec(dec.new_cache(memory, len(seq)), torch.tensor([seq]), torch.arange(len(seq))[None], cross_scores=scores)
    start = len(request.prompt) - 1
    whole = torch.stack([scores[layer][0, 0, start:start + len(result.tokens)] for layer, _ in heads])
    assert result.attention.shape[:2] == (2, len(result.tokens) + (len(cont) < 12 - len(prefix)))
    torch.testing.assert_close(result.attention[:, :len(result.tokens)], whole, atol=1e-4, rtol=1e-4)
    words = decoded_words(tiny_target, result.attention, result.tokens, len(prefix), 80, "en", result.logprobs)
    assert "".join(w.word for w in words).strip() == tiny_target.tokenizer.decode(cont).strip()
    assert all(0 <= w.start <= w.end <= 0.8 for w in words) and all(0 < w.probability <= 1 for w in words)
