"""``asr_spec transcribe --ray``: the batch job as a Ray Data pipeline, on one machine or a cluster.

Files are read (decoded, resampled to 16 kHz) in parallel Ray tasks; a pool of actors, each holding one target and
draft, transcribes them with the batched speculative decoder (``Transcriber.transcribe_many``) and writes each
file's outputs atomically itself, so on a cluster the output folder must be one every node sees. The driver gets
one small row per file as it finishes (text, statistics, or what went wrong) and reports it as a local run does.
``ray`` is an optional dependency: ``pip install "asr_spec[ray]"``."""
from __future__ import annotations

import glob
import json
import logging
import os
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Iterator

import numpy as np

from .audio import AudioError, load_audio

if TYPE_CHECKING:  # the read tasks import this module: they need no torch
    from .models.loader import ModelOptions
    from .transcribe import TranscribeOptions

INSTALL_HINT = 'Ray is not installed: pip install "asr_spec[ray]" (or pip install "ray[data]")'


class RayUnavailable(RuntimeError):
    """Ray is not installed, or the cluster cannot be joined."""


@dataclass(frozen=True)
class Job:
    """Everything a worker needs: which models, how to decode, where to write."""

    models: ModelOptions  # model, draft, device, compute type, torch threads per worker
    options: TranscribeOptions
    batch_size: int  # files in flight inside one worker
    out_dir: str | None
    formats: tuple[str, ...] = ()
    word_cues: bool = False


@dataclass(frozen=True)
class FileResult:
    index: int
    text: str  # "" when the audio could not be read
    error: str  # why the file could not be read, or ""
    write_error: str  # why its outputs could not be written, or ""
    stats: dict
    seconds: float  # from its worker's batch start to this file's end
    worker: str


def _read(row: dict) -> dict:
    """A Ray task: one file's audio as float32 bytes, or the reason it cannot be read."""
    try:
        audio, error = load_audio(row["path"]), ""
    except AudioError as e:
        audio, error = np.zeros(0, np.float32), str(e)
    return {**row, "audio": audio.astype(np.float32).tobytes(), "error": error}


class _Worker:
    """A Ray actor: one model, the batched speculative decoder, atomic outputs."""

    def __init__(self, job: Job):
        from .models.loader import load
        from .transcribe import Transcriber

        target, draft = load(job.models)
        self.job = job
        self.transcriber = Transcriber(target, draft)
        self.extra = {"model": target.name, "draft": draft.name if draft else None}
        self.name = f"{socket.gethostname()}:{os.getpid()}"

    def __call__(self, batch: dict[str, np.ndarray]) -> Iterator[dict[str, list]]:
        """Transcribe a batch of files, yielding each file's row as soon as it is done (so the driver reports
        files as they finish, not batch by batch)."""
        from .writers import write_outputs

        job, t0 = self.job, time.perf_counter()

        def row(j: int, text: str = "", error: str = "", write_error: str = "", stats: str = "{}") -> dict[str, list]:
            return {"index": [int(batch["index"][j])], "text": [text], "error": [error], "write_error": [write_error],
                    "stats": [stats], "seconds": [time.perf_counter() - t0], "worker": [self.name]}

        def loader(j: int):
            return lambda: np.frombuffer(batch["audio"][j], np.float32).copy()

        n = len(batch["index"])
        for j in range(n):
            if batch["error"][j]:
                yield row(j, error=str(batch["error"][j]))
        items = [(j, loader(j)) for j in range(n) if not batch["error"][j]]
        for j, result in self.transcriber.transcribe_many(items, job.options, job.batch_size):
            if isinstance(result, AudioError):
                yield row(j, error=str(result))
                continue
            problem = ""
            if job.out_dir is not None:
                try:
                    write_outputs(result, str(batch["stem"][j]), Path(job.out_dir), list(job.formats),
                                  {"file": str(batch["path"][j]), **self.extra}, job.word_cues)
                except OSError as e:
                    problem = f"cannot write output: {e}"
            yield row(j, result.text, write_error=problem, stats=json.dumps(result.stats.as_dict()))


