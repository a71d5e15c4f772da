"""``asr_spec serve``: streaming transcription over WebSockets (protocol: docs/protocol.md).

One :class:`~asr_spec.streaming.engine.Engine` (one model) serves every session. Its inference thread
decodes whichever streams are due, batched, off the event loop; events go back to each session's
queue. HTTP on the same port: ``/healthz``, ``/metrics`` and the browser page at ``/``.
"""
from __future__ import annotations

import asyncio
import hmac
import json
import logging
import threading
import time
from dataclasses import dataclass
from http import HTTPStatus
from pathlib import Path

from websockets.asyncio.server import ServerConnection, serve
from websockets.datastructures import Headers
from websockets.exceptions import ConnectionClosed
from websockets.http11 import Request, Response

from ..streaming.engine import Engine
from ..streaming.stream import StreamConfig
from .protocol import AudioDecoder, ProtocolError, parse_message, parse_start

log = logging.getLogger("asr_spec.serve")
STATIC = Path(__file__).parent / "static"
FLUSH_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class ServerConfig:
    host: str = "127.0.0.1"
    port: int = 8765
    max_sessions: int = 8
    api_key: str | None = None
    max_frame_bytes: int = 256 * 1024  # larger audio frames get an error event and are dropped
    max_message_bytes: int = 4 * 1024 * 1024  # the connection is closed (1009) beyond this
    idle_timeout_s: float = 60.0
    ping_interval_s: float = 20.0
    step_s: float = StreamConfig.step_s


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
        with engine.lock:
            live = list(engine.streams.values())
        audio = self.audio_s + sum(s.stats.audio_s for s in live)
        acc = self.accepted + sum(s.stats.decode.accepted for s in live)
        rej = self.rejected + sum(s.stats.decode.rejected for s in live)
        return {"sessions": sessions, "sessions_total": self.sessions_total, "refused": self.refused,
                "audio_seconds": round(audio, 3), "busy_seconds": round(engine.busy_s, 3),
                "rtf": round(engine.busy_s / audio, 4) if audio else None,
                "acceptance": round(acc / (acc + rej), 4) if acc + rej else None,
                "uptime_seconds": round(time.time() - self.started, 1)}


