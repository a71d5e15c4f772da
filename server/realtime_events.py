"""OpenAI Realtime API, transcription sessions (docs/realtime.md): the client events' parsing and validation, the
session's settings, the audio formats, and the objects the server's events carry. ``realtime.py`` runs a session."""
from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass, replace

import numpy as np
from asr_spec.server.protocol import (
    ECHO_FIELDS,
    MAX_HOTWORDS,
    MAX_NAME,
    MAX_PROMPT,
    AudioDecoder,
    ProtocolError,
    Start,
    echo,
    load_object,
)

from asr_spec.streaming.config import StreamConfig
from asr_spec.streaming.policy import AlignAtt

UPDATES = ("session.update", "transcription_session.update")
CLIENT_EVENTS = (*UPDATES, "input_audio_buffer.append", "input_audio_buffer.commit", "input_audio_buffer.clear")
LOGPROBS = "item.input_audio_transcription.logprobs"
FORMATS = {"audio/pcm": "pcm16", "audio/pcmu": "g711_ulaw", "audio/pcma": "g711_alaw"}  # GA type -> beta name
SERVER_ERRORS = ("server_full", "shutting_down", "decode_failed", "flush_timeout")  # the rest are the client's
# OpenAI's fields that do not apply here: accepted, and each named in a ``warning`` event (why, by field)
IGNORED = {"session": {"id", "object", "expires_at", "client_secret", "modalities"},
           "turn_detection": {"create_response", "interrupt_response", "idle_timeout_ms", "eagerness"},
           "noise_reduction": {"strength"}}
WHY_IGNORED = {"session": "the server sets it (a transcription session has text output only and no expiry)",
               "create_response": "a transcription session creates no responses",
               "interrupt_response": "a transcription session creates no responses",
               "idle_timeout_ms": "the server's idle timeout applies (serve --idle-timeout)",
               "eagerness": "semantic_vad's setting; server_vad ends turns after silence_duration_ms",
               "noise_reduction": "no noise filter is applied (Whisper is trained on noisy audio)"}
# transcription.delay: how long AlignAtt waits before it commits a word (streaming/policy.py): its margin after a word
# the model is sure of, the probability that counts as sure, its margin after any other word; medium is the server's.
# Measured on the dev set: docs/realtime.md, "delay" (python eval/experiments/bench_delay.py)
DELAYS = {"minimal": AlignAtt(0.2, 0.6, 1.5), "low": AlignAtt(0.25, 0.7, 2.0), "medium": AlignAtt(),
          "high": AlignAtt(1.0, 0.9, 4.0), "xhigh": AlignAtt(2.0, 0.95, 6.0)}


class RealtimeError(ProtocolError):
    """A client mistake, sent as OpenAI's ``error`` event (``param``: the field at fault); the session goes on."""

    def __init__(self, code: str, message: str, param: str | None = None):
        super().__init__(code, message)
        self.param = param


def error_event(e: ProtocolError, event_id: str | None, server_event_id: str) -> dict:
    kind = "server_error" if e.code in SERVER_ERRORS else "invalid_request_error"
    return {"type": "error", "event_id": server_event_id,
            "error": {"type": kind, "code": e.code, "message": e.message, "param": getattr(e, "param", None),
                      "event_id": event_id}}


@dataclass(frozen=True)
class Vad:
    threshold: float = 0.5
    prefix_padding_ms: int = 300
    silence_duration_ms: int = 500


