"""``asr_spec serve --ray``: two replicas on a local Ray cluster on loopback (the tiny random model: the text is noise,
the same noise wherever it is decoded). Sessions spread over both replicas and each gets the finals a single
``asr_spec serve`` gives for the same audio and options; the Realtime protocol's subprotocol passes Ray's proxy;
every replica's metrics are scraped on its own port; a replica killed mid-session closes its own sessions' connections
alone, a reconnect lands on the survivor, and Ray Serve brings the replica back.

What is decoded must not depend on when the audio arrives (two runs of any server would differ): ``--step 30``, no
partial decode; and each session's audio is one stretch of speech without a pause long enough to end an utterance
(checked), so its only final is the close's, the whole buffer. (A voice-activity final cuts the buffer wherever the
audio received so far ends: sent at once, a pause's final may come before or after the rest has arrived — the
flaky failure of CI's run on 2026-11-26.)"""
from __future__ import annotations

import base64
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest
from asr_spec.clients.stream import StreamEnded, stream_file
from conftest import DEV
from prometheus_client.parser import text_string_to_metric_families
from server_proc import free_port, recv, serve
from test_openai_realtime import COMPLETED, pcm24
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from asr_spec.audio import load_audio
from asr_spec.streaming.config import StreamConfig
from asr_spec.vad import VoiceActivity

pytestmark = pytest.mark.slow  # a real Ray cluster and servers

OPTIONS = ("--no-draft", "--compute-type", "float32", "--threads", "1", "--step", "30", "--max-sessions", "3",
           "--max-sessions-per-client", "8")
START_S = 300  # Ray's start, two replicas loading the model


def free_ports(n: int) -> int:
    """A port P with P..P+n-1 free on loopback."""
    for _ in range(100):
        base = free_port()
        try:
            for p in range(base, base + n):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", p))
            return base
        except OSError:
            continue
    pytest.fail(f"no {n} consecutive free ports")


