"""What the server's parts share: the engine, the upload worker, the metrics, the session threads, the registry of
started sessions, the inference thread's wake-up and the API keys. The server (app.py) builds one :class:`Shared`
and hands it to the sessions (session.py, realtime.py) and the upload endpoints (openai_api.py), which know it and
not the server."""
from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Callable, Protocol

from asr_spec.server.config import KEY_PROTOCOL, ServerConfig, bearer_token, match_key
from asr_spec.server.files import FileWorker
from asr_spec.server.metrics import Metrics
from starlette.requests import HTTPConnection

from asr_spec.models.vocab import LANGUAGES
from asr_spec.streaming.engine import Engine
from asr_spec.streaming.events import Event
from asr_spec.threads import release_pool


class Listener(Protocol):
    """A started session, as the inference thread sees it: where its stream's events go."""

    def deliver(self, sid: int, events: list[Event], flushes: int) -> None: ...


class SessionThreads(ThreadPoolExecutor):
    """The session threads. A call that ran torch (a stream's voice detector is made with torch) leaves its thread
    without OpenMP workers: the inference thread's pool stays the process's only one (asr_spec/threads.py)."""

    def submit(self, fn: Callable, /, *args, **kwargs):
        return super().submit(_released, fn, *args, **kwargs)


def _released(fn: Callable, *args, **kwargs):
    try:
        return fn(*args, **kwargs)
    finally:
        release_pool()


@dataclass(eq=False)
class Shared:
    engine: Engine
    config: ServerConfig
    files: FileWorker | None = None  # the OpenAI-compatible uploads' worker; None: the server transcribes no files
    metrics: Metrics = field(default_factory=Metrics)
    # started sessions by stream id (the inference thread's addressees): written through register and unregister
    sessions: dict[int, Listener] = field(default_factory=dict)
    # each session runs one call at a time here (its reader's), plus one at its close or the shutdown's drain
    pool: SessionThreads = field(init=False)
    languages: set[str] | None = field(init=False)  # the model's language codes; None: an English-only model
    language_names: dict[str, str] | None = field(init=False)  # code -> name (OpenAI's verbose_json)
    _wake: threading.Event = field(default_factory=threading.Event, repr=False)

    def __post_init__(self) -> None:
        self.pool = SessionThreads(max_workers=2 * self.config.max_sessions + 2,
                                       thread_name_prefix="asr_spec-session")
        self.languages = set(self.engine.recognizer.vocab.languages) or None
        self.language_names = {code: LANGUAGES.get(code, code) for code in self.languages} if self.languages else None

    def register(self, sid: int, session: Listener) -> None:
        """Stream ``sid`` is ``session``'s: its events go there."""
        self.sessions[sid] = session

    def unregister(self, sid: int) -> None:
        """Stream ``sid`` is closed (or closing): its events go nowhere."""
        self.sessions.pop(sid, None)

    def wake(self) -> None:
        """Tell the inference thread that a stream may be due (new audio, a flush)."""
        self._wake.set()

    def sleep(self, timeout: float) -> None:
        """The inference thread, with nothing due: wait until :meth:`wake` is called, at most ``timeout`` seconds."""
        self._wake.wait(timeout)
        self._wake.clear()

    def client_of(self, conn: HTTPConnection, key: str | None) -> tuple[tuple[str, str], ...]:
        """Who a connection is, for the per-client limits: its address and, when the server has several keys, the
        key it presented (``key``)."""
        several = len(self.config.api_keys) > 1 and key
        return (("address", conn.client.host if conn.client else ""),) + ((("key", key),) if several else ())

    def key_of(self, conn: HTTPConnection) -> str | None:
        """The API key this request presents, when it is one of the server's ("" when none is needed); None
        when it is missing or wrong. ``Authorization: Bearer KEY``, or ``?api_key=KEY``, or on a WebSocket the
        subprotocol ``openai-insecure-api-key.KEY`` (browsers cannot set headers on a WebSocket)."""
        if not self.config.api_keys:
            return ""
        auths = conn.headers.getlist("authorization")
        auth = auths[0] if len(auths) == 1 else ""  # two Authorization headers: neither counts
        if (key := match_key(self.config.api_keys, bearer_token(auth) or conn.query_params.get("api_key", ""))):
            return key
        offered = [p.strip() for p in conn.scope.get("subprotocols", [])]
        keys = [p[len(KEY_PROTOCOL):] for p in offered if p.startswith(KEY_PROTOCOL)]
        return match_key(self.config.api_keys, keys[0]) if len(keys) == 1 else None
