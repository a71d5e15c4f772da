"""The WebSocket protocol's messages (docs/protocol.md): parsing and validation of what clients send,
and the audio decoding of binary frames."""
from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np
import soxr

from asr_spec.audio import SAMPLE_RATE
from asr_spec.streaming.policy import POLICIES, CommitPolicy, policy_named

ENCODINGS = {"pcm_s16le": (np.dtype("<i2"), 32768.0), "f32le": (np.dtype("<f4"), 1.0)}
TASKS = ("transcribe", "translate")
CHANNELS = (1, 2)
ECHO_CHARS = 64  # a client's string echoed in an error message is cut to this many characters
ECHO_FIELDS = 5  # unknown start fields named in an error message (the rest are counted)


class ProtocolError(Exception):
    """A client mistake: sent back as an ``error`` event with ``code``; the session goes on."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code, self.message = code, message

    def event(self) -> dict:
        return {"type": "error", "code": self.code, "message": self.message}


MAX_HOTWORDS = 1000  # characters: more than the prompt's room (223 tokens) holds
# a prompt (Whisper's initial_prompt; an upload's or a Realtime session's ``prompt``): Whisper reads at most the last
# 223 tokens of it, ~1000 characters of English; twice that leaves room for other scripts. Text work on a client's
# string (tokenizing, joining) is then bounded wherever it runs.
MAX_PROMPT = 2000
MAX_NAME = 256  # characters of any other free-text field (a model's name, a language's)


@dataclass(frozen=True)
class Start:
    sample_rate: int = SAMPLE_RATE
    encoding: str = "pcm_s16le"
    channels: int = 1
    language: str | None = "en"
    task: str = "transcribe"
    interim_results: bool = True
    word_timestamps: bool = False
    commit_policy: CommitPolicy | None = None  # None: the server's (--commit-policy)
    hotwords: str | None = None  # None: the server's (--hotwords)


def echo(value) -> str:
    """A client's value for an error message, as JSON: strings and numbers cut to ``ECHO_CHARS`` characters,
    arrays and objects named by type (an error never repeats a megabyte field name, nor a deeply nested list)."""
    if isinstance(value, list | dict):
        return "an array" if isinstance(value, list) else "an object"
    if isinstance(value, str) and len(value) > ECHO_CHARS:
        return f"{json.dumps(value[:ECHO_CHARS], ensure_ascii=False)}... ({len(value)} characters)"
    text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= ECHO_CHARS else f"{text[:ECHO_CHARS]}... ({len(text)} characters)"


def load_object(text: str) -> dict:
    """A client's JSON text message: an object with a string ``type`` (``bad_json``, ``bad_message`` otherwise)."""
    try:
        msg = json.loads(text)
    except json.JSONDecodeError as e:
        raise ProtocolError("bad_json", f"not JSON: {e.msg} at position {e.pos}") from None
    except RecursionError:  # "[[[[..." nested deeper than the parser's recursion limit
        raise ProtocolError("bad_json", "not JSON this server accepts: nested too deeply") from None
    except ValueError as e:  # e.g. an integer of more than 4300 digits
        raise ProtocolError("bad_json", f"not JSON this server accepts: {str(e)[:200]}") from None
    if not isinstance(msg, dict) or not isinstance(msg.get("type"), str):
        raise ProtocolError("bad_message", 'a message is a JSON object with a string "type"')
    return msg


def parse_message(text: str) -> dict:
    msg = load_object(text)
    if msg["type"] not in ("start", "finalize", "close"):
        raise ProtocolError("unknown_type", f"unknown message type {echo(msg['type'])} (start, finalize, close)")
    return msg


