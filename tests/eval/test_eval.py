"""``asr_spec eval``: a real 3-clip smoke run, and the scoring checked against hand-computed values."""
from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import DEV

from asr_spec.evaluation.metrics import acceptance_by_position, speedups, summarize
from asr_spec.evaluation.run import fold


def _run(texts: dict[str, str], kind: str = "hf", walls: dict[str, list[float]] | None = None) -> dict:
    items = {i: {"text": t, "audio_seconds": 10.0, "wall_s": (walls or {}).get(i, [1.0]), "encoder_s": [],
                 "decode_s": [], "text_tokens": len(t.split())} for i, t in texts.items()}
    return {"system": {"kind": kind, "k": 0}, "items": items, "peak_rss_mb": 100.0}


def test_wer_and_identical_count_on_a_fake_system():
    refs = {"a": "The cat sat on the mat.", "b": "Twenty five dogs", "c": "hello world"}
    target = {"a": "the cat sat on the mat", "b": "twenty-five dogs", "c": "hello world"}
    fake = {"a": "the cat sat on a mat", "b": "Twenty five dogs", "c": "hello word world"}
    # normalised: a: 1 substitution of 6 words; b: "twenty five dogs" exact (normaliser joins numbers as 25
    # on both sides); c: 1 insertion... hello word world vs hello world = 1 insertion over 2 words
    s = summarize(_run(fake, walls={"a": [3.0, 1.0, 2.0]}), refs, target)
    ref_words = 6 + len("25 dogs".split()) + 2
    assert s["wer"] == pytest.approx(round(100 * 2 / ref_words, 2))
    assert s["identical_to_target"] == 0  # no text is byte-identical to the target's
    assert summarize(_run(target), refs, target)["identical_to_target"] == 3
    assert s["wall_s"] == pytest.approx(2.0 + 1.0 + 1.0)  # median of the repeats, summed
    assert s["rtf"] == pytest.approx(4.0 / 30.0, abs=1e-4)


def test_acceptance_by_position_and_speedups():
    # passes accepting 0, 2, 4, 4 drafts (K = 4): position 1 reached 4 times, accepted 3 times, ...
    assert acceptance_by_position([0, 2, 4, 4], 4) == [3 / 4, 3 / 3, 2 / 3, 2 / 2]
    sp = speedups({"target": {"wall_s": 10.0}, "x": {"wall_s": 4.0}, "y": {"wall_s": None}}, "target", "wall_s")
    assert sp == {"target": 1.0, "x": 2.5, "y": None}



def test_rounds_fold_into_one_run_per_system():
    """``--repeat`` rounds: each round's timings are appended per utterance, so the medians span every round."""
    first = _run({"a": "x", "b": "y"}, walls={"a": [3.0], "b": [1.0]}) | {"run_wall_s": [4.0]}
    second = _run({"a": "x", "b": "y"}, walls={"a": [1.0], "b": [5.0]}) | {"run_wall_s": [6.0], "peak_rss_mb": 150.0}
    third = _run({"a": "x", "b": "z"}, walls={"a": [2.0], "b": [2.0]}) | {"run_wall_s": [4.0]}
    run = fold(fold(fold(None, first), second), third)
    assert run["items"]["a"]["wall_s"] == [3.0, 1.0, 2.0] and run["items"]["b"]["wall_s"] == [1.0, 5.0, 2.0]
    assert run["run_wall_s"] == [4.0, 6.0, 4.0] and run["peak_rss_mb"] == 150.0
    assert run["items"]["b"]["text"] == "z"  # the last round's
    assert summarize(run, {"a": "x", "b": "y"}, None)["wall_s"] == pytest.approx(2.0 + 2.0)

