"""``GET /metrics``: what the server has done, and what its streams are waiting for."""
from __future__ import annotations

import threading
import time

from ..decoding.speculative import acceptance
from ..streaming.engine import Engine


class Metrics:
    def __init__(self):
        self.sessions_total = 0
        self.refused = 0
        self.audio_s = 0.0
        self.accepted = 0
        self.rejected = 0
        self.started = time.time()
        # closing a stream and counting its totals is one step for ``snapshot`` (both run in worker threads)
        self._lock = threading.Lock()

    def close(self, engine: Engine, sid: int) -> None:
        """Close engine stream ``sid`` and count its totals."""
        with self._lock:
            if (stream := engine.close(sid)) is not None:
                self.audio_s += stream.stats.audio_s
                self.accepted += stream.stats.decode.accepted
                self.rejected += stream.stats.decode.rejected

    def snapshot(self, engine: Engine, sessions: int) -> dict:
        """Run it off the event loop: ``engine.snapshot`` waits for the engine's lock."""
        with self._lock:
            live = engine.snapshot()
            audio = self.audio_s + sum(s["audio_seconds"] for s in live)
            acc = self.accepted + sum(s["accepted"] for s in live)
            rej = self.rejected + sum(s["rejected"] for s in live)
        waits = sorted(engine.queue_wait_s)
        pct = lambda q: round(waits[min(len(waits) - 1, int(q * len(waits)))], 3) if waits else None  # noqa: E731
        return {"sessions": sessions, "sessions_total": self.sessions_total, "refused": self.refused,
                "audio_seconds": round(audio, 3), "busy_seconds": round(engine.busy_s, 3),
                "rtf": round(engine.busy_s / audio, 4) if audio else None,
                "acceptance": round(a, 4) if (a := acceptance(acc, rej)) is not None else None,
                "decodes": engine.decodes,
                "queue_wait_seconds": {"median": pct(0.5), "p90": pct(0.9), "max": waits[-1] if waits else None},
                "streams": [{"backlog_seconds": s["backlog_seconds"], "waiting_seconds": s["waiting_seconds"],
                             "audio_seconds": s["audio_seconds"], "decoded_seconds": s["decoded_seconds"]}
                            for s in live],
                "uptime_seconds": round(time.time() - self.started, 1)}
