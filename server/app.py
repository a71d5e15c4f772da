"""``asr_spec serve``: one port, a Starlette app on uvicorn. The native streaming WebSocket protocol at ``/``
(session.py, docs/protocol.md), the browser page, ``/health``, ``/metrics`` and the OpenAI-compatible file
endpoints (openai_api.py).

One :class:`~asr_spec.streaming.engine.Engine` (one model) serves every session. Its inference thread decodes
whichever streams are due, batched, off the event loop; events go back to each session's queue. The sessions' audio
decoding and engine calls run in a pool of session threads, also off the event loop (session.py). What the sessions
and the upload endpoints use of the server (the engine, the pool, the metrics, the session registry) is one
:class:`~asr_spec.server.shared.Shared` that the server builds and hands them: they never import this module.
"""
from __future__ import annotations

import asyncio
import logging
import signal
import socket
import threading
from collections import Counter
from functools import partial
from http import HTTPStatus
from pathlib import Path
from typing import Callable

import uvicorn
from asr_spec.server.asgi import HeadTimeout, MethodGuard, Uvicorn, WebSockets
from asr_spec.server.auth import KeyGuard
from asr_spec.server.config import ServerConfig, install_log_redaction
from asr_spec.server.files import FileWorker
from asr_spec.server.openai_api import PATHS, ApiError, transcription
from asr_spec.server.protocol import ProtocolError
from asr_spec.server.realtime import RealtimeSession
from asr_spec.server.session import Session, StreamSession
from asr_spec.server.settings import ServeSettings
from asr_spec.server.shared import Shared
from starlette.applications import Starlette
from starlette.requests import HTTPConnection, Request
from starlette.responses import FileResponse, JSONResponse, PlainTextResponse, Response
from starlette.routing import Mount, Route, WebSocketRoute
from starlette.staticfiles import StaticFiles
from starlette.websockets import WebSocket

from asr_spec.measure import hold
from asr_spec.models.loader import Draft, Whisper
from asr_spec.recognizer import Recognizer
from asr_spec.streaming.engine import Engine
from asr_spec.threads import release_pool
from asr_spec.transcribe import TranscribeOptions, Transcriber

log = logging.getLogger("asr_spec.serve")
STATIC = Path(__file__).parent / "static"
SHUTDOWN_CLOSE_S = 3.0  # after the drain, peers get this long to answer the close (1001) before they are dropped
SHUTDOWN_JOIN_S = 30.0  # and the inference thread this long to finish the decode it is running
UNAUTHORIZED = "missing or wrong API key (Authorization: Bearer KEY, or ?api_key=KEY)\n"


