"""``asr_spec serve``: streaming transcription over WebSockets (protocol: docs/protocol.md).

One :class:`~asr_spec.streaming.engine.Engine` (one model) serves every session. Its inference thread
decodes whichever streams are due, batched, off the event loop; events go back to each session's
queue. HTTP on the same port: ``/healthz``, ``/metrics``, the browser page at ``/`` and the
OpenAI-compatible ``POST /v1/audio/transcriptions`` and ``/v1/audio/translations`` (openai_api.py).
"""
from __future__ import annotations

import asyncio
import hmac
import json
import logging
import re
import signal
import socket
import threading
import time
from dataclasses import dataclass
from http import HTTPStatus
from pathlib import Path

from websockets.asyncio.server import ServerConnection, serve
from websockets.datastructures import Headers
from websockets.exceptions import ConnectionClosed
from websockets.protocol import State
from websockets.http11 import Request, Response

from transformers.models.whisper.tokenization_whisper import LANGUAGES

from ..audio import SAMPLE_RATE
from ..decoding.speculative import acceptance
from ..streaming.engine import Engine
from ..streaming.stream import StreamConfig
from .openai_api import MAX_UPLOAD_BYTES, PATHS, ApiError, FileWorker, parse_form, parse_upload, render
from .protocol import AudioDecoder, ProtocolError, parse_message, parse_start

log = logging.getLogger("asr_spec.serve")
STATIC = Path(__file__).parent / "static"
FLUSH_TIMEOUT_S = 120.0
SHUTDOWN_CLOSE_S = 3.0  # on SIGINT/SIGTERM, sessions get this long to complete the closing handshake (1001)
SHUTDOWN_JOIN_S = 30.0  # and the inference thread this long to finish the decode it is running
HTTP_METHODS = ("GET", "HEAD")
HEAD_TIMEOUT_S = 10.0  # a connection must send a complete request head within this (WebSocket or HTTP)
UPLOAD_TIMEOUT_S = 120.0  # an API request's body must have arrived within this
MAX_HEAD_BYTES = 64 * 1024
DRAIN_FACTOR = 4  # a body up to this many times the limit is read (and dropped) before its 413 is sent
RATE_WINDOW_S = 30.0
RECEIVE_BUFFER_BYTES = 64 * 1024  # about 2 s of 16 kHz 16-bit audio


@dataclass(frozen=True)
class ServerConfig:
    host: str = "127.0.0.1"
    port: int = 8765
    max_sessions: int = 8
    api_key: str | None = None
    max_frame_bytes: int = 256 * 1024  # larger audio frames get an error event and are dropped
    max_message_bytes: int = 4 * 1024 * 1024  # the connection is closed (1009) beyond this
    idle_timeout_s: float = 60.0  # a connection that sends nothing this long is closed (also how a dead peer is found)
    # keepalive pings (for proxies and NAT); pongs are not awaited: a backpressured client's pong waits behind its
    # unread audio for as long as decoding takes, and the idle timeout finds a dead peer
    ping_interval_s: float = 20.0
    step_s: float = StreamConfig.step_s
    max_backlog_s: float = 40.0  # a session's undecoded audio beyond which its socket is not read (backpressure)
    start_timeout_s: float = 10.0  # a connection must send its start message within this
    min_audio_s_per_30s: float = 1.0  # a started session sending less is closed (trickling connections)


_SECRETS = re.compile(r"(?i)(api(?:_|%5f)key=)[^&\s#'\"]*|(\bauthorization:\s*(?:bearer\s+)?)[^\s'\"]+")


def redact(text: str) -> str:
    """``text`` with API keys hidden: ``api_key=VALUE`` (a URL's query) and ``Authorization: Bearer VALUE``."""
    return _SECRETS.sub(lambda m: (m.group(1) or m.group(2)) + "***", text)


