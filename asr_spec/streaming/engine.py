"""The streaming engine: one shared model, the re-decodes of the due streams batched together.

``Engine.step()`` decodes one batch of up to ``max_batch`` due streams (decode.py): each stream's buffer encoded
at its own length — by default only what is new since its last decode (encoding.py) — and all rows decoded as
one ragged speculative batch. Fairness: end-of-utterance and flush decodes go first, then the streams whose audio
has waited longest; a stream is in a batch at most once, so no session takes more than its share. Callers (the
WebSocket server's inference thread, the in-process microphone client, tests) call ``poll`` and ``step`` in a
loop; everything about one stream is in :class:`~asr_spec.streaming.stream.Stream`.
"""
from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass

from ..cpu import Others
from ..recognizer import EncoderWindow, Recognizer
from .capacity import Capacity
from .config import EngineConfig, StreamConfig
from .decode import decode_apart
from .encoding import BufferEncoder
from .events import Event
from .request import RequestKind
from .stream import Stream, listen

LOAD_SAMPLE_S = 0.5  # the load is sampled after every decode, and at least this often while polling


@dataclass(frozen=True)
class Due:
    """A stream due to be decoded in the next batch, and what for."""
    sid: int
    stream: Stream
    kind: RequestKind
    waiting_since: float  # when its oldest undecoded audio arrived (monotonic)

    def order(self) -> tuple[bool, float]:
        """Its place in the batch's order: finals and windows first, then the longest waiting."""
        return self.kind is RequestKind.PARTIAL, self.waiting_since


