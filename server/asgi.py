"""uvicorn and ASGI plumbing for ``asr_spec serve``: uvicorn without its signal handling, a deadline for request
heads, a client's bad WebSocket input logged as one warning line, and the HTTP methods the server answers."""
from __future__ import annotations

import contextlib
import logging

import h11
import uvicorn
from starlette.responses import PlainTextResponse
from uvicorn.protocols.http.h11_impl import H11Protocol
from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol

HTTP_METHODS = ("GET", "HEAD")
log = logging.getLogger("asr_spec.serve")


class Uvicorn(uvicorn.Server):
    """uvicorn's server without its signal handling: :class:`Server` handles the signals (it drains the sessions
    before uvicorn shuts down, and does not re-raise the signal afterwards)."""

    def capture_signals(self) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext()


class HeadTimeout(H11Protocol):
    """uvicorn's HTTP/1.1 protocol with a deadline for the request head: a connection that has not sent a
    complete head within ``head_timeout_s`` of connecting (or of its previous response) is closed, so that
    slow senders cannot hold connections open (uvicorn times out idle keep-alive connections only)."""

    head_timeout_s = 10.0

    @classmethod
    def factory(cls, head_timeout_s: float) -> type[HeadTimeout]:
        return type(cls.__name__, (cls,), {"head_timeout_s": head_timeout_s})

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        self._head_timer = self.loop.call_later(self.head_timeout_s, self._head_late)

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self.conn.their_state is not h11.IDLE and self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if self._head_timer is None and not self.transport.is_closing():
            self._head_timer = self.loop.call_later(self.head_timeout_s, self._head_late)

    def _head_late(self) -> None:
        self._head_timer = None
        if self.transport.get_protocol() is self and self.conn.their_state is h11.IDLE:
            self.transport.close()

    def connection_lost(self, exc) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
        super().connection_lost(exc)


class WebSockets(WebSocketsSansIOProtocol):
    """uvicorn's WebSocket protocol (websockets' sans-I/O one), but a lost peer's unread messages are dropped, and
    what a client gets wrong is not logged as a server error: a text message that is not UTF-8 is one warning line
    (uvicorn logs an error with a traceback), and a handshake the app refuses (401) is logged by the app alone
    (uvicorn would add "ASGI callable returned without completing handshake" as an error, because it does not
    count a denial response as completing it)."""

    def connection_lost(self, exc) -> None:
        """The peer is gone: messages it sent that the app has not taken yet are dropped, so that the app hears
        of the loss next rather than after working through them (a flooding client that vanished left hundreds of
        audio and junk messages queued; decoding them held its session slot for seconds)."""
        kept = []
        while not self.queue.empty():
            if (message := self.queue.get_nowait())["type"] != "websocket.receive":
                kept.append(message)
        for message in kept:
            self.queue.put_nowait(message)
        super().connection_lost(exc)

    def send_receive_event_to_app(self) -> None:
        if self.curr_msg_data_type == "text" and not self.close_sent:
            try:
                b"".join(self.frames).decode()
            except UnicodeDecodeError as e:
                client = f"{self.client[0]}:{self.client[1]}" if self.client else "a client"
                log.warning("closed the WebSocket of %s with 1007: a text message that is not UTF-8 (%s at byte %d)",
                            client, e.reason, e.start)
                self.frames = []
                self.conn.send_close(1007, "text messages must be UTF-8")
                self.handle_parser_exception()  # tells the app the client is gone, sends the close, drops the link
                return
        super().send_receive_event_to_app()

    async def send(self, message) -> None:
        await super().send(message)
        if message["type"] == "websocket.http.response.body" and not message.get("more_body", False):
            self.handshake_complete = True  # the denial response is sent: the handshake is over


class MethodGuard:
    """HTTP methods other than GET and HEAD get 405 (POST on ``post_paths`` only)."""

    def __init__(self, app, post_paths):
        self.app, self.post_paths = app, tuple(post_paths)

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http" and scope["method"] not in HTTP_METHODS and not (
                scope["method"] == "POST" and scope["path"] in self.post_paths):
            allowed = " or ".join(HTTP_METHODS)
            response = PlainTextResponse(f"Method Not Allowed: use {allowed} (POST on {' and '.join(self.post_paths)})\n",
                                         405, headers={"Allow": ", ".join(HTTP_METHODS)})
            return await response(scope, receive, send)
        await self.app(scope, receive, send)
