"""Does a position keep its bits whatever the pass? The target's logits of one position computed in a 1-token step,
inside a 4-token verify pass, inside a 9-token pass and as row 2 of a batch of 3, compared bitwise (and by their
largest difference) at each compute type on a device: what speculative == target-only and batch 8 == batch 1 rest
on. ``tests/decoding/test_compute.py`` checks the same on the tiny model on the CPU that runs the tests; this runs the real
model on any device (a GPU's kernels may pick another path by row count).

    python eval/experiments/exact_rows.py [--device cuda] [--compute-type float16,int8,float32]
"""
from __future__ import annotations

import argparse

import torch

from asr_spec.models.loader import load_target


def check(compute_type: str, device: str) -> dict:
    target = load_target(device=device, compute_type=compute_type)
    dec = target.decoder
    g = torch.Generator().manual_seed(0)
    memory = target.encode(torch.randn(3, target.n_mels, 3000, generator=g).to(device))
    tokens = torch.randint(0, 50000, (3, 20), generator=g).to(device)
    pos = torch.arange(20, device=device).expand(3, -1)

    def logits(rows: slice, start: int, width: int) -> torch.Tensor:
        cache = dec.new_cache(memory[rows], 40)
        dec(cache, tokens[rows, :start], pos[rows, :start])
        return dec(cache, tokens[rows, start:start + width], pos[rows, start:start + width])

    one = logits(slice(2, 3), 8, 1)[0, 0]
    others = {"verify pass of 4": logits(slice(2, 3), 8, 4)[0, 0], "pass of 9": logits(slice(2, 3), 5, 9)[0, 3],
              "pass of 19": logits(slice(2, 3), 1, 19)[0, 7],
              "row 2 of a batch of 3": logits(slice(0, 3), 8, 4)[2, 0]}
    return {"compute_type": target.precision.name, "exact": dec.exact,
            "same bits": {k: torch.equal(one, o) for k, o in others.items()},
            "max difference": {k: float((one - o).abs().max()) for k, o in others.items()}}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--compute-type", default="float32,int8")
    args = ap.parse_args()
    for ct in args.compute_type.split(","):
        print(check(ct, args.device))


if __name__ == "__main__":
    main()
