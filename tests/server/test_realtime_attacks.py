"""The Realtime endpoint against bad and hostile clients: malformed JSON, unknown events, base64 that is not base64,
audio before session.update, binary frames, a 20 MB event, 393 s of G.711 in one append, a flood then a vanished
peer, slot holders, a full server. Each gets an ``error`` event in OpenAI's shape (and the session goes on) or a clean close, while a bystander
session streams audio beside them and must not notice.

A real server on loopback with the tiny random model (the text is noise; the events are what is tested). Every wait
has a deadline and every failure says what it saw."""
from __future__ import annotations

import base64
import json
import logging
import socket
import threading
import time
import urllib.request
from contextlib import contextmanager

import numpy as np
import pytest
from asr_spec.server.config import KEY_ENV, ServerConfig, redact
from server_proc import in_process, recv, serve
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from asr_spec.streaming.engine import Engine
from asr_spec.transcribe import Transcriber

pytestmark = pytest.mark.slow  # a real server, browser, subprocess or real weights

KEY = "atk-Key_9"
UPDATE = {"type": "session.update", "session": {"type": "transcription", "audio": {"input": {
    "format": {"type": "audio/pcm", "rate": 24000}, "transcription": {"language": "en"}, "turn_detection": None}}}}


def tiny_server(tiny_target, **config):
    return in_process(Engine(Transcriber(tiny_target)), ServerConfig(port=0, api_keys=(KEY,), **config))


@pytest.fixture(scope="module")
def server(tiny_target):
    with tiny_server(tiny_target, max_sessions=8, max_sessions_per_client=8, start_timeout_s=3) as srv:
        yield srv


def open_session(port: int, **kw):
    return connect(f"ws://127.0.0.1:{port}/v1/realtime?intent=transcription", open_timeout=10, close_timeout=5,
                   additional_headers={"Authorization": f"Bearer {KEY}"}, max_size=None, **kw)


def until(ws, seen: list, kind: str, timeout: float = 30.0) -> dict:
    deadline = time.monotonic() + timeout
    while (e := recv(ws, seen, max(0.1, deadline - time.monotonic())))["type"] != kind:
        pass
    return e


def error(ws, seen: list, sent, code: str) -> dict:
    e = recv(ws, seen)
    shown = repr(sent)[:200]
    assert e["type"] == "error" and e["error"]["code"] == code, f"sent {shown}: expected error {code}, got {e}"
    assert set(e["error"]) == {"type", "code", "message", "param", "event_id"} and len(e["error"]["message"]) < 1000
    return e


def append(ws, samples: int = 2400, event_id: str | None = None) -> None:
    tone = (np.sin(np.arange(samples) / 7) * 3000).astype("<i2").tobytes()
    ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": base64.b64encode(tone).decode(),
                        **({"event_id": event_id} if event_id else {})}))


def survives(ws, seen: list) -> None:
    """The session still works: audio, a commit, and its item's completed transcript."""
    for _ in range(5):
        append(ws)
    ws.send(json.dumps({"type": "input_audio_buffer.commit"}))
    committed = until(ws, seen, "input_audio_buffer.committed")
    done = until(ws, seen, "conversation.item.input_audio_transcription.completed", 60)
    assert done["item_id"] == committed["item_id"], (committed, done)


