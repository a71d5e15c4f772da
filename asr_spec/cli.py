"""The ``asr_spec`` command line."""
from __future__ import annotations

import argparse
import itertools
import os
import sys
import time
from dataclasses import replace
from pathlib import Path

from .models.compute import COMPUTE_TYPES
from .streaming import POLICIES

DEFAULT_DRAFT = "auto"  # the draft shipped for the target (asr_spec/drafts/), else none
SAMPLE = Path(__file__).parent / "samples" / "jfk.flac"


def _writable_dir(path: Path) -> str | None:
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        return f"cannot create output directory {path}: {e.strerror}"
    if not path.is_dir():
        return f"output path {path} is not a directory"
    if not os.access(path, os.W_OK | os.X_OK):
        return f"output directory {path} is not writable"
    return None


def _unique_stems(natural: list[str]) -> list[str]:
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


def _draft_spec(args: argparse.Namespace) -> str | None:
    return None if args.no_draft else args.draft


def _model_options(args: argparse.Namespace):
    """The one options object every command loads its models from (--model/--draft/--no-draft/--device/
    --compute-type/--threads)."""
    from .models.loader import ModelOptions

    return ModelOptions(args.model, _draft_spec(args), args.torch_device, args.compute_type, args.threads)


def _load_models(args: argparse.Namespace):
    """(target, draft or None) from the command's model options, or None after printing the error."""
    return _load(_model_options(args))


