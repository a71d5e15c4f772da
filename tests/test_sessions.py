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
