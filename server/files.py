"""The file worker of ``asr_spec serve``: transcribes the OpenAI-compatible endpoints' uploads on its own thread,
with the same engine and options as ``asr_spec transcribe``, batching requests that wait together. Its refusals
are :class:`UploadError` subclasses; the HTTP layer (openai_api.py) says them in OpenAI's error shape.

An upload waits as it arrived, compressed (spilled to a temporary file past 1 MB), and is decoded a block at a
time as its windows go: memory holds the windows in flight, not the uploads. Waiting uploads go shortest first
(each second waited counts as ``AGING`` seconds less audio, so a long one is not put off for ever), and a short one
does not wait for the long ones in flight: at a long file's next window it takes that file's place, which resumes
once a file is done. Each client (address, and key when there are several) may hold ``per_client`` uploads waiting
or in flight."""
from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from concurrent.futures import Future
from dataclasses import dataclass, field, replace
from typing import Callable, Hashable

from asr_spec.audio import Audio, AudioError, AudioTooLong
from asr_spec.decoding.beam import BeamOptions
from asr_spec.memory import give_back
from asr_spec.recognizer import temperature_ladder
from asr_spec.threads import release_pool
from asr_spec.transcribe import TranscribeOptions, Transcriber

log = logging.getLogger("asr_spec.serve")
AGING = 10.0  # seconds of audio a waiting upload counts as shorter per second it has waited
RETRY_AFTER_S = 10  # what a refusal for a full queue or a client's limit tells the client to wait


@dataclass(frozen=True)
class Upload:
    """One transcription request, validated."""
    task: str
    audio: Audio
    filename: str
    model: str
    language: str | None
    prompt: str | None
    temperature: float
    response_format: str
    words: bool  # timestamp_granularities[] includes "word"
    seconds: float = 0.0  # its audio's length as its header says (0: the header does not say)
    client: tuple[tuple[str, str], ...] = ()  # who sent it: ("address", ...) and, with several keys, ("key", ...)
    beams: int = 1  # its beam search's beams at temperature 0 (1: greedy)
    close: Callable[[], None] = field(default=lambda: None, compare=False)  # its spilled bytes, once done


class UploadError(Exception):
    """An upload the worker does not transcribe."""


class Busy(UploadError):
    """Too many uploads are waiting already (nothing was done: the client may try again later)."""


class ClientBusy(UploadError):
    """This client holds its most uploads already (nothing was done: it may send again once one is answered)."""


class BadAudio(UploadError):
    """The upload's audio cannot be transcribed (the transcriber's :class:`~asr_spec.audio.AudioError`)."""


class TooLong(BadAudio):
    """The upload holds more audio than the server takes (found while decoding: its header did not say)."""


class Failed(UploadError):
    """The transcription failed inside the server (a bug); the worker goes on."""


def options_for(upload: Upload, base: TranscribeOptions) -> TranscribeOptions:
    """``asr_spec transcribe``'s options for an upload (``--temperature T`` starts Whisper's ladder at T)."""
    return replace(base, language=upload.language, task=upload.task, initial_prompt=upload.prompt,
                   checks=replace(base.checks, temperatures=temperature_ladder(upload.temperature)),
                   word_timestamps=upload.words, beam=BeamOptions(upload.beams) if upload.beams > 1 else base.beam)


def batch_options(o: TranscribeOptions) -> TranscribeOptions:
    """What files decoded together share: everything but each file's language, task and initial prompt."""
    return replace(o, language=None, task="transcribe", initial_prompt=None)


@dataclass
class _Waiting:
    upload: Upload
    future: Future
    since: float = field(default_factory=time.monotonic)

    def priority(self, now: float) -> float:
        return self.upload.seconds - AGING * (now - self.since)


