"""``--compute-type auto``: the type measured fastest on this machine, end to end, for a model and its shipped draft.

On first use for a (model, machine, thread count), every type the device computes natively is loaded and timed on
what a window costs: the encoder on one 30 s window and ``PASSES`` speculative passes (``K`` draft steps and a verify
pass of K + 1 tokens: an average dev-set utterance's decode). The fastest is kept in the cache directory
(``auto/*.json``, with every type's seconds) and used from then on; delete the file to measure again (a new release
whose costs changed, :data:`REVISION`, measures again by itself). Measuring takes
seconds (each type's load dominates). CPU flags alone chose badly: int8 on a CPU with AVX512-BF16 meant int8_bfloat16,
slower there than int8_float32.
"""
from __future__ import annotations

import json
import os
import re
import signal
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, TypeVar

import torch

from .cache import locked
from .compute import amx, int8_kernels, native_bfloat16
from .kv_decoder import CachedDecoder

T = TypeVar("T")

# the code whose costs a kept measurement reflects: a measurement of another revision is made again (raised when
# the decode's costs change, or what is measured does: 4 times beam searches too)
REVISION = 4
PASSES = 12  # speculative passes per window: a dev utterance's 26 tokens at ~2.2 per pass
K = 3  # most drafted tokens per target pass by default (every command's --k): the widths are measured at it
LOCK_WAIT_S = 120.0  # longest wait for another process's measurement of the same thing


def native_types(device: str | torch.device = "cpu") -> list[str]:
    """The concrete types ``device`` computes natively: floats it has units for, and int8 weights with each."""
    device = torch.device(device)
    if device.type == "cuda":
        floats = ["float16"] + (["bfloat16"] if torch.cuda.is_bf16_supported() else [])
    else:
        floats = ["float32"] + (["bfloat16"] if native_bfloat16(device) or amx(device) else [])
    return floats + ([f"int8_{f}" for f in floats] if int8_kernels(device) else [])


@torch.inference_mode()
def window_seconds(encode: Callable[[torch.Tensor], torch.Tensor], n_mels: int, target: CachedDecoder,
                   draft: CachedDecoder | None, rounds: int = 3) -> float:
    """Seconds of one window at a loaded type: the encoder on 30 s, then ``PASSES`` passes of ``K`` draft steps and a
    verify of K + 1 tokens over a cache of a typical length (median of ``rounds``, after a warm-up)."""
    dev = target.device
    mel = torch.zeros(1, n_mels, 3000, device=dev)
    tokens = torch.randint(0, 50000, (1, 64), generator=torch.Generator().manual_seed(0)).to(dev)
    pos = torch.arange(64, device=dev)[None]

    def window() -> None:
        memory = encode(mel)
        t_cache = target.new_cache(memory, 64)
        target(t_cache, tokens[:, :24], pos[:, :24])
        d_cache = draft.new_cache(memory, 64) if draft is not None else None
        if draft is not None:
            draft(d_cache, tokens[:, :24], pos[:, :24])
        for _ in range(PASSES):
            for j in range(K if draft is not None else 0):
                draft(d_cache, tokens[:, 24 + j:25 + j], pos[:, 24 + j:25 + j], shortlist=True)
            target(t_cache, tokens[:, 24:25 + K], pos[:, 24:25 + K])
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)

    window()
    return statistics.median(timed(window, rounds))


_CONTINUED = [0]  # times this process was continued after a stop (SIGCONT)


def count_stops() -> None:
    """Count this process's stops (a server stops its background measurement while it has work: measure.py), so that
    :func:`timed` can tell a timing a stop fell into."""
    signal.signal(signal.SIGCONT, lambda *_: _CONTINUED.__setitem__(0, _CONTINUED[0] + 1))


def timed(run: Callable[[], object], rounds: int, tries: int = 20) -> list[float]:
    """Seconds of ``rounds`` calls of ``run``; a call during which the process was stopped and continued is timed
    again (``tries`` times at most: then it counts as it is)."""
    took = []
    for _ in range(rounds):
        for _ in range(tries):
            before, t0 = _CONTINUED[0], time.perf_counter()
            run()
            seconds = time.perf_counter() - t0
            if _CONTINUED[0] == before:
                break
        took.append(seconds)
    return took


def kept_path(cache: Path, kind: str, key: str) -> Path:
    """Where a measurement of ``kind`` (``auto``: the type; ``draft-widths``) for ``key`` is kept."""
    return cache / kind / (re.sub(r"[^A-Za-z0-9._-]+", "_", key).strip("_")[:150] + ".json")


def kept_type(key: str, candidates: list[str], cache: Path) -> str | None:
    """The type measured fastest for ``key`` among the same ``candidates``, if it was measured (else None)."""
    doc = read_kept(kept_path(cache, "auto", key))
    return doc["chosen"] if doc.get("candidates") == candidates and doc.get("chosen") in candidates else None


def guessed_type(device: str | torch.device = "cpu") -> str:
    """What ``auto`` uses before it has been measured on a machine (a process that does not wait for the measurement:
    serve, mic): float16 on CUDA; on a CPU bfloat16 where it is native (measured fastest or within 2 % of it on the
    AMX Xeon and the AVX512-BF16 EPYC), else int8_float32 (the AVX2 EPYC's fastest)."""
    device = torch.device(device)
    if device.type == "cuda":
        return "float16"
    if native_bfloat16(device) or amx(device):
        return "bfloat16"
    return "int8_float32" if int8_kernels(device) else "float32"


