"""The clients for real: `asr_spec stream` and `asr_spec mic` as subprocesses, against a real `asr_spec serve`
subprocess on loopback (or the engine in-process), the terminal client under a real pseudo-terminal."""
from __future__ import annotations

import json
import os
import pty
import select
import signal
import subprocess
import sys
import time

import pytest
from conftest import DEV, default_sigint
from server_proc import serve
from whisper_normalizer.english import EnglishTextNormalizer

pytestmark = pytest.mark.slow  # a real server, browser, subprocess or real weights

normalize = EnglishTextNormalizer()
JFK = DEV / "jfk-inaugural-1961-ask-not.wav"
CLI = [sys.executable, "-m", "asr_spec.cli"]
EXPECTED = "what your country can do for you"  # streamed text may differ from offline in a word


@pytest.fixture(scope="module")
def url():
    with serve() as u:
        yield u


def test_stream_prints_json_events_and_the_transcript(url):
    out = subprocess.run(CLI + ["stream", str(JFK), "--url", url, "--json"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    events = [json.loads(line) for line in out.stdout.splitlines()]
    assert events[0]["type"] == "ready" and events[-1]["type"] == "closed"
    text = " ".join(e["text"] for e in events if e["type"] == "final")
    assert EXPECTED in normalize(text)
    plain = subprocess.run(CLI + ["stream", str(JFK), "--url", url], capture_output=True, text=True, timeout=300)
    assert plain.returncode == 0 and "->" in plain.stdout and "closed:" in plain.stderr


def test_stream_word_timestamps_through_the_server(url):
    out = subprocess.run(CLI + ["stream", str(JFK), "--url", url, "--json", "--word-timestamps"], capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    finals = [e for line in out.stdout.splitlines() if (e := json.loads(line))["type"] == "final" and e["text"]]
    assert finals
    for e in finals:
        assert [w["word"] for w in e["words"]] == e["text"].split(), e
        assert all(e["start"] <= w["start"] <= w["end"] <= e["end"] and 0 <= w["probability"] <= 1 for w in e["words"]), e
    words = [w for e in finals for w in e["words"]]
    assert all(a["start"] <= b["start"] for a, b in zip(words, words[1:]))
    assert words[-1]["end"] <= 11.1  # the clip is 11 s long


def test_stream_realtime_paces_the_audio(url):
    clip = DEV / "LJ001-0002.wav"  # 1.9 s
    t0 = time.monotonic()
    out = subprocess.run(CLI + ["stream", str(clip), "--url", url, "--realtime"], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0 and time.monotonic() - t0 >= 1.9
    # one "[start -> end] text" line per final (AlignAtt commits a few words at a time)
    text = " ".join(line.split("]", 1)[1] for line in out.stdout.splitlines() if "]" in line)
    assert "comparatively modern" in normalize(text), out.stdout


def test_stream_reports_an_unreachable_server_and_a_bad_file(tmp_path):
    out = subprocess.run(CLI + ["stream", str(JFK), "--url", "ws://127.0.0.1:9"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 1 and "cannot stream to ws://127.0.0.1:9" in out.stderr
    bad = tmp_path / "bad.wav"
    bad.write_bytes(b"RIFF....nonsense")
    out = subprocess.run(CLI + ["stream", str(bad), "--url", "ws://127.0.0.1:9"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 1 and "bad.wav" in out.stderr


def test_mic_says_clearly_when_there_is_no_microphone():
    """This machine (and CI) has no sound card and no PortAudio library: the message must say so."""
    for args in (["mic", "--list-devices"], ["mic", "--url", "ws://127.0.0.1:9"]):
        out = subprocess.run(CLI + args, capture_output=True, text=True, timeout=60)
        assert out.returncode == 1, out
        assert "error:" in out.stderr and ("PortAudio" in out.stderr or "input device" in out.stderr), out.stderr
        assert "Traceback" not in out.stderr


def run_in_pty(args: list[str], seconds: float) -> tuple[int, str]:
    """Run the command on a real pseudo-terminal, press Ctrl-C after ``seconds``, return (status, output)."""
    master, slave = pty.openpty()
    proc = subprocess.Popen(CLI + args, stdin=slave, stdout=slave, stderr=slave, close_fds=True, preexec_fn=default_sigint)
    os.close(slave)
    chunks, deadline, interrupted = [], time.monotonic() + seconds, False
    while True:
        if not interrupted and time.monotonic() > deadline:
            proc.send_signal(signal.SIGINT)
            interrupted = True
        ready, _, _ = select.select([master], [], [], 0.2)
        if ready:
            try:
                data = os.read(master, 65536)
            except OSError:
                break
            if not data:
                break
            chunks.append(data)
        elif proc.poll() is not None:
            break
    proc.wait(60)
    os.close(master)
    return proc.returncode, b"".join(chunks).decode(errors="replace")


@pytest.mark.parametrize("remote", [False, True])
def test_mic_shows_live_text_in_a_terminal_and_the_transcript_on_ctrl_c(url, remote):
    args = ["mic", "--input-file", str(JFK)] + (["--url", url] if remote else [])
    status, output = run_in_pty(args, seconds=16 if remote else 20)
    assert status == 0, output
    live, _, transcript = output.partition("transcript:")
    assert "\x1b[2m" in live  # partial text was shown dimmed while it could still change
    assert EXPECTED in normalize(transcript), output