@dataclass(frozen=True)
class Settings:
    """A session's configuration: defaults as OpenAI's, changed by each ``session.update``."""
    format: str = "audio/pcm"  # or audio/pcmu, audio/pcma (G.711, 8 kHz)
    rate: int = 24000  # audio/pcm only: OpenAI's 24000, or any rate from 8000 to 192000 Hz (resampled)
    model: str = "whisper-1"  # any name: the server has one model
    language: str | None = None  # None: detected per utterance
    languages: tuple[str, ...] = ()  # with language None: detected among these only (empty: any)
    prompt: str = ""  # the stream's first prompt (Whisper's initial_prompt), then its committed text
    keywords: tuple[str, ...] = ()  # hotwords: in the prompt before the committed text of every decode
    vad: Vad | None = Vad()  # None: turns end at input_audio_buffer.commit only
    noise_reduction: str | None = None
    logprobs: bool = False
    delay: str | None = None  # one of DELAYS: an AlignAtt server's (None: the server's commit policy as it is)

    @property
    def bytes_per_second(self) -> int:
        """Of the session's audio: 16-bit PCM at its rate, or G.711's byte per sample at 8 kHz."""
        return 2 * self.rate if self.format == "audio/pcm" else 8000

    def stream(self, base: StreamConfig) -> StreamConfig:
        """The engine stream these settings ask for, over the server's ``base`` (its step, policy and hotwords; its
        AlignAtt takes the session's delay, and its hotwords give way to the session's keywords)."""
        vad, policy = self.vad or Vad(), base.policy
        if self.delay is not None and isinstance(policy, AlignAtt):
            policy = DELAYS[self.delay]
        return replace(base, language=self.language, languages=self.languages, interim=True,
                       vad=self.vad is not None, vad_threshold=vad.threshold,
                       preroll_s=vad.prefix_padding_ms / 1000, end_silence_s=vad.silence_duration_ms / 1000,
                       policy=policy, prompt=self.prompt,
                       hotwords=", ".join(self.keywords) if self.keywords else base.hotwords)

    def as_dict(self, beta: bool) -> dict:
        """The session object of ``session.created``/``.updated`` (beta: ``transcription_session.*``)."""
        transcription = {"model": self.model, "language": self.language, "prompt": self.prompt,
                         **({"keywords": list(self.keywords)} if self.keywords else {}),
                         **({"languages": list(self.languages)} if self.languages else {}),
                         **({"delay": self.delay} if self.delay else {})}
        vad = None if self.vad is None else {"type": "server_vad", **self.vad.__dict__}
        noise = None if self.noise_reduction is None else {"type": self.noise_reduction}
        include = [LOGPROBS] if self.logprobs else []
        if beta:
            return {"object": "realtime.transcription_session", "input_audio_format": FORMATS[self.format],
                    "input_audio_transcription": transcription, "turn_detection": vad,
                    "input_audio_noise_reduction": noise, "include": include, "modalities": ["text"]}
        audio_format = {"type": self.format, **({"rate": self.rate} if self.format == "audio/pcm" else {})}
        return {"type": "transcription", "object": "realtime.transcription_session", "include": include,
                "audio": {"input": {"format": audio_format, "transcription": transcription, "turn_detection": vad,
                                    "noise_reduction": noise}}}


def parse_event(text: str) -> dict:
    """A client event: JSON, a known ``type``, an optional string ``event_id``."""
    try:
        event = load_object(text)
    except ProtocolError as e:
        raise RealtimeError("invalid_json" if e.code == "bad_json" else "missing_required_parameter", e.message,
                            None if e.code == "bad_json" else "type") from None
    if (event_id := event.get("event_id")) is not None and not isinstance(event_id, str):
        raise RealtimeError("invalid_type", f"event_id must be a string, not {echo(event_id)}", "event_id")
    if event["type"] not in CLIENT_EVENTS:
        raise RealtimeError("invalid_value", f"unknown or unsupported event type {echo(event['type'])}: a "
                            f"transcription session takes {', '.join(CLIENT_EVENTS)}", "type")
    return event


def _fields(obj, path: str, known: set[str]) -> dict:
    """``obj`` checked to be an object with no fields beyond ``known`` (and OpenAI's ignored ones)."""
    if not isinstance(obj, dict):
        raise RealtimeError("invalid_type", f"{path} must be an object, not {echo(obj)}", path)
    extra = sorted(set(obj) - known - IGNORED.get(path.rsplit(".", 1)[-1], set()))
    if extra:
        names = ", ".join(echo(name) for name in extra[:ECHO_FIELDS])
        more = f" and {len(extra) - ECHO_FIELDS} more" if len(extra) > ECHO_FIELDS else ""
        raise RealtimeError("unknown_parameter", f"unknown fields in {path}: {names}{more} (known: "
                            f"{', '.join(sorted(known))})", f"{path}.{extra[0]}" if len(extra[0]) <= 64 else path)
    return obj


