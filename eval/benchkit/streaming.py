"""What the streaming benchmarks (eval/bench_streaming.py, bench_realtime.py, bench_shared_machine.py, host_ceiling.py)
share: per-word latency from a session's event log against the offline transcript's word times, words missing,
the capacity bar, how the server's inference thread spends its time, an in-process server around an engine, and
clients streaming at real time from a process of their own.

A word's partial latency is when it first appeared at its place in committed + partial text minus the time its
audio ended (Whisper's word alignment of the offline transcript), its final latency when it was committed minus that
time; ``*_linear`` the same against the old yardstick (the end estimated linearly in characters inside its offline
segment).
"""
from __future__ import annotations

import asyncio
import difflib
import hashlib
import multiprocessing
import os
import re
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Protocol, TypeVar

import numpy as np
from asr_spec.clients.stream import stream_file
from asr_spec.server.app import Server
from asr_spec.server.config import ServerConfig
from asr_spec.server.settings import ServeSettings

from asr_spec.alignment import Word
from asr_spec.audio import SAMPLE_RATE
from asr_spec.decoding.budget import Tally
from asr_spec.decoding.static import EAGER, RUN, STATIC, inside
from asr_spec.evaluation.data import Session
from asr_spec.recognizer import Recognizer
from asr_spec.streaming.engine import Engine
from asr_spec.transcribe import TranscribeOptions, Transcriber
from asr_spec.transcript import Transcript

MAX_FINAL_LATENCY_S = 3.0  # the capacity bar: real time with final latency median at most this
Log = list[tuple[float, dict]]  # (seconds since the session started, event)
T = TypeVar("T")


def words(text: str) -> list[str]:
    return re.findall(r"[a-z0-9']+", text.lower())


@dataclass(frozen=True)
class TimedWord:
    word: str
    end: float  # when its audio ended: Whisper's word alignment of the offline transcript
    end_linear: float  # the old estimate: linear in characters inside its offline segment


class HasWords(Protocol):  # the part of transcribe.Segment that timed_words reads
    start: float
    end: float
    words: list[Word] | None


def timed_words(segments: Sequence[HasWords]) -> list[TimedWord]:
    """The offline transcript's words (as :func:`words` splits them), each with both end times."""
    out = []
    for seg in segments:
        pieces = [(x, w.end) for w in seg.words or () for x in words(w.word)]
        total, acc = sum(len(x) for x, _ in pieces) or 1, 0
        for x, end in pieces:
            acc += len(x)
            out.append(TimedWord(x, end, seg.start + (seg.end - seg.start) * acc / total))
    return out


def streamed_words(log: Log) -> tuple[list[str], list[float], list[float]]:
    """The session's committed words (its finals joined by their ``join`` strings) and, per word, when it first
    appeared at its place in committed + partial text and when it was committed. A final that continues the last
    committed word (no space in between) commits the whole word anew."""
    text, committed, final_at, first = "", [], [], {}
    for t, e in log:
        if e["type"] not in ("partial", "final"):
            continue
        hyp = words(text + e["join"] + e["text"])
        if e["type"] == "final":
            text += e["join"] + e["text"]
            keep = len(os.path.commonprefix([committed, hyp]))
            committed, final_at = hyp, final_at[:keep] + [t] * (len(hyp) - keep)
        for i, x in enumerate(hyp):
            first.setdefault((i, x), t)
    return committed, [first[(i, x)] for i, x in enumerate(committed)], final_at


def word_latencies(log: Log, offline: list[TimedWord]) -> dict[str, list[float]]:
    """Partial and final latency of every committed word that aligns with an offline word, from its aligned end
    time and (``*_linear``) from the old linear estimate."""
    committed, first, final_at = streamed_words(log)
    match = difflib.SequenceMatcher(a=committed, b=[w.word for w in offline], autojunk=False)
    keys = [f"{kind}_latency{suffix}" for kind in ("partial", "final") for suffix in ("", "_linear")]
    out: dict[str, list[float]] = {key: [] for key in keys}
    for block in match.get_matching_blocks():
        for i, j in zip(range(block.a, block.a + block.size), range(block.b, block.b + block.size)):
            for suffix, end in (("", offline[j].end), ("_linear", offline[j].end_linear)):
                out["partial_latency" + suffix].append(first[i] - end)
                out["final_latency" + suffix].append(final_at[i] - end)
    return out


