"""``asr_spec serve``'s settings in one object: every option, its default, its ``ASR_SPEC_*`` environment variable
and the defaults that depend on the hardware. The CLI's serve options are generated from it (an option given on the
command line wins over the environment, which wins over the default); the Ray Serve deployment (ray_serve.py) and the
benchmarks (eval/bench_streaming.py) build their servers from it too."""
from __future__ import annotations

import argparse
import os
from dataclasses import fields as dataclass_fields
from typing import TYPE_CHECKING, Literal, get_type_hints

from pydantic import Field, create_model
from pydantic_settings import BaseSettings, SettingsConfigDict

from asr_spec.arguments import add_options
from asr_spec.models.compute import amx
from asr_spec.models.settings import COMPUTE_HELP, ModelSettings
from asr_spec.streaming import MAX_STEP_S, STEP_S
from asr_spec.streaming.policy import POLICIES, policy_named

if TYPE_CHECKING:  # imported where used: the CLI builds serve's options from this module at every start
    from asr_spec.server.config import ServerConfig

    from asr_spec.models.loader import ModelOptions
    from asr_spec.streaming.config import EngineConfig

ENV_PREFIX = "ASR_SPEC_"


def _cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


class _ServeOptions(BaseSettings):
    """serve's own options (:data:`ServeSettings` adds the model options). 0 means "the hardware's default" for
    max_sessions, max_batch and threads (see the methods below)."""

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, frozen=True, extra="forbid")

    host: str = Field("127.0.0.1", description="interface to listen on (default: localhost only)")
    port: int = Field(8765, ge=0, le=65535, description="port to listen on")
    max_sessions: int = Field(0, ge=0, description=(
        "more simultaneous sessions are refused (0: what the device serves in real time with final latency <= 3 s, "
        "as measured: 2 per CPU core with AMX, else 1 per core; 16 on CUDA)"))
    max_load: float = Field(1.0, ge=0, description=(
        "a new session is also refused (server_full; /health 503) when the open sessions + 1 exceed the real-time "
        "sessions the engine carries, as measured from what its steps cost, at the step a stream takes under load, "
        "busy at most this share of the time (0: no load check, only --max-sessions)"))
    max_sessions_per_client: int = Field(0, ge=0, description=(
        "sessions one client may hold, per address and per key (0: half of --max-sessions)"))
    api_key_file: str | None = Field(None, description=(
        "require one of the bearer tokens in this file (one per line; several keys: several clients, each with "
        "its own session limit); a single key can come from ASR_SPEC_API_KEY instead"))
    drain_seconds: float = Field(5.0, ge=0, description=(
        "on SIGTERM/SIGINT, decode what open sessions hold for up to this long before closing them"))
    max_upload_seconds: float = Field(3600.0, gt=0, description=(
        "longest audio accepted by /v1/audio/* (checked from the file's header; 413 beyond)"))
    step: float = Field(STEP_S, gt=0, description=(
        "re-decode a stream after this many seconds of new audio (longer under load, see --max-step)"))
    max_step: float = Field(MAX_STEP_S, ge=0, description=(
        "let the step grow with the load up to this many seconds (the engine's recent step time / 0.7; 0: a fixed "
        "step)"))
    encoder_window: Literal["auto", "stream", "full", "audio"] = Field("auto", description=(
        "how a stream's buffer is encoded at each step: stream (each audio frame a bounded number of times, the rest "
        "kept: the least arithmetic), full (Whisper's padded 30 s window, every stream's in one call: the least host "
        "work), audio (the buffer and 2 s of silence); auto: full on CUDA, stream on a CPU"))
    alignment: Literal["pass", "decode"] = Field("pass", description=(
        "where AlignAtt's word times come from: pass (a pass of the target over the decoded text after each decode, "
        "Whisper's word alignment) or decode (the cross-attention the decode recorded as it chose each token: no "
        "extra pass)"))
    commit_policy: Literal[POLICIES] = Field(POLICIES[0], description=(
        "what a re-decode commits: alignatt (after one decode, the words the audio already supports and the model "
        "is sure of) or local-agreement (what two decodes in a row agree on: slower, and a worse WER at the same "
        "step)"))
    hotwords: str = Field("", description=(
        "words to favour (names, terms) in every session's prompt and every upload's (faster-whisper's hotwords); "
        "a session's start message may name its own"))
    max_batch: int = Field(0, ge=0, description="most streams decoded in one batch (0: 8 on a CPU, 32 on CUDA)")
    window_padding: Literal["audio", "mel"] = Field("audio", description=(
        "uploads: what follows a window's audio when it holds less than 30 s: audio (the log-mel of silence: "
        "openai-whisper's decode() on padded audio) or mel (zeros after the audio's frames: openai-whisper's "
        "transcribe() and faster-whisper)"))
    file_batch: int = Field(4, ge=1, description=(
        "uploads to /v1/audio/* decoded together (the shortest waiting first; a short one takes a long one's place "
        "at its next window)"))
    max_uploads: int = Field(16, ge=1, description="uploads that may wait; more get 503 with Retry-After")
    max_uploads_per_client: int = Field(0, ge=0, description=(
        "uploads one client may have waiting or in progress, per address and per key; more get 429 with "
        "Retry-After (0: half of --max-uploads)"))
    upload_yield: float = Field(5.0, ge=0, description=(
        "uploads wait up to this many seconds, after about one window of each file in flight, while live streams are "
        "due (0: uploads and streams share the CPU equally)"))
    idle_timeout: float = Field(60.0, gt=0, description="close sessions silent for this many seconds")
    stream_draft: bool = Field(False, description=(
        "live streams also draft with the draft model past their previous hypothesis (which every re-decode "
        "proposes first); by default their hints alone, the draft serving uploads (measured a tenth cheaper for "
        "streams on a CPU). Never changes the text"))
    ray: str | None = Field(None, description=(
        "serve on Ray Serve (pip install 'asr_spec[ray]'): ADDRESS such as HOST:6379, or nothing for the cluster "
        "RAY_ADDRESS names or one started here with 'ray start', else a new local one (docs/deploy.md)"),
        json_schema_extra={"argparse": {"nargs": "?", "const": "local", "metavar": "ADDRESS"}})
    replicas: int = Field(1, ge=1, description="with --ray: replicas, each with its own model and engine")
    min_replicas: int = Field(0, ge=0, description=(
        "with --ray: autoscale on active sessions between --min-replicas and --max-replicas (both needed)"))
    max_replicas: int = Field(0, ge=0, description="with --ray: the most replicas autoscaling starts")
    metrics_port: int = Field(0, ge=0, le=65535, description=(
        "with --ray: replica R also serves its Prometheus metrics at http://HOST:(PORT+R)/metrics (0: off; "
        "/metrics through Ray's proxy answers from whichever replica it reaches)"))

    # --- the defaults that depend on the hardware -------------------------------------------------------------
    @property
    def cuda(self) -> bool:
        return self.device.startswith("cuda")

    def sessions(self) -> int:
        """max_sessions, else the most simultaneous speakers one engine serves at real time with final latency
        median <= 3 s, as measured with serve's defaults (`python eval/bench_streaming.py --skip-wer --sessions
        1,2,4,6,8`; docs/results.md, "Streaming"): on a 2-core Intel Xeon with AMX (bfloat16) 4 keep up, on a 2-core
        AMD EPYC without AVX-512 (int8) 2. So: 2 per core with AMX, else 1 per core. CUDA: 16 (an H100)."""
        if self.max_sessions:
            return self.max_sessions
        return 16 if self.cuda else _cores() * (2 if amx() else 1)

    def torch_threads(self) -> int:
        """threads, else on a CPU every core the process may use; 0 (torch's choice) on CUDA. The decoding thread
        holds the process's only OpenMP pool (asr_spec/threads.py), so its threads no longer sleep between operators
        and a second one pays: 2-core Xeon with AMX, `python eval/bench_streaming.py --skip-wer --threads
        1|2`: 4 sessions final latency median 2.25-2.39 s with 1 thread against 1.69 s with 2, 8 sessions 4.05-4.22
        against 3.00-3.13 s. Before that fix one thread fewer than the cores measured
        faster."""
        if self.threads or self.cuda:
            return self.threads
        return _cores()

    def batch(self) -> int:
        """max_batch, else 8 streams on a CPU (a batch's cost grows with its rows there) and 32 on CUDA (a pass over
        32 rows costs about what one over 1 does)."""
        return self.max_batch or (32 if self.cuda else 8)

    def window(self) -> str:
        """encoder_window, else full on CUDA and stream on a CPU. On a GPU the streaming encoder's arithmetic is
        nothing, its host work per stream everything: it attends each buffer on its own (~280 torch operations per
        stream and step, eval/experiments/profile_stream.py --ops), where full windows take one encoder call for every stream
        (~20): on an H200, 64 streams' ticks spent most of their time issuing them.
        On a CPU the arithmetic is what counts: a 30 s window is ~5x the streaming encoder's tail."""
        if self.encoder_window != "auto":
            return self.encoder_window
        return "full" if self.cuda else "stream"

    # --- what the server is built from ----------------------------------------------------------------------
    def model_options(self) -> ModelOptions:
        from asr_spec.models.loader import ModelOptions

        return ModelOptions(self.model, None if self.no_draft else self.draft, self.device, self.compute_type,
                            self.torch_threads(), self.speculation, measure_now=False)

    def engine_config(self) -> EngineConfig:
        """The streaming engine's configuration (the batch, the load step, the encoder window, the draft; the rest at
        the engine's defaults)."""
        from asr_spec.streaming.config import EngineConfig

        return EngineConfig(max_batch=self.batch(), max_step_s=self.max_step, alignment=self.alignment,
                            encoder_window=self.window(), draft=self.stream_draft)

    def server_config(self, api_keys: tuple[str, ...]) -> ServerConfig:
        from asr_spec.server.config import ServerConfig

        from asr_spec.streaming.config import StreamConfig

        return ServerConfig(host=self.host, port=self.port, max_sessions=self.sessions(), max_load=self.max_load or None,
                            max_sessions_per_client=self.max_sessions_per_client, api_keys=api_keys,
                            idle_timeout_s=self.idle_timeout,
                            stream=StreamConfig(step_s=self.step, policy=policy_named(self.commit_policy),
                                                hotwords=self.hotwords), drain_s=self.drain_seconds, max_upload_s=self.max_upload_seconds)


