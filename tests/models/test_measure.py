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
    seconds = {1: {"target": 1.0, "spec": 0.5}, 8: {"target": 1.0, "spec": 1.5},
               measure.BEAM: {"target": 1.0, "spec": 0.9}}
    monkeypatch.setattr(measure, "measure_widths", lambda *a, **k: seconds)
    widths = measure.measured_widths(options, short_target, draft)
    assert widths.pays == {1: True, 8: False} and widths.source == "measured"
    assert not widths.beam  # beam searches draft on CUDA only: a CPU measures none
    assert options.draft_widths("float32") == widths
    assert options.draft_widths("bfloat16").source == "guessed"  # another type: not measured
    assert replace(options, speculation="on").draft_widths("float32") is ALWAYS
    (kept,) = (tmp_path / "draft-widths").glob("*.json")
    assert json.loads(kept.read_text())["seconds"]["8"]["spec"] == 1.5


@pytest.mark.slow  # tiny models, but over a second: the whole suite runs it, the fast loop the quicker checks
def test_the_measurement_decodes_the_sample_at_each_width(short_target):
    """Really measured: the bundled sample's window decoded target-only and speculatively at each width, and as a
    beam search."""
    seconds = measure.measure_widths(short_target, load_draft("layers:0", short_target), (1, 2, measure.BEAM),
                                     rounds=1)
    assert set(seconds) == {1, 2, measure.BEAM} and all(s["target"] > 0 and s["spec"] > 0 for s in seconds.values())


def test_a_process_that_must_not_wait_guesses_and_measures_in_the_background(tiny_dir, tmp_path, monkeypatch,
                                                                             capsys):
    """Nothing measured here: the guesses now (auto's type, the widths), and one background measurement started at
    the lowest priority in this session (its own process group); none while one holds the cache's measurement lock,
    none under ASR_SPEC_MEASURE=off."""
    import subprocess
    import sys

    monkeypatch.setenv("ASR_SPEC_CACHE", str(tmp_path))
    monkeypatch.setenv("ASR_SPEC_MEASURE", "on")
    monkeypatch.setattr(measure, "_BACKGROUND", [])
    started = []
    real_popen = subprocess.Popen
    sleeper = real_popen([sys.executable, "-c", "import time; time.sleep(60)"])

    class Child:
        pid = sleeper.pid

        def __init__(self, argv, **kw):
            started.append((argv, kw))

        def poll(self):
            return None

    monkeypatch.setattr(measure.subprocess, "Popen", Child)
    options = ModelOptions(str(tiny_dir), "layers:0", "cpu", "auto", measure_now=False)
    target, draft = load(options)
    assert target.precision.guessed and target.precision.name == guessed_type("cpu")
    assert "not measured here yet" in target.name and draft.widths.source == "guessed"
    assert measure.settle(options, target, draft) is draft and not started  # a batch command: no background process
    assert measure.settle(options, target, draft, background=True) is draft  # a server
    (argv, kw), = started
    assert argv[1:3] == ["-m", "asr_spec.measure"] and "--compute-type" in argv
    assert kw["process_group"] == 0 and "start_new_session" not in kw  # nice 19 counts against this session's threads
    assert "in the background" in capsys.readouterr().err
    holder = real_popen([sys.executable, "-c", "import fcntl, sys, time; f = open(sys.argv[1], 'a'); "
                               "fcntl.flock(f, fcntl.LOCK_EX); print('held', flush=True); time.sleep(60)",
                               str(tmp_path / measure.LOCK)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "held\n"
        measure.settle(options, target, draft, background=True)  # one is measuring this cache: not another
        assert len(started) == 1
    finally:
        holder.kill()
        holder.wait(10)
    monkeypatch.setenv("ASR_SPEC_MEASURE", "off")
    measure.settle(options, target, draft, background=True)
    assert len(started) == 1
    monkeypatch.setenv("ASR_SPEC_MEASURE", "on")
    measure.settle(options, target, draft, background=True)  # the holder is gone: its lock with it
    assert len(started) == 2
    measure.hold(True)  # what a server does while it has work: the child is stopped ...
    assert process_state(sleeper.pid, "T")
    measure.hold(False)  # ... and continued once the server is idle
    assert process_state(sleeper.pid, "S")
    sleeper.kill()
    sleeper.wait(10)


def process_state(pid: int, state: str, within_s: float = 10.0) -> bool:
    """Whether process ``pid`` reaches ``state`` (/proc's letter: T stopped, S sleeping, R running) in time."""
    import time

    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if state_of(pid) == state:
            return True
        time.sleep(0.01)
    return False


def state_of(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return None  # gone


@pytest.mark.slow
def test_a_stopped_measurement_is_continued_when_its_server_dies_and_keeps_its_findings(tmp_path):
    """A server stops its background measurement while it works (``hold``); killed meanwhile, the kernel continues the
    measurement (its parent-death signal), which finishes and keeps where the draft pays."""
    import subprocess
    import sys
    import time

    from benchkit.tiny import save_tiny

    tiny_dir = save_tiny(tmp_path / "short", seed=0, max_target_positions=32)
    cache = tmp_path / "cache"
    env = {**os.environ, "ASR_SPEC_CACHE": str(cache), "ASR_SPEC_MEASURE": "on"}
    server = subprocess.Popen([sys.executable, "-c", f"""
import sys, time
from asr_spec import measure
from asr_spec.models.loader import ModelOptions
assert measure.measure_later(ModelOptions({str(tiny_dir)!r}, "layers:0", "cpu", "float32", threads=1))
print(measure._BACKGROUND[0].pid, flush=True)
time.sleep(1.0)
measure.hold(True)
print("held", flush=True)
time.sleep(120)
"""], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        child = int(server.stdout.readline())
        assert server.stdout.readline() == "held\n", server.stderr.read()[-2000:]
        assert process_state(child, "T"), "hold(True) did not stop the measurement"
        time.sleep(1.0)
        assert state_of(child) == "T", "the measurement ran on while held"
    finally:
        server.kill()
        server.wait(10)
    deadline = time.monotonic() + 300
    while state_of(child) not in (None, "Z") and time.monotonic() < deadline:
        assert state_of(child) != "T" or time.monotonic() < deadline - 295, "still stopped after its server died"
        time.sleep(0.2)
    log = (cache / "measuring.log").read_text()
    kept = list((cache / "draft-widths").glob("*.json"))
    assert kept, f"the continued measurement kept nothing; its log: {log[-2000:]}"
    assert json.loads(kept[0].read_text())["pays"], log[-2000:]


@pytest.mark.slow
def test_the_background_measurement_keeps_what_later_processes_load(tmp_path, monkeypatch):
    """``python -m asr_spec.measure --background`` (what a server starts) measures where the draft pays while the
    machine is quiet; a later load uses it, measured. (auto's type: tests/decoding/test_compute.py.)"""
    import subprocess
    import sys

    from benchkit.tiny import save_tiny

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
