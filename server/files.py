"""The file worker of ``asr_spec serve``: transcribes the OpenAI-compatible endpoints' uploads on its own thread,
with the same engine and options as ``asr_spec transcribe``, batching requests that arrive together. Its refusals
are :class:`UploadError` subclasses; the HTTP layer (openai_api.py) says them in OpenAI's error shape."""
from __future__ import annotations

import logging
import queue
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, replace
from typing import Callable, Hashable

import numpy as np

from asr_spec.audio import AudioError
from asr_spec.recognizer import temperature_ladder
from asr_spec.threads import release_pool
from asr_spec.transcribe import TranscribeOptions, Transcriber

log = logging.getLogger("asr_spec.serve")


@dataclass(frozen=True)
class Upload:
    """One transcription request, validated."""
    task: str
    audio: np.ndarray
    filename: str
    model: str
    language: str | None
    prompt: str | None
    temperature: float
    response_format: str
    words: bool  # timestamp_granularities[] includes "word"


class UploadError(Exception):
    """An upload the worker does not transcribe."""


class Busy(UploadError):
    """Too many uploads are waiting already (nothing was done: the client may try again later)."""


class BadAudio(UploadError):
    """The upload's audio cannot be transcribed (the transcriber's :class:`~asr_spec.audio.AudioError`)."""


class Failed(UploadError):
    """The transcription failed inside the server (a bug); the worker goes on."""


def options_for(upload: Upload, base: TranscribeOptions) -> TranscribeOptions:
    """``asr_spec transcribe``'s options for an upload (``--temperature T`` starts Whisper's ladder at T)."""
    return replace(base, language=upload.language, task=upload.task, initial_prompt=upload.prompt,
                   checks=replace(base.checks, temperatures=temperature_ladder(upload.temperature)),
                   word_timestamps=upload.words)


class FileWorker:
    """Transcribes uploads on its own thread, ``batch_size`` files in flight (requests with the same options that
    are waiting together are decoded as one batch). At most ``max_waiting`` requests wait; more are refused.
    Live streams go first: while ``live()`` says streams are waiting to be decoded, the uploads' decode waits between
    two passes once about one window of each file in flight has been decoded since its last wait, at most
    ``max_yield_s`` in a row, so that uploads still progress when the live sessions keep the device busy."""

    def __init__(self, transcriber: Transcriber, options: TranscribeOptions = TranscribeOptions(),
                 batch_size: int = 4, max_waiting: int = 16, live: Callable[[], bool] = lambda: False,
                 max_yield_s: float = 5.0):
        self.transcriber, self.options, self.batch_size = transcriber, options, batch_size
        self.max_waiting = max_waiting
        self.live, self.max_yield_s = live, max_yield_s
        self.yielded_s = 0.0  # time uploads waited for live streams (for /metrics and benchmarks)
        self._waiting: queue.Queue[tuple[Upload, Future]] = queue.Queue()
        self._held: list[tuple[Upload, Future]] = []  # taken from the queue, waiting for a batch with its options
        self._stop = threading.Event()
        self._running = False  # a batch is being transcribed
        self._thread = threading.Thread(target=self._run, name="asr_spec-files", daemon=True)
        self._thread.start()

    def submit(self, upload: Upload) -> Future:
        """The upload's transcript, when it is done (or its :class:`BadAudio` or :class:`Failed`); raises
        :class:`Busy` when ``max_waiting`` requests are waiting already."""
        if self._waiting.qsize() + len(self._held) >= self.max_waiting:
            raise Busy(f"{self.max_waiting} transcriptions are waiting already; try again later")
        future: Future = Future()
        self._waiting.put((upload, future))
        return future

    @property
    def busy(self) -> bool:
        """Whether uploads are waiting or being transcribed."""
        return self._running or bool(self._held) or not self._waiting.empty()

    def stop(self) -> None:
        self._stop.set()

    def _next(self, options: TranscribeOptions | None) -> tuple[Upload, Future] | None:
        """The next waiting request (with ``options`` when given), without blocking."""
        while True:
            try:
                self._held.append(self._waiting.get_nowait())
            except queue.Empty:
                break
        for i, (upload, _future) in enumerate(self._held):
            if options is None or options_for(upload, self.options) == options:
                return self._held.pop(i)
        return None

    def _yield(self) -> None:
        t0 = time.monotonic()
        if self.live():  # the live streams' decoding thread runs the process's only OpenMP pool meanwhile (threads.py)
            release_pool()
        while self.live() and not self._stop.is_set() and time.monotonic() - t0 < self.max_yield_s:
            time.sleep(0.005)
        self.yielded_s += time.monotonic() - t0

    def _run(self) -> None:
        while not self._stop.is_set():
            if (first := self._next(None)) is None:
                try:
                    self._held.append(self._waiting.get(timeout=0.2))
                except queue.Empty:
                    pass
                continue
            options = options_for(first[0], self.options)
            futures: dict[Hashable, Future] = {}

            def items():
                item = first
                while item is not None:
                    upload, future = item
                    if future.set_running_or_notify_cancel():
                        futures[id(future)] = future
                        yield id(future), (lambda a=upload.audio: a)
                    item = self._next(options)

            self._running = True
            try:
                for key, result in self.transcriber.transcribe_many(items(), options, self.batch_size,
                                                                    before_step=self._yield):
                    future = futures.pop(key)
                    if isinstance(result, AudioError):
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
