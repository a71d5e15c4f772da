"""`asr_spec serve` against bad input: start fields of the wrong type, JSON nested too deeply, float audio out of
range, huge field names, HTTP methods, /metrics without the key, the key in logs, a client's mistakes in the log
(text that is not UTF-8, a refused handshake), SIGINT/SIGTERM.

Real servers on loopback with the tiny random model: one in this process for the protocol and HTTP checks, and
`asr_spec serve` subprocesses for the signals. Every wait has a deadline and every failure says what it saw.
"""
from __future__ import annotations

import asyncio
import base64
import http.client
import json
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
from asr_spec.server.app import Server
from asr_spec.server.config import ServerConfig, redact
from conftest import default_sigint
from server_proc import free_port, recv, wait_serving
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import connect

from asr_spec.streaming.engine import Engine
from asr_spec.transcribe import Transcriber

pytestmark = pytest.mark.slow  # a real server, browser, subprocess or real weights

KEY = "s3cret-Key_42"
AUTH = {"Authorization": f"Bearer {KEY}"}
MAX_ECHO = 1000  # an error message that echoes a client's value stays well under this


@pytest.fixture(scope="module")
def server(tiny_target):
    """An in-process server with an API key; yields its port."""
    srv = Server(Engine(Transcriber(tiny_target)), ServerConfig(port=0, api_keys=(KEY,), idle_timeout_s=30))
    ready = threading.Event()
    thread = threading.Thread(target=lambda: asyncio.run(srv.serve_forever(ready)), daemon=True)
    thread.start()
    assert ready.wait(60), "the server did not start within 60 s"
    try:
        yield srv.port
    finally:
        srv.stop()
        thread.join(15)
        assert not thread.is_alive(), "the server did not stop within 15 s of stop()"


def session(port: int, query: str = ""):
    headers = {} if query else AUTH
    return connect(f"ws://127.0.0.1:{port}/{query}", additional_headers=headers, open_timeout=10, close_timeout=5,
                   max_size=2 ** 24)


def expect(ws, seen: list, sent, code: str) -> dict:
    e = recv(ws, seen)
    shown = sent if len(repr(sent)) < 200 else f"{repr(sent)[:200]}..."
    assert e.get("type") == "error" and e.get("code") == code, f"sent {shown}: expected error {code}, got {e}"
    return e


def start(ws, seen: list, **fields) -> dict:
    ws.send(json.dumps({"type": "start", **fields}))
    e = recv(ws, seen)
    assert e["type"] == "ready", f"a valid start {fields} got {e}"
    return e


def close(ws, seen: list, timeout: float = 60.0) -> dict:
    """Send ``close``; return the ``closed`` event (the session survived everything before)."""
    ws.send(json.dumps({"type": "close"}))
    deadline = time.monotonic() + timeout
    while (e := recv(ws, seen, max(0.1, deadline - time.monotonic())))["type"] != "closed":
        assert e["type"] in ("partial", "final"), f"unexpected event while closing: {e}"
    return e


# --- start validation ----------------------------------------------------------------------------------------
def test_channels_must_be_a_real_integer(server):
    seen: list = []
    with session(server) as ws:
        for bad in (True, False, 1.0, 2.0, 1.5, 0, 3, -1, "2", None, [1]):
            ws.send(json.dumps({"type": "start", "channels": bad}))
            e = expect(ws, seen, {"channels": bad}, "bad_channels")
            assert "integer 1 or 2" in e["message"], e
        e = start(ws, seen, channels=2)
        assert e["channels"] == 2 and type(e["channels"]) is int, e
        assert close(ws, seen)["audio_seconds"] == 0