@pytest.mark.slow
def test_three_clip_smoke_run_writes_the_report(tmp_path):
    rows = [json.loads(x) for x in (DEV / "manifest.jsonl").read_text().splitlines()[:3]]
    manifest = tmp_path / "m.jsonl"
    manifest.write_text("\n".join(json.dumps({"id": r["id"], "audio": str(DEV / r["audio"]), "text": r["text"]})
                                  for r in rows))
    out = tmp_path / "out"
    r = subprocess.run([sys.executable, "-m", "asr_spec", "eval", "--manifest", str(manifest), "--out", str(out),
                        "--systems", "target,spec",
                        "--k", "2", "--draft", "layers:0,1,2,3,5"], capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr
    res = json.loads((out / "results.json").read_text())
    assert set(res["systems"]) == {"target", "spec-k2-stop0.3"}  # K=2 with the default draft stop
    spec = res["systems"]["spec-k2-stop0.3"]
    assert spec["identical_to_target"] == 3 and spec["utterances"] == 3
    assert spec["wer"] == res["systems"]["target"]["wer"]
    assert 0 < spec["acceptance"] <= 1 and spec["tokens_per_pass"] > 1
    for key in ("machine", "threads", "date", "command", "git_commit", "torch"):
        assert key in res["environment"]
    md = (out / "report.md").read_text()
    assert "| spec-k2-stop0.3 |" in md and "identical to target" in md
    for png in ("speedup_vs_k.png", "acceptance_by_position.png", "time_split.png"):
        assert (out / png).read_bytes()[:4] == b"\x89PNG"


def test_a_missing_peer_is_reported_as_skipped(monkeypatch):
    import importlib.util

    from asr_spec.evaluation import systems

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "faster_whisper" else real(name, *a))
    specs = systems.expand(["target", "faster-whisper"], [4], 0.5, 1)
    assert [s.name for s in specs] == ["target", "faster-whisper-int8", "faster-whisper-float32"]
    assert systems.missing(specs[0]) is None
    assert "faster-whisper is not installed" in systems.missing(specs[1])


def test_each_batch_size_is_a_run_of_its_own():
    from asr_spec.evaluation import systems

    specs = systems.expand(["target", "spec-chunked", "hf", "faster-whisper-batched"], [3], 0.5, 1, [0.3], [1, 8])
    assert [(s.name, s.batch_size) for s in specs] == [
        ("target", 1), ("target-b8", 8), ("spec-chunked-k3-stop0.3", 1), ("spec-chunked-k3-stop0.3-b8", 8), ("hf", 1),
        ("faster-whisper-batched-int8", 1), ("faster-whisper-batched-int8-b8", 8),
        ("faster-whisper-batched-float32", 1), ("faster-whisper-batched-float32-b8", 8)]
    assert all(s.chunked == s.name.startswith("spec-chunked") for s in specs)
    # compared with target-only at the same batch size; target-only's batched run with its own at batch 1
    assert {s.name: s.baseline for s in specs if s.kind in systems.OURS} == {
        "target": "target", "target-b8": "target", "spec-chunked-k3-stop0.3": "target",
        "spec-chunked-k3-stop0.3-b8": "target-b8"}


def test_a_faster_whisper_compute_type_can_be_named_alone():
    from asr_spec.evaluation import systems

    specs = systems.expand(["faster-whisper-int8", "faster-whisper-batched-float32"], [3], 0.5, 1, [0.3], [8])
    assert [(s.name, s.kind, s.compute_type) for s in specs] == [
        ("faster-whisper-int8", "faster-whisper", "int8"),
        ("faster-whisper-batched-float32-b8", "faster-whisper-batched", "float32")]
    with pytest.raises(ValueError, match="unknown system"):
        systems.expand(["faster-whisper-int4"], [3], 0.5, 1)


def test_peers_beam_search_and_whisper_cpp_are_named_as_users_run_them():
    """faster-whisper and whisper.cpp at their default beam search (-beam5) beside greedy, as `eval --help` names them;
    whisper.cpp skipped with the install command where pywhispercpp is absent."""
    from asr_spec.evaluation import systems

    specs = systems.expand(["faster-whisper-int8-beam5", "whisper.cpp", "whisper.cpp-beam5", "faster-whisper-beam5"],
                           [3], 0.5, 1)
    assert [(s.name, s.kind, s.beam) for s in specs] == [
        ("faster-whisper-int8-beam5", "faster-whisper", 5), ("whisper.cpp", "whisper.cpp", 1),
        ("whisper.cpp-beam5", "whisper.cpp", 5), ("faster-whisper-int8-beam5", "faster-whisper", 5),
        ("faster-whisper-float32-beam5", "faster-whisper", 5)]
    ours = systems.expand(["target-beam5", "spec-beam5"], [3], 0.5, 1, [0.3])
    assert [(s.name, s.beam, s.baseline) for s in ours] == [("target-beam5", 5, "target-beam5"),
                                                           ("spec-k3-stop0.3-beam5", 5, "target-beam5")]
    with pytest.raises(ValueError, match="-beamN"):
        systems.expand(["draft-beam5"], [3], 0.5, 1)
    assert systems.missing(specs[1]) is None  # pywhispercpp is a test dependency


