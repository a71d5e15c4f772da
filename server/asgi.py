"""uvicorn and ASGI plumbing for ``asr_spec serve``: uvicorn without its signal handling, a deadline for request
heads, and the HTTP methods the server answers."""
from __future__ import annotations

import contextlib

import h11
import uvicorn
from starlette.responses import PlainTextResponse
from uvicorn.protocols.http.h11_impl import H11Protocol

HTTP_METHODS = ("GET", "HEAD")


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