def test_start_values_of_the_wrong_type_get_their_error_codes(server):
    seen: list = []
    cases = [({"encoding": []}, "bad_encoding"), ({"encoding": {}}, "bad_encoding"), ({"encoding": 16}, "bad_encoding"),
             ({"encoding": None}, "bad_encoding"), ({"encoding": ["pcm_s16le"]}, "bad_encoding"),
             ({"task": []}, "bad_task"), ({"task": {"a": 1}}, "bad_task"), ({"language": [[]]}, "bad_language"),
             ({"language": 7}, "bad_language"), ({"sample_rate": []}, "bad_sample_rate"),
             ({"sample_rate": 16000.0}, "bad_sample_rate"), ({"sample_rate": True}, "bad_sample_rate"),
             ({"interim_results": "yes"}, "bad_start"), ({"interim_results": 1}, "bad_start"),
             ({"word_timestamps": "true"}, "bad_start"), ({"word_timestamps": None}, "bad_start"),
             ({"hotwords": ["Lübeck"]}, "bad_start"), ({"hotwords": 7}, "bad_start"), ({"hotwords": "x" * 1001}, "bad_start")]
    with session(server) as ws:
        for fields, code in cases:
            ws.send(json.dumps({"type": "start", **fields}))
            expect(ws, seen, fields, code)
        start(ws, seen, encoding="f32le")
        close(ws, seen)


def test_json_nested_too_deeply_is_bad_json_and_the_session_survives(server):
    seen: list = []
    deep_array = "[" * 10_000
    deep_valid = "[" * 100_000 + "]" * 100_000  # well-formed, nested beyond the parser's recursion limit
    huge_int = '{"type": "start", "sample_rate": ' + "9" * 5000 + "}"  # Python refuses ints over 4300 digits
    with session(server) as ws:
        for text in (deep_array, deep_valid, huge_int, '{"type": ' * 5000):
            ws.send(text)
            expect(ws, seen, text, "bad_json")
        nested = {"type": "start", "language": json.loads("[" * 200 + "]" * 200)}  # parses; not a language
        ws.send(json.dumps(nested))
        e = expect(ws, seen, "a 200-deep language", "bad_language")
        assert len(e["message"]) < MAX_ECHO, e
        start(ws, seen)
        ws.send(deep_array)  # after start as well
        expect(ws, seen, deep_array, "bad_json")
        close(ws, seen)


def test_unknown_fields_and_values_are_cut_in_error_messages(server):
    seen: list = []
    megabyte = "x" * 1_000_000
    with session(server) as ws:
        ws.send(json.dumps({"type": "start", megabyte: 1}))
        e = expect(ws, seen, "a 1 MB field name", "bad_start")
        assert len(e["message"]) < MAX_ECHO and "x" * 64 in e["message"] and "x" * 65 not in e["message"], \
            f"message of {len(e['message'])} characters: {e['message'][:300]}"
        assert "1000000 characters" in e["message"], e["message"][:300]
        many = {"type": "start", **{f"f{i:04d}": i for i in range(1000)}}
        ws.send(json.dumps(many))
        e = expect(ws, seen, "1000 unknown fields", "bad_start")
        assert len(e["message"]) < MAX_ECHO and "995 more" in e["message"], e["message"][:300]
        ws.send(json.dumps({"type": "start", "colour": "red"}))
        assert '"colour"' in expect(ws, seen, "colour", "bad_start")["message"]
        ws.send(json.dumps({"type": megabyte}))
        assert len(expect(ws, seen, "a 1 MB type", "unknown_type")["message"]) < MAX_ECHO
        ws.send(json.dumps({"type": "start", "language": megabyte}))
        assert len(expect(ws, seen, "a 1 MB language", "bad_language")["message"]) < MAX_ECHO
        ws.send(json.dumps({"type": "start", "encoding": megabyte}))
        assert len(expect(ws, seen, "a 1 MB encoding", "bad_encoding")["message"]) < MAX_ECHO
        start(ws, seen)
        close(ws, seen)