@contextmanager
def bystander(port: int):
    """A session streaming audio in real time beside the attacks; yields a check that it noticed nothing."""
    seen: list = []
    stop = threading.Event()
    failures: list = []
    ws = open_session(port)
    recv(ws, seen)
    ws.send(json.dumps(UPDATE))
    until(ws, seen, "session.updated")
    gaps: list[float] = []

    def stream():
        try:
            last = time.monotonic()
            while not stop.is_set():
                append(ws)  # 100 ms
                time.sleep(0.1)
                gaps.append(time.monotonic() - last)
                last = time.monotonic()
        except Exception as e:  # noqa: BLE001 - reported by the check
            failures.append(e)

    sender = threading.Thread(target=stream, daemon=True)
    sender.start()

    def check():
        deadline = time.monotonic() + 10
        while len(gaps) < 20 and time.monotonic() < deadline:  # at least 2 s of audio beside the attack
            time.sleep(0.1)
        stop.set()
        sender.join(10)
        assert not failures, f"the bystander's sending failed: {failures}"
        ws.send(json.dumps({"type": "input_audio_buffer.commit", "event_id": "bystander"}))
        committed = until(ws, seen, "input_audio_buffer.committed", 30)
        while until(ws, seen, "conversation.item.input_audio_transcription.completed", 60)["item_id"] != \
                committed["item_id"]:
            pass
        errors = [e for e in seen if e["type"] == "error"]
        assert not errors, f"the bystander got errors: {errors}"
        assert max(gaps) < 2.0, f"the bystander's audio was held up {max(gaps):.1f} s"
    try:
        yield check
    finally:
        ws.close()


def test_bad_events_get_errors_and_the_session_goes_on(server):
    seen: list = []
    with bystander(server.port) as noticed_nothing, open_session(server.port) as ws:
        assert recv(ws, seen)["type"] == "session.created"
        append(ws, event_id="too-early")
        assert error(ws, seen, "append first", "session_not_configured")["error"]["event_id"] == "too-early"
        ws.send(json.dumps({"type": "input_audio_buffer.commit"}))
        error(ws, seen, "commit first", "session_not_configured")
        ws.send(json.dumps(UPDATE))
        until(ws, seen, "session.updated")
        cases = [("{", "invalid_json"), ("[" * 100_000, "invalid_json"), ("1" * 5000, "invalid_json"),
                 ("[1, 2]", "missing_required_parameter"), ('{"type": 7}', "missing_required_parameter"),
                 ('{"type": "response.create"}', "invalid_value"), ('{"type": "x' + "y" * 100_000 + '"}', "invalid_value"),
                 ('{"type": "input_audio_buffer.append", "audio": "%%%%"}', "invalid_value"),
                 ('{"type": "input_audio_buffer.append", "audio": "AAA"}', "invalid_value"),
                 ('{"type": "input_audio_buffer.append", "audio": "AAAA"}', "invalid_value"),  # 3 bytes: half a sample
                 ('{"type": "input_audio_buffer.append"}', "missing_required_parameter"),
                 ('{"type": "input_audio_buffer.append", "audio": [1]}', "invalid_type"),
                 ('{"type": "session.update", "session": {"type": "realtime"}}', "invalid_value"),
                 ('{"type": "session.update", "session": {"type": "transcription", "' + "k" * 100_000 + '": 1}}',
                  "unknown_parameter"),
                 ('{"type": "session.update"}', "missing_required_parameter"),
                 # a megabyte prompt, or a model name of 100k characters: refused where they enter
                 (json.dumps({"type": "session.update", "session": {"type": "transcription", "audio": {"input": {
                     "transcription": {"prompt": "word " * 200_000}}}}}), "string_above_max_length"),
                 (json.dumps({"type": "session.update", "session": {"type": "transcription", "audio": {"input": {
                     "transcription": {"model": "m" * 100_000}}}}}), "string_above_max_length"),
                 ('{"type": "input_audio_buffer.commit", "event_id": {"a": 1}}', "invalid_type")]
        for text, code in cases:
            ws.send(text)
            e = error(ws, seen, text, code)
            assert "y" * 100 not in e["error"]["message"] and "k" * 100 not in e["error"]["message"], e
        ws.send(b"\x00\x01" * 100)  # binary: not part of the Realtime API
        error(ws, seen, "binary", "invalid_value")
        ws.send(json.dumps({"type": "input_audio_buffer.commit", "event_id": "empty"}))
        assert error(ws, seen, "empty commit", "input_audio_buffer_commit_empty")["error"]["event_id"] == "empty"
        survives(ws, seen)
        noticed_nothing()


