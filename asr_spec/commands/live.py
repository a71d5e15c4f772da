"""The live commands: ``serve`` (its options are ServeSettings', asr_spec.server.settings), ``stream`` (a file to a
server as a live stream) and ``mic`` (the microphone, to a server or to an engine in this process)."""
from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass
from typing import Literal

from ..arguments import option, variant
from ..models.settings import ModelSettings
from ..streaming import POLICIES
from .models import load


def serve(args: argparse.Namespace) -> int:
    import asyncio
    import logging

    from pydantic import ValidationError

    from asr_spec.server.config import api_keys
    from asr_spec.server.settings import from_arguments

    try:
        settings = from_arguments(args)
    except ValidationError as e:  # an ASR_SPEC_* variable the settings cannot take
        print(f"error: {e}", file=sys.stderr)
        return 1
    try:
        keys = api_keys(getattr(args, "api_key", None), settings.api_key_file)
    except (OSError, ValueError) as e:
        print(f"error: --api-key-file: {e}", file=sys.stderr)
        return 1
    if settings.host not in ("127.0.0.1", "localhost", "::1") and not keys:
        print("warning: listening beyond localhost without an API key (ASR_SPEC_API_KEY or --api-key-file)",
              file=sys.stderr)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    if settings.ray is not None:
        from asr_spec.server.ray_serve import serve_on_ray

        return serve_on_ray(settings, keys)
    from asr_spec.server.app import Server

    if (models := load(settings.model_options(), background=True)) is None:
        return 1
    target, draft = models
    server = Server.build(settings, keys, target, draft)
    try:  # SIGINT/SIGTERM: sessions' buffered audio is decoded (--drain-seconds), they are closed with 1001
        asyncio.run(server.serve_forever(handle_signals=True))
    except KeyboardInterrupt:  # a Ctrl-C before the signal handlers are in place
        pass
    except OSError as e:
        print(f"error: cannot listen on {settings.host}:{settings.port}: {e.strerror or e}", file=sys.stderr)
        return 1
    return 0


@dataclass(frozen=True, kw_only=True)
class StreamSettings:
    file: str = option(positional=True)
    url: str = option("ws://127.0.0.1:8765", "server address (default ws://127.0.0.1:8765)")
    realtime: bool = option(False, "pace the audio at real time (default: as fast as possible)")
    json: bool = option(False, "print every event as a JSON line (default: finals as text)")
    language: str = option("en", "language code, or '' to detect")
    api_key: str | None = option(None, "bearer token (or ASR_SPEC_API_KEY)")
    word_timestamps: bool = option(False, "finals carry their words with start and end times")


def stream(settings: StreamSettings) -> int:
    from websockets.exceptions import InvalidStatus, InvalidURI

    from asr_spec.clients.stream import printer, stream_file

    from ..audio import AudioError, load_audio

    try:
        audio = load_audio(settings.file)
    except AudioError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    try:
        events = stream_file(settings.url, audio, 1.0 if settings.realtime else None, printer(settings.json),
                             settings.language or None, settings.api_key or os.environ.get("ASR_SPEC_API_KEY"),
                             settings.word_timestamps)
    except (OSError, InvalidURI, InvalidStatus, TimeoutError) as e:
        print(f"error: cannot stream to {settings.url}: {e}", file=sys.stderr)
        return 1
    return 0 if events and events[-1]["type"] == "closed" else 1


MicModelSettings = variant(ModelSettings, "MicModelSettings", "mic's model options: --device is the microphone, and "
                           "the compute type puts latency first.", __name__, defaults={"compute_type": "auto"},
                           flags={"torch_device": "--torch-device"})


@dataclass(frozen=True, kw_only=True)
class MicSettings:
    url: str | None = option(None, "stream to asr_spec serve at this ws:// address (default: run the engine "
                             "in-process)")
    device: str | None = option(None, "input device (number or name; see --list-devices)")
    list_devices: bool = option(False, "list audio input devices and exit")
    language: str = option("en", "language code, or '' to detect")
    api_key: str | None = option(None, "bearer token for --url (or ASR_SPEC_API_KEY)")
    input_file: str | None = option(None, "replay this audio file at real time instead of the microphone")
    commit_policy: Literal[POLICIES] | None = option(None, "alignatt or local-agreement (default: the server's; "
                                                     f"in-process: {POLICIES[0]})")
    models: MicModelSettings


def mic(settings: MicSettings) -> int:
    import torch

    from ..audio import AudioError

    if settings.models.threads:
        torch.set_num_threads(settings.models.threads)
    from asr_spec.clients.mic import FileSource, LiveLine, MicError, Microphone, list_devices, run_local, run_remote

    try:
        if settings.list_devices:
            print(list_devices())
            return 0
        device = int(settings.device) if settings.device and settings.device.isdigit() else settings.device
        source = FileSource(settings.input_file) if settings.input_file else Microphone(device)
    except (MicError, AudioError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    display = LiveLine()
    language = settings.language or None
    if settings.url:
        from websockets.exceptions import InvalidStatus, InvalidURI

        print(f"streaming to {settings.url}; Ctrl-C to stop", file=sys.stderr)
        try:
            with source:
                run_remote(settings.url, source, display, language,
                           settings.api_key or os.environ.get("ASR_SPEC_API_KEY"), settings.commit_policy)
        except (OSError, InvalidURI, InvalidStatus, TimeoutError) as e:
            print(f"error: cannot stream to {settings.url}: {e}", file=sys.stderr)
            return 1
    else:
        from ..measure import hold
        from ..recognizer import Recognizer
        from ..streaming.engine import Engine

        if (models := load(settings.models.options(), background=True)) is None:
            return 1
        print("listening (in-process engine); Ctrl-C to stop", file=sys.stderr)
        hold(True)  # a background measurement of this machine waits until the live session ends
        try:
            with source:
                run_local(Engine(Recognizer(*models)), source, display, language, settings.commit_policy)
        finally:
            hold(False)
    print("\n\ntranscript:\n" + display.transcript)
    return 0
