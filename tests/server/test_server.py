"""`asr_spec serve` for real: the server on loopback with the embedded models, real WebSocket clients."""
from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from contextlib import contextmanager

import jiwer
import numpy as np
import pytest
import soxr
from asr_spec.clients.stream import stream_file as stream
from asr_spec.server.app import Server
from asr_spec.server.config import ServerConfig
from conftest import DEV
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import connect
from whisper_normalizer.english import EnglishTextNormalizer

from asr_spec.audio import load_audio
from asr_spec.models.loader import default_draft, load_draft
from asr_spec.streaming.config import EngineConfig
from asr_spec.streaming.engine import Engine
from asr_spec.transcribe import TranscribeOptions, Transcriber

pytestmark = pytest.mark.slow  # a real server, browser, subprocess or real weights

normalize = EnglishTextNormalizer()
JFK = DEV / "jfk-inaugural-1961-ask-not.wav"


@pytest.fixture(scope="module")
def transcriber(base_model):
    return Transcriber(base_model, load_draft(default_draft("whisper-base"), base_model))


@contextmanager
def running(transcriber, engine: Callable[[Transcriber], Engine] = Engine, **config):
    server = Server(engine(transcriber), ServerConfig(port=0, **config))
    ready = threading.Event()
    thread = threading.Thread(target=lambda: asyncio.run(server.serve_forever(ready)), daemon=True)
    thread.start()
    assert ready.wait(30), "server did not start"
    try:
        yield server, f"ws://127.0.0.1:{server.port}"
    finally:
        server.stop()
        thread.join(10)


@pytest.fixture(scope="module")
def server(transcriber):
    """A server whose streams draft with the draft model too (``serve --stream-draft``): its counts reach the
    session's totals and /metrics."""
    with running(transcriber, lambda tr: Engine(tr, EngineConfig(draft=True)), max_sessions=5,
                 max_sessions_per_client=5, idle_timeout_s=30) as s:
        yield s


def pcm16(audio: np.ndarray) -> bytes:
    return (np.clip(audio, -1, 1) * 32767).astype("<i2").tobytes()


def recv(ws, timeout=60.0) -> dict:
    return json.loads(ws.recv(timeout=timeout))


def stream_file(url: str, audio: np.ndarray, speed: float = 4.0) -> list[dict]:
    """Send ``audio`` as 16-bit PCM frames at ``speed`` x real time with the `asr_spec stream` client, close,
    and return every event."""
    events = stream(url, audio, speed)
    assert events[0]["type"] == "ready"
    return events


def final_text(events: list[dict]) -> str:
    return "".join(e["join"] + e["text"] for e in events if e["type"] == "final")


def test_streamed_file_gives_the_offline_transcript(server, transcriber):
    """A file streamed at 4x real time gives the offline words: none lost, none added, at most two of its 22 words
    heard differently. How much audio each decode sees depends on the machine's speed, and AlignAtt commits a word
    from the audio 0.5 s after it: "asked not" where the offline decode, hearing on, says "ask not"."""
    _, url = server
    audio = load_audio(JFK)
    events = stream_file(url, audio)
    kinds = [e["type"] for e in events]
    assert kinds[-1] == "closed" and "final" in kinds and "partial" in kinds
    offline = transcriber.transcribe(audio, TranscribeOptions(language="en")).text
    streamed = final_text(events)
    print(f"offline:  {offline}\nstreamed: {streamed}")
    diff = jiwer.process_words(normalize(offline), normalize(streamed))
    assert diff.deletions == diff.insertions == 0 and diff.substitutions <= 2, (offline, streamed)
    finals = [e for e in events if e["type"] == "final"]
    assert finals[-1]["end_of_utterance"]
    assert all(isinstance(e[k], float | int) for e in finals for k in ("start", "end"))
    assert all(a["end"] <= b["start"] + 1e-6 for a, b in zip(finals, finals[1:]))  # no overlap, in order
    closed = events[-1]
    assert closed["audio_seconds"] == pytest.approx(len(audio) / 16000, abs=0.2) and closed["tokens"] > 0
    assert closed["accepted"] > 0  # the draft drafted


def test_four_concurrent_sessions_all_complete(server):
    _, url = server
    files = sorted(DEV.glob("LJ001-000*.wav"))[:4]
    results: dict[str, list[dict]] = {}
    threads = [threading.Thread(target=lambda f=f: results.__setitem__(f.name, stream_file(url, load_audio(f), 3.0)))
               for f in files]
    for t in threads:
        t.start()
    for t in threads:
        t.join(600)
    assert len(results) == 4
    for name, events in results.items():
        assert events[-1]["type"] == "closed", name
        assert final_text(events).strip(), name


