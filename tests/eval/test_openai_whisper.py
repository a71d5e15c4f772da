"""The text openai-whisper's own code gives on the same weights, in both window-padding modes: ``--window-padding
mel`` is ``whisper.transcribe()`` (the function its CLI runs), ``--window-padding audio`` is ``whisper.decode()`` on
``log_mel_spectrogram(pad_or_trim(audio))``. float32, greedy, no fallback, English, timestamps; a handful of dev
clips (eval/whisper_parity.py runs the whole dev set)."""
from __future__ import annotations

import numpy as np
import pytest
from conftest import DEV

from asr_spec.audio import load_audio
from asr_spec.features import WindowPadding
from asr_spec.recognizer import Checks
from asr_spec.transcribe import TranscribeOptions

# short and long clips, LibriSpeech and LJ Speech: ones where the two paddings give other texts among them
CLIPS = ["1688-142285-0000.wav", "LJ001-0031.wav", "LJ001-0012.wav", "jfk-inaugural-1961-ask-not.wav",
         "3331-159605-0008.wav"]


@pytest.fixture(scope="module")
def openai_model():
    from asr_spec.evaluation.systems import openai_whisper_model

    return openai_whisper_model("whisper-base")


@pytest.mark.slow
@pytest.mark.parametrize("padding", list(WindowPadding))
def test_each_padding_mode_gives_openai_whispers_text(base_transcriber, openai_model, padding):
    import whisper

    options = TranscribeOptions(language="en", checks=Checks((0.0,)), window_padding=padding)
    for clip in CLIPS:
        audio = load_audio(DEV / clip).astype(np.float32)
        ours = base_transcriber.transcribe(audio, options).text.strip()
        if padding is WindowPadding.MEL:
            theirs = whisper.transcribe(openai_model, audio, language="en", temperature=0.0, fp16=False)["text"]
        else:
            mel = whisper.log_mel_spectrogram(whisper.pad_or_trim(audio), openai_model.dims.n_mels)
            theirs = whisper.decode(openai_model, mel, whisper.DecodingOptions(language="en", temperature=0.0,
                                                                               fp16=False)).text
        assert ours == theirs.strip(), (clip, padding)


@pytest.mark.slow
def test_the_two_paddings_differ_where_a_window_is_short(base_transcriber):
    """The modes are not the same thing under two names: on these clips at least one text differs."""
    texts = {p: [base_transcriber.transcribe(load_audio(DEV / c), TranscribeOptions(
        language="en", checks=Checks((0.0,)), window_padding=p)).text for c in CLIPS] for p in WindowPadding}
    assert texts[WindowPadding.AUDIO] != texts[WindowPadding.MEL]