class RedactSecrets(logging.Filter):
    """Logs never show the API key: the message, its exception text and stack are redacted (see :func:`redact`)."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
            if (clean := redact(message)) != message:
                record.msg, record.args = clean, ()
            if record.exc_info and not record.exc_text:
                record.exc_text = logging.Formatter().formatException(record.exc_info)
            if record.exc_text:
                record.exc_text = redact(record.exc_text)
            if record.stack_info:
                record.stack_info = redact(record.stack_info)
        except Exception:  # a malformed record is the handler's to report, as without this filter
            pass
        return True


_REDACT = RedactSecrets()
REDACTED_LOGGERS = ("asr_spec", "asr_spec.serve", "websockets", "websockets.server", "websockets.client")


def install_log_redaction() -> None:
    """Add :class:`RedactSecrets` to the loggers the server and websockets log on, and to the root logger's
    handlers (which every propagated record passes). A logger's filters only see records logged on that very
    logger, hence the list; a handler's see all it emits. Idempotent."""
    for target in [*(logging.getLogger(name) for name in REDACTED_LOGGERS), *logging.getLogger().handlers]:
        if _REDACT not in target.filters:
            target.addFilter(_REDACT)


class Metrics:
    def __init__(self):
        self.sessions_total = 0
        self.refused = 0
        self.audio_s = 0.0
        self.decodes = 0
        self.accepted = 0
        self.rejected = 0
        self.started = time.time()

    def snapshot(self, engine: Engine, sessions: int) -> dict:
        live = engine.snapshot()
        audio = self.audio_s + sum(s["audio_seconds"] for s in live)
        acc = self.accepted + sum(s["accepted"] for s in live)
        rej = self.rejected + sum(s["rejected"] for s in live)
        waits = sorted(engine.queue_wait_s)
        pct = lambda q: round(waits[min(len(waits) - 1, int(q * len(waits)))], 3) if waits else None  # noqa: E731
        return {"sessions": sessions, "sessions_total": self.sessions_total, "refused": self.refused,
                "audio_seconds": round(audio, 3), "busy_seconds": round(engine.busy_s, 3),
                "rtf": round(engine.busy_s / audio, 4) if audio else None,
                "acceptance": round(a, 4) if (a := acceptance(acc, rej)) is not None else None,
                "decodes": engine.decodes,
                "queue_wait_seconds": {"median": pct(0.5), "p90": pct(0.9), "max": waits[-1] if waits else None},
                "streams": [{"backlog_seconds": s["backlog_seconds"], "waiting_seconds": s["waiting_seconds"],
                             "audio_seconds": s["audio_seconds"], "decoded_seconds": s["decoded_seconds"]}
                            for s in live],
                "uptime_seconds": round(time.time() - self.started, 1)}


class _Body:
    """An HTTP request body, held beside websockets (whose parser refuses bodies). Bodies up to ``keep`` bytes are
    kept; a larger one is read and dropped (so that its client reads the 413 instead of a reset)."""

    def __init__(self, length: int | None, keep: int):
        self.length, self.keep = length, keep
        self.data = bytearray()
        self.received = 0
        self.complete = asyncio.Event()
        if not length:
            self.complete.set()

    def feed(self, data: bytes) -> None:
        if self.length is None or self.complete.is_set():
            return
        data = data[:self.length - self.received]
        self.received += len(data)
        if self.length <= self.keep:
            self.data += data
        if self.received >= self.length:
            self.complete.set()


