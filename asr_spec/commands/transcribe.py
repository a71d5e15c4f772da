"""``asr_spec transcribe``: its options (TranscribeSettings), the files it reads and writes (Plan), what it shows as
it goes (Console), and the two ways it runs: in this process, or as a Ray job (asr_spec.scaleout)."""
from __future__ import annotations

import itertools
import os
import sys
import time
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from ..arguments import option
from ..audio import SAMPLE
from ..models.settings import ModelSettings
from .models import load

if TYPE_CHECKING:
    from ..transcribe import TranscribeOptions



@dataclass(frozen=True, kw_only=True)
class TranscribeSettings:
    files: tuple[str, ...] = option((), "audio files (wav, flac, ogg, mp3; any rate and channel count)",
                                    positional=True, nargs="*")
    sample: bool = option(False, "also transcribe the bundled sample clip")
    output_dir: str | None = option(None, "write transcripts here (default: print only)")
    format: Literal["txt", "srt", "vtt", "json", "all"] | None = option(None, "output format (default txt)")
    models: ModelSettings
    k: int | None = option(None, "most drafted tokens per target pass (default 3)")
    adaptive_k: bool = option(False, "each greedy pass drafts the 0..K tokens measured to pay most (default: K; "
                              "measured no faster on a quiet machine; the text is the same either way)")
    draft_stop: float | None = option(None, "adaptive draft length: stop drafting once the draft's probability "
                                      "for its proposal is below this (default 0.3; 0 = always K)")
    temperature: float = option(0.0, "0 = greedy; > 0 samples (exact speculative sampling)")
    no_fallback: bool = option(False, "no temperature fallback on failed windows")
    seed: int = option(0)
    language: str | None = option(None, "language code (default: detect)")
    task: Literal["transcribe", "translate"] = option("transcribe")
    no_timestamps: bool = option(False, "decode without timestamps (one segment per window)")
    initial_prompt: str | None = option(None, "text the first window is conditioned on (names, spelling, style)")
    hotwords: str | None = option(None, "words to favour (names, terms): placed in the prompt before every window, "
                                  "as faster-whisper's hotwords")
    word_timestamps: bool = option(False, "times for every word (Whisper's cross-attention alignment): 'words' in "
                                   "json; the text is the same")
    word_cues: bool = option(False, "srt/vtt with one cue per word (implies --word-timestamps)")
    quiet: bool = option(False, "no progress bar")
    chunked: bool = option(False, "split each file at voice-activity pauses into <= 30 s pieces and decode them side "
                           "by side without previous-text prompts (faster on long files; different text from "
                           "Whisper's loop: README)")
    batch_size: int = option(0, "files decoded together, each in Whisper's own window loop (default: 8 on a CPU, 16 "
                             "on CUDA; 1 = one file at a time); the text is the same")
    ray: str | None = option(None, "run the job on a Ray cluster (pip install 'asr_spec[ray]'): ADDRESS such as "
                             "HOST:6379 or ray://HOST:10001; without one, the cluster RAY_ADDRESS names or one "
                             "started here with 'ray start', else a new local one. --output-dir must be a folder "
                             "every node sees", nargs="?", const="local", metavar="ADDRESS")
    workers: int = option(0, "with --ray: model replicas (default: the cluster's CPUs / --threads, or one per GPU)")
    beam_size: int = option(1, "beams of a beam search at temperature 0, as openai-whisper's --beam_size (1: greedy, "
                            "the default)")
    patience: float = option(1.0, "beam search: finished candidates collected, in beams (openai-whisper's --patience)")
    length_penalty: float | None = option(None, "beam search: rank candidates by log-probability over "
                                          "((5 + length) / 6) ** this (default: over the length, as openai-whisper)")
    window_padding: Literal["audio", "mel"] = option("audio", "what follows a window's audio when it holds less than 30 s: audio (the log-mel of silence: openai-whisper's decode() on padded audio, default) or mel (zeros after the audio's frames: openai-whisper's transcribe() and faster-whisper); changes the text slightly (docs/how-it-works.md)")
    encoder_window: Literal["full", "audio"] = option(
        "full", "full: Whisper's padded 30 s encoder window (exact Whisper, default); audio: encode only the window's "
        "audio and 2 s of silence, rounded up to whole seconds (faster on short files; slightly different text, see "
        "docs/how-it-works.md)")

    def inputs(self) -> list[Path]:
        return [Path(f) for f in self.files] + ([SAMPLE] if self.sample else [])

    def out_dir(self) -> Path | None:
        """--output-dir, else the current directory where --format asks for files, else None (print only)."""
        return Path(self.output_dir) if self.output_dir else Path.cwd() if self.format else None

    def formats(self) -> list[str]:
        """--format (all: every one), else txt where there is an output directory."""
        from ..writers import FORMATS

        if self.format == "all":
            return list(FORMATS)
        return [self.format] if self.format else ["txt"] if self.output_dir else []

    def batch(self) -> int:
        """--batch-size, else the files decoded together by default: on a CPU a batch of 8 windows decodes in about
        half the time of 8 one by one (cross-attention over each window's 1500 encoder frames grows with the batch:
        docs/how-it-works.md); an accelerator takes more."""
        return self.batch_size or (16 if self.models.torch_device.startswith("cuda") else 8)

    def options(self) -> TranscribeOptions:
        from ..decoding.beam import BeamOptions
        from ..recognizer import Checks, temperature_ladder
        from ..transcribe import TranscribeOptions

        ladder = temperature_ladder(self.temperature, not self.no_fallback)
        return TranscribeOptions(language=self.language, task=self.task, timestamps=not self.no_timestamps,
                                 k=TranscribeOptions.k if self.k is None else self.k,
                                 draft_stop=TranscribeOptions.draft_stop if self.draft_stop is None else self.draft_stop,
                                 checks=Checks(ladder, seed=self.seed),
                                 encoder_window=self.encoder_window, window_padding=self.window_padding,
                                 adaptive_k=self.adaptive_k, chunked=self.chunked,
                                 initial_prompt=self.initial_prompt or None, hotwords=self.hotwords or None,
                                 word_timestamps=self.word_timestamps or self.word_cues,
                                 beam=BeamOptions(self.beam_size, self.patience, self.length_penalty)
                                 if self.beam_size > 1 else None)