class Engine:
    def __init__(self, recognizer: Recognizer, config: EngineConfig = EngineConfig()):
        self.recognizer = recognizer  # its draft drafts for the streams only where ``config.draft`` asks for it
        self.config = config
        self._streams: dict[int, Stream] = {}
        self._lock = threading.Lock()  # guards ``_streams`` and the streams' state
        self._next_id = 0
        self.busy_s = 0.0  # time the engine worked: voice detection, scheduling, decoding (the real-time factor)
        self.queue_wait_s: deque[float] = deque(maxlen=2000)  # per decode: how long its audio had waited
        self.decodes = 0
        self.ticks = 0  # steps that decoded a batch
        self._gone_s = 0.0  # audio the closed streams took in (decoded or skipped as silence)
        self._load: deque[tuple[float, float, float]] = deque()  # (time, busy seconds, audio taken in) samples
        self.step_wall_s = 0.0  # moving average of a step's time (scheduling and decoding), for the load step
        self.capacity = Capacity()  # what steps cost by rows and new audio: how many real-time streams it carries

    # --- sessions ---------------------------------------------------------------------------------------
    def open(self, config: StreamConfig = StreamConfig()) -> int:
        c = self.config
        encoder = BufferEncoder(self.recognizer, c.lookahead_s, c.pad_s, c.draft) \
            if c.encoder_window is EncoderWindow.STREAM else None
        stream = Stream(config, self.recognizer.target.tokenizer, encoder)
        with self._lock:
            self._next_id += 1
            self._streams[self._next_id] = stream
            return self._next_id

    def feed(self, sid: int, audio) -> None:
        """Queue audio for stream ``sid`` (dropped if the stream was closed, or ended by a failed decode)."""
        with self._lock:
            if (s := self._streams.get(sid)) is not None:
                s.feed(audio)

    def flush(self, sid: int, close: bool = False) -> int:
        """Ask for stream ``sid``'s buffer to be decoded to the end; returns the flush count that marks it done
        (compare with :meth:`flushes`). Pending requests coalesce."""
        with self._lock:
            if (s := self._streams.get(sid)) is None:
                return 0
            s.flush(close)
            return s.flushes + 1

    def close(self, sid: int) -> Stream | None:
        """Forget stream ``sid`` at once: its queued audio is never decoded, a decode in flight is discarded."""
        with self._lock:
            stream = self._streams.pop(sid, None)
            if stream is not None:
                self._gone_s += stream.stats.decoded_s + stream.stats.skipped_s
            return stream

    def cost(self) -> float | None:
        """Engine seconds per second of audio taken in (decoded, or skipped as silence), over the last
        ``EngineConfig.load_window_s``; None until ``load_min_audio_s`` of audio has been taken in there. N
        real-time streams keep the engine busy N times this share of the time, however fast their audio came."""
        with self._lock:
            if len(self._load) < 2:
                return None
            (_, busy0, audio0), (_, busy1, audio1) = self._load[0], self._load[-1]
        audio = audio1 - audio0
        return (busy1 - busy0) / audio if audio >= self.config.load_min_audio_s else None

    def carried(self, step_s: float, share: float = 1.0) -> int | None:
        """How many real-time streams this engine carries, each re-decoded every ``step_s`` seconds under load (its
        longest step), keeping the engine busy at most ``share`` of the time (None: not measured yet)."""
        with self._lock:
            return self.capacity.streams(step_s, self.config.max_batch, share)

    def _sample_load(self) -> None:
        """Add a (time, busy, audio taken in) sample, forgetting those older than the window (caller holds the lock)."""
        now = time.monotonic()
        taken = self._gone_s + sum(s.stats.decoded_s + s.stats.skipped_s for s in self._streams.values())
        self._load.append((now, self.busy_s, taken))
        while len(self._load) > 2 and now - self._load[1][0] > self.config.load_window_s:
            self._load.popleft()

    # --- what callers may read --------------------------------------------------------------------------
    def flushes(self, sid: int) -> int:
        with self._lock:
            s = self._streams.get(sid)
            return s.flushes if s is not None else 0

    def backlog_s(self, sid: int) -> float:
        """Seconds of audio stream ``sid`` has received and not yet committed (0 for a closed stream)."""
        with self._lock:
            s = self._streams.get(sid)
            return s.backlog_s if s is not None else 0.0

    def stream_stats(self, sid: int) -> dict | None:
        with self._lock:
            s = self._streams.get(sid)
            return s.stats.as_dict() if s is not None else None

    def snapshot(self) -> list[dict]:
        """Live streams' statistics, with their current lag (undecoded audio) and how long it has waited."""
        now = time.monotonic()
        with self._lock:
            return [{**s.stats.as_dict(), "backlog_seconds": round(s.backlog_s, 3),
                     "waiting_seconds": round(now - s.waiting_since, 3) if s.waiting_since is not None else 0.0,
                     "accepted": s.stats.decode.accepted, "rejected": s.stats.decode.rejected}
                    for s in self._streams.values()]

    @property
    def load_step_s(self) -> float:
        """The least new audio a stream waits for at this load (see ``EngineConfig.target_busy``)."""
        return min(self.config.max_step_s, self.step_wall_s / self.config.target_busy)

    # --- decoding -----------------------------------------------------------------------------------------
    def poll(self) -> bool:
        """Take in the audio that arrived (voice detection, counted as the engine's work) and say whether a stream
        is due to be decoded."""
        t0 = time.perf_counter()
        self._listen()
        with self._lock:
            due = any(s.due(self.load_step_s) is not None for s in self._streams.values())
        self.busy_s += time.perf_counter() - t0
        if not self._load or time.monotonic() - self._load[-1][0] > LOAD_SAMPLE_S:
            with self._lock:
                self._sample_load()
        return due

    def _listen(self) -> None:
        """Voice detection of every stream's new audio, outside the engine's lock (only this thread listens)."""
        with self._lock:
            streams = list(self._streams.values())
        listen(streams)

    def step(self) -> dict[int, list[Event]]:
        """Decode one batch of due streams (finals first, then by waiting time); return events per stream id."""
        events: dict[int, list[Event]] = {}
        t0 = time.perf_counter()
        others = Others()
        self._listen()
        with self._lock:
            batch = self._gather(events)
            requests = [d.stream.request(d.kind) for d in batch]
            new_audio = sum(d.stream.intake.since_decode for d in batch)
        if not batch:
            self.busy_s += time.perf_counter() - t0
            return events
        decoded = decode_apart(self.recognizer, requests, self.config)
        with self._lock:
            self.decodes += len(batch)
            self.ticks += 1
            for d, req, outcome in zip(batch, requests, decoded):
                sid, stream = d.sid, d.stream
                self.queue_wait_s.append(req.waited_s)
                if self._streams.get(sid) is not stream:  # closed meanwhile
                    continue
                if isinstance(outcome, Exception):  # end this stream only; the others go on
                    del self._streams[sid]
                    failed = Event("error", f"decoding this stream failed ({type(outcome).__name__}: {outcome}); "
                                   "audio after the last final was not transcribed", stream.intake.start,
                                   stream.intake.start)
                    events[sid] = events.get(sid, []) + [failed]
                else:
                    events[sid] = events.get(sid, []) + stream.apply(req, outcome)
        wall = time.perf_counter() - t0
        self.busy_s += wall
        self.step_wall_s = 0.8 * self.step_wall_s + 0.2 * wall
        self.capacity.add(len(batch), new_audio, wall, others.cores())
        with self._lock:
            self._sample_load()
        return events

    def _gather(self, events: dict[int, list[Event]]) -> list[Due]:
        """The batch to decode now: due streams (finals first, then the longest waiting), and streams nearly due to
        fill it. Flushes that need no decode are settled here, into ``events``."""
        due = []
        for sid, s in self._streams.items():
            kind = s.due(self.load_step_s)
            if kind is RequestKind.FINAL and (settled := s.settle_flush()) is not None:
                events[sid] = settled
            elif kind is not None:
                due.append(Due(sid, s, kind, s.waiting_since or 0.0))
        due = sorted(due, key=Due.order)[: self.config.max_batch]
        if due and len(due) < self.config.max_batch:  # streams nearly due join the batch
            chosen = {d.sid for d in due}
            near = [Due(sid, s, RequestKind.PARTIAL, s.waiting_since or 0.0) for sid, s in self._streams.items()
                    if sid not in chosen and s.due(self.load_step_s, self.config.join_share) is RequestKind.PARTIAL]
            due += sorted(near, key=Due.order)[: self.config.max_batch - len(due)]
        return due