class HttpConnection(ServerConnection):
    """websockets' connection, which also takes HTTP requests with a body (the OpenAI-compatible POSTs): the body
    is taken off here and websockets sees the request head without it. Any request head must be complete within
    ``HEAD_TIMEOUT_S`` (websockets' own open timeout is off: an API request's handshake lasts its transcription)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._head: bytearray | None = bytearray()  # None once the head has been passed on
        self._timer: asyncio.TimerHandle | None = None
        self.body: _Body | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self._timer = self.loop.call_later(HEAD_TIMEOUT_S, self._head_timeout)

    def _head_timeout(self) -> None:
        if self._head is not None and self.transport is not None:
            self.transport.abort()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._timer is not None:
            self._timer.cancel()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self.body is not None:
            self.body.feed(data)
            return
        if self._head is None:
            super().data_received(data)
            return
        self._head += data
        end = self._head.find(b"\r\n\r\n")
        if end < 0 and len(self._head) <= MAX_HEAD_BYTES:
            return
        head, self._head = bytes(self._head), None
        if self._timer is not None:
            self._timer.cancel()
        if end < 0 or not head.startswith(b"POST "):
            super().data_received(head)  # websockets answers (or refuses) it
            return
        kept, length, expect = [], None, False
        for line in head[:end].split(b"\r\n"):
            name, _, value = line.partition(b":")
            name, value = name.strip().lower(), value.strip()
            if name == b"content-length":
                length = int(value) if value.isdigit() and length in (None, int(value)) else -1
            elif name == b"transfer-encoding":
                length = -1  # chunked uploads are refused (411): every HTTP client here sends a length
            elif name == b"expect":
                expect = value.lower() == b"100-continue"
            else:
                kept.append(line)
        self.body = _Body(length if length is not None and length >= 0 else None, MAX_UPLOAD_BYTES + MAX_HEAD_BYTES)
        if expect and self.body.length is not None and self.body.length <= self.body.keep:
            self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        super().data_received(b"\r\n".join(kept) + b"\r\n\r\n")
        self.body.feed(head[end + 4:])


class Server:
    def __init__(self, engine: Engine, config: ServerConfig = ServerConfig(), files: FileWorker | None = None):
        self.engine, self.config, self.files = engine, config, files
        self._live = threading.Event()  # set while live streams are due: uploads wait for them (FileWorker)
        if files is not None:
            files.live = self._live.is_set
        self.sessions: dict[int, "Session"] = {}  # started sessions by stream id
        self.connections = 0
        self.metrics = Metrics()
        self.languages = set(engine.transcriber.vocab.languages) or None
        self.language_names = {code: LANGUAGES.get(code, code) for code in self.languages} if self.languages else None
        self._wake = threading.Event()
        self._stop = threading.Event()
        self.loop: asyncio.AbstractEventLoop | None = None
        self._done: asyncio.Future | None = None
        self.port: int | None = None

    # --- inference thread -----------------------------------------------------------------------------
    def _infer(self) -> None:
        while not self._stop.is_set():
            if not self.engine.pending():
                self._live.clear()
                self._wake.wait(0.02)
                self._wake.clear()
                continue
            self._live.set()
            try:
                out = self.engine.step()
            except Exception:  # never let one bad decode kill the server
                log.exception("decode failed")
                continue
            for sid, events in out.items():
                if (session := self.sessions.get(sid)) is not None and self.loop is not None:
                    try:
                        self.loop.call_soon_threadsafe(session.deliver, events, self.engine.flushes(sid))
                    except RuntimeError:  # the loop closed meanwhile: the server is shutting down
                        return

    def wake(self) -> None:
        """Tell the inference thread that a stream may be due (new audio, a flush)."""
        self._wake.set()

    # --- HTTP -----------------------------------------------------------------------------------------
    def _http(self, connection: ServerConnection, request: Request):
        """Answer plain HTTP requests (None: go on with the WebSocket handshake). GET and HEAD are served, and POST
        on the OpenAI-compatible paths (a coroutine: websockets awaits it); 405 otherwise. A HEAD gets the GET
        response's status and headers without its body."""
        path = request.path.split("?", 1)[0]
        if request.method == "POST" and path in PATHS:
            return self._api(connection, request, PATHS[path])
        if request.method not in HTTP_METHODS:
            response = connection.respond(HTTPStatus.METHOD_NOT_ALLOWED, f"{HTTPStatus.METHOD_NOT_ALLOWED.phrase}: "
                                          f"use {' or '.join(HTTP_METHODS)} (POST on {' and '.join(PATHS)})\n")
            response.headers["Allow"] = ", ".join(HTTP_METHODS)
            return response
        response = self._route(connection, request)
        if response is not None and request.method == "HEAD":
            return Response(response.status_code, response.reason_phrase, response.headers, b"")
        return response

    def _route(self, connection: ServerConnection, request: Request) -> Response | None:
        path = request.path.split("?", 1)[0]
        if path == "/healthz":  # open: load balancers and supervisors probe it without a key
            return connection.respond(HTTPStatus.OK, "ok\n")
        if path == "/metrics":
            if self.config.api_key and not self._authorized(request):
                return _unauthorized(connection)
            body = json.dumps(self.metrics.snapshot(self.engine, len(self.sessions))) + "\n"
            return _respond(HTTPStatus.OK, body, "application/json")
        if request.headers.get("Upgrade", "").lower() != "websocket":
            if path in ("/", "/index.html") and (STATIC / "index.html").is_file():
                return _respond(HTTPStatus.OK, (STATIC / "index.html").read_text(), "text/html; charset=utf-8")
            if path.startswith("/static/") and (f := STATIC / path[len("/static/"):]).is_file() and STATIC in f.resolve().parents:
                kind = {".js": "text/javascript", ".css": "text/css"}.get(f.suffix, "application/octet-stream")
                return _respond(HTTPStatus.OK, f.read_text(), kind)
            return connection.respond(HTTPStatus.NOT_FOUND, "not found\n")
        if self.config.api_key and not self._authorized(request):
            return _unauthorized(connection)
        return None

    async def _api(self, connection: ServerConnection, request: Request, task: str) -> Response:
        """One OpenAI-compatible request: the uploaded file transcribed by the file worker, in the requested
        format; every refusal in OpenAI's error shape."""
        try:
            if self.config.api_key and not self._authorized(request):
                raise ApiError(HTTPStatus.UNAUTHORIZED, "missing or wrong API key (Authorization: Bearer KEY)",
                               code="invalid_api_key")
            if self.files is None:
                raise ApiError(HTTPStatus.NOT_FOUND, "this server does not transcribe files", code="not_found")
            body = getattr(connection, "body", None)
            if body is None or body.length is None:
                raise ApiError(HTTPStatus.LENGTH_REQUIRED, "send the form with a Content-Length (no chunked uploads)")
            too_large = ApiError(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, f"the request is larger than {body.keep} bytes "
                                 f"(files up to {MAX_UPLOAD_BYTES} bytes)", param="file")
            if body.length > DRAIN_FACTOR * body.keep:
                raise too_large  # at once: the client may see the connection closed before it reads this
            try:
                await asyncio.wait_for(body.complete.wait(), UPLOAD_TIMEOUT_S)
            except asyncio.TimeoutError:
                raise ApiError(HTTPStatus.REQUEST_TIMEOUT, f"the request body did not arrive within "
                               f"{UPLOAD_TIMEOUT_S:g} s") from None
            if body.length > body.keep:
                raise too_large  # read and dropped, so that the client reads this answer
            fields, files = parse_form(request.headers.get("Content-Type", ""), bytes(body.data))
            upload = await asyncio.to_thread(parse_upload, task, fields, files, self.language_names)
            transcript = await asyncio.wrap_future(self.files.submit(upload))
            return _respond(HTTPStatus.OK, *reversed(render(upload, transcript, self.language_names or {})))
        except ApiError as e:
            response = _respond(e.status, e.body(), "application/json")
            if e.status == HTTPStatus.UNAUTHORIZED:
                response.headers["WWW-Authenticate"] = "Bearer"
            return response
        except Exception as e:  # noqa: BLE001 - the client gets a 500, the server goes on
            log.exception("transcription request failed")
            return _respond(HTTPStatus.INTERNAL_SERVER_ERROR,
                            ApiError(HTTPStatus.INTERNAL_SERVER_ERROR, f"internal error: {type(e).__name__}").body(),
                            "application/json")

    def _authorized(self, request: Request) -> bool:
        key = self.config.api_key or ""
        auths = request.headers.get_all("Authorization")
        auth = auths[0] if len(auths) == 1 else ""  # two Authorization headers: neither counts
        token = auth[len("Bearer "):] if auth.startswith("Bearer ") else ""
        if not token and "?" in request.path:  # browsers cannot set headers on a WebSocket
            from urllib.parse import parse_qs

            token = parse_qs(request.path.split("?", 1)[1]).get("api_key", [""])[0]
        return hmac.compare_digest(token.encode(errors="replace"), key.encode())

    # --- sessions -------------------------------------------------------------------------------------
    async def _handle(self, ws: ServerConnection) -> None:
        if self.connections >= self.config.max_sessions:
            self.metrics.refused += 1
            await _send(ws, {"type": "error", "code": "server_full",
                             "message": f"all {self.config.max_sessions} sessions are in use; try again later"})
            await ws.close(1013, "server full")
            return
        self.connections += 1
        _small_receive_buffer(ws)
        session = Session(self, ws)
        try:
            await session.run()
        except ConnectionClosed:
            pass
        except Exception:
            log.exception("session failed")
            await ws.close(1011, "internal error")
        finally:
            self.connections -= 1
            session.end()

    async def serve_forever(self, ready: threading.Event | None = None, handle_signals: bool = False) -> None:
        """Serve until :meth:`stop` (or, with ``handle_signals``, SIGINT or SIGTERM; main thread only), then shut
        down: refuse new connections, close every session with 1001 (going away), stop the inference thread
        and join it. Returns normally after a signal."""
        self.loop = asyncio.get_running_loop()
        self._done = self.loop.create_future()
        install_log_redaction()
        worker = threading.Thread(target=self._infer, name="asr_spec-infer", daemon=True)
        worker.start()
        signals = []
        c = self.config
        server = None
        try:
            server = await serve(self._handle, c.host, c.port, process_request=self._http, create_connection=HttpConnection,
                                 open_timeout=None, max_size=c.max_message_bytes, ping_interval=c.ping_interval_s,
                                 ping_timeout=None)
            if handle_signals:
                for sig in (signal.SIGINT, signal.SIGTERM):
                    self.loop.add_signal_handler(sig, self._on_signal, sig)
                    signals.append(sig)
            self.port = next(iter(server.sockets)).getsockname()[1]
            log.info("listening on ws://%s:%d", c.host, self.port)
            if ready is not None:
                ready.set()
            await self._done
        finally:
            if server is not None:
                await self._close(server)
            self._stop.set()
            self._wake.set()
            if self.files is not None:
                self.files.stop()
            worker.join(timeout=SHUTDOWN_JOIN_S)
            if worker.is_alive():
                log.warning("the inference thread is still decoding after %g s; exiting without it", SHUTDOWN_JOIN_S)
            else:
                log.info("stopped: sessions closed, inference thread joined")
            for sig in signals:
                self.loop.remove_signal_handler(sig)

    async def _close(self, server) -> None:
        """Close every connection with 1001 and wait for the session handlers, at most ``SHUTDOWN_CLOSE_S``
        (then connections that did not complete the closing handshake are dropped)."""
        if open_sessions := len(server.connections):
            log.info("shutting down: closing %d connection(s)", open_sessions)
        server.close(close_connections=True, code=1001, reason="server shutting down")
        try:
            await asyncio.wait_for(asyncio.shield(server.wait_closed()), SHUTDOWN_CLOSE_S)
        except asyncio.TimeoutError:
            log.warning("shutdown: dropping connections that did not close within %g s", SHUTDOWN_CLOSE_S)
            for connection in list(server.all_connections):
                if connection.transport is not None:
                    connection.transport.abort()
            for task in list(server.handler_tasks):
                task.cancel()
            try:
                await asyncio.wait_for(asyncio.shield(server.wait_closed()), SHUTDOWN_CLOSE_S)
            except asyncio.TimeoutError:
                log.warning("shutdown: connection handlers did not finish")

    def _on_signal(self, sig: signal.Signals) -> None:
        if self._done is not None and not self._done.done():
            log.info("%s: shutting down", signal.Signals(sig).name)
        self.stop()

    def stop(self) -> None:
        """Stop serving (from any thread)."""
        if self.loop is not None and self._done is not None:
            self.loop.call_soon_threadsafe(lambda: self._done.done() or self._done.set_result(None))


