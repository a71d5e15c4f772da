"""The server's settings in one object, where its API keys come from, and the log filter that keeps them out
of the logs."""
from __future__ import annotations

import hmac
import logging
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path

from asr_spec.streaming.config import StreamConfig

KEY_ENV = "ASR_SPEC_API_KEY"


@dataclass(frozen=True)
class ServerConfig:
    host: str = "127.0.0.1"
    port: int = 8765
    max_sessions: int = 8
    # a new session is refused (server_full; /health 503) when the engine's measured cost per second of audio x
    # (open sessions + 1) exceeds this share of the engine's time: one more speaker would not be kept at real time.
    # None: no load check (tests and benchmarks that overload a server on purpose); serve: ServeSettings.max_load
    max_load: float | None = None
    max_sessions_per_client: int = 0  # per client address, and per key when there are several; 0: half of max_sessions
    api_keys: tuple[str, ...] = ()  # empty: no key needed
    max_frame_bytes: int = 256 * 1024  # larger audio frames get an error event and are dropped
    max_append_s: float = 8.0  # audio in one Realtime append (as a 256 KiB frame of 16 kHz pcm_s16le); larger: dropped
    max_message_bytes: int = 4 * 1024 * 1024  # the connection is closed (1009) beyond this
    idle_timeout_s: float = 60.0  # a session that sends no audio this long is closed (also how a dead peer is found)
    # keepalive pings (for proxies and NAT); pongs are not awaited: a backpressured client's pong waits behind its
    # unread audio for as long as decoding takes, and the idle timeout finds a dead peer
    ping_interval_s: float = 20.0
    # every session's stream as the server sets it (step, commit policy, hotwords), replaced by what the session's
    # start message or Realtime settings name (a language, another policy, its own hotwords)
    stream: StreamConfig = StreamConfig()
    max_backlog_s: float = 40.0  # a session's undecoded audio beyond which its socket is not read (backpressure)
    start_timeout_s: float = 10.0  # a connection must send its start message within this
    min_audio_s_per_30s: float = 1.0  # a started session sending less is closed (checked on a timer)
    rate_window_s: float = 30.0
    head_timeout_s: float = 10.0  # a connection must send a complete request head within this
    upload_timeout_s: float = 120.0  # an upload's body must have arrived within this
    max_upload_bytes: int = 25 * 1024 * 1024  # OpenAI's limit for these endpoints
    max_upload_s: float = 3600.0  # audio in one upload, checked from the file's header, then while decoding
    drain_s: float = 5.0  # on SIGTERM, open sessions get this long to have their buffered audio decoded
    flush_timeout_s: float = 120.0  # a closing session's audio must be decoded within this

    @property
    def per_client(self) -> int:
        return self.max_sessions_per_client or max(1, self.max_sessions // 2)


def api_keys(cli_key: str | None, key_file: str | None) -> tuple[str, ...]:
    """The keys the server accepts: from ``--api-key-file`` (one per line, ``#`` comments), else ``--api-key``
    (with a warning: any local user sees it in ``ps``), else the environment variable."""
    if key_file:
        lines = Path(key_file).read_text().splitlines()
        keys = tuple(k for line in lines if (k := line.split("#", 1)[0].strip()))
        if not keys:
            raise ValueError(f"{key_file}: no key in the file")
        return keys
    if cli_key:
        print(f"warning: --api-key is visible to every local user (ps); prefer {KEY_ENV} or --api-key-file",
              file=sys.stderr)
        return (cli_key,)
    return (key,) if (key := os.environ.get(KEY_ENV)) else ()


KEY_PROTOCOL = "openai-insecure-api-key."  # browsers: the key as a WebSocket subprotocol (OpenAI's name)


def match_key(keys: tuple[str, ...], token: str) -> str | None:
    """The key among ``keys`` that ``token`` is (compared in constant time), or None."""
    matches = [k for k in keys if hmac.compare_digest(token.encode(errors="replace"), k.encode())]
    return matches[0] if matches else None


def bearer_token(authorization: str) -> str:
    """The token of an ``Authorization: Bearer TOKEN`` header ("" for another scheme or none). The scheme's name is
    case-insensitive in HTTP (RFC 9110, 11.1): ``bearer``, ``BEARER`` and ``Bearer`` all name it."""
    scheme, _, token = authorization.strip().partition(" ")
    return token.strip() if scheme.lower() == "bearer" else ""


_SECRETS = re.compile(r"(?i)(api(?:_|%5f)key=)[^&\s#'\"]*|(\bauthorization:\s*(?:bearer\s+)?)[^\s'\"]+"
                      r"|(openai-insecure-api-key\.)[^\s,'\"]+")


def redact(text: str) -> str:
    """``text`` with API keys hidden: ``api_key=VALUE`` (a URL's query), ``Authorization: Bearer VALUE`` and
    the browser subprotocol ``openai-insecure-api-key.VALUE``."""
    return _SECRETS.sub(lambda m: next(g for g in m.groups() if g) + "***", text)


class RedactSecrets(logging.Filter):
    """Logs never show the API key: the message, its exception text and stack are redacted (see :func:`redact`)."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            if isinstance(record.args, tuple):  # keep the arguments (uvicorn's access formatter unpacks them)
                record.args = tuple(redact(a) if isinstance(a, str) else a for a in record.args)
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
REDACTED_LOGGERS = ("asr_spec", "asr_spec.serve", "uvicorn", "uvicorn.error", "uvicorn.access")


def install_log_redaction() -> None:
    """Add :class:`RedactSecrets` to the loggers the server and uvicorn log on, and to the root logger's
    handlers (which every propagated record passes). A logger's filters only see records logged on that very
    logger, hence the list; a handler's see all it emits. Idempotent."""
    for target in [*(logging.getLogger(name) for name in REDACTED_LOGGERS), *logging.getLogger().handlers]:
        if _REDACT not in target.filters:
            target.addFilter(_REDACT)