def missing_words(offline: list[str], committed: list[str], reference: list[str] | None = None) -> int:
    """Offline words with no counterpart in the finals: deleted ones, and those a shorter span replaced. With the
    human ``reference``, only offline words the reference has count: words an offline decode invented (Whisper
    looping, or a sentence made up in a pause) are not missing when a stream does not say them."""
    real = set(range(len(offline)))
    if reference is not None:
        confirm = difflib.SequenceMatcher(a=offline, b=reference, autojunk=False)
        real = {i for b in confirm.get_matching_blocks() for i in range(b.a, b.a + b.size)}
    match = difflib.SequenceMatcher(a=offline, b=committed, autojunk=False)
    return sum(max(0, sum(i in real for i in range(i1, i2)) - (j2 - j1))
               for tag, i1, i2, j1, j2 in match.get_opcodes() if tag in ("delete", "replace"))


def pct(xs: Sequence[float], q: float) -> float | None:
    """The ``q`` quantile of ``xs`` (nearest rank, rounded to ms); None when empty."""
    xs = sorted(xs)
    return round(xs[min(len(xs) - 1, int(q * len(xs)))], 3) if xs else None


def largest_real_time(rows: list[dict]) -> int | None:
    """The most sessions served at real time (RTF < 1) with final latency median <= ``MAX_FINAL_LATENCY_S``."""
    def ok(r: dict) -> bool:
        latency = r["final_latency_median_s"]
        return r["rtf"] < 1 and latency is not None and latency <= MAX_FINAL_LATENCY_S

    return max((r["sessions"] for r in rows if ok(r)), default=None)


class Offline:
    """Each distinct utterance's offline transcript (``asr_spec transcribe``'s, one file at a time) and its time,
    computed once: N sessions draw on the dev set's 65 utterances, so at 64 or 256 sessions most pieces repeat, and
    each is counted as often as it occurs. Keyed by the audio's bytes, per transcriber and word-timestamp option."""

    def __init__(self) -> None:
        self._done: weakref.WeakKeyDictionary[Transcriber, dict[tuple[bool, bytes], tuple[float, Transcript]]] = \
            weakref.WeakKeyDictionary()

    def __call__(self, tr: Transcriber, audio: np.ndarray, word_timestamps: bool = False) -> tuple[float, Transcript]:
        """(seconds the transcription took, its transcript)."""
        done = self._done.setdefault(tr, {})
        key = (word_timestamps, hashlib.sha1(audio.tobytes()).digest())
        if key not in done:
            start = time.perf_counter()
            result = tr.transcribe(audio, TranscribeOptions(language="en", word_timestamps=word_timestamps))
            done[key] = (time.perf_counter() - start, result)
        return done[key]


OFFLINE = Offline()


def cost_vs_offline(tr: Transcriber, sessions: Sequence[Session], busy: float) -> dict:
    """The engine's seconds per second of stream against the same speech transcribed offline, each utterance as a
    file (as ``asr_spec eval --systems spec`` times it: the same models, compute type and threads, one after the
    other in this process; each distinct utterance timed once, :class:`Offline`)."""
    audio_s = sum(s.seconds for s in sessions)
    speech_s = offline_s = 0.0
    for s in sessions:
        for _, piece in s.pieces:
            offline_s += OFFLINE(tr, piece)[0]
            speech_s += len(piece) / SAMPLE_RATE
    live, offline = busy / audio_s, offline_s / speech_s
    return {"engine_s_per_stream_s": round(live, 4), "offline_s_per_audio_s": round(offline, 4),
            "cost_vs_offline": round(live / offline, 2)}


class EngineProbe:
    """How the server's inference thread spends its time, seen from outside (``poll`` and ``step`` wrapped;
    nothing added to the engine's own accounting): inside the engine; between engine calls after a step or a
    ``poll`` that found a stream due (the engine idle while a stream waits: delivering events, waiting for
    the GIL); and after ``poll`` found nothing due (idle, nothing to do)."""

    def __init__(self, engine: Engine):
        self.inside_s = self.idle_due_s = self.idle_s = 0.0
        self._end: float | None = None
        self._due = False
        poll, step = engine.poll, engine.step
        engine.poll = lambda: self._call(poll, lambda due: due)
        engine.step = lambda: self._call(step, lambda _: True)

    def _call(self, fn: Callable[[], T], due: Callable[[T], bool]) -> T:
        t0 = time.perf_counter()
        if self._end is not None:
            if self._due:
                self.idle_due_s += t0 - self._end
            else:
                self.idle_s += t0 - self._end
        out = fn()
        self._end = time.perf_counter()
        self.inside_s += self._end - t0
        self._due = due(out)
        return out

    def shares(self, wall: float) -> dict[str, float]:
        return {"engine_inside_share": round(self.inside_s / wall, 3),
                "engine_idle_while_due_share": round(self.idle_due_s / wall, 3),
                "engine_idle_share": round(self.idle_s / wall, 3)}