class Server:
    def __init__(self, engine: Engine, config: ServerConfig = ServerConfig()):
        self.engine, self.config = engine, config
        self.sessions: dict[int, "Session"] = {}  # started sessions by stream id
        self.connections = 0
        self.metrics = Metrics()
        self.languages = set(engine.transcriber.vocab.languages) or None
        self._wake = threading.Event()
        self._stop = threading.Event()
        self.loop: asyncio.AbstractEventLoop | None = None
        self._done: asyncio.Future | None = None
        self.port: int | None = None

    # --- inference thread -----------------------------------------------------------------------------
    def _infer(self) -> None:
        while not self._stop.is_set():
            if not self.engine.pending():
                self._wake.wait(0.02)
                self._wake.clear()
                continue
            try:
                out = self.engine.step()
            except Exception:  # never let one bad decode kill the server
                log.exception("decode failed")
                continue
            for sid, events in out.items():
                if (session := self.sessions.get(sid)) is not None and self.loop is not None:
                    with self.engine.lock:
                        stream = self.engine.streams.get(sid)
                    flushes = stream.flushes if stream is not None else 0
                    self.loop.call_soon_threadsafe(session.deliver, events, flushes)

    # --- HTTP -----------------------------------------------------------------------------------------
    def _http(self, connection: ServerConnection, request: Request) -> Response | None:
        path = request.path.split("?", 1)[0]
        if path == "/healthz":
            return connection.respond(HTTPStatus.OK, "ok\n")
        if path == "/metrics":
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
            return connection.respond(HTTPStatus.UNAUTHORIZED, "missing or wrong bearer token\n")
        return None

    def _authorized(self, request: Request) -> bool:
        key = self.config.api_key or ""
        auth = request.headers.get("Authorization", "")
        token = auth[len("Bearer "):] if auth.startswith("Bearer ") else ""
        if not token and "?" in request.path:  # browsers cannot set headers on a WebSocket
            from urllib.parse import parse_qs

            token = parse_qs(request.path.split("?", 1)[1]).get("api_key", [""])[0]
        return hmac.compare_digest(token.encode(), key.encode())

    # --- sessions -------------------------------------------------------------------------------------
    async def _handle(self, ws: ServerConnection) -> None:
        if self.connections >= self.config.max_sessions:
            self.metrics.refused += 1
            await _send(ws, {"type": "error", "code": "server_full",
                             "message": f"all {self.config.max_sessions} sessions are in use; try again later"})
            await ws.close(1013, "server full")
            return
        self.connections += 1
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

    async def serve_forever(self, ready: threading.Event | None = None) -> None:
        self.loop = asyncio.get_running_loop()
        worker = threading.Thread(target=self._infer, name="asr_spec-infer", daemon=True)
        worker.start()
        c = self.config
        try:
            async with serve(self._handle, c.host, c.port, process_request=self._http, max_size=c.max_message_bytes,
                             ping_interval=c.ping_interval_s, ping_timeout=c.ping_interval_s) as server:
                self.port = next(iter(server.sockets)).getsockname()[1]
                log.info("listening on ws://%s:%d", c.host, self.port)
                self._done = self.loop.create_future()
                if ready is not None:
                    ready.set()
                await self._done
        finally:
            self._stop.set()
            worker.join(timeout=5)


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

    def deliver(self, events, flushes: int) -> None:
        for e in events:
            self.outbox.put_nowait(e.as_dict())
        self.flushes_delivered = max(self.flushes_delivered, flushes)

    async def _send_loop(self) -> None:
        while True:
            msg = await self.outbox.get()
            try:
                await _send(self.ws, msg)
            except ConnectionClosed:
                pass
            finally:
                self.outbox.task_done()

    async def run(self) -> None:
        self.sender = asyncio.create_task(self._send_loop())
        c = self.server.config
        while True:
            try:
                data = await asyncio.wait_for(self.ws.recv(), timeout=c.idle_timeout_s)
            except asyncio.TimeoutError:
                await self._error(ProtocolError("idle_timeout", f"no message for {c.idle_timeout_s:g} s; closing"))
                await self._drain()
                await self.ws.close(1000, "idle timeout")
                return
            try:
                if isinstance(data, bytes):
                    self._audio(data)
                elif await self._control(parse_message(data)):
                    return
            except ProtocolError as e:
                await self._error(e)

    def _audio(self, data: bytes) -> None:
        if self.sid is None or self.decoder is None:
            raise ProtocolError("not_started", "send a start message before audio")
        if len(data) > self.server.config.max_frame_bytes:
            raise ProtocolError("frame_too_large", f"audio frames are limited to {self.server.config.max_frame_bytes} "
                                f"bytes; this one has {len(data)} (dropped)")
        self.server.engine.feed(self.sid, self.decoder(data))
        self.server._wake.set()

    async def _control(self, msg: dict) -> bool:
        """Handle a control message; True when the session is over."""
        kind, engine = msg["type"], self.server.engine
        if kind == "start":
            if self.sid is not None:
                raise ProtocolError("already_started", "this session has started already")
            start = parse_start(msg, self.server.languages)
            self.decoder = AudioDecoder(start)
            self.sid = engine.open(StreamConfig(language=start.language, task=start.task,
                                                interim=start.interim_results, step_s=self.server.config.step_s))
            self.server.sessions[self.sid] = self
            self.server.metrics.sessions_total += 1
            await _send(self.ws, {"type": "ready", "session": self.sid, "sample_rate": start.sample_rate,
                                  "encoding": start.encoding, "channels": start.channels})
            return False
        if self.sid is None:
            raise ProtocolError("not_started", f"send a start message before {kind}")
        if kind == "close":
            engine.feed(self.sid, self.decoder.finish())
        await self._flush()
        if kind == "finalize":
            return False
        with engine.lock:
            stats = engine.streams[self.sid].stats.as_dict()
        await _send(self.ws, {"type": "closed", **stats})
        await self.ws.close(1000, "closed")
        return True

    async def _flush(self) -> None:
        """Flush the stream and wait until its last events are sent."""
        engine = self.server.engine
        with engine.lock:
            done = engine.streams[self.sid].flushes + 1
        engine.flush(self.sid)
        self.server._wake.set()
        deadline = time.monotonic() + FLUSH_TIMEOUT_S
        while self.flushes_delivered < done:
            if time.monotonic() > deadline:
                raise ProtocolError("flush_timeout", f"the stream could not be decoded within {FLUSH_TIMEOUT_S:g} s")
            await asyncio.sleep(0.01)
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


async def _send(ws: ServerConnection, msg: dict) -> None:
    await ws.send(json.dumps(msg))


def _respond(status: HTTPStatus, body: str, content_type: str) -> Response:
    data = body.encode()
    headers = Headers([("Content-Type", content_type), ("Content-Length", str(len(data))), ("Connection", "close")])
    return Response(status.value, status.phrase, headers, data)
