"""One session of the native WebSocket protocol (docs/protocol.md): a client's audio frames in, the engine's
partial and final events out; limits, backpressure, and the last finals on ``close`` and on shutdown."""
from __future__ import annotations

import asyncio
import json
import time
from typing import TYPE_CHECKING

from starlette.websockets import WebSocket, WebSocketDisconnect

from ..audio import SAMPLE_RATE
from ..streaming.stream import StreamConfig
from .protocol import AudioDecoder, ProtocolError, parse_message, parse_start

if TYPE_CHECKING:
    from .app import Server

Message = dict  # an ASGI websocket message


class Session:
    def __init__(self, server: Server, ws: WebSocket):
        self.server, self.ws = server, ws
        self.config = server.config
        self.sid: int | None = None
        self.decoder: AudioDecoder | None = None
        self.outbox: asyncio.Queue[dict | None] = asyncio.Queue()
        self.sender: asyncio.Task | None = None
        self.flushes_delivered = 0
        self.last_message = time.monotonic()
        self.rate_window = (time.monotonic(), 0.0)  # (start, audio seconds received since) for the minimum rate
        self.ending = False  # a close or the server's shutdown is decoding the last audio: input is ignored

    # --- events out -------------------------------------------------------------------------------------
    def deliver(self, events, flushes: int) -> None:
        """Queue the engine's events (called on the event loop by the inference thread)."""
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
                    await self.close(1011, "decoding failed")
                else:
                    await self.send(msg)
            finally:
                self.outbox.task_done()

    async def send(self, msg: dict) -> None:
        try:
            await self.ws.send_text(json.dumps(msg))
        except (WebSocketDisconnect, RuntimeError):  # the client is gone, or the session was closed
            pass

    async def close(self, code: int, reason: str) -> None:
        try:
            await self.ws.close(code, reason)
        except (WebSocketDisconnect, RuntimeError):
            pass

    async def _error(self, e: ProtocolError) -> None:
        await self.outbox.join()
        await self.send(e.event())

    # --- messages in ------------------------------------------------------------------------------------
    async def run(self) -> None:
        self.sender = asyncio.create_task(self._send_loop())
        c = self.config
        opened = time.monotonic()
        while True:
            await self._backpressure()
            now = time.monotonic()
            if self.sid is None:
                deadline = opened + c.start_timeout_s
            else:
                deadline = min(self.last_message + c.idle_timeout_s, self.rate_window[0] + c.rate_window_s)
            try:
                msg = await asyncio.wait_for(self.ws.receive(), timeout=max(0.0, deadline - now))
            except asyncio.TimeoutError:
                if await self._timed_out():
                    return
                continue
            if msg["type"] == "websocket.disconnect":
                return  # the client is gone: what it had queued is not decoded (``end`` cancels the stream)
            self.last_message = time.monotonic()
            if self.ending:
                continue
            try:
                if msg.get("bytes") is not None:
                    self._audio(msg["bytes"])
                elif await self._control(parse_message(msg.get("text") or "")):
                    return
            except ProtocolError as e:
                await self._error(e)

    async def _timed_out(self) -> bool:
        """The start, rate and idle rules, checked when their time comes (not only when a message arrives, so
        that connections which send nothing cannot hold session slots); True when the session is closed."""
        c = self.config
        if self.sid is None:
            await self._error(ProtocolError("start_timeout", f"no start message within {c.start_timeout_s:g} s"))
            await self.close(1008, "no start")
            return True
        if self.ending:
            return False
        if time.monotonic() - self.last_message >= c.idle_timeout_s:
            await self._error(ProtocolError("idle_timeout", f"no message for {c.idle_timeout_s:g} s; closing"))
            await self.close(1000, "idle timeout")
            return True
        began, audio = self.rate_window
        if time.monotonic() - began < c.rate_window_s:
            return False
        self.rate_window = (time.monotonic(), 0.0)
        if audio >= c.min_audio_s_per_30s:
            return False
        await self._error(ProtocolError("too_slow", f"less than {c.min_audio_s_per_30s:g} s of audio in "
                                        f"{c.rate_window_s:g} s; closing to free the session slot"))
        await self.close(1008, "too slow")
        return True

    async def _backpressure(self) -> None:
        """Stop reading this client's socket while its undecoded audio is at the limit: a fast sender is slowed
        down by TCP instead of having audio dropped (uvicorn reads no further frame until this one is taken).
        The time spent here does not count against its rate, nor as idleness."""
        if self.sid is None:
            return
        engine, limit = self.server.engine, self.config.max_backlog_s
        if engine.backlog_s(self.sid) < limit:
            return
        while engine.backlog_s(self.sid) >= limit:
            self.server.wake()
            await asyncio.sleep(0.02)
        self.rate_window = (time.monotonic(), 0.0)
        self.last_message = time.monotonic()

    def _audio(self, data: bytes) -> None:
        if self.sid is None or self.decoder is None:
            raise ProtocolError("not_started", "send a start message before audio")
        if len(data) > self.config.max_frame_bytes:
            raise ProtocolError("frame_too_large", f"audio frames are limited to {self.config.max_frame_bytes} "
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
                                                interim=start.interim_results, step_s=self.config.step_s,
                                                word_timestamps=start.word_timestamps,
                                                policy=start.commit_policy or self.config.commit_policy))
            self.server.sessions[self.sid] = self
            self.server.metrics.sessions_total += 1
            self.rate_window = (time.monotonic(), 0.0)
            await self.send({"type": "ready", "session": self.sid, "sample_rate": start.sample_rate,
                             "encoding": start.encoding, "channels": start.channels})
            return False
        if self.sid is None:
            raise ProtocolError("not_started", f"send a start message before {kind}")
        self.rate_window = (self.rate_window[0], self.rate_window[1] + self.config.min_audio_s_per_30s)
        if kind == "finalize":  # coalesces with a pending one; its finals arrive as they are decoded
            engine.flush(self.sid)
            self.server.wake()
            return False
        await self.finish(1000, "closed", self.config.flush_timeout_s, read=True)
        return True

    async def finish(self, code: int, reason: str, within_s: float, read: bool) -> None:
        """Decode everything the stream holds, send its last events and ``closed``, and close with ``code``.
        ``read``: this is the session's own reader (a ``close`` message), which keeps reading meanwhile so that
        keepalive pings are answered; otherwise (the server's shutdown) the reader ignores what arrives."""
        if self.ending or self.sid is None or self.decoder is None:
            return
        self.ending = True
        engine = self.server.engine
        engine.feed(self.sid, self.decoder.finish())
        done = engine.flush(self.sid, close=True)
        self.server.wake()
        deadline = time.monotonic() + within_s
        while self.flushes_delivered < done:
            if time.monotonic() > deadline:
                await self._error(ProtocolError("flush_timeout", f"the stream's last audio could not be decoded "
                                                f"within {within_s:g} s"))
                await self.close(code, reason)
                return
            if not read:
                await asyncio.sleep(0.02)
                continue
            try:
                if (await asyncio.wait_for(self.ws.receive(), timeout=0.05))["type"] == "websocket.disconnect":
                    return
            except asyncio.TimeoutError:
                pass
        await self.outbox.join()
        await self.send({"type": "closed", **(engine.stream_stats(self.sid) or {})})
        await self.close(code, reason)

    def end(self) -> None:
        if self.sender is not None:
            self.sender.cancel()
        if self.sid is not None:
            self.server.sessions.pop(self.sid, None)
            if (stream := self.server.engine.close(self.sid)) is not None:
                self.server.metrics.ended(stream.stats)
