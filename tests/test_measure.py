"""What a machine is measured for once (asr_spec/measure.py): where drafting pays, by batch width; a process that
must not wait starts with the guesses and leaves the measurement to a background process at the lowest priority."""
from __future__ import annotations

import json
import os
from dataclasses import replace

import pytest
import torch

from asr_spec import measure
from asr_spec.models.auto import ALWAYS, DraftWidths, guessed_type, guessed_widths
from asr_spec.models.loader import ModelOptions, load, load_draft
from asr_spec.models.pair import Pair
from asr_spec.recognizer import Recognizer


def test_a_width_follows_the_measured_width_below_it():
    w = DraftWidths({1: True, 8: False, 16: True})
    assert [w(n) for n in (1, 2, 7, 8, 15, 16, 64)] == [True, True, True, False, False, True, True]
    assert "target alone at batch 8" in w.describe() and "measured here" in w.describe()
    assert "not measured" in guessed_widths("cpu").describe()
    assert guessed_widths("cpu")(8) and not guessed_widths("cuda")(8) and guessed_widths("cuda")(1)
    assert ALWAYS(1000) and guessed_type("cpu") in ("bfloat16", "int8_float32", "float32")


def test_where_drafting_does_not_pay_the_decode_is_target_only_with_the_same_tokens(short_target):
    """A width measured not to pay decodes without drafting (no draft step at all), and its tokens are those of
    the speculative decode: only the speed changes."""
    draft = load_draft("layers:0", short_target)
    memory = torch.randn(1, 40, short_target.config.d_model, generator=torch.Generator().manual_seed(0))
    rows = memory.expand(3, -1, -1).contiguous()
    request = Recognizer(short_target).prompt([], "en", "transcribe", timestamps=True)
    runs = {}
    for widths in (DraftWidths({1: True}), DraftWidths({1: True, 2: False})):
        rec = Recognizer(short_target, replace(draft, widths=widths))
        runs[widths(3)] = (rec.decode(Pair(rows, rows), [request] * 3), rec.decode(Pair(rows[:1], rows[:1]), [request]))
    (spec3, spec1), (target3, spec1_again) = runs[True], runs[False]
    assert [r.tokens for r in spec3] == [r.tokens for r in target3]
    assert sum(r.stats.drafted for r in spec3) > 0 and sum(r.stats.drafted for r in target3) == 0
    assert spec1_again[0].stats.drafted > 0  # batch 1 still drafts
    assert spec1[0].tokens == spec1_again[0].tokens


def test_measured_widths_are_kept_and_loaded(short_target, tmp_path, monkeypatch):
    monkeypatch.setenv("ASR_SPEC_CACHE", str(tmp_path))
    draft = load_draft("layers:0", short_target)
    options = ModelOptions("tiny", "layers:0", "cpu", "float32")
    seconds = {1: {"target": 1.0, "spec": 0.5}, 8: {"target": 1.0, "spec": 1.5}}
    monkeypatch.setattr(measure, "measure_widths", lambda *a, **k: seconds)
    widths = measure.measured_widths(options, short_target, draft)
    assert widths.pays == {1: True, 8: False} and widths.source == "measured"
    assert options.draft_widths("float32") == widths
    assert options.draft_widths("bfloat16").source == "guessed"  # another type: not measured
    assert replace(options, speculation="on").draft_widths("float32") is ALWAYS
    (kept,) = (tmp_path / "draft-widths").glob("*.json")
    assert json.loads(kept.read_text())["seconds"]["8"]["spec"] == 1.5


def test_the_measurement_decodes_the_sample_at_each_width(short_target):
    """Really measured: the bundled sample's window decoded target-only and speculatively at each width."""
    seconds = measure.measure_widths(short_target, load_draft("layers:0", short_target), (1, 2), rounds=1)
    assert set(seconds) == {1, 2} and all(s["target"] > 0 and s["spec"] > 0 for s in seconds.values())


def test_a_process_that_must_not_wait_guesses_and_measures_in_the_background(tiny_dir, tmp_path, monkeypatch,
                                                                             capsys):
    """Nothing measured here: the guesses now (auto's type, the widths), and one background measurement started at
    the lowest priority; none while one runs, none under ASR_SPEC_MEASURE=off."""
    import subprocess
    import sys

    monkeypatch.setenv("ASR_SPEC_CACHE", str(tmp_path))
    monkeypatch.setenv("ASR_SPEC_MEASURE", "on")
    started = []
    # what a running measurement looks like to the lock: a live process of that name
    running = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "asr_spec.measure"])

    class Child:
        pid = running.pid

        def __init__(self, argv, **kw):
            started.append((argv, kw))

    monkeypatch.setattr(measure.subprocess, "Popen", Child)
    options = ModelOptions(str(tiny_dir), "layers:0", "cpu", "auto", measure_now=False)
    target, draft = load(options)
    assert target.precision.guessed and target.precision.name == guessed_type("cpu")
    assert "not measured here yet" in target.name and draft.widths.source == "guessed"
    assert measure.settle(options, target, draft) is draft and not started  # a batch command: no background process
    assert measure.settle(options, target, draft, background=True) is draft  # a server
    (argv, kw), = started
    assert argv[1:3] == ["-m", "asr_spec.measure"] and "--compute-type" in argv and kw["start_new_session"]
    assert "in the background" in capsys.readouterr().err
    measure.settle(options, target, draft, background=True)  # the lock names a live process: not again
    monkeypatch.setenv("ASR_SPEC_MEASURE", "off")
    (tmp_path / measure.LOCK).unlink()
    measure.settle(options, target, draft, background=True)
    assert len(started) == 1
    (tmp_path / measure.LOCK).write_text(str(os.getpid()))  # a stale lock: its number is another process's
    monkeypatch.setenv("ASR_SPEC_MEASURE", "on")
    running.kill()
    running.wait(10)
    measure.settle(options, target, draft, background=True)
    assert len(started) == 2


@pytest.mark.slow
def test_the_background_measurement_keeps_what_later_processes_load(tmp_path, monkeypatch):
    """``python -m asr_spec.measure --background`` (what a server starts) measures where the draft pays while the
    machine is quiet; a later load uses it, measured. (auto's type: tests/test_compute.py.)"""
    import subprocess
    import sys

    from asr_spec.models.tiny import save_tiny

    tiny_dir = save_tiny(tmp_path / "short", seed=0, max_target_positions=32)  # its decodes end quickly
    env = {**os.environ, "ASR_SPEC_CACHE": str(tmp_path), "ASR_SPEC_MEASURE": "on"}
    done = subprocess.run([sys.executable, "-m", "asr_spec.measure", "--model", str(tiny_dir), "--draft", "layers:0",
                           "--compute-type", "float32", "--threads", "1", "--background",
                           "--patience", "5"], env=env, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    monkeypatch.setenv("ASR_SPEC_CACHE", str(tmp_path))
    _, draft = load(ModelOptions(str(tiny_dir), "layers:0", "cpu", "float32", threads=1, measure_now=False))
    assert draft.widths.source == "measured", done.stderr[-2000:]
