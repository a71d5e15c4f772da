"""The cache directory shared by any number of processes (asr_spec/models/cache.py): built once under a lock, whole
or not at all, verified at every load, rebuilt once when damaged, a full disk one clear error with nothing left."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from asr_spec.models import cache
from asr_spec.models.cache import MANIFEST, ModelError, built, problem

JFK = "ask not what your country can do for you, ask what you can do for your country"


def fill(folder: Path) -> None:
    (folder / "weights.bin").write_bytes(os.urandom(1 << 16))
    (folder / "config.json").write_text('{"a": 1}')


def test_a_built_folder_is_whole_and_every_kind_of_damage_is_named(tmp_path):
    out = built(tmp_path / "model", fill, "a test model")
    assert problem(out) is None and (out / MANIFEST).exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model", "model.lock"]  # no temporary folder
    weights = out / "weights.bin"
    with open(weights, "r+b") as f:  # bytes written inside, same size
        f.seek(100)
        f.write(b"\xff" * 64)
    assert "other bytes" in problem(out)
    weights.write_bytes(b"short")
    assert "truncated" in problem(out)
    weights.unlink()
    assert "missing" in problem(out)
    (out / MANIFEST).write_text('{"format": "asr_spec-cache/1", "files": null}')
    assert "unreadable" in problem(out)
    (out / MANIFEST).unlink()
    assert "no asr_spec_manifest.json" in problem(out)


def test_a_damaged_folder_is_built_again_once_saying_why(tmp_path, capsys):
    calls = []
    out = built(tmp_path / "model", lambda f: (calls.append(1), fill(f)), "a test model")
    (out / "config.json").unlink()
    assert built(out, lambda f: (calls.append(1), fill(f)), "a test model") == out
    assert "config.json is missing; building it again" in capsys.readouterr().err
    assert built(out, lambda f: (calls.append(1), fill(f)), "a test model") == out  # whole: not built again
    assert len(calls) == 2 and problem(out) is None
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model", "model.lock"]


def test_a_copied_folder_is_checked_whole_once_then_by_its_stamps(tmp_path, monkeypatch):
    out = built(tmp_path / "model", fill, "a test model")
    copy = tmp_path / "copy"
    copy.mkdir()
    for p in out.iterdir():
        (copy / p.name).write_bytes(p.read_bytes())  # other inodes and times: the digests decide
    read = []
    real = cache.sha256
    monkeypatch.setattr(cache, "sha256", lambda p: (read.append(p.name), real(p))[1])
    assert problem(copy) is None and sorted(read) == ["config.json", "weights.bin"]
    read.clear()
    assert problem(copy) is None and read == []  # stamped on the first check


def test_a_builder_that_fails_leaves_nothing_and_a_dead_builders_folder_is_removed(tmp_path):
    (tmp_path / "model.tmp999999").mkdir()  # what a builder killed with -9 leaves
    (tmp_path / "model.tmp999999" / "half").write_text("x")

    def broken(folder: Path) -> None:
        fill(folder)
        raise RuntimeError("the package is unreadable")

    with pytest.raises(RuntimeError):
        built(tmp_path / "model", broken, "a test model")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.lock"]


BUILDER = textwrap.dedent("""
    import os, sys, time
    from pathlib import Path
    from asr_spec.models.cache import built

    def build(folder):
        (Path(sys.argv[2]) / f"built-by-{os.getpid()}").write_text("")
        time.sleep(0.5)  # a conversion takes a while: the others arrive meanwhile
        (folder / "weights.bin").write_bytes(b"w" * 100000)

    print(built(Path(sys.argv[1]), build, "a test model"))