def _number(obj: dict, name: str, path: str, default, low: float, high: float, integer: bool = False):
    value = obj.get(name, default)
    kinds = int if integer else int | float
    if not isinstance(value, kinds) or isinstance(value, bool) or not low <= value <= high:
        kind = "an integer" if integer else "a number"
        raise RealtimeError("invalid_value", f"{path}.{name} must be {kind} from {low:g} to {high:g}, not "
                            f"{echo(value)}", f"{path}.{name}")
    return value


def _string(obj: dict, name: str, path: str, default, choices=None, nullable: bool = False, most: int = MAX_NAME):
    """A string field (``most`` characters at most; a prompt's bound is MAX_PROMPT)."""
    value = obj.get(name, default)
    if isinstance(value, str) and len(value) > most:
        raise RealtimeError("string_above_max_length", f"{path}.{name} is {len(value)} characters long; at most "
                            f"{most} are accepted", f"{path}.{name}")
    if (value is None and nullable) or (isinstance(value, str) and (choices is None or value in choices)):
        return value
    allowed = f"one of {', '.join(choices)}" if choices else "a string"
    raise RealtimeError("invalid_value", f"{path}.{name} must be {allowed}, not {echo(value)}", f"{path}.{name}")


def _keywords(obj: dict, path: str, default: tuple[str, ...]) -> tuple[str, ...]:
    """``keywords``: a list of strings (or null: none), at most MAX_HOTWORDS characters joined."""
    value = obj.get("keywords", default)
    if value is None:
        return ()
    if not isinstance(value, (list, tuple)) or not all(isinstance(k, str) for k in value) \
            or len(", ".join(value)) > MAX_HOTWORDS:
        raise RealtimeError("invalid_value", f"{path}.keywords must be a list of strings of at most {MAX_HOTWORDS} "
                            f"characters in all, not {echo(value)}", f"{path}.keywords")
    return tuple(k.strip() for k in value if k.strip())


def _languages(obj: dict, path: str, default: tuple[str, ...], known: set[str] | None) -> tuple[str, ...]:
    """``languages``: language codes of the model that detection may choose (or null: any)."""
    value = obj.get("languages", default)
    if value is None:
        return ()
    if not isinstance(value, (list, tuple)) or len(value) > 200 or not all(
            isinstance(code, str) and (known is None or code in known) for code in value):
        raise RealtimeError("invalid_value", f"{path}.languages must be a list of the model's language codes, not "
                            f"{echo(value)}", f"{path}.languages")
    return tuple(dict.fromkeys(value))


def _beta_as_ga(session: dict) -> dict:
    """A beta ``transcription_session.update``'s session in the GA layout (same checks for both)."""
    session = _fields(session, "session", {"input_audio_format", "input_audio_transcription", "turn_detection",
                                           "input_audio_noise_reduction", "include"})
    names = {"input_audio_format": "format", "input_audio_transcription": "transcription",
             "turn_detection": "turn_detection", "input_audio_noise_reduction": "noise_reduction"}
    audio_in = {ga: session[beta] for beta, ga in names.items() if beta in session}
    if "format" in audio_in:
        beta_formats = {beta: ga for ga, beta in FORMATS.items()}
        if not isinstance(audio_in["format"], str) or audio_in["format"] not in beta_formats:
            raise RealtimeError("invalid_value", f"session.input_audio_format must be one of {', '.join(beta_formats)}"
                                f", not {echo(audio_in['format'])}", "session.input_audio_format")
        audio_in["format"] = {"type": beta_formats[audio_in["format"]]}
    return {"type": "transcription", "audio": {"input": audio_in}, **{k: session[k] for k in ("include",) if k in session}}


