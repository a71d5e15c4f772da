"""Where a live stream's time goes: N streams of dev speech fed to one engine in-process (0.1 s chunks, as fast as
the engine decodes them, with serve's engine settings on the device — its batch and encoder window — and the streams'
defaults, at a fixed 0.5 s step), the busy time split into voice
detection, encoding, decoding (prefill, verify passes, draft steps) and AlignAtt's word alignment, per stream
second, and the rest of the tick; then the functions that took the most time themselves (cProfile).

    python eval/experiments/profile_stream.py [--sessions 4] [--seconds 40] [--device cpu] [--compute-type auto]
                                  [--threads 2] [--top 25] [--encoder-window stream|audio|full] [--no-cprofile | --torch-profiler] [--ops]
                                  [--alignment pass|decode] [--pad S] [--lookahead S] [--[no-]stream-draft]
                                  [--dev DIR]

Per stream second: engine seconds per second of each stream's audio (the engine's total over the sessions' audio).

No server and no real-time pacing (eval/bench_streaming.py measures those): this isolates the engine's own cost.
"""
from __future__ import annotations

import argparse
import contextlib
import cProfile
import functools
import pstats
import time
from dataclasses import replace

import torch
from asr_spec.server.settings import ServeSettings
from torch.utils._python_dispatch import TorchDispatchMode

from asr_spec.decoding import speculative, static
from asr_spec.decoding.budget import Tally
from asr_spec.evaluation.harness import add_data_args, data
from asr_spec.models.loader import ModelOptions, load
from asr_spec.recognizer import Recognizer
from asr_spec.streaming import decode as decode_module
from asr_spec.streaming import encoding, intake
from asr_spec.streaming.engine import Engine, stream_audios

REST = "the rest (the tick itself)"
_runs = Tally().open()  # static decodes' arena runs while the script runs
_inside: list[list] = []  # the timed parts running now, innermost last: [key, static runs at entry, nested runs]
_ops: dict[str, int] = {}  # torch operations dispatched per part (its own, not its nested parts'), with --ops


def timed(owner, name: str, key: str, totals: dict[str, float], device: str) -> None:
    """Replace ``owner.name`` with a wrapper that adds its wall time to ``totals[key]`` (on a GPU, until the device has
    done what it was given: a part's time is its host work and its kernels, not whichever later read waits for them)
    and its static decode runs (each one graph replay on CUDA) to its operations."""
    fn = getattr(owner, name)
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        t0 = time.perf_counter()
        _inside.append([key, _runs[static.RUN], 0])
        try:
            return fn(*args, **kwargs)
        finally:
            sync()
            totals[key] = totals.get(key, 0.0) + time.perf_counter() - t0
            _, runs0, nested = _inside.pop()
            runs = _runs[static.RUN] - runs0
            _ops[key] = _ops.get(key, 0) + runs - nested
            if _inside:
                _inside[-1][2] += runs
    setattr(owner, name, wrapper)