@dataclass(frozen=True)
class Plan:
    """The files a run reads and the outputs it writes: ``names`` are the inputs' own stems ("sample" for the
    bundled clip), ``stems`` the names their outputs take (unique), in ``out_dir`` (None: print only)."""

    files: list[Path]
    names: list[str]
    stems: list[str]
    out_dir: Path | None
    formats: list[str]
    batch_size: int

    @classmethod
    def of(cls, settings: TranscribeSettings) -> Plan:
        files = settings.inputs()
        names = ["sample" if f == SAMPLE else f.stem for f in files]
        return cls(files, names, unique_stems(names), settings.out_dir(), settings.formats(), settings.batch())


def unique_stems(natural: list[str]) -> list[str]:
    """One output name per input, in order: its own stem, or for a later input whose stem an earlier one
    already has (a/x.wav, b/x.wav, x.flac) the stem with -2, -3, ... skipping stems that other inputs have.
    Compared case-insensitively, as some file systems do."""
    taken = {s.casefold() for s in natural}
    used: set[str] = set()
    stems = []
    for stem in natural:
        if stem.casefold() in used:
            stem = next(c for n in itertools.count(2) if (c := f"{stem}-{n}").casefold() not in taken)
            taken.add(stem.casefold())
        used.add(stem.casefold())
        stems.append(stem)
    return stems


