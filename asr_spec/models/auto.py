"""``--compute-type auto``: the type measured fastest on this machine, end to end, for a model and its shipped draft.

On first use for a (model, machine, thread count), every type the device computes natively is loaded and timed on
what a window costs: the encoder on one 30 s window and ``PASSES`` speculative passes (``K`` draft steps and a verify
pass of K + 1 tokens: an average dev-set utterance's decode). The fastest is kept in the cache directory
(``auto/*.json``, with every type's seconds) and used from then on; delete the file to measure again. Measuring takes
seconds (each type's load dominates). CPU flags alone chose badly: int8 on a CPU with AVX512-BF16 meant int8_bfloat16,
slower there than int8_float32 (issue 39).
"""
from __future__ import annotations

import json
import os
import re
import statistics
import sys
import time
from pathlib import Path
from typing import Callable

import torch

from .compute import amx, int8_kernels, native_bfloat16
from .kv_decoder import StaticDecoder

PASSES = 12  # speculative passes per window: a dev utterance's 26 tokens at ~2.2 per pass
K = 3  # draft steps per pass (the default draft length)


def native_types(device: str | torch.device = "cpu") -> list[str]:
    """The concrete types ``device`` computes natively: floats it has units for, and int8 weights with each."""
    device = torch.device(device)
    if device.type == "cuda":
        floats = ["float16"] + (["bfloat16"] if torch.cuda.is_bf16_supported() else [])
    else:
        floats = ["float32"] + (["bfloat16"] if native_bfloat16(device) or amx(device) else [])
    return floats + ([f"int8_{f}" for f in floats] if int8_kernels(device) else [])


@torch.inference_mode()
def window_seconds(encode: Callable[[torch.Tensor], torch.Tensor], n_mels: int, target: StaticDecoder,
                   draft: StaticDecoder | None, rounds: int = 3) -> float:
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
    took = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        window()
        took.append(time.perf_counter() - t0)
    return statistics.median(took)


def measured_type(key: str, candidates: list[str], measure: Callable[[str], float], cache: Path) -> str:
    """The fastest of ``candidates`` by ``measure`` (seconds), kept per ``key`` in ``cache``/auto; measured on first
    use (and again when the candidates change), saying so on stderr."""
    path = cache / "auto" / (re.sub(r"[^A-Za-z0-9._-]+", "_", key).strip("_")[:150] + ".json")
    if path.exists():
        try:
            doc = json.loads(path.read_text())
            if doc.get("candidates") == candidates and doc.get("chosen") in candidates:
                return doc["chosen"]
        except (OSError, ValueError):
            pass  # unreadable: measured again
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
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps({"key": key, "candidates": candidates, "seconds": seconds, "failed": failed, "chosen": chosen,
                               "passes": PASSES, "k": K, "torch": torch.__version__}, indent=1))
    tmp.replace(path)
    return chosen