# --- audio frames --------------------------------------------------------------------------------------------
def test_float_frames_out_of_range_or_not_finite_are_dropped(server):
    seen: list = []
    frame = 1600  # 0.1 s per channel at 16 kHz

    def stereo(left: float, right: float) -> bytes:
        x = np.zeros((frame, 2), dtype="<f4")
        x[10] = (left, right)
        return x.tobytes()

    bad = {"1.5": stereo(1.5, 0.0), "-1.0001": stereo(0.0, -1.0001), "nan": stereo(np.nan, 0.0),
           "inf": stereo(0.0, np.inf), "-inf": stereo(-np.inf, -np.inf), "1e38 both": stereo(1e38, 1e38),
           "2 and -2 (each channel out of range, although their mix is 0)": stereo(2.0, -2.0)}
    with session(server) as ws:
        start(ws, seen, encoding="f32le", channels=2)
        ws.send(stereo(0.0, 0.0))
        for name, data in bad.items():
            ws.send(data)
            e = expect(ws, seen, f"a frame with {name}", "bad_frame")
            assert "dropped" in e["message"], e
        ws.send(stereo(1.0, -1.0))  # the full scale is allowed
        closed = close(ws, seen)
        assert [e for e in seen if e["type"] == "error"] == seen[1:1 + len(bad)], f"unexpected errors: {seen}"
        assert closed["audio_seconds"] == pytest.approx(0.2, abs=1e-3), f"the bad frames were not dropped: {closed}"


# --- HTTP ----------------------------------------------------------------------------------------------------
def http_request(port: int, method: str, path: str, headers: dict | None = None, body: bytes | None = None):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        r = conn.getresponse()
        return r.status, r.headers, r.read()  # case-insensitive header names
    finally:
        conn.close()


def test_http_methods_other_than_get_and_head_get_405(server):
    for method in ("POST", "PUT", "DELETE", "PATCH", "OPTIONS", "TRACE"):
        for path in ("/healthz", "/metrics", "/", "/static/app.js", "/nowhere"):
            status, headers, body = http_request(server, method, path, AUTH)
            assert status == 405 and headers.get("Allow") == "GET, HEAD", f"{method} {path}: {status} {headers} {body!r}"
    status, headers, body = http_request(server, "HEAD", "/healthz")
    assert (status, body, headers.get("Content-Length")) == (200, b"", "3"), f"HEAD /healthz: {status} {headers} {body!r}"
    status, headers, body = http_request(server, "HEAD", "/metrics", AUTH)
    assert status == 200 and body == b"" and int(headers["Content-Length"]) > 0, f"HEAD /metrics: {status} {headers}"
    assert http_request(server, "HEAD", "/metrics")[0] == 401
    assert http_request(server, "GET", "/healthz")[:3:2] == (200, b"ok\n")
    # a request with a body: websockets' HTTP parser refuses it (the connection is closed without a response)
    try:
        status = http_request(server, "POST", "/healthz", body=b"x=1")[0]
    except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError):
        status = None
    assert status in (None, 400, 405), f"POST with a body got {status}"


def test_metrics_needs_the_api_key_and_healthz_does_not(server):
    for headers, path in (({}, "/metrics"), ({"Authorization": "Bearer nope"}, "/metrics"), ({}, "/metrics?api_key=nope"),
                          ({"Authorization": KEY}, "/metrics"), ({}, "/metrics?api_key=")):
        status, got, body = http_request(server, "GET", path, headers)
        assert status == 401 and b"sessions" not in body, f"GET {path} with {headers}: {status} {body[:200]!r}"
        assert got.get("WWW-Authenticate") == "Bearer", got
    for headers, path in ((AUTH, "/metrics?format=json"), ({}, f"/metrics?api_key={KEY}&format=json")):
        status, _, body = http_request(server, "GET", path, headers)
        assert status == 200, f"GET {path} with {headers}: {status} {body[:200]!r}"
        assert {"sessions", "audio_seconds", "rtf"} <= json.loads(body).keys(), body[:200]
    status, _, body = http_request(server, "GET", "/metrics", AUTH)
    assert status == 200 and b"\nasr_spec_sessions_active " in body, body[:200]
    status, _, body = http_request(server, "GET", "/healthz")
    assert (status, body) == (200, b"ok\n"), f"/healthz without a key: {status} {body!r}"


