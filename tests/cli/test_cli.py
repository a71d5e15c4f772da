"""The ``asr_spec transcribe`` command as a user runs it: good files in several formats, each kind of bad
input (non-finite samples, FIFOs and devices included), an unwritable output directory, inputs with the same
name, output permissions, and Ctrl-C."""
from __future__ import annotations

import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import time

import numpy as np
import pytest
import soundfile as sf
from conftest import DEV, default_sigint, wait_for_line

from asr_spec import cli
from asr_spec.cli import build_parser
from asr_spec.writers import FORMATS, write_atomic

pytestmark = pytest.mark.slow
DRAFT = ["--draft", "layers:0,1,2,3,5"]


def run(*args: str, timeout: int = 600, **kw) -> subprocess.CompletedProcess:
    try:
        return subprocess.run([sys.executable, "-m", "asr_spec", "transcribe", "--quiet", *args],
                              capture_output=True, text=True, timeout=timeout, **kw)
    except subprocess.TimeoutExpired as e:
        seen = [v.decode(errors="replace") if isinstance(v, bytes) else v for v in (e.stdout, e.stderr)]
        pytest.fail(f"asr_spec transcribe still running after {timeout} s; stdout: {seen[0]!r}; stderr: {seen[1]!r}")


def error_line(stderr: str, name: str) -> str:
    return next((ln for ln in stderr.splitlines() if name in ln and ln.startswith("error")), "")


def test_bundled_sample_prints_its_text():
    r = run("--sample")  # the default draft: the one shipped for the embedded model
    assert r.returncode == 0, r.stderr
    assert "+ draft" in r.stderr and "drafts/whisper-base" in r.stderr
    assert "ask not what your country can do for you" in r.stdout.lower()
    assert "acceptance" in r.stderr and "RTF" in r.stderr


def test_formats_rates_and_channels(tmp_path):
    speech, rate = sf.read(DEV / "LJ001-0002.wav", dtype="float32")  # "in being comparatively modern."
    import soxr
    stereo44 = np.stack([soxr.resample(speech, rate, 44100)] * 2, axis=1)
    sf.write(tmp_path / "stereo44.ogg", stereo44, 44100, format="OGG", subtype="VORBIS")
    sf.write(tmp_path / "mono22.mp3", soxr.resample(speech, rate, 22050), 22050, format="MP3")
    sf.write(tmp_path / "mono8.flac", soxr.resample(speech, rate, 8000), 8000)
    files = [str(tmp_path / n) for n in ("stereo44.ogg", "mono22.mp3", "mono8.flac")]
    out = tmp_path / "out"
    r = run(*files, "--output-dir", str(out), "--format", "all", "--language", "en", *DRAFT)
    assert r.returncode == 0, r.stderr
    for stem in ("stereo44", "mono22", "mono8"):
        doc = json.loads((out / f"{stem}.json").read_text())
        assert "comparatively modern" in doc["text"].lower()
        assert doc["language"] == "en" and doc["segments"]
        seg = doc["segments"][0]
        assert isinstance(seg["start"], float) and isinstance(seg["end"], float) and seg["end"] > seg["start"]
        stats = doc["statistics"]
        for key in ("audio_seconds", "encoder_seconds", "decode_seconds", "tokens", "target_passes", "drafted",
                    "accepted", "acceptance"):
            assert key in stats
        assert stats["drafted"] > 0 and stats["target_passes"] < stats["tokens"] + 1
        srt = (out / f"{stem}.srt").read_text()
        assert srt.startswith("1\n00:00:00,000 --> 00:00:0")
        assert (out / f"{stem}.vtt").read_text().startswith("WEBVTT\n\n00:00:00.000 --> ")
        assert (out / f"{stem}.txt").read_text().strip() == doc["text"]
    assert not list(out.glob(".*.part"))


def test_bad_inputs_are_reported_and_the_rest_is_transcribed(tmp_path):
    (tmp_path / "empty.wav").write_bytes(b"")
    (tmp_path / "corrupt.wav").write_bytes(b"RIFF\x00\x00\x00\x00WAVEfmt garbage" + os.urandom(2000))
    sf.write(tmp_path / "zero.wav", np.zeros(0, dtype=np.float32), 16000)
    sf.write(tmp_path / "silent.wav", np.zeros(16000 * 2, dtype=np.float32), 16000)
    good = DEV / "LJ001-0002.wav"
    out = tmp_path / "out"
    names = ["missing.wav", "empty.wav", "corrupt.wav", "zero.wav", "silent.wav"]
    r = run(*[str(tmp_path / n) for n in names[:2]], str(good), *[str(tmp_path / n) for n in names[2:]],
            "--output-dir", str(out), "--format", "json", "--no-draft", "--language", "en")
    assert r.returncode == 1
    reasons = {"missing.wav": "no such file", "empty.wav": "empty file", "corrupt.wav": "cannot decode",
               "zero.wav": "zero length", "silent.wav": "silent"}
    for name, reason in reasons.items():
        assert reason in error_line(r.stderr, name), (name, r.stderr)
    assert "5 of 6 file(s) failed" in r.stderr
    assert sorted(p.name for p in out.iterdir()) == ["LJ001-0002.json"]
    assert "comparatively modern" in r.stdout.lower()