# serve's model options are every command's (asr_spec.models.settings: one declaration), with serve's defaults: the
# compute type measured fastest here, torch on every core
SERVE_MODEL_DEFAULTS = {"compute_type": "auto"}
SERVE_MODEL_HELP = {"threads": "torch CPU threads (0: every core on a CPU; torch's choice on CUDA)",
                    "compute_type": COMPUTE_HELP + "; live sessions put latency first"}


def _model_fields() -> dict:
    hints = get_type_hints(ModelSettings)
    out = {}
    for f in dataclass_fields(ModelSettings):
        name = "device" if f.name == "torch_device" else f.name  # serve has no other device (mic's is its input)
        description = SERVE_MODEL_HELP.get(f.name, f.metadata["help"]).replace(" (default %(default)s)", "")
        bounds = {"ge": 0} if hints[f.name] is int else {}
        out[name] = (hints[f.name], Field(SERVE_MODEL_DEFAULTS.get(f.name, f.default), description=description,
                                          json_schema_extra={"argparse": f.metadata["kw"]}, **bounds))
    return out


ServeSettings = create_model("ServeSettings", __base__=_ServeOptions, __module__=__name__, **_model_fields())


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """serve's options, one per setting: ``--max-sessions`` is ``max_sessions``, its environment variable
    ``ASR_SPEC_MAX_SESSIONS``. Options not given stay out of the namespace (the settings' environment and defaults
    apply); ``--api-key`` is the command line's alone."""
    add_options(parser, ServeSettings, ENV_PREFIX)
    parser.add_argument("--api-key", default=argparse.SUPPRESS, help=(
        "require this bearer token (visible to local users in ps: prefer the ASR_SPEC_API_KEY environment variable "
        "or --api-key-file)"))


def from_arguments(args: argparse.Namespace) -> ServeSettings:
    """The settings: the options given on the command line over ``ASR_SPEC_*`` over the defaults (a bad
    environment value raises pydantic's ValidationError)."""
    return ServeSettings(**{k: v for k, v in vars(args).items() if k in ServeSettings.model_fields})