def test_every_bad_input_gets_an_error_and_the_session_survives(server):
    _, url = server
    with connect(url) as ws:
        ws.send(b"\x00\x01")
        assert recv(ws)["code"] == "not_started"
        ws.send("this is not json")
        assert recv(ws)["code"] == "bad_json"
        ws.send(json.dumps([1, 2]))
        assert recv(ws)["code"] == "bad_message"
        ws.send(json.dumps({"type": "dance"}))
        assert recv(ws)["code"] == "unknown_type"
        ws.send(json.dumps({"type": "finalize"}))
        assert recv(ws)["code"] == "not_started"
        for bad, code in (({"sample_rate": 5}, "bad_sample_rate"), ({"encoding": "mp3"}, "bad_encoding"),
                          ({"channels": 6}, "bad_channels"), ({"language": "xx"}, "bad_language"),
                          ({"task": "summarize"}, "bad_task"), ({"colour": "red"}, "bad_start")):
            ws.send(json.dumps({"type": "start", **bad}))
            assert recv(ws)["code"] == code
        ws.send(json.dumps({"type": "start", "sample_rate": 8000, "channels": 2}))  # resampled, mixed down
        assert recv(ws)["type"] == "ready"
        ws.send(json.dumps({"type": "start"}))
        assert recv(ws)["code"] == "already_started"
        ws.send(b"\x00\x01\x02")  # not whole stereo 16-bit samples
        assert recv(ws)["code"] == "bad_frame"
        ws.send(bytes(300 * 1024))
        assert recv(ws)["code"] == "frame_too_large"
        audio = soxr.resample(load_audio(JFK), 16000, 8000)
        stereo = np.repeat(audio[:, None], 2, axis=1).reshape(-1)
        for i in range(0, len(stereo), 1600):
            ws.send(pcm16(stereo[i:i + 1600]))
        ws.send(json.dumps({"type": "finalize"}))
        events, seconds = [], len(audio) / 8000
        # JFK's pause after "ask not" may end an utterance too (end_of_utterance): finalize's own final is the one
        # that reaches the last words (before the clip's trailing second of silence)
        while not (events and events[-1]["type"] == "final" and events[-1]["end_of_utterance"]
                   and events[-1]["end"] >= seconds - 2.0):
            events.append(recv(ws))
        assert "what your country can do for you" in normalize(final_text(events))  # 8 kHz: telephone quality
        ws.send(json.dumps({"type": "close"}))
        while (e := recv(ws))["type"] != "closed":
            pass
        assert e["audio_seconds"] == pytest.approx(11.0, abs=0.3)


def test_abrupt_disconnects_do_not_hurt_the_server(server):
    srv, url = server
    for _ in range(2):
        ws = connect(url).__enter__()
        ws.send(json.dumps({"type": "start"}))
        recv(ws)
        ws.send(pcm16(load_audio(JFK)[:32000]))
        ws.socket.shutdown(socket.SHUT_RDWR)  # no close frame
        ws.socket.close()
    deadline = time.time() + 30
    while srv.shared.sessions and time.time() < deadline:
        time.sleep(0.1)
    assert not srv.shared.sessions
    events = stream_file(url, load_audio(JFK)[:48000], speed=8)
    assert events[-1]["type"] == "closed"


def test_max_sessions_refuses_clearly(server):
    """A full server refuses a session with server_full (1013), and says so on /health (readiness: 503 and the
    reason) while /livez stays 200; once a session ends /health is 200 again."""
    _, url = server
    http = url.replace("ws://", "http://")
    held = [connect(url).__enter__() for _ in range(5)]
    try:
        with pytest.raises(urllib.error.HTTPError) as full:
            urllib.request.urlopen(f"{http}/health", timeout=10)
        assert full.value.code == 503 and full.value.read() == b"full: all 5 sessions are in use\n"
        assert urllib.request.urlopen(f"{http}/livez", timeout=10).read() == b"ok\n"
        with connect(url) as extra:
            e = recv(extra, timeout=10)
            assert e["type"] == "error" and e["code"] == "server_full"
            with pytest.raises(ConnectionClosed) as closed:
                extra.recv(timeout=10)
            assert closed.value.rcvd.code == 1013
    finally:
        for ws in held:
            ws.close()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            assert urllib.request.urlopen(f"{http}/health", timeout=10).read() == b"ok\n"
            break
        except urllib.error.HTTPError:
            time.sleep(0.05)
    else:
        pytest.fail("/health still 503 10 s after the sessions closed")