def writable_dir(path: Path) -> str | None:
    """None if ``path`` is (now) a directory this process can write in, else what is wrong."""
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        return f"cannot create output directory {path}: {e.strerror}"
    if not path.is_dir():
        return f"output path {path} is not a directory"
    if not os.access(path, os.W_OK | os.X_OK):
        return f"output directory {path} is not writable"
    return None


def audio_seconds(f: Path) -> float:
    import soundfile as sf

    if not f.is_file():  # a FIFO or device could block: load_audio refuses it without opening it
        return 0.0
    try:
        return sf.info(str(f)).duration
    except Exception:  # noqa: BLE001 - reported properly when the file is loaded
        return 0.0


class Console:
    """What a run shows on stderr: a progress bar over the inputs' audio seconds, a line per finished file (its
    text on stdout), errors; ``failures`` counts the files that failed (unreadable, or an output not written)."""

    def __init__(self, plan: Plan, quiet: bool) -> None:
        from tqdm import tqdm

        self.plan, self.failures, self.finished = plan, 0, 0
        self.lengths = [audio_seconds(f) for f in plan.files]
        self.done: dict[int, float] = {}  # audio seconds transcribed, by input
        self.bar = tqdm(total=round(sum(self.lengths), 1), unit="s", unit_scale=True, file=sys.stderr,
                        disable=quiet or None,
                        bar_format="{desc} {percentage:3.0f}%|{bar}| {n:.0f}/{total:.0f} s audio [{elapsed}<{remaining}]")
        self.bar.set_description(f"[0/{len(plan.files)} files]")

    def progress(self, i: int, seconds_done: float) -> None:
        self.done[i] = seconds_done
        self.bar.update(sum(self.done.values()) - self.bar.n)

    def _finish(self, i: int) -> None:
        self.finished += 1
        self.bar.set_description(f"[{self.finished}/{len(self.plan.files)} files]")
        self.progress(i, self.lengths[i])

    def failed(self, i: int, error: str) -> None:
        """Input ``i`` could not be transcribed (``error``: unreadable audio)."""
        self._finish(i)
        self.failures += 1
        self.bar.write(f"error: {error}", file=sys.stderr)

    def transcribed(self, i: int, text: str, stats: dict, wall: float, where: str = "") -> None:
        """Input ``i``'s line (``stats``: TranscribeStats.as_dict(); ``where``: the worker) and its text."""
        self._finish(i)
        p = self.plan
        f, name, stem, audio = p.files[i], p.names[i], p.stems[i], stats["audio_seconds"]
        self.bar.write(
            f"{f}: {audio:.1f} s audio in {wall:.2f} s (RTF {wall / max(audio, 1e-9):.3f}"
            + (f", {p.batch_size} files in flight" if p.batch_size > 1 and len(p.files) > 1 else "") + where
            + f"; encoder {stats['encoder_seconds']:.2f} s, decode {stats['decode_seconds']:.2f} s), "
            f"{stats['tokens']} tokens, {stats['target_passes']} target passes"
            + (f" ({1000 * stats['decode_seconds'] / stats['target_passes']:.1f} ms a pass)"
               if stats["target_passes"] else "")
            + (f", acceptance {stats['acceptance']:.0%}, {stats['tokens_per_pass']:.2f} tokens/pass"
               if stats["drafted"] else "")
            + (f"; written as {p.out_dir / stem}.* ({name} is taken by an earlier input)"
               if p.out_dir is not None and stem != name else ""),
            file=sys.stderr)
        print(text if len(p.files) == 1 else f"{f}: {text}", flush=True)

    def not_written(self, i: int, error: str) -> None:
        self.failures += 1
        self.bar.write(f"error: {self.plan.files[i]}: {error}", file=sys.stderr)

    def close(self) -> None:
        self.bar.close()