class Server:
    def __init__(self, engine: Engine, config: ServerConfig = ServerConfig(), files: FileWorker | None = None):
        self.engine, self.config, self.files = engine, config, files
        self.shared = Shared(engine, config, files)  # what the sessions and the upload endpoints use
        self._live = threading.Event()  # set while live streams are due: uploads wait for them (FileWorker)
        if files is not None:
            files.live = self._live.is_set
        self.connections: dict[WebSocket, StreamSession] = {}
        # the thread that built the models hands its torch work to the inference thread: its OpenMP workers end, and
        # the inference thread's are the process's (else every decode operator waits for sleeping workers: threads.py)
        release_pool()
        self.clients: Counter[tuple[str, str]] = Counter()  # open connections per ("address" | "key", value)
        self._stop = threading.Event()
        self.loop: asyncio.AbstractEventLoop | None = None
        self._done: asyncio.Future | None = None
        self.port: int | None = None
        routes = [Route("/health", self.health), Route("/healthz", self.health), Route("/livez", self.alive),
                  Route("/metrics", self.metrics_page),
                  Route("/", self.page), Mount("/static", StaticFiles(directory=STATIC)),
                  WebSocketRoute("/", self.websocket),
                  WebSocketRoute("/v1/realtime", partial(self.websocket, kind=RealtimeSession)),  # realtime.py
                  *(Route(path, transcription(self.shared, task), methods=["POST"]) for path, task in PATHS.items())]
        self.routes = routes  # every route is KeyGuard's but server/auth.py's PUBLIC ones
        guarded = KeyGuard(Starlette(routes=routes), self.shared.key_of, self._denial, self._refused)
        self.app = MethodGuard(guarded, PATHS)
        self._worker: threading.Thread | None = None

    @classmethod
    def build(cls, settings: ServeSettings, api_keys: tuple[str, ...], target: Whisper, draft: Draft | None) -> Server:
        """The server ``asr_spec serve`` runs (and each Ray Serve replica): one engine for the sessions, a file
        worker for the uploads (at the same compute type: one model in memory)."""
        engine = Engine(Recognizer(target, draft), settings.engine_config())
        uploads = TranscribeOptions(hotwords=settings.hotwords or None, window_padding=settings.window_padding)
        files = FileWorker(Transcriber(target, draft), uploads,
                           batch_size=settings.file_batch, max_waiting=settings.max_uploads,
                           per_client=settings.max_uploads_per_client, max_yield_s=settings.upload_yield)
        return cls(engine, settings.server_config(api_keys), files)

    # --- inference thread -----------------------------------------------------------------------------
    def _infer(self) -> None:
        shared = self.shared
        while not self._stop.is_set():
            # a background measurement of this machine (asr_spec.measure) runs only while there is no work
            hold(bool(self.connections) or (self.files is not None and self.files.busy))
            if not self.engine.poll():
                self._live.clear()
                shared.sleep(0.02)
                continue
            self._live.set()
            try:
                out = self.engine.step()
            except Exception:  # never let one bad decode kill the server
                log.exception("decode failed")
                continue
            shared.metrics.decoded(self.engine)
            for sid, events in out.items():
                shared.metrics.events(events)
                if (session := shared.sessions.get(sid)) is not None and self.loop is not None:
                    try:
                        self.loop.call_soon_threadsafe(session.deliver, sid, events, self.engine.flushes(sid))
                    except RuntimeError:  # the loop closed meanwhile: the server is shutting down
                        return

    # --- HTTP -----------------------------------------------------------------------------------------
    def unready(self) -> str | None:
        """Why this server takes no new session now (draining, full), or None: it is ready."""
        if self._done is None or self._done.done():
            return "draining: the server is shutting down"
        if len(self.connections) >= self.config.max_sessions:
            return f"full: all {self.config.max_sessions} sessions are in use"
        return self.overloaded()

    def overloaded(self) -> str | None:
        """Why the engine cannot take one more real-time speaker, or None: every open session counts (measured or
        just admitted), against how many real-time streams the engine carries at the step a stream takes under load
        (``Engine.carried``: fitted from what its steps cost by rows and new audio, keeping it busy at most
        ``max_load`` of the time). A server with no session always takes one; before the engine has measured
        anything, ``max_sessions`` alone decides."""
        n, limit = len(self.connections), self.config.max_load
        if limit is None or not n:
            return None
        step = self.engine.config.max_step_s or self.config.stream.step_s
        if (carried := self.engine.carried(step, limit)) is None or n + 1 <= carried:
            return None
        return (f"full: the engine carries about {carried} real-time sessions (re-decoded every {step:g} s, busy at "
                f"most {limit:.0%} of the time, as its decodes have cost); {n} are open")

    async def health(self, request: Request) -> Response:
        """Readiness, for load balancers (open: they probe without a key): 200 ``ok``, or 503 and the reason while
        the server is full or draining."""
        reason = self.unready()
        return PlainTextResponse("ok\n" if reason is None else reason + "\n", 200 if reason is None else 503)

    async def alive(self, request: Request) -> Response:
        """Liveness (open): 200 while the process serves HTTP, full or draining alike."""
        return PlainTextResponse("ok\n")

    async def metrics_page(self, request: Request) -> Response:
        shared = self.shared
        if request.query_params.get("format") == "json":
            return JSONResponse(await asyncio.to_thread(shared.metrics.snapshot, self.engine, len(shared.sessions)))
        body, content_type = await asyncio.to_thread(shared.metrics.scrape, self.engine, len(shared.sessions),
                                                     request.headers.get("accept"))
        return Response(body, headers={"Content-Type": content_type})

    async def page(self, request: Request) -> Response:
        return FileResponse(STATIC / "index.html", media_type="text/html; charset=utf-8")

    def _denial(self, conn: HTTPConnection) -> Response:
        """What a connection without the right key gets: OpenAI's error object on its endpoints, else plain text."""
        if conn.scope["type"] == "http" and conn.url.path in PATHS:
            return ApiError(HTTPStatus.UNAUTHORIZED, "missing or wrong API key (Authorization: Bearer KEY)",
                            code="invalid_api_key").response()
        return unauthorized()

    def _refused(self, conn: HTTPConnection) -> None:
        if conn.scope["type"] == "http" and conn.url.path in PATHS:  # counted as the endpoints count their refusals
            self.shared.metrics.uploads.labels("refused", str(HTTPStatus.UNAUTHORIZED.value)).inc()
        if conn.scope["type"] == "websocket":  # one warning line: a wrong key is the client's mistake
            log.warning("refused a WebSocket handshake on %s from %s: missing or wrong API key (401)", conn.url.path,
                        conn.client.host if conn.client else "an unknown address")
            self.shared.metrics.refuse("unauthorized")

    # --- WebSocket sessions ---------------------------------------------------------------------------
    async def websocket(self, ws: WebSocket, kind: type[StreamSession] = Session) -> None:
        session = kind(self.shared, ws)  # the native protocol's, or OpenAI Realtime's (realtime.py)
        await session.accept()
        c = self.config
        who = self.shared.client_of(ws, ws.state.api_key)  # KeyGuard let it in with this key
        refusal = None
        if len(self.connections) >= c.max_sessions:
            refusal = ("server_full", f"all {c.max_sessions} sessions are in use; try again later")
        elif busy := self.overloaded():
            refusal = ("server_full", busy.removeprefix("full: ") + "; try again later")
        elif any(self.clients[w] >= c.per_client for w in who):
            refusal = ("client_limit", f"this client has {c.per_client} sessions open already (the most one client "
                       "may hold); close one first")
        if refusal is not None or self._done is None or self._done.done():
            code, message = refusal or ("shutting_down", "the server is shutting down")
            self.shared.metrics.refuse(code)
            await session.send(session.error_event(ProtocolError(code, message)))
            await session.close(1013, "try again later")
            return
        self.connections[ws] = session
        self.clients.update(who)
        try:
            await session.run()
        except Exception:
            log.exception("session failed")
            await session.close(1011, "internal error")
        finally:
            del self.connections[ws]
            self.clients.subtract(who)
            session.end()

    async def drain(self) -> None:
        """Shutdown: every open session's buffered audio is decoded and its last finals and ``closed`` sent
        (within ``drain_s`` in all), then it is closed with 1001."""
        sessions = list(self.connections.values())
        if sessions:
            log.info("shutting down: decoding what %d session(s) hold, at most %g s", len(sessions), self.config.drain_s)
        finishing = [asyncio.create_task(s.finish(1001, "server shutting down", self.config.drain_s, read=False))
                     for s in sessions]
        if finishing:
            _, late = await asyncio.wait(finishing, timeout=self.config.drain_s + 1)
            for task in late:
                task.cancel()
        for s in sessions:
            await s.close(1001, "server shutting down")

    # --- running --------------------------------------------------------------------------------------
    def start(self) -> None:
        """Take the running event loop as the sessions' and start the inference thread (``serve_forever`` does;
        a host that runs the ASGI app itself calls it through :meth:`hosted`)."""
        self.loop = asyncio.get_running_loop()
        self._done = self.loop.create_future()
        self._worker = threading.Thread(target=self._infer, name="asr_spec-infer", daemon=True)
        self._worker.start()

    def hosted(self) -> Callable:
        """The ASGI app for a host that runs it on its own server (Ray Serve): starts on its first call."""
        async def app(scope, receive, send) -> None:
            if self._worker is None:
                self.start()
            await self.app(scope, receive, send)
        return app

    async def shutdown(self) -> None:
        """Stop taking sessions, drain the open ones (:meth:`drain`), stop the inference thread and join it."""
        if self._done is not None and not self._done.done():
            self._done.set_result(None)
        await self.drain()
        await self._stop_worker()

    async def _stop_worker(self) -> None:
        self._stop.set()
        self.shared.wake()
        if self.files is not None:
            self.files.stop()
        if self._worker is not None:
            await asyncio.to_thread(self._worker.join, SHUTDOWN_JOIN_S)
        hold(False)
        self.shared.pool.shutdown(wait=False)
        if self._worker is not None and self._worker.is_alive():
            log.warning("the inference thread is still decoding after %g s; exiting without it", SHUTDOWN_JOIN_S)
        else:
            log.info("stopped: sessions closed, inference thread joined")

    async def serve_forever(self, ready: threading.Event | None = None, handle_signals: bool = False) -> None:
        """Serve until :meth:`stop` (or, with ``handle_signals``, SIGINT or SIGTERM; main thread only), then shut
        down: stop accepting, drain the sessions (peers get ``SHUTDOWN_CLOSE_S`` to answer the close), stop the
        inference thread and join it. Returns normally after a signal; raises OSError when the address cannot be
        listened on."""
        c = self.config
        family = socket.AF_INET6 if ":" in c.host else socket.AF_INET
        listener = socket.create_server((c.host, c.port), family=family)
        self.port = listener.getsockname()[1]
        server = Uvicorn(uvicorn.Config(
            self.app, http=HeadTimeout.factory(c.head_timeout_s), ws=WebSockets, lifespan="off",
            ws_max_size=c.max_message_bytes, ws_ping_interval=c.ping_interval_s, ws_ping_timeout=None,
            server_header=False, log_config=None, log_level="warning", timeout_graceful_shutdown=SHUTDOWN_CLOSE_S))
        install_log_redaction()  # after uvicorn's logging set-up
        self.start()
        signals = []
        serving = asyncio.create_task(server.serve(sockets=[listener]))
        try:
            if handle_signals:
                for sig in (signal.SIGINT, signal.SIGTERM):
                    self.loop.add_signal_handler(sig, self._on_signal, sig)
                    signals.append(sig)
            while not server.started and not serving.done():
                await asyncio.sleep(0.01)
            log.info("listening on ws://%s:%d", c.host, self.port)
            if ready is not None:
                ready.set()
            await asyncio.wait([serving, self._done], return_when=asyncio.FIRST_COMPLETED)
        finally:
            for s in server.servers if server.started else []:
                s.close()  # stop accepting
            await self.drain()
            for _ in range(int(SHUTDOWN_CLOSE_S / 0.05)):
                if not (open_ := server.server_state.connections):
                    break
                await asyncio.sleep(0.05)
            else:
                log.warning("shutdown: dropping %d connection(s) that did not close within %g s", len(open_),
                            SHUTDOWN_CLOSE_S)
            server.should_exit = True
            await serving
            listener.close()
            await self._stop_worker()
            for sig in signals:
                self.loop.remove_signal_handler(sig)

    def _on_signal(self, sig: signal.Signals) -> None:
        if self._done is not None and not self._done.done():
            log.info("%s: shutting down", signal.Signals(sig).name)
        self.stop()

    def stop(self) -> None:
        """Stop serving (from any thread)."""
        if self.loop is not None and self._done is not None:
            self.loop.call_soon_threadsafe(lambda: self._done.done() or self._done.set_result(None))


def unauthorized() -> Response:
    return PlainTextResponse(UNAUTHORIZED, 401, headers={"WWW-Authenticate": "Bearer"})