def test_the_bearer_scheme_name_is_case_insensitive(server):
    """RFC 9110: ``bearer KEY`` and ``BEARER KEY`` are ``Bearer KEY``, on HTTP and on the WebSocket handshake."""
    for scheme in ("bearer", "BEARER", "BeArEr"):
        status, _, body = http_request(server, "GET", "/metrics", {"Authorization": f"{scheme} {KEY}"})
        assert status == 200, f"Authorization: {scheme} KEY got {status} {body[:200]!r}"
        with connect(f"ws://127.0.0.1:{server}/", additional_headers={"Authorization": f"{scheme} {KEY}"},
                     open_timeout=10, close_timeout=5) as ws:
            seen: list = []
            start(ws, seen)
            close(ws, seen)
    assert http_request(server, "GET", "/metrics", {"Authorization": f"Basic {KEY}"})[0] == 401


# --- secrets in logs -----------------------------------------------------------------------------------------
def test_redact_hides_keys_in_urls_and_headers():
    assert redact(f"GET /?api_key={KEY}&x=1 HTTP/1.1") == "GET /?api_key=***&x=1 HTTP/1.1"
    assert redact(f"ws://h:1/metrics?a=2&API_KEY={KEY}") == "ws://h:1/metrics?a=2&API_KEY=***"
    assert redact(f"< Authorization: Bearer {KEY}") == "< Authorization: Bearer ***"
    assert redact(f"/?x=1&my_api_key={KEY}#top") == "/?x=1&my_api_key=***#top"
    assert redact(f"/?api%5Fkey={KEY}") == "/?api%5Fkey=***"
    assert redact(f"path='/?api_key={KEY}'") == "path='/?api_key=***'"
    assert redact("nothing to hide: api_keys are secret") == "nothing to hide: api_keys are secret"


def test_api_key_never_reaches_the_logs(server, caplog):
    seen: list = []
    with caplog.at_level(logging.DEBUG, logger="uvicorn.access"), caplog.at_level(logging.DEBUG, logger="uvicorn.error"), \
            caplog.at_level(logging.DEBUG, logger="asr_spec"):
        with session(server, f"?api_key={KEY}") as ws:  # the browser way: the key in the URL
            start(ws, seen)
            close(ws, seen)
        with session(server) as ws:  # the header way
            start(ws, seen)
            close(ws, seen)
        assert http_request(server, "GET", f"/metrics?api_key={KEY}")[0] == 200
        log = logging.getLogger("asr_spec.serve")
        log.warning("request %s failed", f"/x?api_key={KEY}&y=1")
        try:
            raise ValueError(f"cannot open ws://127.0.0.1/?api_key={KEY}")
        except ValueError:
            log.exception("failed")
    text = caplog.text
    assert "GET /metrics?api_key=*** HTTP/1.1" in text and '"WebSocket /?api_key=***" [accepted]' in text, \
        f"the requests were not logged as expected (uvicorn's access and connection logs):\n{text[-3000:]}"
    leaks = [line for line in text.splitlines() if KEY in line]
    assert not leaks, f"the API key is in the log: {leaks}"


# --- a client's mistakes in the log ---------------------------------------------------------------------------
def test_text_that_is_not_utf8_and_a_refused_handshake_log_one_warning_line_each(server, caplog):
    """A client's mistake is not a server error: each is one warning line, without a traceback (uvicorn logged the
    first as an error with its traceback, and a refused handshake as "ASGI callable returned without completing
    handshake", an error)."""
    with caplog.at_level(logging.WARNING):
        s, rest = _handshake(server)
        text = b"\xff\xfe not UTF-8"
        s.sendall(bytes([0x81, 0x80 | len(text)]) + bytes(4) + text)  # a masked text frame (mask 0: payload as is)
        code, frames = _close_code(s, rest, 10)
        s.close()
        assert code == 1007 and not frames, (code, frames)  # invalid frame payload data
        with pytest.raises(InvalidStatus) as refused:
            session(server, "?api_key=not-the-Key_7")
        assert refused.value.response.status_code == 401
        time.sleep(1.0)  # uvicorn's own line would follow the app's return within milliseconds
    lines = [(r.levelname, r.getMessage(), r.exc_info, r.exc_text) for r in caplog.records]
    assert [line[0] for line in lines] == ["WARNING", "WARNING"], f"log records: {lines}"
    assert all("\n" not in message and not exc and not exc_text for _, message, exc, exc_text in lines), lines
    assert "not UTF-8" in lines[0][1] and "401" in lines[1][1] and "not-the-Key" not in lines[1][1], lines


