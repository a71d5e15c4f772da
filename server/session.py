"""Live sessions over WebSocket. :class:`StreamSession` is what every protocol's session shares: one engine stream,
its events out through a queue, the start, rate and idle timers, backpressure, and the last events on close and on
shutdown. :class:`Session` speaks the native protocol (docs/protocol.md); ``realtime.py`` speaks OpenAI's.

Nothing a session does with audio or the engine runs on the event loop: decoding, resampling and every engine call
run in the server's session threads (:meth:`StreamSession._call`), one at a time per session, so that one session's
message never holds up another session or an HTTP request (the engine's lock is held by its inference thread while
it runs voice detection over queued audio, which takes seconds for a long backlog)."""
from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from functools import partial

import numpy as np
from asr_spec.server.protocol import AudioDecoder, ProtocolError, parse_message, parse_start
from asr_spec.server.shared import Shared
from starlette.websockets import WebSocket, WebSocketDisconnect

from asr_spec.audio import SAMPLE_RATE
from asr_spec.streaming.config import StreamConfig
from asr_spec.streaming.events import Event

Message = dict  # an ASGI websocket message


class StreamSession:
    """One connection and its engine stream (opened by the protocol's first message). Subclasses say how messages
    are handled (:meth:`handle`), how engine events and errors are written (:meth:`translate`,
    :meth:`error_event`) and what is sent last (:meth:`summary`)."""

    first_message = "start"  # what must arrive within the start timeout
    protocol = "native"  # its label in /metrics

    def __init__(self, shared: Shared, ws: WebSocket):
        self.shared, self.ws = shared, ws
        self.config = shared.config
        self.sid: int | None = None
        self.decoder: AudioDecoder | None = None
        self.outbox: asyncio.Queue[dict | None] = asyncio.Queue()
        self.sender: asyncio.Task | None = None
        self.flushes_delivered = 0
        self.last_audio = time.monotonic()  # when audio last arrived (or the stream opened), for the idle timeout
        self.rate_window = (time.monotonic(), 0.0)  # (start, audio seconds received since) for the minimum rate
        self.backlog = 0.0  # the stream's undecoded seconds after this session's last feed (decoding only lowers it)
        self.ending = False  # a close or the server's shutdown is decoding the last audio: input is ignored
        self.work = asyncio.Lock()  # one message (or the shutdown's last flush) at a time uses the decoder and stream
        self.holding = 0  # > 0: engine events wait in ``held`` (see :meth:`_atomic`)
        self.held: list[tuple[int, list, int]] = []

    # --- what a protocol says -----------------------------------------------------------------------------
    async def accept(self) -> None:
        await self.ws.accept()

    async def handle(self, msg: Message) -> bool:
        """Handle one message (raise :class:`ProtocolError` for the client's mistakes); True when the session is over."""
        raise NotImplementedError

    def translate(self, event: Event) -> list[dict]:
        """The messages that tell the client about one engine event."""
        return [event.as_dict()]

    def error_event(self, e: ProtocolError) -> dict:
        return e.event()

    async def summary(self) -> dict | None:
        """The last message before the server closes the session (after ``close`` or on shutdown)."""
        return None

    # --- events out -------------------------------------------------------------------------------------
    def deliver(self, sid: int, events, flushes: int) -> None:
        """The engine's events for stream ``sid`` (called on the event loop by the inference thread): queued, unless
        they are an earlier stream's, or wait while a message is handled (:meth:`_atomic`)."""
        if sid != self.sid:
            return
        if self.holding:
            self.held.append((sid, events, flushes))
            return
        self._deliver(events, flushes)

    @contextlib.contextmanager
    def _atomic(self) -> Iterator[None]:
        """Engine events that arrive during the block are delivered after it, in order, as if the block had run at
        once: it awaits engine calls in a thread, and what it decides (a commit's turn, say) must not see the events
        of the flush it asks for before it is done."""
        self.holding += 1
        try:
            yield
        finally:
            self.holding -= 1
            if not self.holding:
                held, self.held = self.held, []
                for sid, events, flushes in held:
                    self.deliver(sid, events, flushes)

    def _deliver(self, events, flushes: int) -> None:
        for e in events:
            for message in self.translate(e):
                self.outbox.put_nowait(message)
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
        await self.send(self.error_event(e))

    # --- work off the event loop --------------------------------------------------------------------------
    async def _call(self, fn: Callable, *args):
        """``fn(*args)`` in the server's session threads. Engine calls wait for the engine's lock, which its
        inference thread holds while it runs voice detection over queued audio (about 0.03-0.1 s per second of
        audio on a CPU core): on the event loop, that wait would stop every session and HTTP request."""
        return await asyncio.get_running_loop().run_in_executor(self.shared.pool, partial(fn, *args))

    async def _feed(self, decode: Callable[[], np.ndarray], received: bool = True) -> None:
        """Decode audio (``decode()``: 16 kHz samples) and feed it to the engine, in a session thread. ``received``:
        audio the client sent, which counts for the minimum rate and the idle timeout (a resampler's tail does not;
        nor do control messages)."""
        sid, engine = self.sid, self.shared.engine

        def work() -> tuple[int, float]:
            audio = decode()
            engine.feed(sid, audio)
            return len(audio), engine.backlog_s(sid)

        samples, self.backlog = await self._call(work)
        if received and samples:
            self.last_audio = time.monotonic()
            self.rate_window = (self.rate_window[0], self.rate_window[1] + samples / SAMPLE_RATE)
        self.shared.wake()

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
                deadline = min(self.last_audio + c.idle_timeout_s, self.rate_window[0] + c.rate_window_s)
            try:
                msg = await asyncio.wait_for(self.ws.receive(), timeout=max(0.0, deadline - now))
            except asyncio.TimeoutError:
                if await self._timed_out():
                    return
                continue
            if msg["type"] == "websocket.disconnect":
                return  # the client is gone: what it had queued is not decoded (``end`` cancels the stream)
            async with self.work:
                if self.ending:
                    continue
                try:
                    if await self.handle(msg):
                        return
                except ProtocolError as e:
                    await self._error(e)

    async def _timed_out(self) -> bool:
        """The start, rate and idle rules, checked when their time comes (not only when a message arrives, so
        that connections which send nothing cannot hold session slots); True when the session is closed. Only audio
        counts for the rate and idle rules: a client sending control messages alone would hold its slot for ever."""
        c = self.config
        if self.sid is None:
            await self._error(ProtocolError("start_timeout", f"no {self.first_message} message within "
                                            f"{c.start_timeout_s:g} s"))
            await self.close(1008, f"no {self.first_message}")
            return True
        if self.ending:
            return False
        if time.monotonic() - self.last_audio >= c.idle_timeout_s:
            await self._error(ProtocolError("idle_timeout", f"no audio for {c.idle_timeout_s:g} s; closing"))
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
        The time spent here does not count against its rate, nor as idleness. The engine is asked only when the
        backlog it gave after the last feed was at the limit (decoding only lowers it)."""
        engine, limit = self.shared.engine, self.config.max_backlog_s
        if self.sid is None or self.backlog < limit:
            return
        held = False
        while (backlog := await self._call(engine.backlog_s, self.sid)) >= limit:
            held = True
            self.shared.wake()
            await asyncio.sleep(0.02)
        self.backlog = backlog
        if held:
            self.rate_window = (time.monotonic(), 0.0)
            self.last_audio = time.monotonic()

    # --- the engine stream ------------------------------------------------------------------------------
    async def _open(self, config: StreamConfig) -> None:
        """Open the session's engine stream (a session counts once however often it reopens its stream)."""
        if self.sid is None:
            self.shared.metrics.opened(self.protocol)
        self.sid = await self._call(self.shared.engine.open, config)  # loads a voice detector: ~0.1 s
        self.shared.register(self.sid, self)
        self.flushes_delivered, self.backlog = 0, 0.0
        self.rate_window = (time.monotonic(), 0.0)
        self.last_audio = time.monotonic()

    async def _flush(self, close: bool = False) -> int:
        """Ask for everything buffered to be decoded; returns the flush count that marks it done. Pending flushes
        coalesce. A flush is no audio: it does not count toward the minimum rate, nor against idleness."""
        done = await self._call(self.shared.engine.flush, self.sid, close)
        self.shared.wake()
        return done

    async def _until_flushed(self, done: int, within_s: float, read: bool) -> bool | None:
        """Wait until the engine has delivered flush ``done``: True; None when the client went away meanwhile;
        False (after a ``flush_timeout`` error) when it took longer than ``within_s``. ``read``: keep reading (and
        ignoring) messages meanwhile, so that keepalive pings are answered."""
        deadline = time.monotonic() + within_s
        while self.flushes_delivered < done:
            if time.monotonic() > deadline:
                await self._error(ProtocolError("flush_timeout", f"the stream's last audio could not be decoded "
                                                f"within {within_s:g} s"))
                return False
            if not read:
                await asyncio.sleep(0.02)
                continue
            try:
                if (await asyncio.wait_for(self.ws.receive(), timeout=0.05))["type"] == "websocket.disconnect":
                    return None
            except asyncio.TimeoutError:
                pass
        return True

    async def finish(self, code: int, reason: str, within_s: float, read: bool) -> None:
        """Decode everything the stream holds, send its last events and :meth:`summary`, and close with ``code``.
        ``read``: this is the session's own reader (a ``close`` message), which keeps reading meanwhile so that
        keepalive pings are answered; otherwise (the server's shutdown) the reader ignores what arrives."""
        if self.ending or self.sid is None or self.decoder is None:
            return
        # the session's own reader holds ``work`` already; the shutdown waits for the message being handled
        async with contextlib.nullcontext() if read else self.work:
            if self.ending or self.sid is None or self.decoder is None:
                return
            self.ending = True
            await self._feed(self.decoder.finish, received=False)
            done = await self._flush(close=True)
        flushed = await self._until_flushed(done, within_s, read)
        if flushed is None:
            return
        if flushed:
            await self.outbox.join()
            if (last := await self.summary()) is not None:
                await self.send(last)
        await self.close(code, reason)

    async def _close_stream(self) -> None:
        """Forget the engine stream: its queued audio is never decoded."""
        if self.sid is not None:
            self.shared.unregister(self.sid)
            await self._call(self.shared.metrics.close, self.shared.engine, self.sid)

    def end(self) -> None:
        """The connection is over: stop sending, and close the engine stream in a session thread (not waited for)."""
        if self.sender is not None:
            self.sender.cancel()
        if self.sid is not None:
            self.shared.unregister(self.sid)
            close = partial(self.shared.metrics.close, self.shared.engine, self.sid)
            try:
                self.shared.pool.submit(close)
            except RuntimeError:  # the pool is shut down: the server has stopped
                close()


