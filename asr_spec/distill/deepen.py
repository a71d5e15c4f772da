"""A continued draft made deeper: the target's layers added among its own, each adding nothing until trained."""
from __future__ import annotations

import torch


def deepened(dec: torch.nn.Module, src: torch.nn.Module, layers: list[int], trained: list[int],
             saved: dict[str, torch.Tensor]) -> None:
    """Load a continued draft's layers (``saved``, started from the target's ``trained``) into ``dec``, whose layers
    start from the target's ``layers``: ``trained`` in order among them, each other one the target's layer with its
    three output projections zeroed, so that it adds nothing to the residual stream and the deepened draft proposes
    exactly what the draft it continues proposes until training moves it."""
    it = iter(layers)
    if not all(any(i == j for j in it) for i in trained):  # trained must be a subsequence of layers
        raise RuntimeError(f"--layers {','.join(map(str, layers))} must keep the draft's own layers "
                           f"{','.join(map(str, trained))} in their order")
    k = 0
    for j, i in enumerate(layers):
        if k < len(trained) and i == trained[k]:
            dec.layers[j].load_state_dict({n.split(".", 1)[1]: v for n, v in saved.items() if n.startswith(f"{k}.")})
            k += 1
            continue
        dec.layers[j].load_state_dict(src.layers[i].state_dict())
        with torch.no_grad():
            for out in (dec.layers[j].self_attn.out_proj, dec.layers[j].encoder_attn.out_proj, dec.layers[j].fc2):
                out.weight.zero_()
                out.bias.zero_()