def test_non_finite_samples_are_a_bad_file_and_the_rest_is_transcribed(tmp_path):
    speech, rate = sf.read(DEV / "LJ001-0002.wav", dtype="float32")
    for name, value in (("nan.wav", np.nan), ("inf.wav", -np.inf)):
        bad = speech.copy()
        bad[rate // 2] = value
        sf.write(tmp_path / name, bad, rate, subtype="FLOAT")
        assert not np.isfinite(sf.read(tmp_path / name)[0]).all()
    out = tmp_path / "out"
    r = run(str(tmp_path / "nan.wav"), str(tmp_path / "inf.wav"), str(DEV / "LJ001-0002.wav"), "--output-dir", str(out),
            "--format", "json", "--no-draft", "--language", "en", timeout=300)
    assert r.returncode == 1, r.stderr
    for name in ("nan.wav", "inf.wav"):
        assert "non-finite samples (NaN or Inf): 1 of" in error_line(r.stderr, name), (name, r.stderr)
    assert "2 of 3 file(s) failed" in r.stderr
    assert sorted(p.name for p in out.iterdir()) == ["LJ001-0002.json"]
    assert "comparatively modern" in r.stdout.lower()


def test_fifo_directory_and_device_are_refused_without_opening_them(tmp_path):
    os.mkfifo(tmp_path / "pipe.wav")  # opening it for reading would block until a writer comes: none will
    (tmp_path / "folder.wav").mkdir()
    r = run(str(tmp_path / "pipe.wav"), str(tmp_path / "folder.wav"), "/dev/null", str(DEV / "LJ001-0002.wav"),
            "--no-draft", "--language", "en", timeout=300)
    assert r.returncode == 1, r.stderr
    kinds = {"pipe.wav": "a FIFO (named pipe)", "folder.wav": "a directory", "/dev/null": "a character device"}
    for name, kind in kinds.items():
        assert f"is {kind}, not a regular file" in error_line(r.stderr, name), (name, r.stderr)
    assert "3 of 4 file(s) failed" in r.stderr
    assert "comparatively modern" in r.stdout.lower()


def test_inputs_with_the_same_name_get_their_own_outputs(tmp_path):
    speech, rate = sf.read(DEV / "LJ001-0002.wav", dtype="float32")
    for sub in ("a", "b", "c"):
        (tmp_path / sub).mkdir()
    shutil.copy(DEV / "LJ001-0002.wav", tmp_path / "a" / "same.wav")
    shutil.copy(DEV / "LJ001-0002.wav", tmp_path / "b" / "same.wav")
    shutil.copy(DEV / "LJ001-0002.wav", tmp_path / "c" / "same-2.wav")  # its own name: b/same.wav must skip it
    shutil.copy(DEV / "LJ001-0002.wav", tmp_path / "x.wav")
    sf.write(tmp_path / "x.flac", speech, rate)
    where = {"same.json": "a/same.wav", "same-3.json": "b/same.wav", "same-2.json": "c/same-2.wav",
             "x.json": "x.wav", "x-2.json": "x.flac"}
    out = tmp_path / "out"
    r = run(*[str(tmp_path / f) for f in ("a/same.wav", "b/same.wav", "c/same-2.wav", "x.wav", "x.flac")],
            "--output-dir", str(out), "--format", "json", "--no-draft", "--language", "en", timeout=600)
    assert r.returncode == 0, r.stderr
    assert {p.name: json.loads(p.read_text())["file"] for p in out.iterdir()} == {
        name: str(tmp_path / f) for name, f in where.items()}
    for f, name in (("b/same.wav", "same-3"), ("x.flac", "x-2")):
        line = next((ln for ln in r.stderr.splitlines() if ln.startswith(str(tmp_path / f))), "")
        assert f"written as {out / name}.*" in line, (f, r.stderr)


def test_unwritable_output_directory_is_a_clear_error(tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("x")
    r = run(str(DEV / "LJ001-0002.wav"), "--output-dir", str(blocker / "sub"), "--no-draft")
    assert r.returncode == 1
    assert "cannot create output directory" in r.stderr and str(blocker / "sub") in r.stderr


def test_ctrl_c_leaves_no_partial_files(tmp_path):
    out = tmp_path / "out"
    long = DEV / "longform" / "ljspeech-LJ001-0001_to_LJ001-0032.wav"
    p = subprocess.Popen([sys.executable, "-m", "asr_spec", "transcribe", str(long), "--output-dir", str(out),
                          "--format", "all", "--no-draft", "--language", "en"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=default_sigint)
    try:
        wait_for_line(p.stderr, "loaded", 120)
    except BaseException:
        p.kill()
        raise
    time.sleep(3)  # inside the first windows
    p.send_signal(signal.SIGINT)
    _, err = p.communicate(timeout=120)
    assert p.returncode == 130, err
    assert "interrupted" in err
    assert list(out.iterdir()) == []


def test_atomic_write_keeps_the_old_file_when_interrupted(tmp_path, monkeypatch):
    target = tmp_path / "t.txt"
    target.write_text("old")

    def interrupted(*a):
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "replace", interrupted)
    with pytest.raises(KeyboardInterrupt):
        write_atomic(target, "new text")
    assert target.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["t.txt"]


def test_outputs_get_the_mode_the_umask_gives_new_files(tmp_path):
    out = tmp_path / "out"
    r = run(str(DEV / "LJ001-0002.wav"), "--output-dir", str(out), "--format", "all", "--no-draft", "--language", "en",
            timeout=300, preexec_fn=lambda: os.umask(0o022))
    assert r.returncode == 0, r.stderr
    assert {p.name: oct(stat.S_IMODE(p.stat().st_mode)) for p in out.iterdir()} == {
        f"LJ001-0002.{fmt}": oct(0o644) for fmt in FORMATS}
    old = os.umask(0o027)
    try:
        write_atomic(out / "LJ001-0002.txt", "overwritten")  # replacing an existing file, with another umask
    finally:
        os.umask(old)
    assert stat.S_IMODE((out / "LJ001-0002.txt").stat().st_mode) == 0o640



def test_cli_defaults_match_the_library_defaults():
    from asr_spec.transcribe import TranscribeOptions

    ev = build_parser().parse_args(["eval", "--manifest", "m.jsonl"])
    assert (int(ev.k), float(ev.draft_stop)) == (TranscribeOptions.k, TranscribeOptions.draft_stop)
    tr = build_parser().parse_args(["transcribe", "a.wav"])
    assert tr.k is None and tr.draft_stop is None  # resolved to TranscribeOptions' defaults
    help_text = " ".join(build_parser()._subparsers._group_actions[0].choices["transcribe"].format_help().split())
    assert f"(default {TranscribeOptions.k})" in help_text and f"(default {TranscribeOptions.draft_stop};" in help_text


def settings_of(*argv: str):
    from asr_spec.server.settings import from_arguments

    return from_arguments(build_parser().parse_args(["serve", *argv]))


def test_serve_defaults_are_the_engines_and_the_measured_ones(monkeypatch):
    """serve's step and policy are the streaming library's defaults, its load step 3 s; on a CPU it runs torch on every
    core and admits the sessions measured to run at real time (2 per core with AMX, else 1); CUDA differs (and
    encodes full windows, every stream's in one call); streams draft, or with their hints only when told."""
    from asr_spec.server import settings as settings_module

    from asr_spec.streaming import MAX_STEP_S
    from asr_spec.streaming.config import StreamConfig

    s = settings_of()
    assert (s.step, s.max_step, s.commit_policy) == (StreamConfig.step_s, MAX_STEP_S,
                                                     StreamConfig.policy.name) == (0.5, 3.0, "alignatt")
    assert s.server_config(()).stream.policy == StreamConfig.policy
    monkeypatch.setattr("os.sched_getaffinity", lambda _pid: {0, 1, 2, 3})
    assert s.torch_threads() == 4 and settings_of("--threads", "4").torch_threads() == 4
    assert settings_of("--device", "cuda").torch_threads() == 0  # torch's choice
    for has_amx, sessions in ((True, 8), (False, 4)):
        monkeypatch.setattr(settings_module, "amx", lambda *_a, has=has_amx: has)
        assert settings_of().sessions() == sessions and settings_of("--max-sessions", "3").sessions() == 3
    assert settings_of("--device", "cuda").sessions() == 16
    assert s.batch() == 8 and settings_of("--device", "cuda").batch() == 32
    assert (s.window(), settings_of("--device", "cuda").window()) == ("stream", "full")
    assert settings_of("--device", "cuda", "--encoder-window", "stream").engine_config().encoder_window == "stream"
    assert settings_of("--device", "cuda").engine_config().encoder_window == "full"
    assert not s.engine_config().draft and settings_of("--stream-draft").engine_config().draft


def test_serve_settings_come_from_options_over_the_environment_over_the_defaults(monkeypatch, capsys):
    """Every serve option has its ASR_SPEC_* variable (named in --help); an option given wins; a value the settings
    cannot take is a clear error before anything loads."""
    from asr_spec.streaming.policy import LocalAgreement

    monkeypatch.setenv("ASR_SPEC_MAX_SESSIONS", "5")
    monkeypatch.setenv("ASR_SPEC_COMMIT_POLICY", "local-agreement")
    monkeypatch.setenv("ASR_SPEC_HOTWORDS", "Kubernetes")
    s = settings_of("--max-sessions", "7")
    assert (s.max_sessions, s.commit_policy, s.hotwords) == (7, "local-agreement", "Kubernetes")
    assert s.server_config(()).max_sessions == 7 and s.server_config(()).stream.policy == LocalAgreement()
    help_text = " ".join(build_parser()._subparsers._group_actions[0].choices["serve"].format_help().split())
    assert "--ray [ADDRESS]" in help_text and "[ASR_SPEC_MAX_SESSIONS]" in help_text
    monkeypatch.setenv("ASR_SPEC_PORT", "not-a-port")
    assert cli.main(["serve"]) == 1
    err = capsys.readouterr().err
    assert "port" in err and "not-a-port" in err, err