def parse_update(event: dict, current: Settings, languages: set[str] | None) -> Settings:
    """The settings after ``session.update`` (GA) or ``transcription_session.update`` (beta): fields not given keep
    their values; ``turn_detection: null`` turns server VAD off."""
    if "session" not in event:
        raise RealtimeError("missing_required_parameter", "the event needs a session object", "session")
    session = event["session"]
    if event["type"] == "transcription_session.update":
        session = _beta_as_ga(session)
    session = _fields(session, "session", {"type", "audio", "include"})
    if session.get("type") != "transcription":
        raise RealtimeError("invalid_value", f"session.type must be \"transcription\" (asr_spec serves transcription "
                            f"sessions only), not {echo(session.get('type'))}", "session.type")
    new = current
    if (include := session.get("include")) is not None:
        if not isinstance(include, list) or any(x != LOGPROBS for x in include):
            raise RealtimeError("invalid_value", f"session.include may hold only {LOGPROBS!r}", "session.include")
        new = replace(new, logprobs=bool(include))
    audio = _fields(session.get("audio", {}), "session.audio", {"input"})
    audio_in = _fields(audio.get("input", {}), "session.audio.input",
                       {"format", "transcription", "turn_detection", "noise_reduction"})
    if (fmt := audio_in.get("format")) is not None:
        path = "session.audio.input.format"
        kind = _string(_fields(fmt, path, {"type", "rate"}), "type", path, "audio/pcm", list(FORMATS))
        if kind != "audio/pcm" and "rate" in fmt and fmt["rate"] != 8000:
            raise RealtimeError("invalid_value", f"{kind} is 8000 Hz audio", f"{path}.rate")
        rate = _number(fmt, "rate", path, 24000, 8000, 192000, integer=True) if kind == "audio/pcm" else 8000
        new = replace(new, format=kind, rate=rate)
    if (tr := audio_in.get("transcription")) is not None:
        path = "session.audio.input.transcription"
        _fields(tr, path, {"model", "language", "prompt", "keywords", "languages", "delay"})
        language = _string(tr, "language", path, new.language, nullable=True) or None
        if language is not None and languages is not None and language not in languages:
            raise RealtimeError("invalid_value", f"unknown language {echo(language)}", f"{path}.language")
        new = replace(new, model=_string(tr, "model", path, new.model, nullable=True) or new.model, language=language,
                      prompt=_string(tr, "prompt", path, new.prompt, nullable=True, most=MAX_PROMPT) or "",
                      keywords=_keywords(tr, path, new.keywords), languages=_languages(tr, path, new.languages, languages),
                      delay=_string(tr, "delay", path, new.delay, list(DELAYS), nullable=True))
    if "turn_detection" in audio_in:
        new = replace(new, vad=_vad(audio_in["turn_detection"], new.vad))
    if "noise_reduction" in audio_in:
        path, noise = "session.audio.input.noise_reduction", audio_in["noise_reduction"]
        new = replace(new, noise_reduction=None if noise is None else _string(
            _fields(noise, path, {"type"}), "type", path, "near_field", ["near_field", "far_field"]))
    return new


def ignored_fields(event: dict) -> list[tuple[str, str]]:
    """The fields of a valid update that are accepted but change nothing here, as (path, why): each gets a
    ``warning`` event. Paths are the GA layout's, for beta updates too."""
    session = event["session"]
    found = [(f"session.{k}", WHY_IGNORED["session"]) for k in sorted(IGNORED["session"] & set(session))]
    ga = _beta_as_ga(session) if event["type"] == "transcription_session.update" else session
    audio_in = ga.get("audio", {}).get("input", {})
    if isinstance(td := audio_in.get("turn_detection"), dict):
        found += [(f"session.audio.input.turn_detection.{k}", WHY_IGNORED[k])
                  for k in sorted(IGNORED["turn_detection"] & set(td))]
    if isinstance(audio_in.get("noise_reduction"), dict):
        found.append(("session.audio.input.noise_reduction", WHY_IGNORED["noise_reduction"]))
    return found