def test_health_and_metrics_over_http(server):
    """After the sessions above: /metrics in Prometheus' text format, read with Prometheus' own parser, counts
    them (started, refused by reason, audio, latency and queue-wait histograms, draft tokens); ?format=json keeps
    the JSON view with the same totals."""
    from prometheus_client.parser import text_string_to_metric_families

    _, url = server
    http = url.replace("ws://", "http://")
    assert urllib.request.urlopen(f"{http}/healthz", timeout=10).read() == b"ok\n"
    m = json.loads(urllib.request.urlopen(f"{http}/metrics?format=json", timeout=10).read())
    assert {"sessions", "audio_seconds", "rtf", "acceptance"} <= m.keys()
    assert m["audio_seconds"] > 0 and m["sessions_total"] > 0
    reply = urllib.request.urlopen(f"{http}/metrics", timeout=10)
    assert reply.headers["Content-Type"].startswith("text/plain; version=0.0.4")  # what Prometheus scrapes
    families = {f.name: f for f in text_string_to_metric_families(reply.read().decode())}
    openmetrics = urllib.request.Request(f"{http}/metrics", headers={"Accept": "application/openmetrics-text"})
    with urllib.request.urlopen(openmetrics, timeout=10) as r:
        assert r.headers["Content-Type"].startswith("application/openmetrics-text") and r.read().endswith(b"# EOF\n")
    value = lambda family, sample, **labels: next(  # noqa: E731
        s.value for s in families[family].samples if s.name == sample and labels.items() <= s.labels.items())
    assert len(families) >= 10, sorted(families)
    assert value("asr_spec_sessions_started", "asr_spec_sessions_started_total", protocol="native") >= m["sessions_total"]
    assert value("asr_spec_sessions_refused", "asr_spec_sessions_refused_total", reason="server_full") >= 1
    assert value("asr_spec_audio_received_seconds", "asr_spec_audio_received_seconds_total") >= m["audio_seconds"] > 0
    assert value("asr_spec_engine_busy_seconds", "asr_spec_engine_busy_seconds_total") > 0
    assert value("asr_spec_event_latency_seconds", "asr_spec_event_latency_seconds_count", type="final") > 0
    assert value("asr_spec_event_latency_seconds", "asr_spec_event_latency_seconds_count", type="partial") > 0
    assert value("asr_spec_decode_queue_wait_seconds", "asr_spec_decode_queue_wait_seconds_count") > 0
    drafted = sum(s.value for s in families["asr_spec_draft_tokens"].samples)
    assert drafted > 0 and families["asr_spec_sessions_active"].samples[0].value == 0


def test_bearer_token_idle_timeout_and_oversized_messages(transcriber):
    with running(transcriber, api_keys=("s3cret",), idle_timeout_s=1.5, max_message_bytes=64 * 1024) as (_, url):
        with pytest.raises(InvalidStatus) as refused:
            connect(url)
        assert refused.value.response.status_code == 401
        with connect(url, additional_headers={"Authorization": "Bearer s3cret"}) as ws:
            ws.send(json.dumps({"type": "start"}))
            assert recv(ws)["type"] == "ready"
            assert recv(ws, timeout=10)["code"] == "idle_timeout"
            with pytest.raises(ConnectionClosed):
                ws.recv(timeout=10)
        with connect(f"{url}/?api_key=s3cret") as ws:  # the browser way
            ws.send(json.dumps({"type": "start"}))
            assert recv(ws)["type"] == "ready"
            ws.send(bytes(100 * 1024))
            with pytest.raises(ConnectionClosed) as closed:
                ws.recv(timeout=10)
            assert closed.value.rcvd.code == 1009


class GermanFails(Engine):
    """The real engine, except that its recognizer raises on a batch holding a German request (a stand-in for any
    input the decoder cannot handle)."""

    def __init__(self, transcriber: Transcriber):
        class FailsOnGerman(Transcriber):
            def decode(self, memories, requests, *args, **kwargs):
                if any(self.vocab.languages["de"] in r.prompt for r in requests):
                    raise RuntimeError("injected failure")
                return super().decode(memories, requests, *args, **kwargs)

        super().__init__(FailsOnGerman(transcriber.target, transcriber.draft))


def test_a_stream_that_cannot_be_decoded_ends_alone(transcriber):
    """A decode that raises used to be retried for ever with its batch, freezing every session. Now the
    failing stream alone gets ``decode_failed`` and a 1011 close; a session decoded beside it gets its text."""
    jfk = load_audio(JFK)
    with running(transcriber, engine=GermanFails, max_sessions=4) as (srv, url):
        seen: list[dict] = []
        with connect(url, open_timeout=30, close_timeout=5) as bad:
            bad.send(json.dumps({"type": "start", "sample_rate": 16000, "encoding": "pcm_s16le", "language": "de"}))
            seen.append(recv(bad))
            good: dict = {}
            thread = threading.Thread(target=lambda: good.setdefault("events", stream(url, jfk, 4.0)), daemon=True)
            thread.start()
            for i in range(0, len(jfk), 1600):
                try:
                    bad.send(pcm16(jfk[i:i + 1600]))
                except ConnectionClosed:
                    break
                time.sleep(0.025)
            with pytest.raises(ConnectionClosed):
                while True:
                    seen.append(recv(bad, timeout=60))
            assert bad.close_code == 1011, (bad.close_code, seen)
        assert any(e["type"] == "error" and e["code"] == "decode_failed" for e in seen), seen
        thread.join(120)
        assert not thread.is_alive(), "the session beside the failing one did not finish within 120 s"
        # its text, whatever form a word takes (AlignAtt may commit "asked not" at 4x real time; WER is measured in eval/)
        assert "your country can do for you" in normalize(" ".join(e["text"] for e in good["events"] if e["type"] == "final"))
        deadline = time.monotonic() + 10
        while srv.engine.snapshot():
            assert time.monotonic() < deadline, srv.engine.snapshot()
            time.sleep(0.05)
