"""The streaming engine: one shared model, the re-decodes of all due streams batched together.

``Engine.step()`` looks at every open stream, and decodes those that are due in batches of up to
``max_batch`` rows: one encoder call and one speculative decode (ragged per-row acceptance) per batch.
Callers (the WebSocket server's inference thread, the in-process microphone client, tests) call it in a
loop; everything else is in :class:`~asr_spec.streaming.stream.Stream`.
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass

import torch

from ..features import log_mel, window
from ..transcribe import TranscribeOptions, Transcriber
from .stream import Event, Stream, StreamConfig


@dataclass(frozen=True)
class EngineConfig:
    max_batch: int = 8
    k: int = TranscribeOptions.k
    draft_stop: float = TranscribeOptions.draft_stop


class Engine:
    def __init__(self, transcriber: Transcriber, config: EngineConfig = EngineConfig()):
        self.transcriber = transcriber
        self.config = config
        self.streams: dict[int, Stream] = {}
        self.lock = threading.Lock()  # guards ``streams`` and the streams' state
        self._next_id = 0
        self.busy_s = 0.0  # time spent decoding (for the real-time factor)

    def open(self, config: StreamConfig = StreamConfig()) -> int:
        stream = Stream(config, self.transcriber.target.tokenizer)
        with self.lock:
            self._next_id += 1
            self.streams[self._next_id] = stream
            return self._next_id

    def feed(self, sid: int, audio) -> None:
        with self.lock:
            self.streams[sid].feed(audio)

    def flush(self, sid: int) -> None:
        with self.lock:
            self.streams[sid].flush()

    def close(self, sid: int) -> Stream | None:
        with self.lock:
            return self.streams.pop(sid, None)

    def pending(self) -> bool:
        with self.lock:
            return any(s.due() for s in self.streams.values())

    def step(self) -> dict[int, list[Event]]:
        """Decode every due stream once; return the events per stream id."""
        events: dict[int, list[Event]] = {}
        with self.lock:
            due = []
            for sid, s in self.streams.items():
                kind = s.due()
                if kind == "final" and s.silent:
                    events[sid] = s.flush_silent()
                elif kind:
                    due.append((sid, s, s.request(kind)))
        for i in range(0, len(due), self.config.max_batch):
            batch = due[i:i + self.config.max_batch]
            t0 = time.perf_counter()
            results, language = self._decode([r for _, _, r in batch])
            self.busy_s += time.perf_counter() - t0
            with self.lock:
                for (sid, stream, req), result, lang in zip(batch, results, language):
                    if self.streams.get(sid) is stream:  # not closed meanwhile
                        events[sid] = stream.apply(req, result, lang)
        return events

    @torch.inference_mode()
    def _decode(self, requests: list) -> tuple[list, list]:
        tr = self.transcriber
        mel = torch.stack([window(log_mel(r.audio, tr.target.n_mels), 0) for r in requests])
        memories = tr.encode(mel.to(tr.target.decoder.device))
        languages = [r.language for r in requests]
        if tr.vocab.multilingual and None in languages:
            detected = tr.detect_language(memories[0])
            languages = [lang or d for lang, d in zip(languages, detected)]
        prompts = [tr.prompt(r.context, lang, r.task, timestamps=True) for r, lang in zip(requests, languages)]
        results = tr.decode(memories, prompts, 0.0, self.config.k, True, None, draft_stop=self.config.draft_stop,
                            prefixes=[r.prefix for r in requests], hints=[r.hint for r in requests])
        return results, languages


def stream_audio(engine: Engine, audio, config: StreamConfig = StreamConfig(), chunk_s: float = 0.5,
                 stats: list | None = None) -> list[Event]:
    """Stream ``audio`` (16 kHz float32) through ``engine`` in ``chunk_s`` pieces, decoding whatever is due
    before the next piece (a real-time stream with instant decoding), then flush: the events a client would
    get. The stream's statistics are appended to ``stats``."""
    sid = engine.open(config)
    events: list[Event] = []
    step = int(chunk_s * 16000)
    try:
        for start in range(0, len(audio), step):
            engine.feed(sid, audio[start:start + step])
            while engine.pending():
                events += engine.step().get(sid, [])
        engine.flush(sid)
        while engine.pending():
            events += engine.step().get(sid, [])
    finally:
        stream = engine.close(sid)
        if stats is not None and stream is not None:
            stats.append(stream.stats)
    return events