def _vad(td, current: Vad | None) -> Vad | None:
    path = "session.audio.input.turn_detection"
    if td is None:
        return None
    _fields(td, path, {"type", "threshold", "prefix_padding_ms", "silence_duration_ms"})
    kind = _string(td, "type", path, "server_vad", ["server_vad", "semantic_vad"])
    if kind == "semantic_vad":
        raise RealtimeError("invalid_value", "semantic_vad is not supported: use server_vad (silero VAD) or null "
                            "(manual commits)", f"{path}.type")
    base = current or Vad()
    return Vad(threshold=_number(td, "threshold", path, base.threshold, 0.0, 1.0),
               prefix_padding_ms=_number(td, "prefix_padding_ms", path, base.prefix_padding_ms, 0, 10000, integer=True),
               silence_duration_ms=_number(td, "silence_duration_ms", path, base.silence_duration_ms, 32, 10000,
                                           integer=True))


def appended_audio(event: dict, settings: Settings, max_s: float) -> str:
    """The base64 audio of an ``input_audio_buffer.append``, refused when it holds more than ``max_s`` seconds of
    the session's format. Its length says so: the check costs nothing, whatever the event holds."""
    audio = event.get("audio")
    if not isinstance(audio, str):
        raise RealtimeError("missing_required_parameter" if audio is None else "invalid_type",
                            "input_audio_buffer.append needs audio: a base64 string", "audio")
    size = len(audio) * 3 // 4 - audio.endswith("=") - audio.endswith("==")  # bytes, once decoded
    if size > (limit := int(max_s * settings.bytes_per_second)):
        raise RealtimeError("invalid_value", f"an input_audio_buffer.append holds at most {max_s:g} s of audio "
                            f"({limit} bytes of {settings.format} at {settings.rate} Hz, {-(-limit // 3) * 4} base64 "
                            f"characters); this one holds {size / settings.bytes_per_second:.1f} s (dropped): append "
                            "the audio in smaller pieces, as it comes", "audio")
    return audio


def base64_audio(audio: str) -> bytes:
    """The bytes of an append's base64 audio."""
    try:
        return base64.b64decode(audio, validate=True)
    except (binascii.Error, ValueError):
        raise RealtimeError("invalid_value", f"audio is not base64 ({len(audio)} characters; dropped)", "audio") from None


def _g711_tables() -> dict[str, np.ndarray]:
    """16-bit samples of the 256 G.711 codes (ITU-T G.711: mu-law and A-law)."""
    code = np.arange(256)
    u = ~code & 0xFF
    mu = (((u & 0x0F) << 3) + 0x84 << ((u >> 4) & 7)) - 0x84
    a = code ^ 0x55
    exp, mant = (a >> 4) & 7, a & 0x0F
    alaw = np.where(exp == 0, (mant << 4) + 8, ((mant << 4) + 0x108) << np.maximum(exp - 1, 0))
    return {"audio/pcmu": np.where(u & 0x80, -mu, mu).astype("<i2"),
            "audio/pcma": np.where(a & 0x80, alaw, -alaw).astype("<i2")}


G711 = _g711_tables()


class RealtimeAudio(AudioDecoder):
    """Audio of a session's format -> 16 kHz mono float32: 16-bit PCM at its rate, or G.711 at 8 kHz."""

    def __init__(self, settings: Settings):
        super().__init__(Start(sample_rate=settings.rate, encoding="pcm_s16le", channels=1))
        self.table = G711.get(settings.format)

    def __call__(self, data: bytes) -> np.ndarray:
        if self.table is not None:
            data = self.table[np.frombuffer(data, dtype=np.uint8)].tobytes()
        try:
            return super().__call__(data)
        except ProtocolError as e:  # an odd byte count of 16-bit audio
            raise RealtimeError("invalid_value", e.message + " (dropped)", "audio") from None


def item(item_id: str, transcript: str | None) -> dict:
    """The user message item a turn's audio and transcript make."""
    return {"id": item_id, "object": "realtime.item", "type": "message", "status": "completed", "role": "user",
            "content": [{"type": "input_audio", "transcript": transcript}]}