class OpsByPart(TorchDispatchMode):
    """Counts each torch operation the host dispatches against the timed part running (a static decode's own
    operations are not counted: its run counts one, as ``benchkit.streaming.OpCount`` counts them)."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if not static.inside():
            key = _inside[-1][0] if _inside else REST
            _ops[key] = _ops.get(key, 0) + 1
        return func(*args, **(kwargs or {}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sessions", type=int, default=4)
    ap.add_argument("--seconds", type=float, default=40.0)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--compute-type", default="auto")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--encoder-window", default=None, choices=encoding.WINDOWS,
                    help="default: serve's on --device (full on CUDA, stream on a CPU)")
    ap.add_argument("--no-cprofile", action="store_true", help="time the components only (cProfile slows Python)")
    ap.add_argument("--torch-profiler", action="store_true",
                    help="torch's profiler instead of cProfile: operators by host and device time (kernels on a GPU)")
    ap.add_argument("--ops", action="store_true",
                    help="also count the torch operations each part dispatches per stream-step (slower: a Python call each)")
    ap.add_argument("--alignment", default=None, help="pass or decode (default: the engine's)")
    ap.add_argument("--pad", type=float, default=None, help="seconds of silence the streaming encoder adds (default: 3)")
    ap.add_argument("--stream-draft", action=argparse.BooleanOptionalAction, default=None,
                    help="the streams draft with the draft model too, or (--no-stream-draft) with their hints only "
                    "(default: serve's)")
    ap.add_argument("--lookahead", type=float, default=None, help="seconds encoded again at each step (default: 2)")
    add_data_args(ap)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    target, draft = load(ModelOptions(device=args.device, compute_type=args.compute_type))
    serve = ServeSettings(device=args.device, encoder_window=args.encoder_window or "auto")
    config = replace(serve.engine_config(), max_step_s=0.0)  # serve's batch and window, a fixed step
    args.encoder_window = config.encoder_window
    for name, value in (("alignment", args.alignment), ("pad_s", args.pad), ("lookahead_s", args.lookahead),
                        ("draft", args.stream_draft)):
        if value is not None:
            config = replace(config, **{name: value})
    engine = Engine(Recognizer(target, draft), config)
    dev = data(args)
    audios = [dev.session(args.seconds, 7 * i).audio for i in range(args.sessions)]
    stream_audios(engine, [a[:16000 * 5] for a in audios], chunk_s=0.1)  # warm-up (kernels, the cost model's first tries)
    totals: dict[str, float] = {}
    timed(intake, "detect", "voice detection", totals, args.device)
    timed(decode_module, "encode_buffers", "encode: new audio (stream)", totals, args.device)
    timed(decode_module, "encode_whole", "encode: whole buffer", totals, args.device)
    timed(decode_module, "encode_windows", "encode: full windows", totals, args.device)
    timed(speculative.DecodingTask, "prefill", "decode: prefill", totals, args.device)
    timed(speculative.DecodingTask, "verify", "decode: verify passes", totals, args.device)
    timed(speculative.DecodingTask, "draft_tokens", "decode: draft steps", totals, args.device)
    timed(engine.recognizer, "decode", "decode", totals, args.device)
    timed(decode_module, "align_many", "AlignAtt alignment", totals, args.device)
    engine.busy_s, engine.decodes = 0.0, 0
    profile = None if args.no_cprofile or args.torch_profiler else cProfile.Profile()
    activities = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA]
                                                          if args.device.startswith("cuda") else [])
    operators = torch.profiler.profile(activities=activities) if args.torch_profiler else contextlib.nullcontext()
    t0 = time.perf_counter()
    if profile is not None:
        profile.enable()
    with operators, OpsByPart() if args.ops else contextlib.nullcontext():
        stream_audios(engine, audios, chunk_s=0.1)
    if profile is not None:
        profile.disable()
    wall = time.perf_counter() - t0
    stream_s = max(map(len, audios)) / 16000
    print(f"{args.sessions} stream(s) x {stream_s:.1f} s, {target.precision.name} on {args.device}, encoder window "
          f"{args.encoder_window}: wall {wall:.2f} s{'' if profile is None else ' (cProfile on)'}, engine busy "
          f"{engine.busy_s:.2f} s = {engine.busy_s / stream_s / args.sessions:.3f} per stream second, "
          f"{engine.decodes} decodes")
    for key, seconds in totals.items():
        print(f"  {key:28s} {seconds:7.2f} s  {seconds / engine.busy_s:6.1%} of busy  "
              f"{seconds / stream_s / args.sessions:.3f} per stream second")
    parts = ("voice detection", "encode: new audio (stream)", "encode: whole buffer", "encode: full windows", "decode",
             "AlignAtt alignment")
    rest = engine.busy_s - sum(totals.get(k, 0.0) for k in parts)
    print(f"  {REST:28s} {rest:7.2f} s  {rest / engine.busy_s:6.1%} of busy  "
          f"{rest / stream_s / args.sessions:.3f} per stream second")
    if args.ops:
        print(f"torch operations per stream-step ({engine.decodes} stream-steps; a static decode's run counts one):")
        for key, n in sorted(_ops.items(), key=lambda kv: -kv[1]):
            print(f"  {key:28s} {n / engine.decodes:8.1f}")
        print(f"  {'all':28s} {sum(_ops.values()) / engine.decodes:8.1f}")
    if args.torch_profiler:
        table = operators.key_averages()
        for key in ("self_cpu_time_total",) + (("self_device_time_total",) if len(activities) > 1 else ()):
            print(table.table(sort_by=key, row_limit=args.top, max_name_column_width=60))
    if profile is not None:
        pstats.Stats(profile).sort_stats("tottime").print_stats(args.top)


if __name__ == "__main__":
    main()
