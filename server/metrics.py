"""``GET /metrics``: what the server has done, and what its streams are waiting for, in Prometheus' text format or
OpenMetrics (``prometheus_client``, by the scraper's Accept header) or as JSON (``?format=json``)."""
from __future__ import annotations

import threading
import time
from typing import Iterable

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import choose_encoder

from asr_spec.decoding.rows import acceptance
from asr_spec.streaming.engine import Engine
from asr_spec.streaming.events import Event

# seconds: a partial or final from ~0.1 s (a GPU, light load) to a stream far behind
LATENCY_BUCKETS = (0.1, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 8.0, 13.0, 20.0, 30.0)
WAIT_BUCKETS = (0.05, 0.1, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0, 30.0)


class Metrics:
    def __init__(self):
        self.audio_s = 0.0
        self.decoded_s = 0.0
        self.accepted = 0
        self.rejected = 0
        self.started = time.time()
        # closing a stream and counting its totals is one step for ``snapshot`` (both run in worker threads)
        self._lock = threading.Lock()
        # the server's own metrics: registered in each scrape's registry, with the totals of that moment (``scrape``)
        self.sessions_started = Counter("asr_spec_sessions_started", "WebSocket sessions that opened a stream",
                                        ["protocol"], registry=None)
        self.sessions_refused = Counter("asr_spec_sessions_refused", "WebSocket sessions refused, by reason",
                                        ["reason"], registry=None)
        self.latency = Histogram("asr_spec_event_latency_seconds", "From the arrival of the audio at an event's end "
                                 "to the event (partial: the audio its decode heard; final: its closing timestamp)",
                                 ["type"], buckets=LATENCY_BUCKETS, registry=None)
        self.queue_wait = Histogram("asr_spec_decode_queue_wait_seconds", "How long a stream's audio waited for its "
                                    "decode (the step included)", buckets=WAIT_BUCKETS, registry=None)
        self.uploads = Counter("asr_spec_uploads", "Uploads to the OpenAI-compatible endpoints, by outcome "
                               "(transcribed, refused, failed, disconnected: 499) and HTTP status", ["outcome", "status"], registry=None)
        self._decodes_seen = 0
        self.collectors = (self.sessions_started, self.sessions_refused, self.latency, self.queue_wait, self.uploads)

    def opened(self, protocol: str) -> None:
        self.sessions_started.labels(protocol).inc()

    def refuse(self, reason: str) -> None:
        self.sessions_refused.labels(reason).inc()

    def events(self, events: Iterable[Event]) -> None:
        for ev in events:
            if ev.latency_s is not None:
                self.latency.labels(ev.type).observe(ev.latency_s)

    def decoded(self, engine: Engine) -> None:
        """After an engine step, in the thread that steps it: the queue waits of the decodes it ran."""
        new = engine.decodes - self._decodes_seen
        self._decodes_seen = engine.decodes
        waits = list(engine.queue_wait_s)
        for w in waits[max(0, len(waits) - new):]:
            self.queue_wait.observe(w)

    def close(self, engine: Engine, sid: int) -> None:
        """Close engine stream ``sid`` and count its totals."""
        with self._lock:
            if (stream := engine.close(sid)) is not None:
                self.audio_s += stream.stats.audio_s
                self.decoded_s += stream.stats.decoded_s + stream.stats.skipped_s
                self.accepted += stream.stats.decode.accepted
                self.rejected += stream.stats.decode.rejected

    def snapshot(self, engine: Engine, sessions: int) -> dict:
        """Run it off the event loop: ``engine.snapshot`` waits for the engine's lock."""
        with self._lock:
            live = engine.snapshot()
            audio = self.audio_s + sum(s["audio_seconds"] for s in live)
            decoded = self.decoded_s + sum(s["decoded_seconds"] for s in live)
            acc = self.accepted + sum(s["accepted"] for s in live)
            rej = self.rejected + sum(s["rejected"] for s in live)
        waits = sorted(engine.queue_wait_s)
        pct = lambda q: round(waits[min(len(waits) - 1, int(q * len(waits)))], 3) if waits else None  # noqa: E731
        return {"sessions": sessions, "sessions_total": total(self.sessions_started),
                "refused": total(self.sessions_refused),
                "audio_seconds": round(audio, 3), "decoded_seconds": round(decoded, 3),
                "busy_seconds": round(engine.busy_s, 3),
                "rtf": round(engine.busy_s / audio, 4) if audio else None,
                "acceptance": round(a, 4) if (a := acceptance(acc, rej)) is not None else None,
                "draft_tokens": {"accepted": acc, "rejected": rej},
                "decodes": engine.decodes,
                "queue_wait_seconds": {"median": pct(0.5), "p90": pct(0.9), "max": waits[-1] if waits else None},
                "streams": [{"backlog_seconds": s["backlog_seconds"], "waiting_seconds": s["waiting_seconds"],
                             "audio_seconds": s["audio_seconds"], "decoded_seconds": s["decoded_seconds"]}
                            for s in live],
                "uptime_seconds": round(time.time() - self.started, 1)}

    def scrape(self, engine: Engine, sessions: int, accept: str | None) -> tuple[bytes, str]:
        """The exposition the ``accept`` header asks for (Prometheus' text format by default, or OpenMetrics) and
        its content type: the counters and histograms, and the totals of ``snapshot`` (run it off the loop)."""
        registry = CollectorRegistry()
        for collector in (*self.collectors, _Snapshot(self.snapshot(engine, sessions))):
            registry.register(collector)
        encode, content_type = choose_encoder(accept or "")
        return encode(registry), content_type


def total(counter: Counter) -> int:
    """A labelled counter's sum over its labels."""
    return int(sum(s.value for m in counter.collect() for s in m.samples if s.name.endswith("_total")))


class _Snapshot:
    """A one-scrape registry of ``Metrics.snapshot``'s totals."""

    def __init__(self, snap: dict):
        self.snap = snap

    def collect(self) -> Iterable[Metric]:
        s = self.snap
        yield GaugeMetricFamily("asr_spec_sessions_active", "Open WebSocket sessions with a stream", s["sessions"])
        yield CounterMetricFamily("asr_spec_audio_received_seconds", "Seconds of audio received by streams",
                                  s["audio_seconds"])
        yield CounterMetricFamily("asr_spec_audio_decoded_seconds", "Seconds of stream audio decoded (or skipped "
                                  "as silence)", s["decoded_seconds"])
        yield CounterMetricFamily("asr_spec_engine_busy_seconds", "Seconds the streaming engine worked",
                                  s["busy_seconds"])
        yield CounterMetricFamily("asr_spec_stream_decodes", "Stream decodes run by the engine", s["decodes"])
        drafts = CounterMetricFamily("asr_spec_draft_tokens", "Draft tokens the target verified, by outcome "
                                     "(speculative acceptance = accepted / all)", labels=["outcome"])
        for outcome, n in s["draft_tokens"].items():
            drafts.add_metric([outcome], n)
        yield drafts
        yield GaugeMetricFamily("asr_spec_streams_backlog_seconds", "Undecoded audio over all live streams",
                                sum(st["backlog_seconds"] for st in s["streams"]))
        yield GaugeMetricFamily("asr_spec_uptime_seconds", "Seconds since the server started", s["uptime_seconds"])
