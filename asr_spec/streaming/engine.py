"""The streaming engine: one shared model, the re-decodes of the due streams batched together.

``Engine.step()`` looks at every open stream and decodes one batch of up to ``max_batch`` due streams:
each stream's audio is encoded at its own length (``encoder_window="audio"``: the buffer plus 2 s of
silence, rounded up to whole seconds, instead of a padded 30 s window) and all rows run one ragged
speculative decode. Fairness: end-of-utterance and flush decodes go first, then the streams whose
audio has waited longest; a stream is in a batch at most once, so no session takes more than its share.
Callers (the WebSocket server's inference thread, the in-process microphone client, tests) call
``step`` in a loop; everything about one stream is in :class:`~asr_spec.streaming.stream.Stream`.
"""
from __future__ import annotations

import logging
import threading
import time
from collections import deque
from dataclasses import dataclass, replace
from functools import partial

import torch

from ..alignment import Alignment, Word, align, align_many
from ..decoding.speculative import SAMPLE_LEN
from ..models.kv_decoder import CrossKV
from ..features import HOP, N_FRAMES, SAMPLE_RATE, encoder_frames, log_mel, window
from ..recognizer import DRAFT_STOP, K, Checks, Recognizer, pad_memories
from .stream import Event, Request, Stream, StreamConfig

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class EngineConfig:
    max_batch: int = 8
    k: int = K
    draft_stop: float = DRAFT_STOP
    encoder_window: str = "audio"  # "audio": encode only the buffer (plus 2 s); "full": padded 30 s windows
    # Whisper's hallucination thresholds; a shorter fallback ladder than offline (each step is a full decode)
    checks: Checks = Checks(temperatures=(0.0, 0.4, 0.8))
    # a row holds at most its prefix + 16 + this many tokens per second of its audio (capped at Whisper's 224):
    # speech is 3-7 tokens/s with timestamps, so only a loop reaches it, and a loop on a short piece costs
    # what the piece is worth instead of 224 tokens at every temperature
    tokens_per_s: float = 16.0
    # the step grows with the load: a stream is due once it has this many times the engine's recent step time of
    # new audio (so that decoding takes about this share of the time), between its own step_s and max_step_s
    target_busy: float = 0.7
    # 0: off, every stream re-decodes after its own step, and decodes do not depend on the machine's speed (serve: 3 s)
    max_step_s: float = 0.0
    # a batch that decodes anyway takes along the streams with at least this share of their step of new audio: a row
    # added to a batch costs far less than a batch of its own later (the passes are shared), and the streams fall
    # into step with each other, so that later batches are full too (1: only streams that are due)
    join_share: float = 0.5


