"""Which way of computing a linear layer gives a row the same bits whatever the other rows of the call? One row's
output from calls of 1 to 1000 rows, compared bitwise with the same row computed alone, for each way and float type,
at the decoder's layer shapes. An exact decoder needs a way that never differs (speculative == target-only, batch 8 ==
batch 1); ``asr_spec.models.linear.project`` is the one the decoders use (the way ``exact_way`` measured exact
and fastest here, printed at the end).

    python eval/experiments/exact_linear.py [--device cuda] [--dtype float16,bfloat16,float32]
"""
from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F

from asr_spec.models.linear import exact_way, in_blocks, project

ROWS = (1, 2, 3, 4, 5, 7, 8, 9, 12, 16, 17, 24, 33, 40, 64, 65, 100, 128, 200, 256, 257, 440, 1000)
SHAPES = ((512, 512), (1536, 512), (2048, 512), (512, 2048), (51865, 512))  # (out, in): whisper-base's decoder


def matmul(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return (w @ x.t()).t()


WAYS = {"project (the decoders')": lambda x, w: project(x, w), "weight @ x.T": matmul,
        "F.linear": lambda x, w: F.linear(x, w), "weight @ x.T, blocks of 4": lambda x, w: in_blocks(x, w, 4, True),
        "blocks of 64 rows": lambda x, w: in_blocks(x, w, 64),
        "blocks of 256 rows": lambda x, w: in_blocks(x, w, 256)}


def differing(way, dtype: torch.dtype, device: str) -> list[str]:
    """The (shape, row count) pairs where row 0 differs from row 0 computed alone."""
    g = torch.Generator().manual_seed(0)
    bad = []
    for out, inp in SHAPES:
        w = (torch.randn(out, inp, generator=g) / inp ** 0.5).to(device, dtype)
        x = torch.randn(max(ROWS), inp, generator=g).to(device, dtype)
        alone = way(x[:1], w)[0]
        bad += [f"{out}x{inp}@{m}" for m in ROWS[1:] if not torch.equal(way(x[:m], w)[0], alone)]
    return bad


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32,bfloat16")
    args = ap.parse_args()
    for name in args.dtype.split(","):
        for label, way in WAYS.items():
            bad = differing(way, getattr(torch, name), args.device)
            print(f"{name:9s} {label:26s} " + ("row-exact" if not bad else f"differs at {len(bad)}: {' '.join(bad[:8])}"))
        for out, inp in SHAPES:
            print(f"{name:9s} {out}x{inp}: project uses {exact_way(out, inp, getattr(torch, name), torch.device(args.device))[0]}")


if __name__ == "__main__":
    main()
