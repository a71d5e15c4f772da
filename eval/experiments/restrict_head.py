"""A distilled draft's output layer cut to another draft's shortlist (``asr_spec.distill.shortlist.restricted``): a
draft trained with a wide layer, served with the narrow one of the draft it continued (fewer rows read at each draft
step). Writes the draft format; the card and report are copied with a line saying what was cut.

    python eval/experiments/restrict_head.py DRAFT --to SHORTLIST_FROM --out OUT
"""
from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

from safetensors.torch import load_file, save_file

from asr_spec.distill.shortlist import restricted
from asr_spec.models.loader import DRAFT_META


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("draft", type=Path)
    ap.add_argument("--to", type=Path, required=True, help="the draft whose shortlist to keep")
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args()
    meta = json.loads((a.draft / DRAFT_META).read_text())
    keep = json.loads((a.to / DRAFT_META).read_text())["head_ids"]
    weights = load_file(str(a.draft / "draft.safetensors"))
    before = len(meta["head_ids"])
    meta["head_ids"], weights["head.weight"] = restricted(meta["head_ids"], weights["head.weight"], keep)
    a.out.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in weights.items()}, str(a.out / "draft.safetensors"), metadata={"format": "pt"})
    (a.out / DRAFT_META).write_text(json.dumps(meta, indent=1))
    for name in ("README.md", "report.json"):
        if (a.draft / name).exists() and a.draft != a.out:
            shutil.copy(a.draft / name, a.out / name)
    note = (f"\nServed with its output layer cut from {before} to {len(meta['head_ids'])} rows (the shortlist of "
            f"{a.to}): `python eval/experiments/restrict_head.py {a.draft} --to {a.to} --out {a.out}`.\n")
    with open(a.out / "README.md", "a") as f:
        f.write(note)
    print(f"{a.out}: {before} -> {len(meta['head_ids'])} rows")


if __name__ == "__main__":
    main()
