"""Voice detection (asr_spec/vad.py): Silero VAD's network run for many streams at once, each stream's
probabilities the same alone, in company and however its audio arrived, and the package's own model's."""
import json
from importlib.resources import files

import numpy as np
import pytest
import torch
from conftest import DEV

from asr_spec.audio import load_audio
from asr_spec.streaming import intake
from asr_spec.streaming.config import StreamConfig
from asr_spec.streaming.events import StreamStats
from asr_spec.vad import ROWS, VoiceActivity, probabilities


def dev_speech(n: int) -> list[np.ndarray]:
    items = [json.loads(line) for line in (DEV / "manifest.jsonl").read_text().splitlines()][:n]
    return [load_audio(DEV / it["audio"]) for it in items]


def test_the_probabilities_are_silero_vads_own():
    """The network's back written out as matrix products (an LSTM cell, a linear output) gives the probabilities of
    the package's model called chunk by chunk, as silero-vad's own wrapper runs it, to rounding."""
    model = torch.jit.load(str(files("silero_vad") / "data" / "silero_vad.jit"), map_location="cpu").eval()
    for audio in dev_speech(3):
        model.reset_states()
        with torch.inference_mode():
            theirs = [float(model(torch.from_numpy(audio[i:i + 512].copy())[None], 16000))
                      for i in range(0, len(audio) - 511, 512)]
        ours = probabilities([(VoiceActivity(), audio)])[0]
        assert len(ours) == len(theirs)
        assert np.abs(np.array(ours) - np.array(theirs)).max() < 1e-4
        assert sum(p >= 0.5 for p in ours) > len(ours) / 3  # speech is detected: the comparison is not of zeros


def test_a_streams_probabilities_do_not_depend_on_its_company_or_how_its_audio_arrived():
    """More streams than one call's rows, each sent in uneven pieces, some streams silent in some rounds: every
    stream's probabilities have the bits of the same audio detected alone in one piece."""
    audios = dev_speech(ROWS + 5)
    alone = [probabilities([(VoiceActivity(), a)])[0] for a in audios]
    vads, got, at = [VoiceActivity() for _ in audios], [[] for _ in audios], [0] * len(audios)
    rng = np.random.default_rng(0)
    while any(p < len(a) for p, a in zip(at, audios)):
        turn = [k for k, a in enumerate(audios) if at[k] < len(a) and rng.random() < 0.7]
        pieces = [audios[k][at[k]:at[k] + int(rng.integers(100, 20000))] for k in turn]
        for k, piece, probs in zip(turn, pieces, probabilities([(vads[k], p) for k, p in zip(turn, pieces)])):
            got[k] += probs
            at[k] += len(piece)
    assert got == alone


def test_the_engine_detects_every_streams_new_audio_in_one_call(monkeypatch):
    calls = []
    real = intake.detect
    monkeypatch.setattr(intake, "detect", lambda work: calls.append(len(work)) or real(work))
    config = StreamConfig()
    intakes = [intake.Intake(StreamStats(), True, config.vad_threshold, config.preroll_s) for _ in range(5)]
    for i, a in zip(intakes[:4], dev_speech(4)):  # the fifth received nothing
        i.feed(a[:8000])
    intake.listen([(i, False) for i in intakes])
    assert calls == [4]
    assert all(i.buffer_s > 0 for i in intakes[:4]) and intakes[4].buffer_s == 0


@pytest.mark.parametrize("pieces", [1, 7])
def test_a_lone_stream_in_pieces_flags_what_it_flags_in_one(pieces):
    audio = dev_speech(1)[0]
    whole = VoiceActivity()(audio)
    vad = VoiceActivity()
    flags = [f for part in np.array_split(audio, pieces) for f in vad(part)]
    assert flags == whole and vad.pending == len(audio) % VoiceActivity.CHUNK
