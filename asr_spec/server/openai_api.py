"""The OpenAI-compatible audio API of ``asr_spec serve``: ``POST /v1/audio/transcriptions`` and
``/v1/audio/translations`` (multipart form, OpenAI's fields and response formats, errors in OpenAI's JSON
shape), answered by a worker thread that transcribes uploaded files with the same engine and options as
``asr_spec transcribe``, batching requests that arrive together."""
from __future__ import annotations

import email.parser
import email.policy
import io
import json
import logging
import queue
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, replace
from http import HTTPStatus
from typing import Callable, Hashable

import numpy as np
import soundfile as sf

from ..audio import AudioError, checked_audio
from ..recognizer import temperature_ladder
from ..transcribe import TranscribeOptions, Transcriber, Transcript
from ..writers import to_srt, to_vtt, word_dicts

log = logging.getLogger("asr_spec.serve")
PATHS = {"/v1/audio/transcriptions": "transcribe", "/v1/audio/translations": "translate"}
FORMATS = ("json", "text", "srt", "vtt", "verbose_json")
GRANULARITIES = ("segment", "word")
MAX_UPLOAD_BYTES = 25 * 1024 * 1024  # OpenAI's limit for these endpoints
_FIELDS = {"file", "model", "language", "prompt", "temperature", "response_format", "timestamp_granularities[]",
           "timestamp_granularities"}