def transcribe(settings: TranscribeSettings) -> int:
    """The command: 0, 1 (a file failed, or nothing could run), 2 (no files) or 130 (Ctrl-C)."""
    import torch

    plan = Plan.of(settings)
    if not plan.files:
        print("asr_spec transcribe: give audio files (or --sample)", file=sys.stderr)
        return 2
    if plan.out_dir is not None and (problem := writable_dir(plan.out_dir)):
        print(f"error: {problem}", file=sys.stderr)
        return 1
    if settings.models.threads:
        torch.set_num_threads(settings.models.threads)
    console = Console(plan, settings.quiet)
    try:
        ran = (transcribe_on_ray if settings.ray is not None else transcribe_here)(settings, plan, console)
    except KeyboardInterrupt:
        console.close()
        if settings.ray is not None and plan.out_dir is not None:
            from ..scaleout import remove_partials

            remove_partials(plan.out_dir, plan.stems, plan.formats)
        print("interrupted: no partial output files were left", file=sys.stderr)
        return 130
    console.close()
    if not ran:
        return 1
    if console.failures:
        print(f"{console.failures} of {len(plan.files)} file(s) failed", file=sys.stderr)
    return 1 if console.failures else 0


def transcribe_here(settings: TranscribeSettings, plan: Plan, console: Console) -> bool:
    """In this process, ``plan.batch_size`` files in flight, each read a block at a time (memory holds the windows in
    flight, not the files); False if the models did not load."""
    from ..audio import AudioError, AudioFile
    from ..transcribe import Transcriber
    from ..writers import write_outputs

    if (models := load(settings.models.options())) is None:
        return False
    target, draft = models
    started = [0.0] * len(plan.files)

    def opened(i: int) -> AudioFile:
        started[i] = time.perf_counter()
        return AudioFile(plan.files[i])

    inputs = [(i, partial(opened, i)) for i in range(len(plan.files))]
    for i, result in Transcriber(target, draft).transcribe_many(inputs, settings.options(), plan.batch_size,
                                                                progress=console.progress):
        if isinstance(result, AudioError):
            console.failed(i, str(result))
            continue
        console.transcribed(i, result.text, result.stats.as_dict(), time.perf_counter() - started[i])
        if plan.out_dir is not None:
            extra = {"file": str(plan.files[i]), "model": target.name, "draft": draft.name if draft else None}
            try:
                write_outputs(result, plan.stems[i], plan.out_dir, plan.formats, extra, settings.word_cues)
            except OSError as e:
                console.not_written(i, f"cannot write output: {e}")
    return True


def transcribe_on_ray(settings: TranscribeSettings, plan: Plan, console: Console) -> bool:
    """A Ray Data pipeline (asr_spec.scaleout); False if there is no Ray to run on."""
    try:
        from ..scaleout import Job, RayUnavailable, connect, default_workers, run
    except ImportError as e:  # numpy etc. are there; only ray can be missing, and scaleout imports it lazily
        print(f"error: {e}", file=sys.stderr)
        return False
    job = Job(replace(settings.models.options(), threads=settings.models.threads or 1), settings.options(),
              plan.batch_size, None if plan.out_dir is None else str(plan.out_dir.resolve()), tuple(plan.formats),
              settings.word_cues)
    try:
        resources = connect(None if settings.ray == "local" else settings.ray)
    except RayUnavailable as e:
        print(f"error: {e}", file=sys.stderr)
        return False
    workers = settings.workers or default_workers(resources, job)
    print(f"ray: {workers} worker(s) x {job.models.threads} thread(s), {plan.batch_size} files in flight each; "
          f"cluster {resources.get('CPU', 0):g} CPUs, {resources.get('GPU', 0):g} GPUs", file=sys.stderr)
    for r in run(job, [str(f) for f in plan.files], plan.stems, workers):
        if r.error:
            console.failed(r.index, r.error)
            continue
        console.transcribed(r.index, r.text, r.stats, r.seconds, f", on {r.worker}")
        if r.write_error:
            console.not_written(r.index, r.write_error)
    return True