def _handshake(port: int) -> tuple[socket.socket, bytes]:
    """A raw socket that has completed a WebSocket handshake (with the key); and what it read after the head."""
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    key = base64.b64encode(os.urandom(16)).decode()
    s.sendall(f"GET /?api_key={KEY} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUpgrade: websocket\r\n"
              f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n".encode())
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = s.recv(4096)
        assert chunk, f"the server closed the connection during the handshake: {data!r}"
        data += chunk
    head, rest = data.split(b"\r\n\r\n", 1)
    assert head.startswith(b"HTTP/1.1 101"), head
    return s, rest


# --- SIGINT / SIGTERM ----------------------------------------------------------------------------------------
def _frozen_client(port: int) -> tuple[socket.socket, bytes]:
    """A WebSocket client that completes the handshake, then never reads nor answers (a hung peer)."""
    s, rest = _handshake(port)
    start = json.dumps({"type": "start"}).encode()
    s.sendall(bytes([0x81, 0x80 | len(start)]) + bytes(4) + start)  # a masked text frame (mask 0: payload as is)
    return s, rest


def _close_code(s: socket.socket, data: bytes, timeout: float) -> tuple[int | None, list]:
    """Read server frames from ``s`` (after ``data``) until a close frame; its code, and the frames before it."""
    deadline, frames = time.monotonic() + timeout, []
    while True:
        if len(data) >= 2:
            opcode, n, at = data[0] & 0x0F, data[1] & 0x7F, 2
            if n >= 126:
                size = 2 if n == 126 else 8
                n, at = (int.from_bytes(data[2:2 + size], "big"), 2 + size) if len(data) >= 2 + size else (None, 0)
            if n is not None and len(data) >= at + n:
                payload, data = data[at:at + n], data[at + n:]
                if opcode == 0x8:
                    return (int.from_bytes(payload[:2], "big") if len(payload) >= 2 else None), frames
                frames.append((opcode, payload[:200]))
                continue
        s.settimeout(max(0.01, deadline - time.monotonic()))
        try:
            chunk = s.recv(65536)
        except (TimeoutError, ConnectionResetError) as e:
            pytest.fail(f"no close frame for the frozen client ({e!r}); frames: {frames}")
        if not chunk:
            pytest.fail(f"the frozen client's connection ended without a close frame; frames: {frames}")
        data += chunk


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_signal_closes_sessions_with_1001_and_exits_0(tiny_dir, tmp_path, sig):
    """`asr_spec serve` on SIGINT or SIGTERM: every session's buffered audio is decoded and its finals and ``closed``
    sent, then it is closed with 1001 (going away); a peer that does not answer the close is dropped after 3 s, the
    inference thread is joined, and the process exits with 0."""
    port = free_port()
    err_path = tmp_path / "stderr.txt"
    with open(err_path, "w") as err:
        proc = subprocess.Popen([sys.executable, "-m", "asr_spec.cli", "serve", "--port", str(port), "--model",
                                 str(tiny_dir), "--no-draft", "--threads", "1", "--max-sessions", "4", "--api-key", KEY],
                                stdout=subprocess.DEVNULL, stderr=err, preexec_fn=default_sigint)
    stderr = lambda: err_path.read_text(errors="replace")  # noqa: E731
    frozen = None
    try:
        wait_serving(port, proc, stderr)
        frozen, frozen_rest = _frozen_client(port)
        seen: list = []
        with session(port) as ws:
            start(ws, seen)
            t = np.arange(32000) / 16000
            ws.send((0.3 * np.sin(2 * np.pi * 220 * t) * 32767).astype("<i2").tobytes())
            time.sleep(0.3)
            signalled = time.monotonic()
            proc.send_signal(sig)
            try:
                while True:
                    seen.append(json.loads(ws.recv(timeout=max(0.1, 10 - (time.monotonic() - signalled)))))
            except TimeoutError:
                pytest.fail(f"the session was not closed within 10 s of {sig.name} (events: {seen})\n{stderr()}")
            except ConnectionClosed as e:
                assert e.rcvd is not None and e.rcvd.code == 1001, f"closed with {e.rcvd} (events: {seen})\n{stderr()}"
        assert [e["type"] for e in seen][-1:] == ["closed"], f"no closed event before 1001: {seen}"
        code, frames = _close_code(frozen, frozen_rest, 2)  # the hung peer gets its closed and 1001 too
        kinds = [re.match(rb'\{"type": "(\w+)"', f).group(1).decode() for _, f in frames]
        assert code == 1001 and kinds[0] == "ready" and kinds[-1] == "closed", (code, frames)
        assert set(kinds[1:-1]) <= {"partial", "final"}, frames
        try:
            code = proc.wait(15)
        except subprocess.TimeoutExpired:
            pytest.fail(f"asr_spec serve still running 15 s after {sig.name}:\n{stderr()}")
        took = time.monotonic() - signalled
        log = stderr()
        assert code == 0, f"exit code {code} after {sig.name}:\n{log}"
        assert took < 10, f"took {took:.1f} s to exit after {sig.name}:\n{log}"
        assert "Traceback" not in log and "Fatal Python error" not in log, log
        assert "stopped: sessions closed, inference thread joined" in log, log
        assert KEY not in log, log
        assert "did not close within" in log, f"the hung peer was not dropped after the close timeout:\n{log}"
    finally:
        if frozen is not None:
            frozen.close()
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


# --- one guard over every route -------------------------------------------------------------------------------
def test_every_route_but_the_declared_public_ones_refuses_a_request_without_the_key(server, tiny_target):
    """The app's routes, enumerated: each that auth.PUBLIC does not declare refuses a request (every method it
    answers) or a WebSocket handshake without the key and with a wrong one (401) and takes the key; the public ones
    answer without one. A route someone adds is guarded unless declared public."""
    from asr_spec.server.auth import is_public
    from starlette.routing import Mount, Route, WebSocketRoute

    routes = Server(Engine(Transcriber(tiny_target)), ServerConfig(api_keys=(KEY,))).routes
    checked = {"http": 0, "websocket": 0, "public": 0}
    for route in routes:
        if isinstance(route, WebSocketRoute):
            assert not is_public("websocket", route.path), route.path
            for query in ("", "?api_key=not-the-Key_7"):
                with pytest.raises(InvalidStatus) as refused:
                    connect(f"ws://127.0.0.1:{server}{route.path}{query}", open_timeout=10, close_timeout=5)
                assert refused.value.response.status_code == 401, f"WebSocket {route.path}{query}"
            with connect(f"ws://127.0.0.1:{server}{route.path}", additional_headers=AUTH, open_timeout=10,
                         close_timeout=5):
                pass  # let in with the key
            checked["websocket"] += 1
            continue
        assert isinstance(route, (Route, Mount)), f"a route of a kind this test does not know: {route!r}"
        path = route.path + "/pcm-worklet.js" if isinstance(route, Mount) else route.path
        methods = ["GET"] if isinstance(route, Mount) else sorted(route.methods)
        for method in methods:
            body = b"" if method == "POST" else None
            if is_public("http", path):
                status = http_request(server, method, path, body=body)[0]
                assert status == 200, f"{method} {path} (public) without a key: {status}"
                checked["public"] += 1
                continue
            for headers in ({}, {"Authorization": "Bearer nope"}):
                status, got, answer = http_request(server, method, path, headers, body)
                assert status == 401 and got.get("WWW-Authenticate") == "Bearer", \
                    f"{method} {path} with {headers}: {status} {answer[:200]!r}"
            status = http_request(server, method, path, AUTH, body)[0]
            assert status != 401, f"{method} {path} with the key: {status}"
            checked["http"] += 1
    assert checked["websocket"] == 2 and checked["http"] >= 4 and checked["public"] >= 5, checked
    metrics = http_request(server, "GET", "/metrics", AUTH)[2].decode()
    refused = re.search(r'^asr_spec_uploads_total\{outcome="refused",status="401"\} (\S+)$', metrics, re.M)
    assert refused and float(refused.group(1)) >= 4, "the uploads refused for their key are not counted"
