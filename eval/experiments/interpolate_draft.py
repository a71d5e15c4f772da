"""A distilled draft's weights moved back toward where its training started (WiSE-FT: Wortsman et al., 2022): each
tensor ``weight * trained + (1 - weight) * initial``, the initial ones the target's layers the draft was made from
(its card's ``layers_from``), the target's final layer norm and the target's embedding rows of its shortlist (Whisper
ties its output layer to them), or with ``--toward`` another draft of the same shape (the one a ``distill --init``
run started from). A draft that has learnt its few hours of training speech by heart agrees more on speech it has
not heard; one fine-tuned on recordings keeps more of what it knew of clips. Writes the draft format, its card with a
line saying so.

    python eval/experiments/interpolate_draft.py DRAFT --weight 0.7 [--toward INIT_DRAFT] --out OUT
"""
from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from asr_spec.models.cache import sha256
from asr_spec.models.loader import DRAFT_META, load_target


def initial(target_decoder: torch.nn.Module, meta: dict) -> dict[str, torch.Tensor]:
    """The draft's tensors as its training started: the target's layers ``layers_from``, final norm, embedding rows."""
    out = {f"layers.{i}.{k}": v for i, j in enumerate(meta["training"]["layers_from"])
           for k, v in target_decoder.layers[j].state_dict().items()}
    out |= {f"layer_norm.{k}": v for k, v in target_decoder.layer_norm.state_dict().items()}
    out["head.weight"] = target_decoder.embed_tokens.weight[torch.tensor(meta["head_ids"])]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("draft", type=Path)
    ap.add_argument("--weight", type=float, required=True, help="the trained weights' share (1: the draft as it is)")
    ap.add_argument("--toward", type=Path, help="a draft of the same shape and shortlist whose weights are the initial "
                    "ones (default: the target's layers)")
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args()
    meta = json.loads((a.draft / DRAFT_META).read_text())
    trained = load_file(str(a.draft / "draft.safetensors"))
    if a.toward:
        if json.loads((a.toward / DRAFT_META).read_text())["head_ids"] != meta["head_ids"]:
            raise SystemExit(f"{a.toward}: another shortlist than {a.draft}'s")
        start, toward = load_file(str(a.toward / "draft.safetensors")), f"the draft {a.toward.name}"
    else:
        start = initial(load_target(meta["target"]).net.model.decoder, meta)
        toward = f"the target's layers {meta['training']['layers_from']}, final norm and embedding rows"
    unlike = sorted(k for k in set(start) | set(trained)
                    if k not in start or k not in trained or start[k].shape != trained[k].shape)
    if unlike:
        raise SystemExit(f"{a.draft}: tensors that its initialisation lacks, adds or shapes otherwise: {unlike}")
    mixed = {k: (a.weight * v.float() + (1 - a.weight) * start[k].float()).to(v.dtype).contiguous()
             for k, v in trained.items()}
    a.out.mkdir(parents=True, exist_ok=True)
    save_file(mixed, str(a.out / "draft.safetensors"), metadata={"format": "pt"})
    meta["training"]["interpolated"] = {"weight": a.weight, "toward": toward}
    meta["weights_sha256"] = sha256(a.out / "draft.safetensors")  # what the loader verifies
    (a.out / DRAFT_META).write_text(json.dumps(meta, indent=1))
    for name in ("README.md", "report.json"):
        if (a.draft / name).exists() and a.draft != a.out:
            shutil.copy(a.draft / name, a.out / name)
    with open(a.out / "README.md", "a") as f:
        f.write(f"\nIts weights moved back toward its initialisation ({toward}): {a.weight} x trained + "
                f"{round(1 - a.weight, 4)} x initial (`python eval/experiments/interpolate_draft.py DRAFT --weight "
                f"{a.weight}{' --toward INIT' if a.toward else ''} --out OUT`).\n")


if __name__ == "__main__":
    main()