def once(path: Path, kept: Callable[[], T | None], measure: Callable[[], T]) -> T:
    """What is kept at ``path`` (``kept()``), else ``measure()`` (which keeps it there), by one process at a time: a
    process that finds another measuring waits for it and takes what it found. It measures by itself after
    :data:`LOCK_WAIT_S`, or at once when the one measuring is stopped (a server's background measurement, held while
    the server works)."""
    if (k := kept()) is not None:
        return k
    try:
        with locked(path.with_suffix(".lock"), timeout=LOCK_WAIT_S) as held:
            if held and (k := kept()) is not None:
                return k
            return measure()
    except OSError:  # a read-only cache: nothing kept, nothing to lock
        return measure()


def write_kept(path: Path, doc: dict) -> None:
    """Keep a measurement (``doc``, with this code's :data:`REVISION`) at ``path``, replaced whole."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps({**doc, "revision": REVISION}, indent=1))
    tmp.replace(path)


def read_kept(path: Path) -> dict:
    """A kept measurement; empty if there is none, it is unreadable, or another revision of the code took it."""
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return doc if isinstance(doc, dict) and doc.get("revision") == REVISION else {}


def measured_type(key: str, candidates: list[str], measure: Callable[[str], float], cache: Path) -> str:
    """The fastest of ``candidates`` by ``measure`` (seconds), kept per ``key`` in ``cache``/auto; measured on first
    use (and again when the candidates change), saying so on stderr."""
    path = kept_path(cache, "auto", key)
    return once(path, lambda: kept_type(key, candidates, cache), lambda: _measure_types(path, key, candidates, measure))


def _measure_types(path: Path, key: str, candidates: list[str], measure: Callable[[str], float]) -> str:
    print(f"compute type auto: measuring {', '.join(candidates)} on {key} (once; kept in {path})", file=sys.stderr)
    seconds, failed = {}, {}
    for c in candidates:
        try:
            seconds[c] = round(measure(c), 4)
        except RuntimeError as e:  # e.g. a library's int8 kernel refuses these shapes (cuBLAS, a tiny test model)
            failed[c] = str(e).splitlines()[0][:200]
            print(f"compute type auto: {c} does not run here ({failed[c]})", file=sys.stderr)
    if not seconds:
        raise RuntimeError(f"compute type auto: no type runs here: {failed}")
    chosen = min(seconds, key=seconds.__getitem__)
    print("compute type auto = " + chosen + ": seconds per window " +
          ", ".join(f"{c} {s:.3f}" for c, s in sorted(seconds.items(), key=lambda kv: kv[1])), file=sys.stderr)
    write_kept(path, {"key": key, "candidates": candidates, "seconds": seconds, "failed": failed, "chosen": chosen,
                      "passes": PASSES, "k": K, "torch": torch.__version__})
    return chosen


@dataclass(frozen=True)
class DraftWidths:
    """Where drafting pays: for each batch width measured (rows decoded together), whether the speculative decode
    was faster than target-only on this machine at this type. A width between two measured ones follows the one
    below it. ``source``: ``measured``, ``guessed`` (not measured here yet), or ``always`` (``--speculation on``)."""

    pays: dict[int, bool]
    source: str = "measured"
    beam: bool = False  # whether drafting pays for a beam search (5 beams of one window)

    def __call__(self, rows: int) -> bool:
        below = [w for w in self.pays if w <= rows]
        return self.pays[max(below) if below else min(self.pays)]

    def describe(self) -> str:
        on = [w for w, p in sorted(self.pays.items()) if p]
        off = [w for w, p in sorted(self.pays.items()) if not p]
        if self.source == "always":
            return "drafting at every batch width (--speculation on)"
        said = ("drafting at batch " + ", ".join(map(str, on)) if on else "target alone at every batch width") + \
            (f", target alone at batch {', '.join(map(str, off))}" if off and on else "") + \
            (", and in beam searches" if self.beam else "")
        return said + (" (measured here)" if self.source == "measured" else " (a guess: not measured here yet)")


ALWAYS = DraftWidths({1: True}, "always", beam=True)


def guessed_widths(device: str | torch.device = "cpu") -> DraftWidths:
    """Where drafting pays before it was measured: every width on a CPU (measured so on three CPU kinds at batch 1
    and 8); on CUDA batch 1 only (H100, whisper-base, batch 8: speculation 0.83x of target-only's decode). Beam
    searches draft on CUDA only (on the AMX Xeon a speculative beam-5 search took 31 % fewer target passes and 1.19x
    the time over the dev clips: its draft steps over five beams cost more than they saved; eval/results/beam)."""
    cuda = torch.device(device).type == "cuda"
    return DraftWidths({1: True, 8: not cuda}, "guessed", beam=cuda)


def kept_widths(key: str, cache: Path) -> DraftWidths | None:
    try:
        doc = read_kept(kept_path(cache, "draft-widths", key))
        return DraftWidths({int(w): bool(p) for w, p in doc["pays"].items()}, beam=bool(doc.get("beam", False)))
    except (ValueError, KeyError, TypeError, AttributeError):  # none kept, or not a measurement of widths
        return None