""")


def test_processes_starting_at_once_build_once_and_all_use_it(tmp_path):
    out, log = tmp_path / "cache" / "model", tmp_path / "log"
    log.mkdir()
    procs = [subprocess.Popen([sys.executable, "-c", BUILDER, str(out), str(log)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(4)]
    outputs = [p.communicate(timeout=120) for p in procs]
    assert all(p.returncode == 0 for p in procs), outputs
    assert all(o.strip() == str(out) for o, _ in outputs), outputs
    assert len(list(log.iterdir())) == 1, "built more than once"
    assert problem(out) is None and sorted(p.name for p in out.parent.iterdir()) == ["model", "model.lock"]


def test_a_full_disk_is_one_clear_error_with_nothing_left(tmp_path):
    """A file-size limit (what a full disk looks like to the writer: EFBIG as ENOSPC) while a folder is built."""
    script = textwrap.dedent("""
        import resource, signal, sys
        from pathlib import Path
        from asr_spec.models.cache import ModelError, built
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (10000, 10000))
        try:
            built(Path(sys.argv[1]), lambda f: (f / "weights.bin").write_bytes(b"w" * 100000), "a test model")
        except ModelError as e:
            print(e)
    """)
    done = subprocess.run([sys.executable, "-c", script, str(tmp_path / "model")], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0 and "no room to write a test model" in done.stdout, (done.stdout, done.stderr)
    assert "ASR_SPEC_CACHE" in done.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.lock"]


def test_a_lock_is_given_up_when_its_holder_is_stopped(tmp_path):
    """A measurement a server has stopped (measure.hold) holds its lock; waiters take no wait from it."""
    import signal
    import time

    holder = subprocess.Popen([sys.executable, "-c", "import sys; from pathlib import Path; "
                               "from asr_spec.models.cache import locked\n"
                               "with locked(Path(sys.argv[1])):\n print('held', flush=True); import time; "
                               "time.sleep(60)", str(tmp_path / "x.lock")], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "held\n"
        t0 = time.monotonic()
        with cache.locked(tmp_path / "x.lock", timeout=1.0) as held:
            assert not held and time.monotonic() - t0 >= 1.0  # a running holder: waited out
        os.kill(holder.pid, signal.SIGSTOP)
        t0 = time.monotonic()
        with cache.locked(tmp_path / "x.lock", timeout=30.0) as held:
            assert not held and time.monotonic() - t0 < 5.0  # a stopped holder: given up at once
    finally:
        holder.kill()
        holder.wait(10)
    with cache.locked(tmp_path / "x.lock", timeout=5.0) as held:  # a killed holder leaves no stale lock
        assert held


def test_exact_ways_of_another_shape_are_measured_again_without_a_traceback(tmp_path, monkeypatch):
    from asr_spec.models import linear

    monkeypatch.setenv("ASR_SPEC_CACHE", str(tmp_path))
    path = linear._ways_file()
    path.parent.mkdir(parents=True)
    for text in ('{"ways": null}', '{"ways": [1, 2]}', '[1, 2', '{"ways": {"8x8 float32 1 threads": 3}}'):
        path.write_text(text)
        assert linear.measured_ways() == {}, text
    linear.keep_way("8x8 float32 1 threads", "a way")
    assert linear.measured_ways() == {"8x8 float32 1 threads": "a way"}


def test_a_damaged_draft_or_tokenizer_is_refused_naming_the_file(tiny_dir, tiny_target, tmp_path):
    from asr_spec.models.loader import load_draft, load_target, save_distilled, truncated_draft

    draft = truncated_draft(tiny_target, [0])
    folder = tmp_path / "draft"
    save_distilled(folder, draft.model.decoder, draft.proj_out.weight, None, {"target": "tiny"})
    assert json.loads((folder / "asr_spec_draft.json").read_text())["weights_sha256"]
    load_draft(str(folder), tiny_target)
    with open(folder / "draft.safetensors", "r+b") as f:
        f.seek(-64, 2)
        f.write(b"\x00" * 64)
    with pytest.raises(ModelError, match="draft.safetensors: damaged"):
        load_draft(str(folder), tiny_target)
    model = tmp_path / "model"
    model.mkdir()
    for p in tiny_dir.iterdir():
        (model / p.name).write_bytes(p.read_bytes())
    (model / "tokenizer.json").write_text((tiny_dir / "tokenizer.json").read_text()[:1000])
    with pytest.raises(ModelError, match="cannot read its tokenizer.json"):
        load_target(str(model))
    (model / "tokenizer.json").write_bytes((tiny_dir / "tokenizer.json").read_bytes())
    (model / "model.safetensors").write_bytes((tiny_dir / "model.safetensors").read_bytes()[:5000])
    with pytest.raises(ModelError, match="cannot read its weights"):
        load_target(str(model))


@pytest.mark.slow
def test_three_first_runs_at_once_convert_once_and_a_fourth_measures_nothing(tmp_path):
    """The issue's case: three ``transcribe --sample`` on one empty cache at once all print JFK's sentence; no
    temporary folder is left; a fourth run converts and measures nothing."""
    env = {**os.environ, "ASR_SPEC_CACHE": str(tmp_path)}
    argv = [sys.executable, "-m", "asr_spec.cli", "transcribe", "--sample", "--threads", "1"]
    procs = [subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(3)]
    try:
        outputs = [p.communicate(timeout=600) for p in procs]
    finally:
        for p in procs:
            p.kill()
    for p, (out, err) in zip(procs, outputs):
        assert p.returncode == 0 and JFK in out, err[-3000:]
    assert not [p.name for p in tmp_path.iterdir() if ".tmp" in p.name or ".old" in p.name]
    model = tmp_path / "whisper-base"
    assert problem(model) is None
    inode = (model / "model.safetensors").stat().st_ino
    fourth = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600)
    assert fourth.returncode == 0 and JFK in fourth.stdout, fourth.stderr[-3000:]
    assert "measuring" not in fourth.stderr and "building" not in fourth.stderr, fourth.stderr
    assert (model / "model.safetensors").stat().st_ino == inode


@pytest.mark.slow
def test_random_bytes_in_the_cached_weights_never_give_a_transcript_from_them(tmp_path):
    """1 MiB of random bytes written inside the converted model (same size): the next run says so, converts again
    and prints the right text; ``config.json`` removed: repaired, one model in the cache."""
    env = {**os.environ, "ASR_SPEC_CACHE": str(tmp_path)}
    argv = [sys.executable, "-m", "asr_spec.cli", "transcribe", "--sample", "--threads", "2"]
    first = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600)
    assert first.returncode == 0 and JFK in first.stdout, first.stderr[-3000:]
    weights = tmp_path / "whisper-base" / "model.safetensors"
    with open(weights, "r+b") as f:
        f.seek(100_000_000)
        f.write(os.urandom(1 << 20))
    second = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600)
    assert "model.safetensors has other bytes than when it was written (damaged); building it again" in second.stderr
    assert second.returncode == 0 and JFK in second.stdout, second.stderr[-3000:]
    (tmp_path / "whisper-base" / "config.json").unlink()
    third = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600)
    assert "config.json is missing; building it again" in third.stderr
    assert third.returncode == 0 and JFK in third.stdout, third.stderr[-3000:]
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("whisper-base")) == \
        ["whisper-base", "whisper-base.lock"]
