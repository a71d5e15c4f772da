"""The ``asr_spec`` command line: one subcommand per command in asr_spec.commands, its options generated from its
settings (a frozen dataclass; serve's from ServeSettings)."""
from __future__ import annotations

import argparse
import os
import sys
from functools import partial
from typing import Callable, TypeVar

from .arguments import add_options, from_args
from .commands.distill import DistillSettings, distill
from .commands.evaluate import EvalSettings, evaluate
from .commands.live import MicSettings, StreamSettings, mic, serve, stream
from .commands.transcribe import TranscribeSettings, transcribe

S = TypeVar("S")


def _run(settings: type[S], command: Callable[[S], int], args: argparse.Namespace) -> int:
    return command(from_args(settings, args))


def _command(sub: argparse._SubParsersAction, name: str, settings: type[S], command: Callable[[S], int],
             **parser_kw: str) -> None:
    parser = sub.add_parser(name, **parser_kw)
    add_options(parser, settings)
    parser.set_defaults(func=partial(_run, settings, command))


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The whole parser; ``command``: the subcommand being run, whose options alone are needed (serve's come from
    its pydantic settings, whose import costs ~0.25 s: built only for serve, or with None for every command)."""
    p = argparse.ArgumentParser(prog="asr_spec", description="Exact speculative Whisper transcription.")
    sub = p.add_subparsers(dest="command", required=True)
    _command(sub, "transcribe", TranscribeSettings, transcribe, help="transcribe audio files")
    v = sub.add_parser("serve", help="streaming transcription over WebSockets (docs/protocol.md)",
                       description="Every option can also be set by the ASR_SPEC_* environment variable named in "
                       "its help (the option wins); docs/deploy.md")
    if command in ("serve", None):
        from asr_spec.server.settings import add_arguments

        add_arguments(v)
    v.set_defaults(func=serve)
    _command(sub, "mic", MicSettings, mic, help="live microphone transcription in the terminal")
    _command(sub, "stream", StreamSettings, stream,
             help="send an audio file to asr_spec serve as a live stream and print the events")
    _command(sub, "eval", EvalSettings, evaluate,
             help="WER parity, speed-up and memory against target-only and peer systems")
    _command(sub, "distill", DistillSettings, distill,
             help="train a cheap draft for a Whisper target from unlabeled audio (and text)")
    return p


def main(argv: list[str] | None = None) -> int:
    given = sys.argv[1:] if argv is None else argv
    args = build_parser(given[0] if given else None).parse_args(argv)
    return args.func(args)


def run() -> None:
    """The ``asr_spec`` program: :func:`main`, then the process's exit. After ``transcribe`` in this process (its
    outputs written and closed, atomically) the interpreter's teardown is skipped: freeing torch's modules and the
    model took ~0.5 s of a 4 s first command (AMD EPYC, 2 cores). With Ray in the process it exits normally, so
    that Ray shuts down what it started."""
    code = main()
    if sys.argv[1:2] == ["transcribe"] and "ray" not in sys.modules:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)


if __name__ == "__main__":
    run()
