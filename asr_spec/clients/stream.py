"""``asr_spec stream FILE --url ws://…``: send a file to ``asr_spec serve`` as a live stream, print events."""
from __future__ import annotations

import json
import sys
import threading
import time

import numpy as np

FRAME_S = 0.1


def stream_file(url: str, audio: np.ndarray, speed: float | None, on_event=lambda e: None,
                language: str | None = "en", api_key: str | None = None) -> list[dict]:
    """Send 16 kHz ``audio`` in 100 ms pcm_s16le frames, paced at ``speed`` x real time (None: as fast as
    allowed), then ``close``; call ``on_event`` with every event and return them all."""
    from websockets.sync.client import connect

    headers = {"Authorization": f"Bearer {api_key}"} if api_key else None
    events: list[dict] = []

    def receive(ws) -> None:
        try:
            for message in ws:
                events.append(json.loads(message))
                on_event(events[-1])
        except Exception:  # the connection ended
            pass

    # ping_timeout=None: while the server backpressures a fast sender, pings wait behind unread audio
    with connect(url, additional_headers=headers, max_size=None, open_timeout=30, ping_timeout=None) as ws:
        ws.send(json.dumps({"type": "start", "sample_rate": 16000, "encoding": "pcm_s16le", "channels": 1,
                            "language": language}))
        reader = threading.Thread(target=receive, args=(ws,), daemon=True)
        reader.start()
        frame = int(FRAME_S * 16000)
        t0 = time.monotonic()
        for i in range(0, len(audio), frame):
            if speed and (wait := t0 + i / 16000 / speed - time.monotonic()) > 0:
                time.sleep(wait)
            ws.send((np.clip(audio[i:i + frame], -1, 1) * 32767).astype("<i2").tobytes())
        ws.send(json.dumps({"type": "close"}))
        reader.join()
    return events


def printer(as_json: bool, out=sys.stdout):
    """An ``on_event`` that prints JSON lines, or finals as text lines (errors to stderr)."""
    def on_event(e: dict) -> None:
        if as_json:
            print(json.dumps(e), file=out, flush=True)
        elif e["type"] == "final" and e["text"]:
            print(f"[{e['start']:7.2f} -> {e['end']:7.2f}] {e['text']}", file=out, flush=True)
        elif e["type"] == "error":
            print(f"error {e['code']}: {e['message']}", file=sys.stderr, flush=True)
        elif e["type"] == "closed":
            print(f"closed: {e['audio_seconds']} s audio, {e['tokens']} tokens, acceptance {e['acceptance']}",
                  file=sys.stderr, flush=True)
    return on_event
