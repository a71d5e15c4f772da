"""Beam search (asr_spec/decoding/beam.py): openai-whisper's decisions, a window's result independent of its batch,
and the speculative search token for token the plain one's, at every draft length."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import DEV, fast_first

from asr_spec.decoding.beam import BeamOptions, beam_search
from asr_spec.decoding.logits import LogitRules
from asr_spec.models.loader import load_draft
from asr_spec.recognizer import Checks, Recognizer
from asr_spec.transcribe import TranscribeOptions, Transcriber


def windows(target, n: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return target.encode(torch.randn(n, target.n_mels, 3000, generator=g))


def search(target, memory, prompts, beam: BeamOptions, draft=None, k: int = 0, lengths=None):
    rec = Recognizer(target)
    v = target.vocab
    requests = [rec.prompt(p, "en", "transcribe", True) for p in prompts]
    return beam_search(target.decoder, memory, requests, LogitRules.whisper(v, True), v.eot, v.no_speech, beam,
                       lengths, draft.decoder if draft else None, k)


PROMPTS = [[], [1000, 2000], [], [50, 60, 70]]


@pytest.mark.slow  # tiny models, but over a second: the whole suite runs it, the fast loop the quicker checks
@pytest.mark.parametrize("size", [2, 3, 5])
def test_a_windows_search_is_the_same_alone_and_in_a_batch(short_target, size):
    memory = windows(short_target, 4)
    together = search(short_target, memory, PROMPTS, BeamOptions(size))
    for i, prompt in enumerate(PROMPTS):
        (alone,) = search(short_target, memory[i:i + 1], [prompt], BeamOptions(size))
        assert (alone.tokens, alone.sum_logprob) == (together[i].tokens, together[i].sum_logprob)


@pytest.mark.parametrize("k", fast_first([3, 1, 2, 5]))
def test_the_speculative_search_is_the_plain_one_token_for_token(short_target, k):
    draft = load_draft("layers:0", short_target)
    memory = windows(short_target, 4, seed=1)
    plain = search(short_target, memory, PROMPTS, BeamOptions(3))
    spec = search(short_target, memory, PROMPTS, BeamOptions(3), draft, k)
    assert [(r.tokens, r.sum_logprob, r.no_speech_prob) for r in spec] == \
        [(r.tokens, r.sum_logprob, r.no_speech_prob) for r in plain]


def test_a_draft_that_is_the_target_saves_passes_and_changes_nothing(short_target):
    """The target as its own draft: every beam that continues by its most likely token stays on the drafted path,
    so a pass takes several steps (fewer passes), the result the same."""
    draft = load_draft("layers:0,1", short_target)  # all of the tiny target's layers: the target itself
    memory = windows(short_target, 2, seed=2)
    plain = search(short_target, memory, PROMPTS[:2], BeamOptions(2))
    spec = search(short_target, memory, PROMPTS[:2], BeamOptions(2), draft, 4)
    assert [r.tokens for r in spec] == [r.tokens for r in plain]
    assert sum(r.stats.target_passes for r in spec) < sum(r.stats.target_passes for r in plain)


def test_patience_and_length_penalty_as_openai_whisper_defines_them():
    o = BeamOptions(5, patience=2.0, length_penalty=0.5)
    assert o.candidates == 10
    assert o.score(-6.0, 7) == pytest.approx(-6.0 / ((5 + 7) / 6) ** 0.5)
    assert BeamOptions(5).score(-6.0, 3) == -2.0  # no penalty given: the sum over the length
    with pytest.raises(ValueError):
        BeamOptions(1)


@pytest.mark.slow  # tiny models, but over a second: the whole suite runs it, the fast loop the quicker checks
def test_the_window_loop_runs_beam_searches(short_target):
    """``TranscribeOptions.beam``: every window of a file by beam search, the text the same with and without the
    draft."""
    tr = Transcriber(short_target, load_draft("layers:0", short_target))
    audio = np.random.default_rng(0).standard_normal(16000 * 40).astype(np.float32) * 0.1
    o = TranscribeOptions(language="en", beam=BeamOptions(3), checks=Checks((0.0,)))
    plain, spec = tr.transcribe(audio, o, use_draft=False), tr.transcribe(audio, o, use_draft=True)
    assert [s.tokens for s in plain.segments] == [s.tokens for s in spec.segments]
    assert plain.stats.windows >= 2


@pytest.mark.slow
def test_beam_five_is_openai_whispers_beam_search(base_transcriber):
    """float32, no fallback, ``--window-padding mel``: ``transcribe --beam-size 5`` gives the text of
    ``whisper.transcribe(beam_size=5, temperature=0)`` on the same weights (eval/whisper_parity.py --beam 5: the dev
    set), and speculatively the same tokens."""
    import whisper

    from asr_spec.audio import load_audio
    from asr_spec.decoding.beam import BeamOptions as Beam
    from asr_spec.evaluation.systems import openai_whisper_model
    from asr_spec.features import WindowPadding

    model = openai_whisper_model("whisper-base")
    o = TranscribeOptions(language="en", checks=Checks((0.0,)), window_padding=WindowPadding.MEL, beam=Beam(5))
    for clip in ("jfk-inaugural-1961-ask-not.wav", "LJ001-0031.wav", "1688-142285-0000.wav"):
        audio = load_audio(DEV / clip)
        plain = base_transcriber.transcribe(audio, o, use_draft=False)
        spec = base_transcriber.transcribe(audio, o, use_draft=True)
        theirs = whisper.transcribe(model, audio, language="en", temperature=0.0, beam_size=5, fp16=False)["text"]
        assert plain.text == theirs.strip(), clip
        assert [s.tokens for s in spec.segments] == [s.tokens for s in plain.segments], clip