def _ray():
    try:
        import ray
        import ray.data
    except ImportError:
        raise RayUnavailable(INSTALL_HINT) from None
    return ray


def connect(address: str | None) -> dict[str, float]:
    """Join the Ray cluster at ``address`` (None: the one RAY_ADDRESS names or one started on this machine with
    ``ray start``, else a new local one); its total resources."""
    ray = _ray()
    if address and "://" not in address and address != "auto":  # HOST:PORT: fail in seconds, not Ray's minutes
        host, _, port = address.rpartition(":")
        try:
            socket.create_connection((host or "127.0.0.1", int(port)), timeout=5).close()
        except (OSError, ValueError) as e:
            raise RayUnavailable(f"cannot join the Ray cluster at {address}: {e}") from None
    if not ray.is_initialized():
        try:
            ray.init(address=address, logging_level="ERROR")
        except (ConnectionError, RuntimeError) as e:
            hint = ("; a cluster with token authentication (the default of 'ray start' since Ray 2.59) also needs "
                    "RAY_AUTH_MODE=token here, and its token in ~/.ray/auth_token or RAY_AUTH_TOKEN"
                    if os.environ.get("RAY_AUTH_MODE") != "token" else "")
            raise RayUnavailable(f"cannot join the Ray cluster at {address or 'RAY_ADDRESS or this machine'}: "
                                 f"{str(e).strip().splitlines()[-1]}{hint}") from None
        logging.getLogger("ray.data").setLevel(logging.ERROR)  # its progress and start/finish lines: ours are per file
    return ray.cluster_resources()


def default_workers(resources: dict[str, float], job: Job) -> int:
    """One worker per GPU on CUDA, else the cluster's CPUs divided by each worker's threads."""
    if job.models.device.startswith("cuda"):
        return max(1, int(resources.get("GPU", 0)))
    return max(1, int(resources.get("CPU", 1) // max(job.models.threads, 1)))


def run(job: Job, paths: list[str], stems: list[str], workers: int) -> Iterator[FileResult]:
    """Transcribe ``paths`` on the cluster ``connect`` joined, ``workers`` actors, yielding results as files
    finish (not in input order)."""
    ray = _ray()
    ctx = ray.data.DataContext.get_current()
    ctx.enable_progress_bars = False  # the command line shows its own progress over files and audio seconds
    ctx.print_on_execution_start = False
    rows = [{"index": i, "path": p, "stem": s} for i, (p, s) in enumerate(zip(paths, stems))]
    gpu = job.models.device.startswith("cuda")
    ds = (ray.data.from_items(rows, override_num_blocks=max(1, len(rows)))
          # reading is light: it never waits for the workers' CPUs, and a few tasks at a time keep them fed
          .map(_read, num_cpus=0, compute=ray.data.TaskPoolStrategy(size=max(2, workers)))
          .map_batches(_Worker, fn_constructor_kwargs={"job": job}, batch_size=job.batch_size,
                       batch_format="numpy", compute=ray.data.ActorPoolStrategy(size=workers),
                       num_cpus=0 if gpu else max(job.models.threads, 1), num_gpus=1 if gpu else 0))
    for row in ds.iter_rows():
        yield FileResult(int(row["index"]), str(row["text"]), str(row["error"]), str(row["write_error"]),
                         json.loads(row["stats"]), float(row["seconds"]), str(row["worker"]))


def remove_partials(out_dir: Path, stems: list[str], formats: list[str]) -> None:
    """After an interrupted run: stop this driver's workers (leaving the cluster), then remove the temporary files
    of writes they left unfinished."""
    try:
        import ray

        if ray.is_initialized():
            ray.shutdown()
    except ImportError:
        pass
    for stem in stems:
        for fmt in formats:
            for tmp in out_dir.glob(glob.escape(f".{stem}.{fmt}.") + "*.part"):
                tmp.unlink(missing_ok=True)