def _load(options):
    """(target, draft or None) as ``options`` (ModelOptions) say, or None after printing the error."""
    from .models.loader import load
    from .models.sources import ModelError

    t0 = time.perf_counter()
    try:
        target, draft = load(options)
    except ModelError as e:
        print(f"error: {e}", file=sys.stderr)
        return None
    print(f"loaded {target.name}" + (f" + draft {draft.name}" if draft else " (no draft)")
          + f" in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    return target, draft


def _model_args(p: argparse.ArgumentParser, device_flag: str = "--device", compute_type: str = "float32") -> None:
    p.add_argument("--model", default="whisper-base", help="target: whisper-base (embedded), a local directory or a Hugging Face id")
    p.add_argument("--draft", default=DEFAULT_DRAFT, help="draft: 'auto' (the one shipped for the target), a directory or id "
                   "(asr_spec distill output, decoder-only or full Whisper) or layers:I,J (untrained copy)")
    p.add_argument("--no-draft", action="store_true", help="target-only decoding (the baseline)")
    p.add_argument(device_flag, dest="torch_device", default="cpu", help="torch device (cpu, cuda, ...)")
    p.add_argument("--compute-type", choices=COMPUTE_TYPES, default=compute_type, metavar="TYPE",
                   help="precision of the whole model, CTranslate2's names: " + ", ".join(COMPUTE_TYPES) + "; int8 = int8 "
                   "weights with the best float the device computes natively; auto = the native type measured fastest "
                   "here (once, then kept in the cache directory). Each type gives slightly different text; "
                   f"speculation is exact at every type (default {compute_type})")
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (default: torch's choice; with --ray: per worker, default 1)")


def cmd_serve(args: argparse.Namespace) -> int:
    import asyncio
    import logging

    from pydantic import ValidationError

    from .server.config import api_keys
    from .server.settings import from_arguments

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
        from .server.ray_serve import serve_on_ray

        return serve_on_ray(settings, keys)
    from .server.app import Server

    if (models := _load(settings.model_options())) is None:
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


def cmd_stream(args: argparse.Namespace) -> int:
    from websockets.exceptions import InvalidStatus, InvalidURI

    from .audio import AudioError, load_audio
    from .clients.stream import printer, stream_file

    try:
        audio = load_audio(args.file)
    except AudioError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    try:
        events = stream_file(args.url, audio, 1.0 if args.realtime else None, printer(args.json), args.language or None,
                             args.api_key or os.environ.get("ASR_SPEC_API_KEY"), args.word_timestamps)
    except (OSError, InvalidURI, InvalidStatus, TimeoutError) as e:
        print(f"error: cannot stream to {args.url}: {e}", file=sys.stderr)
        return 1
    return 0 if events and events[-1]["type"] == "closed" else 1


def cmd_mic(args: argparse.Namespace) -> int:
    import torch

    from .audio import AudioError
    if args.threads:
        torch.set_num_threads(args.threads)
    from .clients.mic import FileSource, LiveLine, MicError, Microphone, list_devices, run_local, run_remote

    try:
        if args.list_devices:
            print(list_devices())
            return 0
        device = int(args.device) if args.device and args.device.isdigit() else args.device
        source = FileSource(args.input_file) if args.input_file else Microphone(device)
    except (MicError, AudioError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    display = LiveLine()
    language = args.language or None
    if args.url:
        from websockets.exceptions import InvalidStatus, InvalidURI

        print(f"streaming to {args.url}; Ctrl-C to stop", file=sys.stderr)
        try:
            with source:
                run_remote(args.url, source, display, language, args.api_key or os.environ.get("ASR_SPEC_API_KEY"),
                           args.commit_policy)
        except (OSError, InvalidURI, InvalidStatus, TimeoutError) as e:
            print(f"error: cannot stream to {args.url}: {e}", file=sys.stderr)
            return 1
    else:
        from .streaming.engine import Engine
        from .recognizer import Recognizer

        if (models := _load_models(args)) is None:
            return 1
        print("listening (in-process engine); Ctrl-C to stop", file=sys.stderr)
        with source:
            run_local(Engine(Recognizer(*models)), source, display, language, args.commit_policy)
    print("\n\ntranscript:\n" + display.transcript)
    return 0


def _default_batch(device: str) -> int:
    """Files decoded together by default: on a CPU a batch of 8 windows decodes in about half the time of 8
    one by one (cross-attention over each window's 1500 encoder frames grows with the batch: README
    "Many files at once"); an accelerator takes more."""
    return 16 if device.startswith("cuda") else 8


def _options(args: argparse.Namespace):
    from .recognizer import Checks, temperature_ladder
    from .transcribe import TranscribeOptions

    return TranscribeOptions(language=args.language, task=args.task, timestamps=not args.no_timestamps,
                             k=TranscribeOptions.k if args.k is None else args.k,
                             draft_stop=TranscribeOptions.draft_stop if args.draft_stop is None else args.draft_stop,
                             checks=Checks(temperature_ladder(args.temperature, not args.no_fallback), seed=args.seed),
                             encoder_window=args.encoder_window, adaptive_k=args.adaptive_k, chunked=args.chunked,
                             initial_prompt=args.initial_prompt or None, hotwords=args.hotwords or None,
                             word_timestamps=args.word_timestamps or args.word_cues)


def _audio_seconds(f: Path) -> float:
    import soundfile as sf

    if not f.is_file():  # a FIFO or device could block: load_audio refuses it without opening it
        return 0.0
    try:
        return sf.info(str(f)).duration
    except Exception:  # noqa: BLE001 - reported properly when the file is loaded
        return 0.0


def cmd_transcribe(args: argparse.Namespace) -> int:
    import torch
    from tqdm import tqdm

    from .writers import FORMATS

    files = [Path(f) for f in args.files] + ([SAMPLE] if args.sample else [])
    if not files:
        print("asr_spec transcribe: give audio files (or --sample)", file=sys.stderr)
        return 2
    formats = list(FORMATS) if args.format == "all" else [args.format] if args.format else []
    out_dir = Path(args.output_dir) if args.output_dir else (Path.cwd() if formats else None)
    formats = formats or (["txt"] if out_dir else [])
    if out_dir is not None and (problem := _writable_dir(out_dir)):
        print(f"error: {problem}", file=sys.stderr)
        return 1
    if args.threads:
        torch.set_num_threads(args.threads)

    natural = ["sample" if f == SAMPLE else f.stem for f in files]
    stems = _unique_stems(natural)
    batch_size = args.batch_size or _default_batch(args.torch_device)
    failures, finished = 0, 0
    lengths = [_audio_seconds(f) for f in files]
    done: dict[int, float] = {}  # audio seconds transcribed, by input
    bar = tqdm(total=round(sum(lengths), 1), unit="s", unit_scale=True, file=sys.stderr,
               disable=args.quiet or None, bar_format="{desc} {percentage:3.0f}%|{bar}| {n:.0f}/{total:.0f} s audio [{elapsed}<{remaining}]")

    def progress(i: int, seconds_done: float) -> None:
        done[i] = seconds_done
        bar.update(sum(done.values()) - bar.n)

    def report(i: int, text: str | None, error: str, st: dict, wall: float, where: str) -> bool:
        """One finished file: its line, its text; False if it failed (``error``: unreadable audio)."""
        nonlocal finished
        finished += 1
        bar.set_description(f"[{finished}/{len(files)} files]")
        progress(i, lengths[i])
        if text is None:
            bar.write(f"error: {error}", file=sys.stderr)
            return False
        f, name, stem = files[i], natural[i], stems[i]
        bar.write(f"{f}: {st['audio_seconds']:.1f} s audio in {wall:.2f} s (RTF {wall / max(st['audio_seconds'], 1e-9):.3f}"
                  + (f", {batch_size} files in flight" if batch_size > 1 and len(files) > 1 else "") + where
                  + f"; encoder {st['encoder_seconds']:.2f} s, decode {st['decode_seconds']:.2f} s), "
                  f"{st['tokens']} tokens, {st['target_passes']} target passes"
                  + (f", acceptance {st['acceptance']:.0%}, {st['tokens_per_pass']:.2f} tokens/pass" if st["drafted"] else "")
                  + (f"; written as {out_dir / stem}.* ({name} is taken by an earlier input)"
                     if out_dir is not None and stem != name else ""),
                  file=sys.stderr)
        print(text if len(files) == 1 else f"{f}: {text}", flush=True)
        return True

    bar.set_description(f"[0/{len(files)} files]")
    try:
        if args.ray is not None:
            failures = _transcribe_on_ray(args, files, stems, out_dir, formats, batch_size, bar, report)
        else:
            failures = _transcribe_here(args, files, stems, out_dir, formats, batch_size, progress, bar, report)
    except KeyboardInterrupt:
        bar.close()
        if args.ray is not None and out_dir is not None:
            from .scaleout import remove_partials

            remove_partials(out_dir, stems, formats)
        print("interrupted: no partial output files were left", file=sys.stderr)
        return 130
    bar.close()
    if failures is None:
        return 1
    if failures:
        print(f"{failures} of {len(files)} file(s) failed", file=sys.stderr)
    return 1 if failures else 0


def _transcribe_here(args, files, stems, out_dir, formats, batch_size, progress, bar, report) -> int | None:
    """This process, ``batch_size`` files in flight, each read a block at a time (memory holds the windows in
    flight, not the files); the number of failed files (None: no models)."""
    from .audio import AudioError, AudioFile
    from .transcribe import Transcriber
    from .writers import write_outputs

    if (models := _load_models(args)) is None:
        return None
    target, draft = models
    options, transcriber = _options(args), Transcriber(target, draft)
    started = [0.0] * len(files)
    failures = 0

    def loader(i: int):
        def load():
            started[i] = time.perf_counter()
            return AudioFile(files[i])
        return load

    for i, result in transcriber.transcribe_many([(i, loader(i)) for i in range(len(files))], options,
                                                 batch_size, progress=progress):
        if isinstance(result, AudioError):
            failures += not report(i, None, str(result), {}, 0.0, "")
            continue
        report(i, result.text, "", result.stats.as_dict(), time.perf_counter() - started[i], "")
        if out_dir is not None:
            extra = {"file": str(files[i]), "model": target.name, "draft": draft.name if draft else None}
            try:
                write_outputs(result, stems[i], out_dir, formats, extra, args.word_cues)
            except OSError as e:
                failures += 1
                bar.write(f"error: {files[i]}: cannot write output: {e}", file=sys.stderr)
    return failures


def _transcribe_on_ray(args, files, stems, out_dir, formats, batch_size, bar, report) -> int | None:
    """A Ray Data pipeline (asr_spec.scaleout); the number of failed files (None: no Ray)."""
    try:
        from .scaleout import Job, RayUnavailable, connect, default_workers, run
    except ImportError as e:  # numpy etc. are there; only ray can be missing, and scaleout imports it lazily
        print(f"error: {e}", file=sys.stderr)
        return None
    job = Job(replace(_model_options(args), threads=args.threads or 1), _options(args), batch_size, None if out_dir is None else str(out_dir.resolve()), tuple(formats), args.word_cues)
    try:
        resources = connect(None if args.ray == "local" else args.ray)
    except RayUnavailable as e:
        print(f"error: {e}", file=sys.stderr)
        return None
    workers = args.workers or default_workers(resources, job)
    print(f"ray: {workers} worker(s) x {job.models.threads} thread(s), {batch_size} files in flight each; cluster "
          f"{resources.get('CPU', 0):g} CPUs, {resources.get('GPU', 0):g} GPUs", file=sys.stderr)
    failures = 0
    for r in run(job, [str(f) for f in files], stems, workers):
        ok = report(r.index, r.text if not r.error else None, r.error, r.stats, r.seconds, f", on {r.worker}")
        failures += not ok
        if ok and r.write_error:
            failures += 1
            bar.write(f"error: {files[r.index]}: {r.write_error}", file=sys.stderr)
    return failures


def cmd_eval(args: argparse.Namespace) -> int:
    from .evaluation.run import EvalOptions, evaluate
    from .evaluation.report import table

    if not Path(args.manifest).is_file():
        print(f"error: no manifest at {args.manifest}", file=sys.stderr)
        return 1
    opts = EvalOptions(manifest=Path(args.manifest), out=Path(args.out),
                       systems=tuple(s.strip() for s in args.systems.split(",") if s.strip()),
                       ks=tuple(int(k) for k in args.k.split(",")),
                       draft_stops=tuple(float(p) for p in args.draft_stop.split(",")), limit=args.limit, repeat=args.repeat,
                       compute_type=args.compute_type, encoder_window=args.encoder_window,
                       temperature=args.temperature, seeds=args.seeds, model=args.model,
                       draft=args.draft,
                       language=args.language or None, threads=args.threads, device=args.torch_device,
                       hotwords=args.hotwords or None,
                       batch_sizes=tuple(int(n) for n in args.batch_size.split(",")))
    try:
        results = evaluate(opts)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(table(results))
    print(f"\nreport: {Path(args.out) / 'report.md'}  results: {Path(args.out) / 'results.json'}")
    return 0


def cmd_distill(args: argparse.Namespace) -> int:
    import shlex

    import torch

    from .distill.card import write_card
    from .distill.train import DistillOptions, distill
    from .models.sources import ModelError

    if args.threads:
        torch.set_num_threads(args.threads)
    missing = [p for p in args.audio + args.text if not Path(p).exists()]
    if missing:
        print(f"error: not found: {', '.join(missing)}", file=sys.stderr)
        return 1
    o = DistillOptions(target=args.target, out=Path(args.out), work=Path(args.work) if args.work else None, audio=tuple(Path(a) for a in args.audio),
                       text=tuple(Path(t) for t in args.text),
                       layers=tuple(int(i) for i in args.layers.split(",")) if args.layers else (),
                       head_size=args.head_size, tts_clips=args.tts_clips,
                       tts_engines=tuple(e for e in args.tts_engines.split(",") if e), minutes=args.minutes,
                       max_steps=args.steps, batch=args.batch, lr=args.lr, seed=args.seed,
                       session_s=args.session_seconds, init=Path(args.init) if args.init else None,
                       compute_type=args.compute_type)
    try:
        report = distill(o)
    except (ModelError, RuntimeError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    write_card(Path(args.out), report, "asr_spec distill " + " ".join(shlex.quote(a) for a in sys.argv[2:]))
    print(f"draft written to {args.out}: held-aside acceptance {report['held_aside_acceptance']:.1%} after "
          f"{report['steps']} steps ({report['train_seconds'] / 60:.1f} min); use it with --draft {args.out}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="asr_spec", description="Exact speculative Whisper transcription.")
    sub = p.add_subparsers(dest="command", required=True)
    t = sub.add_parser("transcribe", help="transcribe audio files")
    t.add_argument("files", nargs="*", help="audio files (wav, flac, ogg, mp3; any rate and channel count)")
    t.add_argument("--sample", action="store_true", help="also transcribe the bundled sample clip")
    t.add_argument("--output-dir", help="write transcripts here (default: print only)")
    t.add_argument("--format", choices=["txt", "srt", "vtt", "json", "all"], help="output format (default txt)")
    _model_args(t)
    t.add_argument("--k", type=int, help="most drafted tokens per target pass (default 3)")
    t.add_argument("--adaptive-k", action="store_true", help="each greedy pass drafts the 0..K tokens measured to "
                   "pay most (default: K; measured no faster on a quiet machine; the text is the same either way)")
    t.add_argument("--draft-stop", type=float, help="adaptive draft length: stop drafting once the draft's probability "
                   "for its proposal is below this (default 0.3; 0 = always K)")
    t.add_argument("--temperature", type=float, default=0.0, help="0 = greedy; > 0 samples (exact speculative sampling)")
    t.add_argument("--no-fallback", action="store_true", help="no temperature fallback on failed windows")
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--language", help="language code (default: detect)")
    t.add_argument("--task", choices=["transcribe", "translate"], default="transcribe")
    t.add_argument("--no-timestamps", action="store_true", help="decode without timestamps (one segment per window)")
    t.add_argument("--initial-prompt", help="text the first window is conditioned on (names, spelling, style)")
    t.add_argument("--hotwords", help="words to favour (names, terms): placed in the prompt before every window, as "
                   "faster-whisper's hotwords")
    t.add_argument("--word-timestamps", action="store_true",
                   help="times for every word (Whisper's cross-attention alignment): 'words' in json; the text is the same")
    t.add_argument("--word-cues", action="store_true", help="srt/vtt with one cue per word (implies --word-timestamps)")
    t.add_argument("--quiet", action="store_true", help="no progress bar")
    t.add_argument("--chunked", action="store_true",
                   help="split each file at voice-activity pauses into <= 30 s pieces and decode them side by side "
                   "without previous-text prompts (faster on long files; different text from Whisper's loop: README)")
    t.add_argument("--batch-size", type=int, default=0,
                   help="files decoded together, each in Whisper's own window loop (default: 8 on a CPU, 16 on CUDA; "
                   "1 = one file at a time); the text is the same")
    t.add_argument("--ray", nargs="?", const="local", metavar="ADDRESS",
                   help="run the job on a Ray cluster (pip install 'asr_spec[ray]'): ADDRESS such as HOST:6379 or "
                        "ray://HOST:10001; without one, the cluster RAY_ADDRESS names or one started here with "
                        "'ray start', else a new local one. --output-dir must be a folder every node sees")
    t.add_argument("--workers", type=int, default=0,
                   help="with --ray: model replicas (default: the cluster's CPUs / --threads, or one per GPU)")
    t.add_argument("--encoder-window", choices=["full", "audio"], default="full",
                   help="full: Whisper's padded 30 s encoder window (exact Whisper, default); audio: encode only the "
                   "window's audio rounded up to 1 s (faster on short files; slightly different text, see README)")
    t.set_defaults(func=cmd_transcribe)

    v = sub.add_parser("serve", help="streaming transcription over WebSockets (docs/protocol.md)",
                       description="Every option can also be set by the ASR_SPEC_* environment variable named in "
                       "its help (the option wins); docs/deploy.md")
    from .server.settings import add_arguments

    add_arguments(v)
    v.set_defaults(func=cmd_serve)

    m = sub.add_parser("mic", help="live microphone transcription in the terminal")
    m.add_argument("--url", help="stream to asr_spec serve at this ws:// address (default: run the engine in-process)")
    m.add_argument("--device", help="input device (number or name; see --list-devices)")
    m.add_argument("--list-devices", action="store_true", help="list audio input devices and exit")
    m.add_argument("--language", default="en", help="language code, or '' to detect")
    m.add_argument("--api-key", help="bearer token for --url (or ASR_SPEC_API_KEY)")
    m.add_argument("--input-file", help="replay this audio file at real time instead of the microphone")
    m.add_argument("--commit-policy", choices=POLICIES, help="alignatt or local-agreement (default: the server's; "
                   f"in-process: {POLICIES[0]})")
    _model_args(m, device_flag="--torch-device", compute_type="auto")  # --device is the microphone
    m.set_defaults(func=cmd_mic)

    c = sub.add_parser("stream", help="send an audio file to asr_spec serve as a live stream and print the events")
    c.add_argument("file")
    c.add_argument("--url", default="ws://127.0.0.1:8765", help="server address (default ws://127.0.0.1:8765)")
    c.add_argument("--realtime", action="store_true", help="pace the audio at real time (default: as fast as possible)")
    c.add_argument("--json", action="store_true", help="print every event as a JSON line (default: finals as text)")
    c.add_argument("--language", default="en", help="language code, or '' to detect")
    c.add_argument("--api-key", help="bearer token (or ASR_SPEC_API_KEY)")
    c.add_argument("--word-timestamps", action="store_true", help="finals carry their words with start and end times")
    c.set_defaults(func=cmd_stream)

    e = sub.add_parser("eval", help="WER parity, speed-up and memory against target-only and peer systems")
    e.add_argument("--manifest", required=True, help='JSON lines of {"id", "audio", "text"} (audio relative to the file)')
    e.add_argument("--limit", type=int, default=0, help="first N utterances only")
    e.add_argument("--systems", default="target,spec,draft,hf,hf-assisted,faster-whisper",
                   help="comma list of target, spec (the default: always K drafts), spec-fixed (the same), spec-adaptive (each pass drafts the K measured to pay most), spec-chunked (--chunked), spec-fp32draft (the draft in float32 "
                        "where spec runs it in int8), spec-fullview (the draft reads the whole 30 s window, not only "
                        "the audio's frames), spec-sample, target-sample "
                        "(sampling without the draft, same seeds), draft, hf, hf-assisted, faster-whisper, "
                        "faster-whisper-batched (its BatchedInferencePipeline); the faster-whisper systems run int8 and "
                        "float32, or one of them with -int8 / -float32 (faster-whisper-int8)")
    e.add_argument("--k", default="3", help="comma list of K for spec (one run each)")
    e.add_argument("--compute-type", choices=COMPUTE_TYPES, default="float32", metavar="TYPE",
                   help="compute type of our systems without one in their name (spec-int8 names its own): "
                   + ", ".join(COMPUTE_TYPES))
    e.add_argument("--encoder-window", choices=["full", "audio"], default="full",
                   help="our systems' encoder input: padded 30 s windows (default) or only the audio")
    e.add_argument("--draft-stop", default="0.3", help="comma list of adaptive draft-length thresholds (one run per K and each)")
    e.add_argument("--temperature", type=float, default=0.5, help="temperature of spec-sample and target-sample")
    e.add_argument("--seeds", type=int, default=1, help="spec-sample and target-sample runs (seeds 0..N-1)")
    e.add_argument("--repeat", type=int, default=1, help="timing repeats per utterance (medians reported)")
    e.add_argument("--out", default="eval/out", help="directory for results.json, report.md and plots")
    e.add_argument("--model", default="whisper-base")
    e.add_argument("--draft", default=DEFAULT_DRAFT)
    e.add_argument("--language", default="en", help="language for every system ('' = detect)")
    e.add_argument("--threads", type=int, default=0, help="threads for every system (default: torch's)")
    e.add_argument("--hotwords", help="our systems' hotwords (as transcribe's)")
    e.add_argument("--device", dest="torch_device", default="cpu",
                   help="every system's device (cpu, cuda, ...)")
    e.add_argument("--batch-size", default="1", help="comma list (one run of each of our systems per size): files "
                   "decoded together; faster-whisper-batched: its batch size (it batches the chunks of one file)")
    e.set_defaults(func=cmd_eval)

    d = sub.add_parser("distill", help="train a cheap draft for a Whisper target from unlabeled audio (and text)")
    d.add_argument("--target", default="whisper-base", help="the Whisper model the draft will serve")
    d.add_argument("--audio", nargs="+", default=[], help="folders of unlabeled audio (the target labels it)")
    d.add_argument("--text", nargs="*", default=[], help="sentence files (one per line) to synthesize speech from")
    d.add_argument("--out", required=True, help="output folder: the draft, checkpoints, cache, report, model card")
    d.add_argument("--work", help="label cache and checkpoints (default: OUT/work); rerunning resumes from it")
    d.add_argument("--layers", default="", help="target decoder layers to initialise from (default: first,last)")
    d.add_argument("--head-size", type=int, default=4000, help="text tokens in the draft's output layer (0: all)")
    d.add_argument("--tts-clips", type=int, default=600, help="clips to synthesize from --text")
    d.add_argument("--tts-engines", default="", help="comma list of espeak-ng, flite, festival (default: installed)")
    d.add_argument("--session-seconds", type=float, default=120.0,
                   help="also join consecutive real clips into recordings this long and label them window by window "
                   "as transcribe decodes them (previous text as prompt); 0: off")
    d.add_argument("--init", help="continue training this draft (its layers, output layer and shortlist)")
    d.add_argument("--minutes", type=float, default=20.0, help="training time budget")
    d.add_argument("--steps", type=int, default=0, help="train this many steps instead of a time budget")
    d.add_argument("--batch", type=int, default=16)
    d.add_argument("--lr", type=float, default=7e-4)
    d.add_argument("--seed", type=int, default=0)
    d.add_argument("--threads", type=int, default=0)
    d.add_argument("--compute-type", choices=COMPUTE_TYPES, default="float32", metavar="TYPE",
                   help="compute type of the target that labels the audio (the draft learns that target's tokens; "
                   "training itself runs in float32): " + ", ".join(COMPUTE_TYPES))
    d.set_defaults(func=cmd_distill)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