def stream_audio(engine: Engine, audio, config: StreamConfig = StreamConfig(), chunk_s: float = 0.5,
                 stats: list | None = None) -> list[Event]:
    """Stream ``audio`` (16 kHz float32) through ``engine`` in ``chunk_s`` pieces (:func:`stream_pieces`)."""
    return stream_audios(engine, [audio], config, chunk_s, stats)[0]


def stream_audios(engine: Engine, audios: list, config: StreamConfig = StreamConfig(), chunk_s: float = 0.5,
                  stats: list | None = None) -> list[list[Event]]:
    """Stream each of ``audios`` (16 kHz float32) through ``engine`` at once, ``chunk_s`` of each in turn, as fast as
    the engine takes them (:func:`stream_pieces`): each stream's events."""
    step = int(chunk_s * 16000)
    return stream_pieces(engine, [[a[start:start + step] for start in range(0, len(a), step)] for a in audios], config,
                         stats)


def stream_pieces(engine: Engine, streams: list[list], config: StreamConfig = StreamConfig(),
                  stats: list | None = None) -> list[list[Event]]:
    """Stream each stream's audio pieces (16 kHz float32) through ``engine``, one piece of each in turn, decoding
    whatever is due before the next (streams with instant decoding), then flush and close them: the events a client
    of each would get. The streams' statistics are appended to ``stats``."""
    sids = [engine.open(config) for _ in streams]
    events: dict[str, list[Event]] = {sid: [] for sid in sids}

    def drain() -> None:
        while engine.poll():
            for sid, got in engine.step().items():
                if sid in events:
                    events[sid] += got

    try:
        for i in range(max(map(len, streams), default=0)):
            for sid, pieces in zip(sids, streams):
                if i < len(pieces):
                    engine.feed(sid, pieces[i])
            drain()
        for sid in sids:
            engine.flush(sid, close=True)
        drain()
    finally:
        for sid in sids:
            stream = engine.close(sid)
            if stats is not None and stream is not None:
                stats.append(stream.stats)
    return [events[sid] for sid in sids]