def test_the_ggml_names_are_openai_whispers():
    from asr_spec.evaluation.ggml import openai_name

    assert openai_name("model.encoder.layers.3.self_attn.k_proj.weight") == "encoder.blocks.3.attn.key.weight"
    assert openai_name("model.decoder.layers.0.encoder_attn.v_proj.bias") == "decoder.blocks.0.cross_attn.value.bias"
    assert openai_name("model.decoder.layers.5.fc2.weight") == "decoder.blocks.5.mlp.2.weight"
    assert openai_name("model.encoder.embed_positions.weight") == "encoder.positional_embedding"
    assert openai_name("model.decoder.embed_tokens.weight") == "decoder.token_embedding.weight"
    assert openai_name("model.encoder.layer_norm.bias") == "encoder.ln_post.bias"
    assert openai_name("model.encoder.conv1.weight") == "encoder.conv1.weight"
    assert openai_name("proj_out.weight") is None


@pytest.mark.slow
def test_whisper_cpp_reads_the_ggml_file_written_from_the_embedded_model(base_model, tmp_path):
    """The whisper.cpp peer runs the same weights: the embedded whisper-base written as a ggml file (ggml.py) loads in
    whisper.cpp (pywhispercpp's bundled library) and gives the sample's sentence, greedy and at beam 5."""
    from pywhispercpp.model import Model

    from asr_spec.audio import SAMPLE, load_audio
    from asr_spec.evaluation.ggml import write_ggml
    from asr_spec.models.sources import embedded_dir

    path = tmp_path / "ggml-model.bin"
    write_ggml(embedded_dir(), path)
    audio = load_audio(SAMPLE)
    for beams in ({}, {"params_sampling_strategy": 1, "beam_search": {"beam_size": 5, "patience": -1.0}}):
        model = Model(str(path), n_threads=2, language="en", print_progress=False, redirect_whispercpp_logs_to=None,
                      **beams)
        text = "".join(s.text for s in model.transcribe(audio)).strip()
        assert text == "And so my fellow Americans ask not what your country can do for you, ask what you can do " \
                       "for your country.", (beams, text)


@pytest.mark.slow  # two subprocesses, one importing torch
@pytest.mark.skipif(sys.platform != "linux", reason="the parent-death signal is Linux's prctl")
def test_a_killed_eval_takes_its_worker_along(tmp_path):
    """An ``asr_spec eval`` killed mid-round (SIGKILL: no cleanup runs) does not leave its worker running beside the
    next run. The worker's job is a FIFO, so it waits, past its start-up, until this test opens the other end."""
    job = tmp_path / "job.json"
    os.mkfifo(job)
    start = ("import subprocess, sys; w = subprocess.Popen([sys.executable, '-m', 'asr_spec.evaluation.worker', "
             "sys.argv[1], sys.argv[2]]); print(w.pid, flush=True); w.wait()")
    parent = subprocess.Popen([sys.executable, "-c", start, str(job), str(tmp_path / "out.json")],
                              stdout=subprocess.PIPE, text=True)
    fd = None
    try:
        worker = int(parent.stdout.readline())
        deadline = time.monotonic() + 120
        while fd is None:  # opening the FIFO to write succeeds once the worker opens it to read
            try:
                fd = os.open(job, os.O_WRONLY | os.O_NONBLOCK)
            except OSError as e:
                assert e.errno == errno.ENXIO and time.monotonic() < deadline and parent.poll() is None, \
                    f"the worker never read its job (parent status {parent.poll()})"
                time.sleep(0.05)
        parent.send_signal(signal.SIGKILL)
        parent.wait(timeout=30)
        deadline = time.monotonic() + 30
        while (state := _state(worker)) not in (None, "Z"):
            assert time.monotonic() < deadline, f"worker {worker} still running ({state}) 30 s after its eval died"
            time.sleep(0.05)
    finally:
        parent.kill()
        if fd is not None:
            os.close(fd)


def _state(pid: int) -> str | None:
    """A process's state letter (R, S, Z, ...), or None once it is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return None
