"""A distilled draft's output layer widened without training: does offering the draft the tokens outside its shortlist
(5.3 % of the dev set's tokens at 11,502 rows) win accepted tokens? Each new row is the target's own embedding of the
token (``asr_spec.distill.shortlist.widened``'s rows, as ``distill --head-size`` widens before training), or
(``--rows fitted``) that embedding through the linear map fitted by (ridge) least squares from the target's embeddings of the
trained rows to the trained rows themselves. New tokens in ``ranked_text_tokens``' order (the text corpus's most
frequent first), then, for ``--size 0``, every other text token. Writes the draft format; the card and report are
copied with a line saying what was added. Evaluate with ``asr_spec eval --draft OUT``.

    python eval/experiments/widen_head.py DRAFT --text FILE... [--size 0] [--rows embeddings|fitted] --out OUT
"""
from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from asr_spec.distill.shortlist import ranked_text_tokens
from asr_spec.models.loader import DRAFT_META, load_target


def fitted_map(embeddings: torch.Tensor, trained: torch.Tensor, ridge: float = 1e-3) -> torch.Tensor:
    """[D + 1, D]: the least-squares map (with a bias) from the target's embeddings of the trained rows to them, in
    float64 with a small ridge (``torch.linalg.lstsq`` on this ill-conditioned system gave another map at each call)."""
    x = torch.cat([embeddings, embeddings.new_ones(len(embeddings), 1)], 1).double()
    gram = x.T @ x + ridge * torch.eye(x.shape[1], dtype=x.dtype)
    return torch.linalg.solve(gram, x.T @ trained.double()).float()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("draft", type=Path)
    ap.add_argument("--text", type=Path, nargs="+", required=True, help="the corpus that ranks the new tokens")
    ap.add_argument("--size", type=int, default=0, help="rows in all (0: every text token)")
    ap.add_argument("--rows", choices=("embeddings", "fitted"), default="embeddings")
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args()
    meta = json.loads((a.draft / DRAFT_META).read_text())
    weights = load_file(str(a.draft / "draft.safetensors"))
    target = load_target(meta["target"], "cpu")
    emb = target.net.model.decoder.embed_tokens.weight.detach().float()
    ids, head = meta["head_ids"], weights["head.weight"].float()
    have = set(ids)
    ranked = [t for t in ranked_text_tokens(target, [], tuple(a.text)) if t not in have]
    new = ranked + [t for t in range(target.vocab.eot) if t not in have and t not in set(ranked)]
    new = new if a.size == 0 else new[: max(0, a.size - len(ids))]
    source = emb
    if a.rows == "fitted":
        source = torch.cat([emb, emb.new_ones(len(emb), 1)], 1) @ fitted_map(emb[torch.tensor(ids)], head)
    rows = dict(zip(ids, head))
    meta["head_ids"] = sorted(have | set(new))
    weights["head.weight"] = torch.stack([rows[t] if t in rows else source[t] for t in meta["head_ids"]]).to(
        weights["head.weight"].dtype)
    a.out.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in weights.items()}, str(a.out / "draft.safetensors"), metadata={"format": "pt"})
    (a.out / DRAFT_META).write_text(json.dumps(meta, indent=1))
    for name in ("README.md", "report.json"):
        if (a.draft / name).exists():
            shutil.copy(a.draft / name, a.out / name)
    with open(a.out / "README.md", "a") as f:
        f.write(f"\nServed with its output layer widened untrained from {len(ids)} to {len(meta['head_ids'])} rows "
                f"(new rows: the target's {a.rows}): `python eval/experiments/widen_head.py`.\n")
    print(f"{a.out}: {len(ids)} -> {len(meta['head_ids'])} rows ({a.rows})")


if __name__ == "__main__":
    main()