class OpCount:
    """The torch operations the engine issues per step, counted on any machine: every ``every``-th call of
    ``engine.step`` (wrapped, as :class:`EngineProbe` wraps it) runs under a dispatch-mode counter (each operation
    the host dispatches counts one; a static decode's pass or prefill counts one, ``decoding.static.RUN`` in a ``budget.Tally``: on CUDA
    it is one graph replay, on a CPU its operations run but are not counted — what a GPU would launch). What those steps
    decoded: ``ticks``, ``rows`` (stream-steps), ``ops``. The counter slows the counted steps (a Python call per
    operation), so only a sample of them is counted."""

    def __init__(self, engine: Engine, every: int = 10):
        from torch.utils._python_dispatch import TorchDispatchMode


        class Counter(TorchDispatchMode):
            ops = 0

            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                Counter.ops += not inside()
                return func(*args, **(kwargs or {}))

        self.ticks = self.rows = self.ops = 0
        tally = Tally().open()  # open while the engine runs
        self.engine, self.tally, self.since = engine, tally, engine.ticks
        calls, step = [0], engine.step

        def counted():
            calls[0] += 1
            if calls[0] % every:
                return step()
            ticks, decodes, graphs, Counter.ops = engine.ticks, engine.decodes, tally[RUN], 0
            with Counter():
                out = step()
            if engine.ticks > ticks:
                self.ticks += 1
                self.rows += engine.decodes - decodes
                self.ops += Counter.ops + tally[RUN] - graphs
            return out

        engine.step = counted

    def figures(self) -> dict[str, float | None]:
        """Operations per tick and per stream-step (the counted steps), and every tick's decodes by how they ran
        (``static``, or ``eager``: what stays in the eager loop, e.g. sampling fallbacks)."""
        ticks = self.engine.ticks - self.since
        per_tick = {k: round(self.tally[e] / ticks, 2) if ticks else None for k, e in (("static", STATIC), ("eager", EAGER))}
        return {"ops_per_tick": round(self.ops / self.ticks, 1) if self.ticks else None,
                "ops_per_stream_step": round(self.ops / self.rows, 1) if self.rows else None,
                "ops_ticks_counted": self.ticks, "static_decodes_per_tick": per_tick["static"],
                "eager_decodes_per_tick": per_tick["eager"]}


def serve_engine(target, draft, settings: ServeSettings) -> Engine:
    """The engine exactly as ``asr_spec serve`` builds it from its settings."""
    return Engine(Recognizer(target, draft), settings.engine_config())


@contextmanager
def server_around(engine: Engine, config: ServerConfig, start_s: float = 30.0) -> Iterator[Server]:
    """``asr_spec serve``'s server around ``engine`` in a thread of this process (``config.port`` 0: a free loopback
    port, ``server.port`` once it listens); stopped on leaving."""
    server, ready = Server(engine, config), threading.Event()
    thread = threading.Thread(target=lambda: asyncio.run(server.serve_forever(ready)), daemon=True)
    thread.start()
    if not ready.wait(start_s):
        raise RuntimeError(f"the server did not start in {start_s:g} s")
    try:
        yield server
    finally:
        server.stop()
        thread.join(10)


def client(url: str, audio: np.ndarray, log: Log) -> None:
    """Stream ``audio`` at real time; log (seconds since the stream started, event)."""
    t0 = time.monotonic()
    stream_file(url, audio, 1.0, lambda e: log.append((time.monotonic() - t0, e)))


def clients_here(url: str, audios: list[np.ndarray]) -> tuple[list[Log], float]:
    """Every audio streamed by its own client thread at once: their event logs, and the wall time until the last
    closed."""
    logs: list[Log] = [[] for _ in audios]
    threads = [threading.Thread(target=client, args=(url, a, log)) for a, log in zip(audios, logs)]
    t0 = time.monotonic()
    for c in threads:
        c.start()
    for c in threads:
        c.join()
    return logs, time.monotonic() - t0


def run_clients(url: str, audios: list[np.ndarray]) -> tuple[list[Log], float]:
    """:func:`clients_here` in a process of their own, as real clients are: their Python work (pacing, framing,
    reading events) does not share the server's interpreter lock, only the machine's cores."""
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        return pool.apply(clients_here, (url, audios))
