"""One guard over every route: a request or WebSocket handshake to anything but the declared public routes presents
one of the server's API keys, or is refused (401) before any handler runs. A new route is guarded unless it is
added to :data:`PUBLIC`. Handlers find the key presented in ``conn.state.api_key`` ("" when the server needs none).
"""
from __future__ import annotations

from typing import Callable

from starlette.requests import HTTPConnection
from starlette.responses import Response
from starlette.websockets import WebSocket

# (scope type, path): the browser page and its files, and the probes load balancers send without a key
PUBLIC = frozenset({("http", "/"), ("http", "/health"), ("http", "/healthz"), ("http", "/livez")})
PUBLIC_PREFIXES = (("http", "/static/"),)


def is_public(kind: str, path: str) -> bool:
    return (kind, path) in PUBLIC or any(kind == k and path.startswith(p) for k, p in PUBLIC_PREFIXES)


class KeyGuard:
    """ASGI middleware: ``key_of`` finds the key a connection presents (None: missing or wrong); a refused one gets
    ``denial(conn)`` (as the WebSocket handshake's denial response for a WebSocket) after ``refused(conn)``."""

    def __init__(self, app, key_of: Callable[[HTTPConnection], str | None],
                 denial: Callable[[HTTPConnection], Response], refused: Callable[[HTTPConnection], None]):
        self.app, self.key_of, self.denial, self.refused = app, key_of, denial, refused

    async def __call__(self, scope, receive, send) -> None:
        kind = scope["type"]
        if kind not in ("http", "websocket") or is_public(kind, scope["path"]):
            await self.app(scope, receive, send)
            return
        conn = HTTPConnection(scope)
        if (key := self.key_of(conn)) is None:
            self.refused(conn)
            if kind == "websocket":
                await WebSocket(scope, receive, send).send_denial_response(self.denial(conn))
            else:
                await self.denial(conn)(scope, receive, send)
            return
        scope.setdefault("state", {})["api_key"] = key
        await self.app(scope, receive, send)
