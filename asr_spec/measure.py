"""What a machine is measured for once and then kept in the cache directory: ``--compute-type auto``'s type
(models/auto.py) and the batch widths at which drafting pays (``auto.DraftWidths``).

Speculation costs a verify pass of K + 1 positions and K draft steps for the tokens it saves. Where the verify and the
draft cost more than they save (a GPU at batch 8 with whisper-base: 0.83x), the default decodes without drafting at
that width. Which widths pay is measured on the bundled sample: the same decode at each width (1 and 8; 16 on CUDA),
target-only and speculative in turn, ``ROUNDS`` times; drafting pays where the speculative median is the faster.

A process that must not wait (serve, mic, transcribe) starts with what is kept, else with the guesses
(``auto.guessed_type``, ``auto.guessed_widths``). A server (serve, mic) also starts this module in the background,
at the lowest CPU priority, to measure for the processes after it: ``python -m asr_spec.measure`` (the same arguments
as the command's model options; run it in the foreground to measure now). In the background it measures only while
the rest of the machine is quiet: a measurement beside a busy process measures that process, and on a 2-core machine
it slowed a transcription 5x (its torch threads wait for a core the measurement holds). ``eval`` measures before it
times anything. ``ASR_SPEC_MEASURE=off`` measures nothing (the test suite).
"""
from __future__ import annotations

import argparse
import atexit
import ctypes
import os
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import replace
from typing import Callable

import torch

from .audio import SAMPLE, load_audio
from .cpu import Others
from .decoding.beam import BeamOptions
from .features import log_mel, window
from .models.auto import DraftWidths, count_stops, kept_path, kept_widths, once, timed, write_kept
from .models.cache import cache_dir, locked
from .models.loader import Draft, ModelOptions, Whisper, load
from .models.pair import Pair
from .recognizer import Recognizer

ROUNDS = 3  # decodes of each kind per width (medians compared)
WIDTHS = {"cpu": (1, 8), "cuda": (1, 8, 16)}
BEAM = 0  # a width that stands for one window's beam search (5 beams)
LOCK = "measuring.lock"  # held by the measurement while it runs


def decode_seconds(rec: Recognizer, memory: Pair[torch.Tensor], width: int, use_draft: bool) -> float:
    """Wall seconds of one greedy decode of ``width`` copies of the sample's window (``memory``: its encoder outputs,
    the target's and the draft's; ``width`` :data:`BEAM`: one beam search of it), timed again when this process was
    stopped meanwhile (``auto.timed``)."""
    v = rec.vocab
    request = rec.prompt([], "en" if v.multilingual else None, "transcribe", timestamps=True)
    n = 1 if width == BEAM else width
    rows = lambda m: m.expand(n, -1, -1).contiguous()  # noqa: E731
    memories = Pair(rows(memory.target), None if memory.draft is None else rows(memory.draft))
    sync = torch.cuda.synchronize if memory.target.is_cuda else (lambda: None)
    sync()

    def decode() -> None:
        if width == BEAM:
            rec.beam(memories.target, [request], True, BeamOptions(5), use_draft=use_draft)
        else:
            rec.decode(memories, [request] * width, use_draft=use_draft, static=True)
        sync()

    return timed(decode, 1)[0]


def measure_widths(target: Whisper, draft: Draft, widths: tuple[int, ...], rounds: int = ROUNDS,
                   before_each: Callable[[], None] = lambda: None) -> dict:
    """Decode seconds by width, target-only and speculative (medians of ``rounds``, in turn after a warm-up);
    ``before_each`` runs before each pair of decodes. A width :data:`BEAM` is a beam search (5 beams)."""
    rec = Recognizer(target, replace(draft, widths=DraftWidths({1: True}, "always", beam=True)))
    memory = rec.encode(window(log_mel(load_audio(SAMPLE), target.n_mels), 0)[None].to(target.decoder.device))
    out = {}
    for w in widths:
        before_each()
        for use_draft in (False, True):  # warm-up: first calls, caches of this width
            decode_seconds(rec, memory, w, use_draft)
        took: dict[bool, list[float]] = {False: [], True: []}
        for _ in range(rounds):
            before_each()
            for use_draft in (False, True):
                took[use_draft].append(decode_seconds(rec, memory, w, use_draft))
        out[w] = {"target": statistics.median(took[False]), "spec": statistics.median(took[True])}
    return out


def measured_widths(options: ModelOptions, target: Whisper, draft: Draft,
                    before_each: Callable[[], None] = lambda: None) -> DraftWidths:
    """Measure where ``draft`` pays with ``target`` here (now), keep it and return it."""
    kind = torch.device(options.device).type
    key = options.widths_key(target.precision.name)
    path = kept_path(cache_dir(), "draft-widths", key)

    def measure() -> DraftWidths:
        # beam searches are measured on CUDA only: on a CPU the sample's one window said drafting paid where the dev
        # set's 65 clips took 1.19x longer with it (AMX Xeon, bfloat16: eval/results/beam)
        beams = (BEAM,) if kind == "cuda" else ()
        seconds = measure_widths(target, draft, WIDTHS.get(kind, WIDTHS["cpu"]) + beams, before_each=before_each)
        pays = {w: s["spec"] < s["target"] for w, s in seconds.items() if w != BEAM}
        beam = bool(beams) and seconds[BEAM]["spec"] < seconds[BEAM]["target"]
        write_kept(path, {"key": key, "pays": pays, "beam": beam, "seconds": seconds, "rounds": ROUNDS,
                          "torch": torch.__version__})
        return DraftWidths(pays, beam=beam)

    return once(path, lambda: kept_widths(key, cache_dir()), measure)


