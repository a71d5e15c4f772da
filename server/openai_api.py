"""The OpenAI-compatible audio API of ``asr_spec serve``: ``POST /v1/audio/transcriptions`` and
``/v1/audio/translations`` (multipart form, OpenAI's fields and response formats, errors in OpenAI's JSON
shape), answered by the file worker (files.py) with the same engine and options as ``asr_spec transcribe``. The
worker's refusals (:class:`~asr_spec.server.files.UploadError`) are said here as HTTP statuses and error bodies."""
from __future__ import annotations

import asyncio
import json
import logging
import shutil
import tempfile
from dataclasses import replace
from http import HTTPStatus
from typing import Awaitable, BinaryIO, Callable

from asr_spec.server.files import RETRY_AFTER_S, BadAudio, Busy, ClientBusy, Failed, TooLong, Upload
from asr_spec.server.protocol import MAX_NAME, MAX_PROMPT
from asr_spec.server.shared import Shared
from starlette.datastructures import UploadFile
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response

from asr_spec.audio import SAMPLE_RATE, AudioError, AudioFile, AudioTooLong
from asr_spec.transcript import Transcript
from asr_spec.writers import to_srt, to_vtt, word_dicts

log = logging.getLogger("asr_spec.serve")
PATHS = {"/v1/audio/transcriptions": "transcribe", "/v1/audio/translations": "translate"}
FORMATS = ("json", "text", "srt", "vtt", "verbose_json")
GRANULARITIES = ("segment", "word")
DRAIN_FACTOR = 4  # a body up to this many times the limit is read (and dropped) before its 413 is sent
_FIELDS = {"file", "model", "language", "prompt", "temperature", "response_format", "timestamp_granularities[]",
           "timestamp_granularities", "beam_size"}  # beam_size: not OpenAI's (whisper's and faster-whisper's name)
MAX_BEAMS = 16


SPOOL_BYTES = 1 << 20  # an upload larger than this waits in a temporary file, not in memory
CLIENT_CLOSED = 499  # nginx's "client closed request": the status an upload the client gave up on is counted under