class Engine:
    def __init__(self, transcriber: Recognizer, config: EngineConfig = EngineConfig()):
        self.transcriber = transcriber
        self.config = config
        self._streams: dict[int, Stream] = {}
        self._lock = threading.Lock()  # guards ``_streams`` and the streams' state
        self._next_id = 0
        self.busy_s = 0.0  # time the engine worked: voice detection, scheduling, decoding (the real-time factor)
        self.queue_wait_s: deque[float] = deque(maxlen=2000)  # per decode: how long its audio had waited
        self.decodes = 0
        self.step_wall_s = 0.0  # moving average of a step's time (scheduling and decoding), for the load step

    # --- sessions ---------------------------------------------------------------------------------------
    def open(self, config: StreamConfig = StreamConfig()) -> int:
        stream = Stream(config, self.transcriber.target.tokenizer)
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
            return self._streams.pop(sid, None)

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

    def pending(self) -> bool:
        t0 = time.perf_counter()
        with self._lock:
            due = any(s.due(self.load_step_s) for s in self._streams.values())
        self.busy_s += time.perf_counter() - t0  # voice activity detection of new audio runs here
        return due

    # --- decoding -----------------------------------------------------------------------------------------
    def step(self) -> dict[int, list[Event]]:
        """Decode one batch of due streams (finals first, then by waiting time); return events per stream id."""
        events: dict[int, list[Event]] = {}
        t0 = time.perf_counter()
        with self._lock:
            due = []
            for sid, s in self._streams.items():
                kind = s.due(self.load_step_s)
                if kind == "final" and (settled := s.settle_flush()) is not None:
                    events[sid] = settled
                elif kind:
                    due.append((kind == "partial", s.waiting_since or 0.0, sid, s, kind))
            due.sort(key=lambda d: d[:2])
            due = due[: self.config.max_batch]
            if due and len(due) < self.config.max_batch:  # streams nearly due join the batch
                chosen = {d[2] for d in due}
                near = [(True, s.waiting_since or 0.0, sid, s, "partial") for sid, s in self._streams.items()
                        if sid not in chosen and s.due(self.load_step_s, self.config.join_share) == "partial"]
                due += sorted(near, key=lambda d: d[:2])[: self.config.max_batch - len(due)]
            batch = [(sid, s, s.request(kind)) for _, _, sid, s, kind in due]
        if not batch:
            self.busy_s += time.perf_counter() - t0
            return events
        decoded = self._decode_apart([r for _, _, r in batch])
        with self._lock:
            self.decodes += len(batch)
            for (sid, stream, req), outcome in zip(batch, decoded):
                self.queue_wait_s.append(req.waited_s)
                if self._streams.get(sid) is not stream:  # closed meanwhile
                    continue
                if isinstance(outcome, Exception):  # end this stream only; the others go on
                    del self._streams[sid]
                    failed = Event("error", f"decoding this stream failed ({type(outcome).__name__}: {outcome}); "
                                   "audio after the last final was not transcribed", stream.start, stream.start)
                    events[sid] = events.get(sid, []) + [failed]
                else:
                    *result, memory, aligned = outcome
                    aligns = stream.config.word_timestamps or stream.config.policy == "alignatt"
                    aligner = partial(self._align, req, memory, result[1] or stream.language, result[0].cross,
                                      aligned) if aligns else None
                    events[sid] = events.get(sid, []) + stream.apply(req, *result, aligner=aligner)
        wall = time.perf_counter() - t0
        self.busy_s += wall
        self.step_wall_s = 0.8 * self.step_wall_s + 0.2 * wall
        return events

    def _align(self, request: Request, memory: torch.Tensor, language: str | None, cross: CrossKV | None,
               aligned: dict[tuple, list[Word]], before: list[int], tokens: list[int]) -> list[Word]:
        """The words of ``tokens``, Whisper's way (``align``), over the audio they were decoded from, in seconds
        from its start; the ``before`` tokens decoded ahead of them in that audio are aligned with them (their
        audio comes first) and their words dropped. ``aligned``: what the decode aligned already (AlignAtt's
        continuations, aligned in one batch)."""
        if (known := aligned.get((tuple(before), tuple(tokens)))) is not None:
            return known
        try:
            return align(self.transcriber.target, memory, len(request.audio) // HOP, language, request.task,
                         [before, tokens], cross, scored=1)[1]
        except Exception:  # noqa: BLE001 - the final goes out without word times rather than not at all
            log.exception("aligning words failed")
            return []

    def _align_continuations(self, requests: list[Request], results: list[tuple]) -> list[dict[tuple, list[Word]]]:
        """The words of each aligning request's continuation after its prefix (what AlignAtt commits from), all
        rows in one pass of the target decoder; {(prefix, continuation): its words} per request."""
        rows = [i for i, r in enumerate(requests) if r.aligns]
        out: list[dict[tuple, list[Word]]] = [{} for _ in requests]
        if not rows:
            return out
        cont = {i: results[i][0].tokens[len(requests[i].prefix):] for i in rows}
        windows = [Alignment(results[i][4], len(requests[i].audio) // HOP, results[i][1], requests[i].task,
                             [requests[i].prefix, cont[i]], results[i][0].cross, scored=1) for i in rows]
        try:
            words = align_many(self.transcriber.target, windows)
        except Exception:  # noqa: BLE001 - each row is aligned on its own when asked
            log.exception("aligning words failed")
            return out
        for i, w in zip(rows, words):
            out[i][(tuple(requests[i].prefix), tuple(cont[i]))] = w[1]
        return out

    def _decode_apart(self, requests: list[Request]) -> list[tuple | Exception]:
        """(result, language, reliable, fallbacks, target encoder output) per request, or its exception:
        :meth:`_decode`; if the batch raises, each request alone, so that a request that cannot be decoded
        fails by itself (its exception in its place) instead of failing, and being retried with, every batch."""
        try:
            return self._decode(requests)
        except Exception as e:  # noqa: BLE001 - isolated below, reported to the one stream
            if len(requests) == 1:
                log.exception("decoding a stream failed")
                return [e]
        return [out for r in requests for out in self._decode_apart([r])]

    @torch.inference_mode()
    def _decode(self, requests: list[Request]) -> list[tuple]:
        """Encode each request at its own length, decode all rows together, and decode again at higher
        temperatures the committing rows that fail Whisper's hallucination checks (as ``transcribe`` does). A row
        encoded at its audio's length that looks looped (``Recognizer.suspect``) or fails the checks is first
        decoded again on a padded 30 s window (Whisper's own input), and its temperature ladder runs there."""
        tr, c = self.transcriber, self.config
        device = tr.target.decoder.device
        encoded = [tr.encode(window(log_mel(r.audio, tr.target.n_mels), 0,
                                    encoder_frames(len(r.audio) // HOP, full=c.encoder_window == "full"))[None].to(device))
                   for r in requests]
        lengths = [e[0].shape[1] for e in encoded]
        memories = (pad_memories([e[0] for e in encoded]), pad_memories([e[1] for e in encoded]) if encoded[0][1] is not None else None)
        languages = [r.language for r in requests]
        if tr.vocab.multilingual and None in languages:
            detected = tr.detect_language(memories[0], lengths)
            languages = [lang or d for lang, d in zip(languages, detected)]
        rows = [replace(tr.prompt(r.context, lang, r.task, timestamps=True), prefix=r.prefix, hint=r.hint,
                        sample_len=min(SAMPLE_LEN, len(r.prefix) + 16 + int(c.tokens_per_s * len(r.audio) / SAMPLE_RATE)))
                for r, lang in zip(requests, languages)]
        decode = partial(tr.decode, k=c.k, draft_stop=c.draft_stop, seed=c.checks.seed, keep_cross=True)
        short = [n < N_FRAMES // 2 for n in lengths]  # a looped decode of such a row is decoded again on 30 s
        results = decode(memories, [replace(row, memory_length=n, give_up=partial(tr.looping, positions=n) if s else None)
                                    for row, n, s in zip(rows, lengths, short)])
        out = []
        for i, (r, result) in enumerate(zip(requests, results)):
            row = (memories[0][i:i + 1, :lengths[i]], memories[1][i:i + 1, :lengths[i]] if memories[1] is not None else None)
            fallbacks = 0
            if short[i] and (tr.suspect(result, lengths[i]) or (r.final and tr.needs_fallback(result, c.checks))):
                fallbacks += 1  # looped, or failed the checks: decode it again as Whisper would,
                row = tr.encode(window(log_mel(r.audio, tr.target.n_mels), 0, N_FRAMES)[None].to(device))  # 30 s
                result = decode(row, [rows[i]])[0]
            reliable = not tr.needs_fallback(result, c.checks)
            if r.final and not reliable:
                for attempt, temperature in enumerate(c.checks.temperatures[1:], 1):
                    fallbacks += 1
                    result = decode(row, [replace(rows[i], key=(attempt,))], temperature)[0]
                    if reliable := not tr.needs_fallback(result, c.checks):
                        break
            out.append((result, languages[i], reliable, fallbacks, row[0]))
        return [(*o, a) for o, a in zip(out, self._align_continuations(requests, out))]


def stream_audio(engine: Engine, audio, config: StreamConfig = StreamConfig(), chunk_s: float = 0.5,
                 stats: list | None = None) -> list[Event]:
    """Stream ``audio`` (16 kHz float32) through ``engine`` in ``chunk_s`` pieces, decoding whatever is due
    before the next piece (a real-time stream with instant decoding), then close: the events a client
    would get. The stream's statistics are appended to ``stats``."""
    sid = engine.open(config)
    events: list[Event] = []
    step = int(chunk_s * SAMPLE_RATE)
    try:
        for start in range(0, len(audio), step):
            engine.feed(sid, audio[start:start + step])
            while engine.pending():
                events += engine.step().get(sid, [])
        engine.flush(sid, close=True)
        while engine.pending():
            events += engine.step().get(sid, [])
    finally:
        stream = engine.close(sid)
        if stats is not None and stream is not None:
            stats.append(stream.stats)
    return events