class Session:
    def __init__(self, server: Server, ws: ServerConnection):
        self.server, self.ws = server, ws
        self.sid: int | None = None
        self.decoder: AudioDecoder | None = None
        self.outbox: asyncio.Queue = asyncio.Queue()
        self.sender: asyncio.Task | None = None
        self.flushes_delivered = 0
        self.rate_window = (time.monotonic(), 0.0)  # (start, audio seconds received since) for the minimum rate

    def deliver(self, events, flushes: int) -> None:
        for e in events:
            self.outbox.put_nowait(e.as_dict())
            if e.type == "error":  # the engine ended this stream: close once the error is sent
                self.outbox.put_nowait(None)
        self.flushes_delivered = max(self.flushes_delivered, flushes)

    async def _send_loop(self) -> None:
        while True:
            msg = await self.outbox.get()
            try:
                if msg is None:
                    await self.ws.close(1011, "decoding failed")
                else:
                    await _send(self.ws, msg)
            except ConnectionClosed:
                pass
            finally:
                self.outbox.task_done()

    async def run(self) -> None:
        self.sender = asyncio.create_task(self._send_loop())
        c = self.server.config
        opened = time.monotonic()
        while True:
            await self._backpressure()
            wait = c.idle_timeout_s if self.sid is not None else max(0.0, c.start_timeout_s - (time.monotonic() - opened))
            try:
                data = await asyncio.wait_for(self.ws.recv(), timeout=wait)
            except asyncio.TimeoutError:
                if self.sid is None:
                    await self._error(ProtocolError("start_timeout", f"no start message within {c.start_timeout_s:g} s"))
                    await self.ws.close(1008, "no start")
                    return
                await self._error(ProtocolError("idle_timeout", f"no message for {c.idle_timeout_s:g} s; closing"))
                await self.ws.close(1000, "idle timeout")
                return
            if self.ws.state is not State.OPEN:
                return  # the client is gone: what it had queued is not decoded (``end`` cancels the stream)
            try:
                if isinstance(data, bytes):
                    self._audio(data)
                elif await self._control(parse_message(data)):
                    return
            except ProtocolError as e:
                await self._error(e)
            if self.sid is not None and self._too_slow():
                await self._error(ProtocolError("too_slow", f"less than {c.min_audio_s_per_30s:g} s of audio in "
                                                f"{RATE_WINDOW_S:g} s; closing to free the session slot"))
                await self.ws.close(1008, "too slow")
                return

    async def _backpressure(self) -> None:
        """Stop reading this client's socket while its undecoded audio is at the limit: a fast sender is slowed
        down by TCP instead of having audio dropped. The time spent here does not count against its rate."""
        if self.sid is None:
            return
        engine, limit = self.server.engine, self.server.config.max_backlog_s
        if engine.backlog_s(self.sid) < limit:
            return
        while engine.backlog_s(self.sid) >= limit and self.ws.state is State.OPEN:
            self.server.wake()
            await asyncio.sleep(0.02)
        self.rate_window = (time.monotonic(), 0.0)

    def _too_slow(self) -> bool:
        """A session must send at least ``min_audio_s_per_30s`` of audio (or a control message) per 30 s, so
        that connections trickling a byte now and then cannot hold every session slot."""
        began, audio = self.rate_window
        if time.monotonic() - began < RATE_WINDOW_S:
            return False
        self.rate_window = (time.monotonic(), 0.0)
        return audio < self.server.config.min_audio_s_per_30s

    def _audio(self, data: bytes) -> None:
        if self.sid is None or self.decoder is None:
            raise ProtocolError("not_started", "send a start message before audio")
        if len(data) > self.server.config.max_frame_bytes:
            raise ProtocolError("frame_too_large", f"audio frames are limited to {self.server.config.max_frame_bytes} "
                                f"bytes; this one has {len(data)} (dropped)")
        audio = self.decoder(data)
        self.rate_window = (self.rate_window[0], self.rate_window[1] + len(audio) / SAMPLE_RATE)
        self.server.engine.feed(self.sid, audio)
        self.server.wake()

    async def _control(self, msg: dict) -> bool:
        """Handle a control message; True when the session is over."""
        kind, engine = msg["type"], self.server.engine
        if kind == "start":
            if self.sid is not None:
                raise ProtocolError("already_started", "this session has started already")
            start = parse_start(msg, self.server.languages)
            self.decoder = AudioDecoder(start)
            self.sid = engine.open(StreamConfig(language=start.language, task=start.task,
                                                interim=start.interim_results, step_s=self.server.config.step_s,
                                                word_timestamps=start.word_timestamps))
            self.server.sessions[self.sid] = self
            self.server.metrics.sessions_total += 1
            self.rate_window = (time.monotonic(), 0.0)
            await _send(self.ws, {"type": "ready", "session": self.sid, "sample_rate": start.sample_rate,
                                  "encoding": start.encoding, "channels": start.channels})
            return False
        if self.sid is None:
            raise ProtocolError("not_started", f"send a start message before {kind}")
        self.rate_window = (self.rate_window[0], self.rate_window[1] + self.server.config.min_audio_s_per_30s)
        if kind == "finalize":  # coalesces with a pending one; its finals arrive as they are decoded
            engine.flush(self.sid)
            self.server.wake()
            return False
        engine.feed(self.sid, self.decoder.finish())
        await self._flush_to_end()
        stats = engine.stream_stats(self.sid) or {}
        await _send(self.ws, {"type": "closed", **stats})
        await self.ws.close(1000, "closed")
        return True

    async def _flush_to_end(self) -> None:
        """Decode everything the stream holds and wait until its last events are sent. Messages that arrive
        meanwhile are read (so keepalive pings are answered) and ignored."""
        engine = self.server.engine
        done = engine.flush(self.sid, close=True)
        self.server.wake()
        deadline = time.monotonic() + FLUSH_TIMEOUT_S
        while self.flushes_delivered < done:
            if time.monotonic() > deadline:
                raise ProtocolError("flush_timeout", f"the stream could not be decoded within {FLUSH_TIMEOUT_S:g} s")
            try:
                await asyncio.wait_for(self.ws.recv(), timeout=0.05)
            except asyncio.TimeoutError:
                pass
        await self._drain()

    async def _drain(self) -> None:
        """Wait until every queued event is sent."""
        await self.outbox.join()

    async def _error(self, e: ProtocolError) -> None:
        await self._drain()
        await _send(self.ws, e.event())

    def end(self) -> None:
        if self.sender is not None:
            self.sender.cancel()
        if self.sid is not None:
            self.server.sessions.pop(self.sid, None)
            stream = self.server.engine.close(self.sid)
            if stream is not None:
                m = self.server.metrics
                m.audio_s += stream.stats.audio_s
                m.accepted += stream.stats.decode.accepted
                m.rejected += stream.stats.decode.rejected


def _small_receive_buffer(ws: ServerConnection) -> None:
    """Keep little of a client's unread data in the kernel: while backpressure holds a fast sender, its
    keepalive pings and pongs queue behind what is buffered, so the less is buffered the sooner they are
    read once decoding catches up (a large autotuned buffer holds minutes of audio)."""
    sock = ws.transport.get_extra_info("socket") if ws.transport is not None else None
    if sock is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RECEIVE_BUFFER_BYTES)


async def _send(ws: ServerConnection, msg: dict) -> None:
    await ws.send(json.dumps(msg))


def _unauthorized(connection: ServerConnection) -> Response:
    response = connection.respond(HTTPStatus.UNAUTHORIZED, "missing or wrong API key (Authorization: Bearer KEY, "
                                  "or ?api_key=KEY)\n")
    response.headers["WWW-Authenticate"] = "Bearer"
    return response


def _respond(status: HTTPStatus, body: str, content_type: str) -> Response:
    data = body.encode()
    headers = Headers([("Content-Type", content_type), ("Content-Length", str(len(data))), ("Connection", "close")])
    return Response(status.value, status.phrase, headers, data)