class ApiError(Exception):
    """A request the API refuses: an HTTP status and OpenAI's error object."""

    def __init__(self, status: HTTPStatus, message: str, param: str | None = None, code: str | None = None,
                 retry_after: int | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code
        self.retry_after = retry_after

    @property
    def type(self) -> str:
        return {HTTPStatus.UNAUTHORIZED: "authentication_error", HTTPStatus.SERVICE_UNAVAILABLE: "server_error",
                HTTPStatus.INTERNAL_SERVER_ERROR: "server_error"}.get(self.status, "invalid_request_error")

    def response(self) -> Response:
        body = json.dumps({"error": {"message": self.message, "type": self.type, "param": self.param,
                                     "code": self.code}}) + "\n"
        headers = {"WWW-Authenticate": "Bearer"} if self.status == HTTPStatus.UNAUTHORIZED else {}
        if self.retry_after is not None:
            headers["Retry-After"] = str(self.retry_after)
        return Response(body, self.status, headers or None, "application/json")


def transcription(shared: Shared, task: str) -> Callable[[Request], Awaitable[Response]]:
    """The endpoint of one task: the uploaded file transcribed by the file worker, in the requested format;
    every refusal in OpenAI's error shape."""

    async def endpoint(request: Request) -> Response:
        try:
            upload = replace(await _receive(shared, request, task), client=shared.client_of(request, request.state.api_key))
            transcript = await _transcribe(shared, upload)
            shared.metrics.uploads.labels("transcribed", "200").inc()
            return Response(*render(upload, transcript, shared.language_names or {}))
        except ApiError as e:
            shared.metrics.uploads.labels("refused", str(e.status.value)).inc()
            return e.response()
        except ClientDisconnect:  # the client's doing, not the server's: no traceback, not a 500
            log.info("upload from %s: the client disconnected before its request was read",
                     request.client.host if request.client else "?")
            shared.metrics.uploads.labels("disconnected", str(CLIENT_CLOSED)).inc()
            return Response(status_code=CLIENT_CLOSED)  # nobody reads it
        except Exception as e:  # noqa: BLE001 - the client gets a 500, the server goes on
            log.exception("transcription request failed")
            shared.metrics.uploads.labels("failed", "500").inc()
            return ApiError(HTTPStatus.INTERNAL_SERVER_ERROR, f"internal error: {type(e).__name__}").response()

    return endpoint


async def _transcribe(shared: Shared, upload: Upload) -> Transcript:
    """The file worker's transcript of an upload; its refusals as the API's errors."""
    assert shared.files is not None, "a server without a file worker refuses uploads (_receive)"
    try:
        return await asyncio.wrap_future(shared.files.submit(upload))
    except Busy as e:
        raise ApiError(HTTPStatus.SERVICE_UNAVAILABLE, str(e), code="server_busy", retry_after=RETRY_AFTER_S) from None
    except ClientBusy as e:
        raise ApiError(HTTPStatus.TOO_MANY_REQUESTS, str(e), code="client_limit", retry_after=RETRY_AFTER_S) from None
    except TooLong as e:
        raise ApiError(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, str(e)[:300], param="file", code="audio_too_long") from None
    except BadAudio as e:
        raise ApiError(HTTPStatus.BAD_REQUEST, str(e)[:300], param="file", code="invalid_audio") from None
    except Failed as e:
        raise ApiError(HTTPStatus.INTERNAL_SERVER_ERROR, str(e)) from None
    finally:
        upload.close()  # the worker closes it once done; a refused upload is closed here


async def _receive(shared: Shared, request: Request, task: str) -> Upload:
    c = shared.config
    if shared.files is None:
        raise ApiError(HTTPStatus.NOT_FOUND, "this server does not transcribe files", code="not_found")
    length = request.headers.get("content-length", "")
    if not length.isdigit() or "transfer-encoding" in request.headers:
        raise ApiError(HTTPStatus.LENGTH_REQUIRED, "send the form with a Content-Length (no chunked uploads)")
    limit = c.max_upload_bytes + 64 * 1024  # the file and the form around it
    too_large = ApiError(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, f"the request is larger than {limit} bytes (files up "
                         f"to {c.max_upload_bytes} bytes)", param="file")
    if int(length) > DRAIN_FACTOR * limit:
        raise too_large  # at once: the client may see the connection closed before it reads this
    if int(length) > limit:
        await _within(c.upload_timeout_s, _discard(request))  # read and dropped, so that the client reads the 413
        raise too_large
    content_type = request.headers.get("content-type", "")
    if not content_type.lower().startswith("multipart/form-data") or "boundary=" not in content_type:
        raise ApiError(HTTPStatus.BAD_REQUEST, "send the request as multipart/form-data (with a boundary)",
                       code="invalid_content_type")
    try:
        # a text field's bytes are bounded while they arrive (4 bytes a character at most): a megabyte prompt is
        # never held, parsed or tokenized
        form = await _within(c.upload_timeout_s, request.form(max_files=4, max_fields=32, max_part_size=4 * MAX_PROMPT))
    except HTTPException as e:
        if "exceeded maximum size" in str(e.detail):
            raise ApiError(HTTPStatus.BAD_REQUEST, f"a text field is longer than {MAX_PROMPT} characters (the most "
                           "a prompt may have)", code="string_above_max_length") from None
        raise ApiError(HTTPStatus.BAD_REQUEST, f"malformed multipart/form-data body: {e.detail}",
                       code="invalid_body") from None
    try:
        fields: dict[str, list[str]] = {}
        files: dict[str, list[UploadFile]] = {}
        for name, value in form.multi_items():
            if isinstance(value, UploadFile):
                files.setdefault(name, []).append(value)
            else:
                fields.setdefault(name, []).append(value)
        return await asyncio.to_thread(parse_upload, task, fields, files, shared.language_names, c.max_upload_s)
    finally:
        await form.close()


async def _within(seconds: float, work: Awaitable):
    try:
        return await asyncio.wait_for(work, seconds)
    except asyncio.TimeoutError:
        raise ApiError(HTTPStatus.REQUEST_TIMEOUT, f"the request body did not arrive within {seconds:g} s") from None


async def _discard(request: Request) -> None:
    async for _ in request.stream():
        pass


def parse_upload(task: str, fields: dict[str, list[str]], files: dict[str, list[UploadFile]],
                 languages: dict[str, str] | None, max_seconds: float) -> Upload:
    """Validate OpenAI's form fields (``languages``: code -> name, None for an English-only model) and decode the
    file's audio."""
    unknown = sorted((set(fields) | set(files)) - _FIELDS)
    if unknown:
        raise ApiError(HTTPStatus.BAD_REQUEST, f"unknown field(s): {', '.join(unknown[:5])}", param=unknown[0],
                       code="unknown_parameter")
    one = lambda name: (fields.get(name) or [None])[-1]  # noqa: E731 (the last value of a repeated field)
    if "file" in fields:
        raise ApiError(HTTPStatus.BAD_REQUEST, "the 'file' field must be a file upload (a part with a filename)",
                       param="file")
    uploads = files.get("file", [])
    if len(uploads) > 1:
        raise ApiError(HTTPStatus.BAD_REQUEST, "send one 'file' field (this request has several)", param="file")
    if not uploads or not uploads[0].size:
        raise ApiError(HTTPStatus.BAD_REQUEST, "the 'file' field (the audio) is missing or empty", param="file")
    for name, most in (("prompt", MAX_PROMPT), ("model", MAX_NAME), ("language", MAX_NAME)):
        if len(value := one(name) or "") > most:
            raise ApiError(HTTPStatus.BAD_REQUEST, f"'{name}' is {len(value)} characters long; at most {most} are "
                           "accepted", param=name, code="string_above_max_length")
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
    try:
        beams = int(one("beam_size") or 1)
    except ValueError:
        raise ApiError(HTTPStatus.BAD_REQUEST, "'beam_size' must be a whole number", param="beam_size") from None
    if not 1 <= beams <= MAX_BEAMS:
        raise ApiError(HTTPStatus.BAD_REQUEST, f"'beam_size' must be between 1 and {MAX_BEAMS}", param="beam_size")
    response_format = one("response_format") or "json"
    if response_format not in FORMATS:
        raise ApiError(HTTPStatus.BAD_REQUEST, f"'response_format' must be one of {', '.join(FORMATS)}",
                       param="response_format")
    granularities = fields.get("timestamp_granularities[]", []) + fields.get("timestamp_granularities", [])
    if bad := [g for g in granularities if g not in GRANULARITIES]:
        raise ApiError(HTTPStatus.BAD_REQUEST, f"unknown timestamp granularity {bad[0][:32]!r} (segment or word)",
                       param="timestamp_granularities")
    filename = uploads[0].filename or "file"
    audio, seconds, close = spill(filename, uploads[0].file, max_seconds)
    return Upload(task, audio, filename, model, language, one("prompt") or None, temperature, response_format,
                  "word" in granularities, seconds, beams=beams, close=close)


def spill(filename: str, file: BinaryIO, max_seconds: float) -> tuple[AudioFile, float, Callable[[], None]]:
    """An uploaded file kept as it came (in memory up to 1 MB, else in a temporary file) as an :class:`AudioFile`,
    decoded a block at a time when it is transcribed; its header checked now (more than ``max_seconds`` of audio:
    413). Returns the audio, its length as the header says (``max_seconds`` when it does not) and what frees it."""
    kept = tempfile.SpooledTemporaryFile(max_size=SPOOL_BYTES)
    try:
        file.seek(0)
        shutil.copyfileobj(file, kept)
        audio = AudioFile(kept, filename[:64], max_seconds)
    except AudioTooLong as e:
        kept.close()
        raise ApiError(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, str(e)[:300], param="file", code="audio_too_long") from None
    except AudioError as e:
        kept.close()
        raise ApiError(HTTPStatus.BAD_REQUEST, str(e)[:300], param="file", code="invalid_audio") from None
    except BaseException:
        kept.close()
        raise
    return audio, audio.expected_samples / SAMPLE_RATE or max_seconds, kept.close


def render(upload: Upload, t: Transcript, language_names: dict[str, str]) -> tuple[str, int, None, str]:
    """(body, status, headers, media type) of a transcript in the requested format."""
    f = upload.response_format
    if f == "text":
        return t.text + "\n", 200, None, "text/plain; charset=utf-8"
    if f == "srt":
        return to_srt(t), 200, None, "application/x-subrip; charset=utf-8"
    if f == "vtt":
        return to_vtt(t), 200, None, "text/vtt; charset=utf-8"
    doc: dict = {"text": t.text}
    if f == "verbose_json":
        language = t.language or upload.language or "en"
        doc = {"task": upload.task + ("d" if upload.task == "translate" else ""),
               "language": language_names.get(language, language), "duration": round(t.stats.audio_seconds, 3),
               "text": t.text,
               "segments": [{"id": i, "seek": 0, "start": s.start, "end": s.end, "text": s.text, "tokens": s.tokens,
                             "temperature": s.temperature, "avg_logprob": s.avg_logprob,
                             "compression_ratio": s.compression_ratio, "no_speech_prob": s.no_speech_prob}
                            for i, s in enumerate(t.segments)]}
    if upload.words:
        doc["words"] = [{k: w[k] for k in ("word", "start", "end")} for s in t.segments for w in word_dicts(s)]
    return json.dumps(doc, ensure_ascii=False) + "\n", 200, None, "application/json"
