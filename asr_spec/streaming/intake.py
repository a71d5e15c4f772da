"""A stream's audio on its way in: received audio queued, then moved into the buffer with voice activity detection.

``feed`` only queues (a fast sender costs the receiving thread nothing); ``listen`` — run by the engine's thread,
so that detection never competes with a decode for the CPU — moves the queues of every stream into their buffers and
detects voice in all of it together (``vad.detect``).
The queue has a lock of its own: the engine listens without holding its lock, so detecting voice in a long backlog
never holds up other sessions' calls.
Every sample received leaves the buffer exactly once (``drop``), decoded or skipped as silence.
"""
from __future__ import annotations

import threading
import time

import numpy as np

from ..audio import SAMPLE_RATE
from ..vad import VoiceActivity, detect
from .events import StreamStats


class Intake:
    def __init__(self, stats: StreamStats, vad: bool, threshold: float, preroll_s: float):
        self.stats = stats
        self.vad = VoiceActivity(threshold) if vad else None
        self.preroll_s = preroll_s
        self.audio = np.zeros(0, dtype=np.float32)  # the buffer
        self.dropped = 0  # samples that left the buffer: audio[0] is sample ``dropped`` of the stream
        self.speech = not vad  # speech somewhere in the buffer
        self.last_voiced = -1.0  # stream time of the end of the last voiced chunk
        self.silence_s = 0.0  # trailing non-speech
        self.since_decode = 0.0  # audio seconds since the audio of the last decode request
        self.waiting_since: float | None = None  # wall time of the oldest audio not yet in a decode request
        self._queued: list[np.ndarray] = []  # received, not yet listened to
        self._queued_s = 0.0
        self._queue_lock = threading.Lock()

    def feed(self, audio: np.ndarray) -> None:
        audio = np.asarray(audio, dtype=np.float32)
        with self._queue_lock:
            self._queued.append(audio)
            self._queued_s += len(audio) / SAMPLE_RATE
        self.stats.audio_s += len(audio) / SAMPLE_RATE
        if self.waiting_since is None and len(audio):
            self.waiting_since = time.monotonic()

    def receive(self) -> np.ndarray | None:
        """Move queued audio into the buffer; returns it (None when nothing was queued)."""
        with self._queue_lock:
            if not self._queued:
                return None
            queued, self._queued = self._queued, []
            self.audio = np.concatenate([self.audio, *queued])
            self._queued_s = 0.0
        audio = self.audio[len(self.audio) - sum(map(len, queued)):]
        self.since_decode += len(audio) / SAMPLE_RATE
        return audio

    def detected(self, flags: list[bool], keep_silence: bool) -> None:
        """Voice detection's flags for the chunks the audio received completed. While the buffer holds no speech (and
        ``keep_silence`` is false: nothing in it is committed) only a short pre-roll of it is kept: once speech is
        detected, ``preroll_s`` before its first voiced chunk. Times are those of the chunks voice detection flagged,
        so the buffer and ``last_voiced`` are the same however the audio arrived (in one piece or many)."""
        flagged = len(self.audio) - self.vad.pending  # where the flagged chunks end in the buffer (samples)
        had_speech, onset = self.speech, None
        for i, voiced in enumerate(flags):
            if voiced:
                chunk_end = flagged - (len(flags) - 1 - i) * VoiceActivity.CHUNK
                onset = chunk_end - VoiceActivity.CHUNK if onset is None else onset
                self.speech, self.silence_s = True, 0.0
                self.last_voiced = (self.dropped + chunk_end) / SAMPLE_RATE
            else:
                self.silence_s += VoiceActivity.CHUNK / SAMPLE_RATE
        preroll = int(self.preroll_s * SAMPLE_RATE)
        if keep_silence or had_speech:
            return
        if not self.speech:  # the pre-roll before the samples still to be flagged
            if len(self.audio) > preroll + self.vad.pending:
                self.drop(len(self.audio) - preroll - self.vad.pending, decoded=False)
            self.since_decode = 0.0
            self.waiting_since = None
        elif onset is not None:  # speech began in this audio: kept from its pre-roll on, due from its onset on
            if onset > preroll:
                self.drop(onset - preroll, decoded=False)
                onset = preroll
            self.since_decode = (len(self.audio) - onset) / SAMPLE_RATE

    def taken(self) -> float:
        """A decode request takes the buffer now: returns how long its oldest audio waited (seconds)."""
        self.since_decode = 0.0  # audio arriving while the decode runs counts toward the next one
        waited = time.monotonic() - self.waiting_since if self.waiting_since is not None else 0.0
        self.waiting_since = None
        return waited

    def drop(self, samples: int, decoded: bool = True) -> None:
        """Remove the first ``samples`` of the buffer (they were decoded, or skipped as silence)."""
        samples = min(samples, len(self.audio))
        self.audio = self.audio[samples:]
        self.dropped += samples
        if decoded:
            self.stats.decoded_s += samples / SAMPLE_RATE
        else:
            self.stats.skipped_s += samples / SAMPLE_RATE

    def utterance_done(self) -> None:
        """After an utterance's final: speech is in the buffer only if voice was detected after its new start."""
        self.speech = self.vad is None or self.last_voiced > self.start
        if not self.speech:
            self.silence_s = 0.0

    @property
    def start(self) -> float:
        """Stream time of the buffer's start."""
        return self.dropped / SAMPLE_RATE

    @property
    def buffer_s(self) -> float:
        return len(self.audio) / SAMPLE_RATE

    @property
    def end(self) -> float:
        """Stream time of the buffer's end."""
        return self.start + self.buffer_s

    @property
    def backlog_s(self) -> float:
        """Audio received but not yet committed or skipped (what a fast sender has queued)."""
        return self.buffer_s + self._queued_s


def listen(intakes: list[tuple[Intake, bool]]) -> None:
    """Several streams' queued audio moved into their buffers, voice detected in all of it together
    (``vad.detect``: a stream's flags are the same alone or in company); ``(intake, keep_silence)`` each."""
    received = [(intake, intake.receive(), keep) for intake, keep in intakes]
    heard = [(i, audio, keep) for i, audio, keep in received if audio is not None and i.vad is not None]
    for (intake, _, keep), flags in zip(heard, detect([(i.vad, audio) for i, audio, _ in heard])):
        intake.detected(flags, keep)