def test_a_20_mb_event_closes_cleanly_and_others_go_on(server):
    seen: list = []
    with bystander(server.port) as noticed_nothing:
        with open_session(server.port) as ws:
            recv(ws, seen)
            ws.send(json.dumps(UPDATE))
            until(ws, seen, "session.updated")
            big = base64.b64encode(bytes(15 * 1024 * 1024)).decode()  # 20 MB of JSON
            try:
                ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": big}))
                ws.recv(timeout=20)
                pytest.fail("the server answered a 20 MB event instead of closing")
            except ConnectionClosed as e:
                assert e.rcvd is not None and e.rcvd.code == 1009, e  # message too big
        noticed_nothing()


@contextmanager
def responsiveness(port: int):
    """While the block runs, GET /health and a second session's error round trip (an unknown event: answered without
    the engine) are timed every 50 ms; yields a function that stops and returns the slowest of each."""
    health: list[float] = []
    pings: list[float] = []
    failures: list = []
    stop = threading.Event()
    ws = open_session(port)
    recv(ws, [])

    def probe(measure, times: list[float]) -> None:
        try:
            while not stop.is_set():
                began = time.monotonic()
                measure()
                times.append(time.monotonic() - began)
                time.sleep(0.05)
        except Exception as e:  # noqa: BLE001 - reported by the check
            failures.append(e)

    def get_health() -> None:
        assert urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=30).read() == b"ok\n"

    def ping() -> None:
        ws.send('{"type": "ping"}')
        assert json.loads(ws.recv(timeout=30))["error"]["code"] == "invalid_value"

    probes = [threading.Thread(target=probe, args=(f, t), daemon=True) for f, t in ((get_health, health), (ping, pings))]
    for t in probes:
        t.start()

    def slowest() -> tuple[float, float]:
        stop.set()
        for t in probes:
            t.join(40)
        assert not failures, f"a probe failed: {failures!r}"
        assert len(health) >= 5 and len(pings) >= 5, f"too few probes: {len(health)} /health, {len(pings)} pings"
        return max(health), max(pings)
    try:
        yield slowest
    finally:
        stop.set()
        ws.close()


def test_393_s_of_g711_in_one_append_is_refused_and_stalls_no_one(tiny_dir):
    """One append just under the 4 MiB message limit holds 393 s of G.711: decoded, resampled and fed on the event
    loop, it stopped /health and every session for seconds (6.6 s in the security review). It is refused at once now
    (at most 8 s per append; the session goes on), and what is accepted is decoded and fed off the event loop: six
    full appends in a row (48 s, beyond the backlog limit, voice detection on) are all transcribed, while /health and
    another session's events keep answering within 1 s and a bystander streaming audio notices nothing.
    `asr_spec serve` as it runs (one torch thread), with the tiny random model."""
    with serve("--model", str(tiny_dir), "--no-draft", "--threads", "1", "--max-sessions", "4",
               "--max-sessions-per-client", "4", env={KEY_ENV: KEY}) as url:
        port = int(url.rsplit(":", 1)[1])
        seen: list = []
        with bystander(port) as noticed_nothing, responsiveness(port) as slowest, open_session(port) as ws:
            recv(ws, seen)
            ws.send(json.dumps({"type": "session.update", "session": {"type": "transcription", "audio": {"input": {
                "format": {"type": "audio/pcmu"}, "transcription": {"language": "en"}}}}}))  # server VAD: on
            until(ws, seen, "session.updated")
            size = (ServerConfig.max_message_bytes - 200) // 4 * 3  # G.711: a byte per 8 kHz sample
            big = json.dumps({"type": "input_audio_buffer.append", "event_id": "big",
                              "audio": base64.b64encode(np.random.default_rng(0).bytes(size)).decode()})
            assert len(big) < ServerConfig.max_message_bytes and size / 8000 > 390
            sent = time.monotonic()
            ws.send(big)
            e = error(ws, seen, f"{size / 8000:.0f} s of audio/pcmu", "invalid_value")
            took = time.monotonic() - sent
            assert e["error"]["event_id"] == "big" and e["error"]["param"] == "audio", e
            assert "at most 8 s" in e["error"]["message"] and "393.2 s" in e["error"]["message"], e
            assert took < 2.0, f"the refusal took {took:.1f} s"
            silence = base64.b64encode(b"\xff" * 64000).decode()  # mu-law 0xFF is 0: 8 s, the most one append holds
            for _ in range(6):
                ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": silence}))
            ws.send(json.dumps({"type": "input_audio_buffer.commit"}))
            done = until(ws, seen, "conversation.item.input_audio_transcription.completed", 120)
            assert done["usage"]["seconds"] == pytest.approx(48.0, abs=0.1), f"audio lost or added: {done}"
            assert [x for x in seen if x["type"] == "error"] == [e], f"errors besides the refusal: {seen}"
            health, ping = slowest()
            assert health < 1.0, f"/health took up to {health:.2f} s"
            assert ping < 1.0, f"another session's error round trip took up to {ping:.2f} s"
            noticed_nothing()


