"""``asr_spec stream FILE --url ws://…``: send a file to ``asr_spec serve`` as a live stream, print events."""
from __future__ import annotations

import json
import socket
import sys
import threading
import time

import numpy as np

from asr_spec.audio import SAMPLE_RATE

CLOSE_WAIT_S = 180.0  # after close, the server's last events (it gives up on a flush after 120 s)
FRAME_S = 0.1
SEND_BUFFER_BYTES = 64 * 1024  # about 2 s of 16 kHz 16-bit audio queued in the kernel at most


def connect_session(url: str, api_key: str | None):
    """A sync WebSocket connection to ``asr_spec serve``, tuned for sending audio. Client keepalive is off: while
    the server backpressures a fast sender, a pong waits behind the unread audio, and once the ping latency
    exceeds the interval websockets' sync keepalive pings in a tight loop (hundreds of thousands of pings
    that crowd out the audio until the connection breaks). The server's own pings keep the connection alive
    through proxies. A small send buffer keeps what waits in the kernel (and so the server's pong latency) short."""
    from websockets.sync.client import connect

    headers = {"Authorization": f"Bearer {api_key}"} if api_key else None
    ws = connect(url, additional_headers=headers, max_size=None, open_timeout=30, ping_interval=None)
    ws.socket.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SEND_BUFFER_BYTES)
    return ws


def stream_file(url: str, audio: np.ndarray, speed: float | None, on_event=lambda e: None,
                language: str | None = "en", api_key: str | None = None, word_timestamps: bool = False) -> list[dict]:
    """Send 16 kHz ``audio`` in 100 ms pcm_s16le frames, paced at ``speed`` x real time (None: as fast as
    allowed), then ``close``; call ``on_event`` with every event and return them all. Raises
    :class:`StreamEnded` when the connection ends without the server's ``closed`` event."""
    from websockets.exceptions import ConnectionClosed

    events: list[dict] = []
    ended: list[BaseException] = []

    def receive(ws) -> None:
        try:
            for message in ws:
                events.append(json.loads(message))
                on_event(events[-1])
        except BaseException as e:  # noqa: BLE001 - re-raised in the caller's thread
            ended.append(e)

    with connect_session(url, api_key) as ws:
        ws.send(json.dumps({"type": "start", "sample_rate": SAMPLE_RATE, "encoding": "pcm_s16le", "channels": 1,
                            "language": language, "word_timestamps": word_timestamps}))
        reader = threading.Thread(target=receive, args=(ws,), daemon=True)
        reader.start()
        frame = int(FRAME_S * SAMPLE_RATE)
        t0 = time.monotonic()
        for i in range(0, len(audio), frame):
            if speed and (wait := t0 + i / SAMPLE_RATE / speed - time.monotonic()) > 0:
                time.sleep(wait)
            ws.send((np.clip(audio[i:i + frame], -1, 1) * 32767).astype("<i2").tobytes())
        ws.send(json.dumps({"type": "close"}))
        reader.join(CLOSE_WAIT_S)  # leaving the block closes the connection: a reader still waiting ends then
    if ended and not isinstance(ended[0], ConnectionClosed):
        raise ended[0]
    if not any(e["type"] == "closed" for e in events):
        raise StreamEnded(ws.close_code, ws.close_reason, events)
    return events


class StreamEnded(ConnectionError):
    """The server ended the connection before its ``closed`` event: the transcript may be incomplete."""

    def __init__(self, code: int | None, reason: str | None, events: list[dict]):
        errors = [f"{e.get('code')}: {e.get('message')}" for e in events if e["type"] == "error"]
        super().__init__(f"the server ended the stream without a closed event (close code {code}, reason "
                         f"{reason!r}; errors: {errors or 'none'}; last event: {events[-1] if events else None})")
        self.events = events


def printer(as_json: bool, out=sys.stdout):
    """An ``on_event`` that prints JSON lines, or finals as text lines (errors to stderr)."""
    def on_event(e: dict) -> None:
        if as_json:
            print(json.dumps(e), file=out, flush=True)
        elif e["type"] == "final" and e["text"]:
            print(f"[{e['start']:7.2f} -> {e['end']:7.2f}] {e['text']}", file=out, flush=True)
            for w in e.get("words", ()):
                print(f"    [{w['start']:7.2f} -> {w['end']:7.2f}] {w['word']}", file=out, flush=True)
        elif e["type"] == "error":
            print(f"error {e['code']}: {e['message']}", file=sys.stderr, flush=True)
        elif e["type"] == "closed":
            print(f"closed: {e['audio_seconds']} s audio, {e['tokens']} tokens, acceptance {e['acceptance']}",
                  file=sys.stderr, flush=True)
    return on_event