def metrics(port: int) -> dict[str, float]:
    """A replica's samples by name (labels dropped, summed), from its Prometheus text."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[sample.name] = out.get(sample.name, 0.0) + sample.value
    return out


def replica_pid(port: int) -> int | None:
    """The Ray Serve replica process that listens on ``port`` (its metrics port), from /proc."""
    inodes = {f[9] for f in (line.split() for line in Path("/proc/net/tcp").read_text().splitlines()[1:])
              if f[1].endswith(f":{port:04X}") and f[3] == "0A"}
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and b"ServeReplica:asr_spec" in (proc / "cmdline").read_bytes() and any(
                    os.readlink(fd).strip("socket:[]") in inodes for fd in (proc / "fd").iterdir()):
                return int(proc.name)
        except OSError:
            continue
    return None


# (dev utterance, second it starts at): 10 s of speech whose pauses are all shorter than an utterance's end
STRETCHES = (("1688-142285-0001", 0), ("2961-961-0002", 8), ("2961-961-0004", 0), ("3331-159605-0008", 4))


def speech(utterance: str, start_s: int, seconds: float = 10.0) -> np.ndarray:
    """``seconds`` of a dev utterance from ``start_s`` on; fails unless every pause in it (after its first speech) is
    shorter than the silence that ends an utterance, so that voice activity ends none before the close."""
    items = {json.loads(x)["id"]: json.loads(x) for x in (DEV / "manifest.jsonl").read_text().splitlines()}
    audio = load_audio(DEV / items[utterance]["audio"])[start_s * 16000:int((start_s + seconds) * 16000)]
    flags = VoiceActivity()(audio)
    chunk_s, longest, run = VoiceActivity.CHUNK / 16000, 0.0, 0.0
    for voiced in flags[flags.index(True):]:
        run = 0.0 if voiced else run + chunk_s
        longest = max(longest, run)
    assert longest < StreamConfig().end_silence_s - 0.1, f"{utterance} from {start_s} s pauses {longest:.2f} s"
    return audio


def finals(events: list[dict]) -> list[str]:
    return [e["text"] for e in events if e["type"] == "final"]


UPDATE = {"type": "session.update", "session": {"type": "transcription", "audio": {"input": {
    "format": {"type": "audio/pcm", "rate": 24000}, "transcription": {"language": "en"}, "turn_detection": None}}}}


def realtime_transcript(url: str, audio: np.ndarray, speed: float | None) -> str:
    """An OpenAI Realtime session without turn detection: the audio appended in 0.5 s pieces (paced at ``speed`` x
    real time; None: at once), one commit, and the completed item's transcript. What is decoded then is the whole
    buffer, at the commit, however the audio was timed. Raises ConnectionClosed when the connection ends first."""
    seen: list = []
    with connect(url + "/v1/realtime?intent=transcription", subprotocols=["realtime"], open_timeout=30,
                 close_timeout=5) as ws:
        assert ws.subprotocol == "realtime" and recv(ws, seen, 30)["type"] == "session.created"
        ws.send(json.dumps(UPDATE))
        assert recv(ws, seen, 30)["type"] == "session.updated", seen
        data, piece = pcm24(audio), 24000 * 2 // 2  # 0.5 s of 24 kHz pcm16
        for i in range(0, len(data), piece):
            ws.send(json.dumps({"type": "input_audio_buffer.append",
                                "audio": base64.b64encode(data[i:i + piece]).decode()}))
            if speed:
                time.sleep(0.5 / speed)
        ws.send(json.dumps({"type": "input_audio_buffer.commit"}))
        deadline = time.monotonic() + 60
        while (e := json.loads(ws.recv(timeout=max(0.1, deadline - time.monotonic()))))["type"] != COMPLETED:
            seen.append(e)
        return e["transcript"]


@pytest.fixture(scope="module")
def audios() -> list[np.ndarray]:
    return [speech(u, start) for u, start in STRETCHES]


@pytest.fixture(scope="module")
def single_serve(tiny_dir, audios) -> dict[str, list]:
    """What one ``asr_spec serve`` gives for each audio, streamed alone: native finals, Realtime transcripts."""
    with serve("--model", str(tiny_dir), *OPTIONS) as url:
        return {"native": [finals(stream_file(url, a, None)) for a in audios],
                "realtime": [realtime_transcript(url, a, None) for a in audios]}


@contextmanager
def on_ray(tiny_dir, tmp_path: Path):
    """``asr_spec serve --ray --replicas 2`` on a new local cluster: yields (ws URL, the replicas' metrics ports)."""
    port, metrics_port = free_port(), free_ports(2)
    log = tmp_path / "serve-ray.log"
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    with open(log, "w") as err:
        proc = subprocess.Popen([sys.executable, "-m", "asr_spec", "serve", "--ray", "--replicas", "2", "--port",
                                 str(port), "--metrics-port", str(metrics_port), "--model", str(tiny_dir), *OPTIONS],
                                stdout=err, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    ports = [metrics_port, metrics_port + 1]
    deadline = time.monotonic() + START_S
    try:
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=3)
                for p in ports:
                    metrics(p)
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(f"serve --ray not serving after {START_S} s (exit {proc.poll()}):\n"
                                f"{log.read_text()[-4000:]}")
                time.sleep(1)
        yield f"ws://127.0.0.1:{port}", ports
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(90)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
            pytest.fail(f"serve --ray did not stop within 90 s of SIGINT:\n{log.read_text()[-4000:]}")


@pytest.fixture(scope="module")
def ray_serve(tiny_dir, tmp_path_factory):
    with on_ray(tiny_dir, tmp_path_factory.mktemp("ray_serve")) as served:
        yield served


def all_at_once(fn, args: list[tuple]) -> list:
    """``fn(*a)`` for every ``a`` in its own thread at once: each result, or how its connection ended first."""
    results: list = [None] * len(args)

    def one(i: int) -> None:
        try:
            results[i] = fn(*args[i])
        except (ConnectionClosed, StreamEnded) as e:
            results[i] = e

    threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(len(args))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not any(t.is_alive() for t in threads), f"sessions still streaming after 120 s: {results}"
    return results


def test_ray_serve_spreads_sessions_and_each_gets_a_single_serves_finals(ray_serve, audios, single_serve):
    url, ports = ray_serve
    before = [metrics(p).get("asr_spec_sessions_started_total", 0.0) for p in ports]
    results = all_at_once(stream_file, [(url, a, None) for a in audios])  # 3 at most fit on one replica
    started = [metrics(p)["asr_spec_sessions_started_total"] - b for p, b in zip(ports, before)]
    assert sum(started) == 4 and min(started) >= 1, f"sessions per replica: {started}"
    for i, events in enumerate(results):
        assert isinstance(events, list) and events[-1]["type"] == "closed", f"session {i}: {events}"
        assert finals(events) == single_serve["native"][i], f"session {i} differs from a single serve's"
    families = {f.name for f in text_string_to_metric_families(
        urllib.request.urlopen(f"http://127.0.0.1:{ports[0]}/metrics", timeout=5).read().decode())}
    assert len(families) >= 5, families


def test_ray_serve_replica_killed_mid_session(ray_serve, audios, single_serve):
    """Realtime sessions at real time on both replicas; one replica is killed (SIGKILL) 3 s in: its sessions'
    connections close, the others finish with a single serve's transcripts; a reconnect at once lands on the survivor;
    Ray brings the replica back (its metrics port answers again, from a new process)."""
    url, ports = ray_serve
    holder: dict = {}
    streaming = threading.Thread(target=lambda: holder.update(
        r=all_at_once(realtime_transcript, [(url, a, 1.0) for a in audios])), daemon=True)
    streaming.start()
    time.sleep(3.0)
    active = [metrics(p)["asr_spec_sessions_active"] for p in ports]
    assert sum(active) == 4 and min(active) >= 1, f"active sessions per replica: {active}"
    victim, survivor = (0, 1) if active[0] >= active[1] else (1, 0)  # the survivor has room for one more
    pid = replica_pid(ports[victim])
    assert pid is not None, f"no replica process listens on {ports[victim]}"
    survivor_started = metrics(ports[survivor])["asr_spec_sessions_started_total"]
    os.kill(pid, signal.SIGKILL)
    deadline, again = time.monotonic() + 10, None
    while again is None:  # a reconnect while the victim is down (as clients do: retried should Ray pick the victim)
        try:
            again = stream_file(url, audios[0][: 3 * 16000], None)
        except (ConnectionClosed, StreamEnded, OSError) as e:
            assert time.monotonic() < deadline, f"no reconnect served within 10 s of the kill: {e!r}"
            time.sleep(1)
    assert again[-1]["type"] == "closed", again
    assert metrics(ports[survivor])["asr_spec_sessions_started_total"] == survivor_started + 1
    streaming.join(130)
    assert "r" in holder, "the sessions had not all ended 130 s after they started"
    results = holder["r"]
    ended = [i for i, r in enumerate(results) if isinstance(r, ConnectionClosed)]
    assert len(ended) == active[victim], f"{active[victim]} session(s) were on the killed replica; ended: {results}"
    for i, transcript in enumerate(results):
        if i not in ended:
            assert transcript == single_serve["realtime"][i], f"session {i} differs from a single serve's"
    deadline = time.monotonic() + 120
    while (back := replica_pid(ports[victim])) in (None, pid):
        assert time.monotonic() < deadline, "Ray Serve did not bring the killed replica back within 120 s"
        time.sleep(1)
    assert metrics(ports[victim])["asr_spec_sessions_active"] == 0 and back != pid