def test_a_flood_then_a_vanished_peer_leaves_the_server_serving(server):
    with bystander(server.port) as noticed_nothing:
        ws = open_session(server.port)
        recv(ws, [])
        ws.send(json.dumps(UPDATE))

        def flood():  # never reads: the server's errors back up, then its reads stop, then this send blocks
            try:
                for i in range(20_000):
                    ws.send('{"type": "bogus"}' if i % 2 else json.dumps({
                        "type": "input_audio_buffer.append", "audio": base64.b64encode(bytes(480)).decode()}))
            except Exception:  # noqa: BLE001 - the socket is pulled away below
                pass

        flooder = threading.Thread(target=flood, daemon=True)
        flooder.start()
        time.sleep(4)
        ws.socket.shutdown(socket.SHUT_RDWR)  # the peer vanishes without a close frame
        ws.socket.close()
        flooder.join(10)
        noticed_nothing()
    deadline = time.monotonic() + 10
    while server.connections and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not server.connections and not server.shared.sessions, "the vanished sessions still hold slots"


def test_slot_holders_are_closed_and_a_full_server_says_so(tiny_target, caplog):
    with tiny_server(tiny_target, max_sessions=2, max_sessions_per_client=2, start_timeout_s=1) as srv:
        seen: list = []
        with open_session(srv.port) as ws:  # never configures its session
            recv(ws, seen)
            e = error(ws, seen, "nothing", "start_timeout")
            assert "session.update" in e["error"]["message"], e
            with pytest.raises(ConnectionClosed) as info:
                ws.recv(timeout=5)
            assert info.value.rcvd.code == 1008
        url = f"ws://127.0.0.1:{srv.port}/v1/realtime?intent=transcription"
        with caplog.at_level(logging.DEBUG, logger="uvicorn.access"), \
                caplog.at_level(logging.DEBUG, logger="uvicorn.error"), caplog.at_level(logging.DEBUG, logger="asr_spec"):
            holders = [connect(url, subprotocols=["realtime", f"openai-insecure-api-key.{KEY}"], open_timeout=10)
                       for _ in range(2)]
            for h in holders:
                h.send(json.dumps(UPDATE))
                until(h, seen, "session.updated")
            with open_session(srv.port) as ws:
                e = error(ws, seen, "a third session", "server_full")
                assert e["error"]["type"] == "server_error", e
                with pytest.raises(ConnectionClosed) as info:
                    ws.recv(timeout=5)
                assert info.value.rcvd.code == 1013
            for h in holders:
                h.close()
    leaks = [line for line in caplog.text.splitlines() if KEY in line]
    assert not leaks, f"the API key is in the log: {leaks}"
    assert redact(f"Sec-WebSocket-Protocol: realtime, openai-insecure-api-key.{KEY}") == \
        "Sec-WebSocket-Protocol: realtime, openai-insecure-api-key.***"