def parse_start(msg: dict, languages: set[str] | None) -> Start:
    known = {"type", "sample_rate", "encoding", "channels", "language", "task", "interim_results", "word_timestamps",
             "commit_policy", "hotwords"}
    if extra := sorted(set(msg) - known):
        names = ", ".join(echo(name) for name in extra[:ECHO_FIELDS])
        more = f" and {len(extra) - ECHO_FIELDS} more" if len(extra) > ECHO_FIELDS else ""
        raise ProtocolError("bad_start", f"unknown start fields: {names}{more} (known: {', '.join(sorted(known))})")
    d = Start()
    rate = msg.get("sample_rate", d.sample_rate)
    if not isinstance(rate, int) or isinstance(rate, bool) or not 8000 <= rate <= 192000:
        raise ProtocolError("bad_sample_rate", "sample_rate must be an integer from 8000 to 192000 Hz")
    encoding = msg.get("encoding", d.encoding)
    if not isinstance(encoding, str) or encoding not in ENCODINGS:
        raise ProtocolError("bad_encoding", f"encoding must be one of {', '.join(ENCODINGS)}, not {echo(encoding)}")
    channels = msg.get("channels", d.channels)
    if not isinstance(channels, int) or isinstance(channels, bool) or channels not in CHANNELS:
        raise ProtocolError("bad_channels", f"channels must be the integer 1 or 2 (stereo is mixed down), "
                            f"not {echo(channels)}")
    language = msg.get("language", d.language)
    if language is not None and (not isinstance(language, str) or (languages is not None and language not in languages)):
        raise ProtocolError("bad_language", f"unknown language {echo(language)}")
    task = msg.get("task", d.task)
    if not isinstance(task, str) or task not in TASKS:
        raise ProtocolError("bad_task", "task must be transcribe or translate")
    interim = msg.get("interim_results", d.interim_results)
    if not isinstance(interim, bool):
        raise ProtocolError("bad_start", "interim_results must be true or false")
    words = msg.get("word_timestamps", d.word_timestamps)
    if not isinstance(words, bool):
        raise ProtocolError("bad_start", "word_timestamps must be true or false")
    policy = msg.get("commit_policy")
    if policy is not None and policy not in POLICIES:
        raise ProtocolError("bad_start", f"commit_policy must be one of {', '.join(POLICIES)}, not {echo(policy)}")
    hotwords = msg.get("hotwords", d.hotwords)
    if hotwords is not None and (not isinstance(hotwords, str) or len(hotwords) > MAX_HOTWORDS):
        raise ProtocolError("bad_start", f"hotwords must be a string of at most {MAX_HOTWORDS} characters")
    return Start(rate, encoding, channels, language, task, interim, words,
                 d.commit_policy if policy is None else policy_named(policy), hotwords)


class AudioDecoder:
    """Binary frames in the session's encoding -> 16 kHz mono float32, resampled as one continuous stream."""

    def __init__(self, start: Start):
        self.dtype, self.scale = ENCODINGS[start.encoding]
        self.channels = start.channels
        self.frame_bytes = self.dtype.itemsize * self.channels
        self.resampler = soxr.ResampleStream(start.sample_rate, SAMPLE_RATE, 1, dtype="float32") \
            if start.sample_rate != SAMPLE_RATE else None

    def __call__(self, data: bytes) -> np.ndarray:
        if len(data) % self.frame_bytes:
            raise ProtocolError("bad_frame", f"a frame must hold whole samples: {len(data)} bytes is not a multiple "
                                f"of {self.frame_bytes} ({self.dtype.itemsize}-byte samples x {self.channels} channels)")
        x = np.frombuffer(data, dtype=self.dtype).astype(np.float32) / self.scale
        if not np.isfinite(x).all():
            raise ProtocolError("bad_frame", "audio samples must be finite numbers (frame dropped)")
        if (np.abs(x) > 1.0).any():  # f32le only: 16-bit samples are always in range
            raise ProtocolError("bad_frame", f"f32le samples must lie in [-1, 1]; this frame peaks at "
                                f"{float(np.abs(x).max()):.3g} (frame dropped)")
        x = x.reshape(-1, self.channels).mean(axis=1)
        return self.resampler.resample_chunk(x) if self.resampler is not None else x

    def finish(self) -> np.ndarray:
        """What the resampler still holds at the end of the stream."""
        if self.resampler is None:
            return np.zeros(0, dtype=np.float32)
        return self.resampler.resample_chunk(np.zeros(0, dtype=np.float32), last=True)