def settle(options: ModelOptions, target: Whisper, draft: Draft | None, background: bool = False) -> Draft | None:
    """After loading: with ``options.measure_now``, measure where the draft pays if that was guessed; otherwise,
    where a guess stands in (the type, the widths), with ``background`` (a server), start the measurement for later
    processes. Returns the draft with the widths it uses now."""
    guessed = draft is not None and draft.widths.source == "guessed"
    if not measuring():
        return draft
    if options.measure_now and guessed:
        print("speculation: measuring where the draft pays here (once; kept in the cache directory)", file=sys.stderr)
        return replace(draft, widths=measured_widths(options, target, draft))
    if background and (guessed or target.precision.guessed):
        measure_later(options)
    return draft


def measuring() -> bool:
    """Whether what is not measured here may be measured (``ASR_SPEC_MEASURE=off``: never; the guesses stand)."""
    return os.environ.get("ASR_SPEC_MEASURE", "").lower() not in ("off", "0", "no")


def measure_later(options: ModelOptions) -> bool:
    """Start ``python -m asr_spec.measure`` for ``options`` in the background, unless one is measuring already on this
    cache. It runs at the lowest CPU priority in this session (so that the priority counts against this process's
    threads), and this process stops it while it has work (:func:`hold`); if this process dies, the kernel continues
    it, and it finishes for the processes after it. Returns whether it started one."""
    if _measuring_elsewhere():
        return False
    cache_dir().mkdir(parents=True, exist_ok=True)
    argv = [sys.executable, "-m", "asr_spec.measure", "--model", options.model, "--draft", str(options.draft),
            "--device", options.device, "--compute-type", options.compute_type, "--threads", str(options.threads),
            "--background"]
    with open(cache_dir() / "measuring.log", "ab") as log:
        child = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log, process_group=0,
                                 preexec_fn=_lowest_priority)
    _BACKGROUND[:] = [child]
    _HELD[0] = False
    atexit.register(hold, False)
    print(f"measuring this machine in the background (lowest priority, paused while sessions or uploads are open; "
          f"log: {cache_dir() / 'measuring.log'}): later processes use what it finds", file=sys.stderr)
    return True


_BACKGROUND: list[subprocess.Popen] = []  # the background measurement this process started
_HELD = [False]  # whether this process has stopped it


def hold(busy: bool) -> None:
    """Stop this process's background measurement while the process has work (``busy``: a live session, an
    upload), so that it never takes a core from that work; continue it once there is none. Idempotent and cheap
    (a server calls it on every turn of its decoding loop)."""
    if not _BACKGROUND or busy == _HELD[0]:
        return
    child = _BACKGROUND[0]
    if child.poll() is not None:
        _BACKGROUND.clear()
        return
    try:
        os.kill(child.pid, signal.SIGSTOP if busy else signal.SIGCONT)
        _HELD[0] = busy
    except ProcessLookupError:
        _BACKGROUND.clear()


def _lowest_priority() -> None:
    """In the child before it runs: nice 19, and continued (SIGCONT) by the kernel when its parent dies, so that a
    measurement its server stopped does not stay stopped."""
    os.nice(19)
    on_parent_death(signal.SIGCONT)


PR_SET_PDEATHSIG = 1  # prctl(2)


def on_parent_death(sig: int) -> None:
    """Have the kernel send this process ``sig`` when its parent dies (Linux; elsewhere nothing)."""
    if sys.platform == "linux":
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, sig, 0, 0, 0)


def _measuring_elsewhere() -> bool:
    """Whether a measurement holds this cache's lock (it holds it while it runs)."""
    try:
        with locked(cache_dir() / LOCK, timeout=0) as free:
            return not free
    except OSError:
        return True  # a read-only cache: nothing to keep a measurement in


def others_busy(seconds: float = 1.0) -> float:
    """Cores the rest of the machine kept busy over the next ``seconds``; 0 where the system does not say."""
    others = Others()
    time.sleep(seconds)
    return others.cores()


def wait_quiet(most: float = 3600.0, below: float = 0.2) -> None:
    """Wait until the rest of the machine keeps less than ``below`` of a core busy for two seconds in a row (or
    ``most`` seconds passed)."""
    deadline, calm = time.monotonic() + most, 0
    while calm < 2 and time.monotonic() < deadline:
        calm = calm + 1 if others_busy() < below else 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m asr_spec.measure", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=ModelOptions.model)
    p.add_argument("--draft", default="auto")
    p.add_argument("--device", default="cpu")
    p.add_argument("--compute-type", default="auto")
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--background", action="store_true", help="measure only while the rest of the machine is quiet")
    p.add_argument("--patience", type=float, default=3600.0,
                   help="--background: most seconds to wait for a quiet machine before each step (then it measures)")
    a = p.parse_args(argv)
    pause = (lambda: wait_quiet(a.patience)) if a.background else (lambda: None)
    options = ModelOptions(a.model, None if a.draft == "None" else a.draft, a.device, a.compute_type, a.threads)
    count_stops()  # the server that started it stops it while it works: timings a stop fell into are taken again
    signal.signal(signal.SIGHUP, signal.SIG_IGN)  # its terminal closing, or its process group orphaned while stopped
    with locked(cache_dir() / LOCK, timeout=0) as mine:
        if not mine:
            print("another process is measuring this machine already", file=sys.stderr)
            return 0
        pause()
        if options.compute_type == "auto" and options.kept_type() is None:
            options.measure_type(before_each=pause)
        # where the draft pays at the type it resolves to, and at float32 (transcribe's default) where that differs
        for o in dict.fromkeys([options, replace(options, compute_type="float32")]):
            target, draft = load(o)
            if draft is not None and draft.widths.source == "guessed":
                draft = replace(draft, widths=measured_widths(o, target, draft, before_each=pause))
            if draft is not None:
                print(f"{target.name}: {draft.widths.describe()}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
