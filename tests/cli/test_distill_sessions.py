"""Distillation recordings: consecutive clips of one folder joined as ``transcribe`` meets long audio."""
from __future__ import annotations

import numpy as np
import soundfile as sf

from asr_spec.distill.data import sessions


def test_clips_of_a_folder_are_joined_in_order_up_to_the_length(tmp_path):
    rate = 16000
    (tmp_path / "en").mkdir()
    (tmp_path / "de").mkdir()
    for name, seconds in [("en/a", 4), ("en/b", 5), ("en/c", 6), ("en/d", 3), ("de/a", 2)]:
        sf.write(tmp_path / f"{name}.wav", np.full(seconds * rate, seconds / 10, np.float32), rate)
    (tmp_path / "en" / "bb.wav").write_bytes(b"not audio")  # skipped, not fatal
    files = sorted(tmp_path.glob("en/*.wav")) + sorted(tmp_path.glob("de/*.wav"))
    got = sessions(files, seconds=10.5)
    lengths = [round(len(a) / rate, 2) for _, a in got]
    assert lengths == [10.0, 10.0, 2.5]  # 4 + 0.5 + 5 + 0.5 | 6 + 0.5 + 3 + 0.5 | the next folder
    first = got[0][1]
    assert abs(first[0] - 0.4) < 1e-3 and abs(first[4 * rate + rate // 2] - 0.5) < 1e-3  # in order, 0.5 s apart
    assert not first[4 * rate:4 * rate + rate // 2].any()


def test_the_shortlist_holds_every_token_the_target_said_before_corpus_tokens(tmp_path, tiny_target):
    """The draft's head is chosen from the target's own labels first (a label outside it is a sure miss), then
    filled with the text corpus's most frequent tokens; end-of-text and every timestamp are always in it."""
    import torch

    from asr_spec.distill.data import Example
    from asr_spec.distill.shortlist import choose_shortlist

    v = tiny_target.vocab
    said = tiny_target.tokenizer.encode(" zygote quixotic")  # rare in the corpus below
    ex = Example("a", "real", torch.zeros(1, 1), [v.sot], said + [v.eot], torch.zeros(1, 1), torch.zeros(1, 1))
    text = tmp_path / "text.txt"
    text.write_text("the cat sat on the mat\n" * 50 + "a dog ran far away\n" * 10)
    corpus = tiny_target.tokenizer.encode(" the cat sat on the mat")
    ids = set(choose_shortlist(tiny_target, [ex], (text,), len(set(said)) + 3))
    assert set(said) <= ids  # everything the target said, although the corpus never says it
    assert len([t for t in ids if t < v.eot]) == len(set(said)) + 3  # then the corpus's most frequent
    assert len(set(corpus) & ids) == 3 and not set(tiny_target.tokenizer.encode(" dog ran far away")) & ids
    assert v.eot in ids and set(range(v.timestamp_begin, v.size)) <= ids


def test_a_restricted_output_layer_keeps_the_trained_rows_of_the_tokens_kept():
    import pytest
    import torch

    from asr_spec.distill.shortlist import restricted

    head_ids, head = [3, 7, 9, 12], torch.arange(8.0).reshape(4, 2)
    ids, rows = restricted(head_ids, head, [12, 7])
    assert ids == [7, 12] and torch.equal(rows, torch.tensor([[2.0, 3.0], [6.0, 7.0]]))
    with pytest.raises(ValueError, match="not in the draft's shortlist"):
        restricted(head_ids, head, [7, 8])