class FileWorker:
    """Transcribes uploads on its own thread, ``batch_size`` files in flight (waiting requests whose options differ
    only in language, task and prompt are decoded as one batch), shortest first (see the module). At most
    ``max_waiting`` requests wait, and each client holds at most ``per_client`` (0: half of ``max_waiting``); more are
    refused. Live streams go first: while ``live()`` says streams are waiting to be decoded, the uploads' decode
    waits between two passes once about one window of each file in flight has been decoded since its last wait, at
    most ``max_yield_s`` in a row, so that uploads still progress when the live sessions keep the device busy."""

    def __init__(self, transcriber: Transcriber, options: TranscribeOptions = TranscribeOptions(),
                 batch_size: int = 4, max_waiting: int = 16, live: Callable[[], bool] = lambda: False,
                 max_yield_s: float = 5.0, per_client: int = 0):
        self.transcriber, self.options, self.batch_size = transcriber, options, batch_size
        self.max_waiting, self.per_client = max_waiting, per_client or max(1, max_waiting // 2)
        self.live, self.max_yield_s = live, max_yield_s
        self.yielded_s = 0.0  # time uploads waited for live streams (for /metrics and benchmarks)
        self._lock = threading.Lock()
        self._ready = threading.Condition(self._lock)
        self._waiting: list[_Waiting] = []
        self._held = Counter()  # uploads waiting or in flight per client
        self._stop = threading.Event()
        self._running = False  # a batch is being transcribed
        self._thread = threading.Thread(target=self._run, name="asr_spec-files", daemon=True)
        self._thread.start()

    def submit(self, upload: Upload) -> Future:
        """The upload's transcript, when it is done (or its :class:`BadAudio` or :class:`Failed`); raises
        :class:`Busy` when ``max_waiting`` requests are waiting already, :class:`ClientBusy` when its client holds
        ``per_client``."""
        with self._lock:
            if len(self._waiting) >= self.max_waiting:
                raise Busy(f"{self.max_waiting} transcriptions are waiting already; try again later")
            if any(self._held[who] >= self.per_client for who in upload.client):
                raise ClientBusy(f"this client has {self.per_client} transcriptions waiting or in progress already "
                                 "(the most one client may hold); send this one once one is answered")
            future: Future = Future()
            self._held.update(upload.client)
            future.add_done_callback(lambda _f: self._done(upload))
            self._waiting.append(_Waiting(upload, future))
            self._ready.notify()
        return future

    def _done(self, upload: Upload) -> None:
        with self._lock:
            self._held.subtract(upload.client)
            self._held += Counter()  # drop the clients at 0
        upload.close()

    @property
    def busy(self) -> bool:
        """Whether uploads are waiting or being transcribed."""
        return self._running or bool(self._waiting)

    def stop(self) -> None:
        self._stop.set()
        with self._lock:
            self._ready.notify()

    def _take(self, options: TranscribeOptions | None, shorter_than: float = float("inf")) -> _Waiting | None:
        """The waiting request that goes first (with these batch options when given; shorter than that), or None."""
        with self._lock:
            now = time.monotonic()
            fits = [w for w in self._waiting if (options is None or batch_options(options_for(w.upload, self.options))
                                                 == options) and w.upload.seconds < shorter_than]
            if not fits:
                return None
            first = min(fits, key=lambda w: w.priority(now))
            self._waiting.remove(first)
            return first

    def _shorter_waits(self, options: TranscribeOptions, seconds_left: float) -> bool:
        """Whether a waiting request of this batch holds less than half the audio a file in flight has left."""
        with self._lock:
            return any(w.upload.seconds < seconds_left / 2 and
                       batch_options(options_for(w.upload, self.options)) == options for w in self._waiting)

    def _yield(self) -> None:
        give_back()  # about a window of each file decoded since the last round: what they freed goes back
        t0 = time.monotonic()
        if self.live():  # the live streams' decoding thread runs the process's only OpenMP pool meanwhile (threads.py)
            release_pool()
        while self.live() and not self._stop.is_set() and time.monotonic() - t0 < self.max_yield_s:
            time.sleep(0.005)
        self.yielded_s += time.monotonic() - t0

    def _run(self) -> None:
        while not self._stop.is_set():
            with self._lock:
                if not self._waiting:
                    self._ready.wait(0.2)
                    continue
            if (first := self._take(None)) is None:
                continue
            batch = batch_options(options_for(first.upload, self.options))
            futures: dict[Hashable, Future] = {}

            def items():
                item = first
                while not self._stop.is_set():
                    if item is not None and item.future.set_running_or_notify_cancel():
                        futures[id(item.future)] = item.future
                        yield id(item.future), (lambda a=item.upload.audio: a), options_for(item.upload, self.options)
                    elif item is None:
                        yield None  # nothing waits now: asked again at the next step
                    item = self._take(batch)

            self._running = True
            try:
                for key, result in self.transcriber.transcribe_many(
                        items(), batch, self.batch_size, before_step=self._yield,
                        make_room=lambda left: self._shorter_waits(batch, left)):
                    future = futures.pop(key)
                    if isinstance(result, AudioTooLong):
                        future.set_exception(TooLong(str(result)))
                    elif isinstance(result, AudioError):
                        future.set_exception(BadAudio(str(result)))
                    else:
                        future.set_result(result)
            except Exception as e:  # never let one bad batch kill the worker: its requests get a 500
                log.exception("transcription failed")
                for future in futures.values():
                    future.set_exception(Failed(f"transcription failed: {e}"))
            finally:
                self._running = False
            release_pool()  # idle: the process's OpenMP pool is the live streams' decoding thread's (threads.py)
            give_back()
