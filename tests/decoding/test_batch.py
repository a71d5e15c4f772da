"""Files in flight together (``Transcriber.transcribe_many``): the same text as one file at a time, every file
reported once, a bad file reported without stopping the others."""
from __future__ import annotations

import json
from dataclasses import replace

import jiwer
import numpy as np
import pytest
import torch
from conftest import DEV

from asr_spec.audio import AudioError, load_audio
from asr_spec.decoding.costs import BatchCosts
from asr_spec.evaluation.metrics import normalize
from asr_spec.features import log_mel, window
from asr_spec.models.loader import default_draft, load_draft
from asr_spec.recognizer import Checks
from asr_spec.transcribe import TranscribeOptions, Transcriber
from asr_spec.vad import speech_chunks


def _noise(seconds: float, seed: int) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal(int(seconds * 16000)) * 0.1).astype(np.float32)


def _bad() -> np.ndarray:
    raise AudioError("broken.wav", "not audio")


@pytest.mark.slow  # tiny models, but over a second: the whole suite runs it, the fast loop the quicker checks
def test_a_batch_gives_each_file_its_own_text_and_reports_a_bad_one(short_target):
    tr = Transcriber(short_target, load_draft("layers:0,1", short_target))
    audios = {"short": _noise(2, 0), "two windows": _noise(34, 1), "empty": np.zeros(0, np.float32),
              "mid": _noise(6, 2)}
    items = [(name, lambda a=a: a) for name, a in audios.items()]
    items.insert(2, ("bad", _bad))
    o = TranscribeOptions(language="en", checks=Checks(temperatures=(0.0,)))
    alone = {name: tr.transcribe(a, o) for name, a in audios.items()}
    seen: dict[str, float] = {}
    got = list(tr.transcribe_many(items, o, batch_size=3, progress=lambda k, s: seen.__setitem__(k, s)))
    assert sorted(k for k, _ in got) == sorted(list(audios) + ["bad"])  # every file once, the bad one too
    out = dict(got)
    assert isinstance(out.pop("bad"), AudioError)
    for name, t in out.items():
        assert [s.tokens for s in t.segments] == [s.tokens for s in alone[name].segments], name
        assert t.text == alone[name].text
    assert alone["two windows"].stats.windows >= 2
    assert seen["two windows"] == pytest.approx(34, abs=0.05)


def test_the_cost_model_is_kept_per_batch_width():
    costs = BatchCosts()
    assert costs(1) is not costs(8)
    assert costs(8) is costs(9) is costs(15) and costs(16) is not costs(15)
    assert costs(2) is costs(3) and costs(0) is costs(1)


@pytest.mark.slow
def test_batch_8_gives_the_text_of_one_file_at_a_time_on_dev_speech(base_model):
    """Dev utterances decoded 8 at a time against one at a time (shipped draft, speculative greedy): the same text,
    every one (a row's numbers do not depend on its batch company; a divergence is printed with the target's logit
    gap between the two tokens at the first differing position, and fails)."""
    tr = Transcriber(base_model, load_draft(default_draft("whisper-base"), base_model))
    rows = [json.loads(line) for line in (DEV / "manifest.jsonl").read_text().splitlines()][:24]
    items = [(r["id"], lambda p=DEV / r["audio"]: load_audio(p)) for r in rows]
    o = TranscribeOptions(language="en")
    one = dict(tr.transcribe_many(items, o, batch_size=1))
    eight = dict(tr.transcribe_many(items, o, batch_size=8))
    assert set(one) == set(eight) == {r["id"] for r in rows}
    differ = [i for i in one if one[i].text != eight[i].text]
    for i in differ:
        a = [t for s in one[i].segments for t in s.tokens]
        b = [t for s in eight[i].segments for t in s.tokens]
        j = next(n for n in range(min(len(a), len(b)) + 1) if n == min(len(a), len(b)) or a[n] != b[n])
        audio = load_audio(DEV / next(r["audio"] for r in rows if r["id"] == i))
        memory = tr.encode(window(log_mel(audio, base_model.n_mels), 0)[None])
        prompt = tr.prompt([], "en", "transcribe", True).prompt + a[:j]
        dec = base_model.decoder
        with torch.inference_mode():
            logits = dec(dec.new_cache(memory.target, len(prompt)), torch.tensor([prompt]),
                         torch.arange(len(prompt))[None])[0, -1]
        ends = [x[j] if j < len(x) else base_model.vocab.eot for x in (a, b)]
        gap = float(logits[ends[0]] - logits[ends[1]])
        print(f"{i}: diverges at token {j}: {ends[0]} vs {ends[1]}, logit gap {gap:.2e}\n  1: {one[i].text}\n  8: {eight[i].text}")
        pytest.fail(f"{i}: batch 8 differs from batch 1 (logit gap {gap:.2e})")
    print(f"{len(rows) - len(differ)}/{len(rows)} identical")


def test_chunks_cover_the_speech_and_no_chunk_is_longer_than_30_s():
    jfk = load_audio(DEV / "jfk-inaugural-1961-ask-not.wav")
    gap = np.zeros(2 * 16000, np.float32)
    audio = np.concatenate([gap, jfk, gap, jfk, gap, jfk, gap])  # 41 s
    pieces, length = speech_chunks(audio)
    assert length == len(audio)
    assert 2 <= len(pieces) <= 3 and all(b - a <= 30 * 16000 for a, b in pieces)
    assert all(b1 <= a2 for (_, b1), (a2, _) in zip(pieces, pieces[1:]))
    inside = lambda t: any(a <= t * 16000 <= b for a, b in pieces)  # noqa: E731
    for start in (2.0, 15.0, 28.0):  # each clip's first and last words lie inside a piece (a cut falls in a pause)
        assert inside(start + 0.3) and inside(start + 10.5)
    assert not inside(1.0) and not inside(40.5)
    assert speech_chunks(np.zeros(10 * 16000, np.float32))[0] == []
    long, _ = speech_chunks(np.tile(jfk, 4))  # 44 s of speech with short pauses: cut in one of them
    assert len(long) == 2 and all(b - a <= 30 * 16000 for a, b in long) and long[0][0] < 0.3 * 16000


@pytest.mark.slow
def test_chunked_transcribes_every_piece_in_order(base_model):
    """Three dev utterances with pauses between them (33 s): chunked, their words come back in order (against
    each one transcribed alone) with segment times inside the file."""
    tr = Transcriber(base_model, load_draft(default_draft("whisper-base"), base_model))
    clips = [load_audio(f) for f in sorted(DEV.glob("LJ001-000*.wav"))[:3]]
    gap = np.zeros(2 * 16000, np.float32)
    audio = np.concatenate([gap] + [x for c in clips for x in (c, gap)])
    o = TranscribeOptions(language="en")
    alone = " ".join(tr.transcribe(c, o).text for c in clips)
    t = tr.transcribe(audio, replace(o, chunked=True))
    print(f"alone:   {alone}\nchunked: {t.text}")
    assert jiwer.wer(normalize(alone), normalize(t.text)) <= 0.1
    assert all(a.end <= b.start + 1e-6 for a, b in zip(t.segments, t.segments[1:]))  # in order, within the file
    assert t.segments[-1].end <= len(audio) / 16000 + 1e-6 and t.stats.audio_seconds == pytest.approx(len(audio) / 16000)