class ApiError(Exception):
    """A request the API refuses: an HTTP status and OpenAI's error object."""

    def __init__(self, status: HTTPStatus, message: str, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code

    @property
    def type(self) -> str:
        return {HTTPStatus.UNAUTHORIZED: "authentication_error", HTTPStatus.SERVICE_UNAVAILABLE: "server_error",
                HTTPStatus.INTERNAL_SERVER_ERROR: "server_error"}.get(self.status, "invalid_request_error")

    def body(self) -> str:
        return json.dumps({"error": {"message": self.message, "type": self.type, "param": self.param,
                                     "code": self.code}}) + "\n"


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


def parse_form(content_type: str, body: bytes) -> tuple[dict[str, list[str]], dict[str, tuple[str, bytes]]]:
    """A ``multipart/form-data`` body -> (text fields, files by field name as (filename, bytes))."""
    if not content_type.lower().startswith("multipart/form-data") or "boundary=" not in content_type:
        raise ApiError(HTTPStatus.BAD_REQUEST, "send the request as multipart/form-data (with a boundary)",
                       code="invalid_content_type")
    head = f"Content-Type: {content_type}\r\nMIME-Version: 1.0\r\n\r\n".encode("latin-1", "replace")
    message = email.parser.BytesParser(policy=email.policy.HTTP).parsebytes(head + body)
    if not message.is_multipart() or message.defects:
        raise ApiError(HTTPStatus.BAD_REQUEST, "malformed multipart/form-data body", code="invalid_body")
    fields: dict[str, list[str]] = {}
    files: dict[str, tuple[str, bytes]] = {}
    for part in message.iter_parts():
        name = part.get_param("name", header="content-disposition")
        if not name:
            raise ApiError(HTTPStatus.BAD_REQUEST, "a form part has no name", code="invalid_body")
        payload = part.get_payload(decode=True) or b""
        if (filename := part.get_filename()) is not None or name == "file":
            files[name] = (filename or name, payload)
        else:
            fields.setdefault(name, []).append(payload.decode("utf-8", "replace"))
    return fields, files


def parse_upload(task: str, fields: dict[str, list[str]], files: dict[str, tuple[str, bytes]],
                 languages: dict[str, str] | None) -> Upload:
    """Validate OpenAI's form fields (``languages``: code -> name, None for an English-only model)."""
    unknown = sorted((set(fields) | set(files)) - _FIELDS)
    if unknown:
        raise ApiError(HTTPStatus.BAD_REQUEST, f"unknown field(s): {', '.join(unknown[:5])}", param=unknown[0],
                       code="unknown_parameter")
    one = lambda name: (fields.get(name) or [None])[-1]  # noqa: E731 (the last value of a repeated field)
    if "file" not in files or not files["file"][1]:
        raise ApiError(HTTPStatus.BAD_REQUEST, "the 'file' field (the audio) is missing or empty", param="file")
    model = one("model")
    if not model:
        raise ApiError(HTTPStatus.BAD_REQUEST, "the 'model' field is required (any name: this server has one model)",
                       param="model")
    language = one("language") or None
    if task == "translate" and language is not None:
        raise ApiError(HTTPStatus.BAD_REQUEST, "translations take no 'language' (the output is English)",
                       param="language")
    if language is not None:
        language = language.strip().lower()
        by_name = {name: code for code, name in (languages or {}).items()}
        language = by_name.get(language, language)
        if languages is None and language != "en" or languages is not None and language not in languages:
            raise ApiError(HTTPStatus.BAD_REQUEST, f"unknown language {language[:32]!r} (an ISO-639-1 code such as "
                           "'en')", param="language", code="unsupported_language")
    try:
        temperature = float(one("temperature") or 0.0)
    except ValueError:
        raise ApiError(HTTPStatus.BAD_REQUEST, "'temperature' must be a number", param="temperature") from None
    if not 0.0 <= temperature <= 1.0:
        raise ApiError(HTTPStatus.BAD_REQUEST, "'temperature' must be between 0 and 1", param="temperature")
    response_format = one("response_format") or "json"
    if response_format not in FORMATS:
        raise ApiError(HTTPStatus.BAD_REQUEST, f"'response_format' must be one of {', '.join(FORMATS)}",
                       param="response_format")
    granularities = fields.get("timestamp_granularities[]", []) + fields.get("timestamp_granularities", [])
    if bad := [g for g in granularities if g not in GRANULARITIES]:
        raise ApiError(HTTPStatus.BAD_REQUEST, f"unknown timestamp granularity {bad[0][:32]!r} (segment or word)",
                       param="timestamp_granularities")
    filename, data = files["file"]
    return Upload(task, decode_upload(filename, data), filename, model, language, one("prompt") or None,
                  temperature, response_format, "word" in granularities)


def decode_upload(filename: str, data: bytes) -> np.ndarray:
    """An uploaded file's audio at 16 kHz mono, with the same checks as a file on disk."""
    if len(data) > MAX_UPLOAD_BYTES:
        raise ApiError(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, f"the file is larger than {MAX_UPLOAD_BYTES} bytes",
                       param="file")
    try:
        samples, rate = sf.read(io.BytesIO(data), dtype="float32", always_2d=True)
    except (sf.LibsndfileError, RuntimeError, TypeError) as e:
        raise ApiError(HTTPStatus.BAD_REQUEST, f"{filename[:64]}: cannot decode audio ({e})", param="file",
                       code="invalid_audio") from None
    try:
        return checked_audio(filename, samples, rate)
    except AudioError as e:
        raise ApiError(HTTPStatus.BAD_REQUEST, str(e)[:300], param="file", code="invalid_audio") from None


def options_for(upload: Upload, base: TranscribeOptions) -> TranscribeOptions:
    """``asr_spec transcribe``'s options for an upload (``--temperature T`` starts Whisper's ladder at T)."""
    return replace(base, language=upload.language, task=upload.task, initial_prompt=upload.prompt,
                   checks=replace(base.checks, temperatures=temperature_ladder(upload.temperature)),
                   word_timestamps=upload.words)


def render(upload: Upload, t: Transcript, language_names: dict[str, str]) -> tuple[str, str]:
    """(content type, body) of a transcript in the requested format."""
    f = upload.response_format
    if f == "text":
        return "text/plain; charset=utf-8", t.text + "\n"
    if f == "srt":
        return "application/x-subrip; charset=utf-8", to_srt(t)
    if f == "vtt":
        return "text/vtt; charset=utf-8", to_vtt(t)
    if f == "json":
        doc: dict = {"text": t.text}
        if upload.words:
            doc["words"] = _words(t)
        return "application/json", json.dumps(doc, ensure_ascii=False) + "\n"
    language = t.language or upload.language or "en"
    doc = {"task": upload.task + ("d" if upload.task == "translate" else ""),
           "language": language_names.get(language, language), "duration": round(t.stats.audio_seconds, 3),
           "text": t.text,
           "segments": [{"id": i, "seek": 0, "start": s.start, "end": s.end, "text": s.text, "tokens": s.tokens,
                         "temperature": s.temperature, "avg_logprob": s.avg_logprob,
                         "compression_ratio": s.compression_ratio, "no_speech_prob": s.no_speech_prob}
                        for i, s in enumerate(t.segments)]}
    if upload.words:
        doc["words"] = _words(t)
    return "application/json", json.dumps(doc, ensure_ascii=False) + "\n"


def _words(t: Transcript) -> list[dict]:
    return [{k: w[k] for k in ("word", "start", "end")} for s in t.segments for w in word_dicts(s)]


class FileWorker:
    """Transcribes uploads on its own thread, ``batch_size`` files in flight (requests with the same options that
    are waiting together are decoded as one batch). At most ``max_waiting`` requests wait; more are refused.
    Live streams go first: while ``live()`` says streams are waiting to be decoded, the next step of the uploads
    (one window of each file in flight) waits, at most ``max_yield_s`` in a row, so that uploads still progress
    when the live sessions keep the device busy."""

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
        self._thread = threading.Thread(target=self._run, name="asr_spec-files", daemon=True)
        self._thread.start()

    def submit(self, upload: Upload) -> Future:
        if self._waiting.qsize() + len(self._held) >= self.max_waiting:
            raise ApiError(HTTPStatus.SERVICE_UNAVAILABLE, f"{self.max_waiting} transcriptions are waiting already; "
                           "try again later", code="server_busy")
        future: Future = Future()
        self._waiting.put((upload, future))
        return future

    def stop(self) -> None:
        self._stop.set()

    def _next(self, options: TranscribeOptions | None) -> tuple[Upload, Future] | None:
        """The next waiting request (with ``options`` when given), without blocking."""
        while True:
            try:
                self._held.append(self._waiting.get_nowait())
            except queue.Empty:
                break
        for i, (upload, future) in enumerate(self._held):
            if options is None or options_for(upload, self.options) == options:
                return self._held.pop(i)
        return None

    def _yield(self) -> None:
        t0 = time.monotonic()
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

            try:
                for key, result in self.transcriber.transcribe_many(items(), options, self.batch_size,
                                                                    before_step=self._yield):
                    future = futures.pop(key)
                    if isinstance(result, AudioError):
                        future.set_exception(ApiError(HTTPStatus.BAD_REQUEST, str(result), param="file"))
                    else:
                        future.set_result(result)
            except Exception as e:  # never let one bad batch kill the worker: its requests get a 500
                log.exception("transcription failed")
                for future in futures.values():
                    future.set_exception(ApiError(HTTPStatus.INTERNAL_SERVER_ERROR, f"transcription failed: {e}"))