class Session(StreamSession):
    """The native protocol: a ``start`` message, binary audio frames, ``finalize`` and ``close``."""

    async def summary(self) -> dict | None:
        return {"type": "closed", **(await self._call(self.shared.engine.stream_stats, self.sid) or {})}

    async def handle(self, msg: Message) -> bool:
        if msg.get("bytes") is not None:
            await self._audio(msg["bytes"])
            return False
        return await self._control(parse_message(msg.get("text") or ""))

    async def _audio(self, data: bytes) -> None:
        if self.sid is None or self.decoder is None:
            raise ProtocolError("not_started", "send a start message before audio")
        if len(data) > self.config.max_frame_bytes:
            raise ProtocolError("frame_too_large", f"audio frames are limited to {self.config.max_frame_bytes} "
                                f"bytes; this one has {len(data)} (dropped)")
        await self._feed(partial(self.decoder, data))

    async def _control(self, msg: dict) -> bool:
        """Handle a control message; True when the session is over."""
        kind = msg["type"]
        if kind == "start":
            if self.sid is not None:
                raise ProtocolError("already_started", "this session has started already")
            start = parse_start(msg, self.shared.languages)
            self.decoder = AudioDecoder(start)
            base = self.config.stream
            await self._open(replace(base, language=start.language, task=start.task, interim=start.interim_results,
                                     word_timestamps=start.word_timestamps, policy=start.commit_policy or base.policy,
                                     hotwords=base.hotwords if start.hotwords is None else start.hotwords))
            await self.send({"type": "ready", "session": self.sid, "sample_rate": start.sample_rate,
                             "encoding": start.encoding, "channels": start.channels})
            return False
        if self.sid is None:
            raise ProtocolError("not_started", f"send a start message before {kind}")
        if kind == "finalize":  # coalesces with a pending one; its finals arrive as they are decoded
            await self._flush()
            return False
        await self.finish(1000, "closed", self.config.flush_timeout_s, read=True)
        return True
