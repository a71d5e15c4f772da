"""Where does a draft disagree with the target, and on what speech? Teacher-forced over the target's own greedy
tokens (English, timestamps, one 30 s window per clip): at every position, is the draft's argmax the target's token,
counted per corpus and per kind of token (a text token its shortlist has, one it lacks, a timestamp that closes a
segment, one that opens the next, the end). For the tokens a shortlist lacks, also whether the target's tied output
layer over the draft's hidden state would pick them (what ``CachedDecoder.rest`` scores on CUDA).

    python eval/experiments/draft_misses.py [--manifest FILE] [--sample N | --held-aside] [--seed S] [--draft DIR]
                                            [--compute-type float32] [--threads 2] [--out FILE.json]

Labels are the target's decode of the audio, so any manifest works, references or not: the dev set (measured, never
trained on) or clips of ``../shared/data/train/audio/manifest.jsonl`` (``--sample``: that many, drawn per corpus in
proportion, English only), the draft's own kind of speech; ``--held-aside``: the English clips ``asr_spec distill``
holds aside by id (about 1 in 16: speech of the training kinds the draft was not trained on, though a clip's
no-timestamp example may have been).
"""
from __future__ import annotations

import argparse
import random
from collections import Counter, defaultdict
from pathlib import Path

import torch

from asr_spec.distill.data import held_aside
from asr_spec.evaluation.harness import add_data_args, data, write_results
from asr_spec.features import log_mel, window
from asr_spec.models.loader import default_draft, load_draft, load_target, outside
from asr_spec.models.pair import Pair
from asr_spec.transcribe import Transcriber

KINDS = ("text", "text outside the shortlist", "timestamp closing a segment", "timestamp opening a segment", "end")


def kind(token: int, previous: int, vocab, shortlist: set[int] | None) -> str:
    if token == vocab.eot:
        return "end"
    if token >= vocab.timestamp_begin:
        return "timestamp closing a segment" if previous < vocab.eot else "timestamp opening a segment"
    return "text" if shortlist is None or token in shortlist else "text outside the shortlist"


def sample(items: list[dict], n: int, seed: int) -> list[dict]:
    """``n`` English items, each corpus in proportion to its share (at least one each)."""
    by = defaultdict(list)
    for it in items:
        if it.get("language", "en") == "en":
            by[it.get("corpus", "?")].append(it)
    total, rng = sum(len(v) for v in by.values()), random.Random(seed)
    return [it for c in sorted(by) for it in rng.sample(by[c], max(1, round(n * len(by[c]) / total)))]


@torch.inference_mode()
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_data_args(ap)
    ap.add_argument("--sample", type=int, default=0, help="this many clips of the manifest (0: all)")
    ap.add_argument("--held-aside", action="store_true", help="only the clips distill holds aside")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--draft", default=None, help="default: the shipped draft")
    ap.add_argument("--compute-type", default="float32")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path, default=None)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    ds = data(a)
    items = [it for it in ds.items if it.get("language", "en") == "en" and held_aside(f"{Path(it['audio']).stem}@0")] \
        if a.held_aside else sample(ds.items, a.sample, a.seed) if a.sample else ds.items
    target = load_target("whisper-base", compute_type=a.compute_type)
    draft = load_draft(a.draft or default_draft("whisper-base"), target)
    tr, dec, vocab = Transcriber(target, draft), draft.decoder, target.vocab
    ids = dec.head_ids
    shortlist = None if ids is None else set(ids.tolist())
    rest = outside(target, ids)
    rest_rows = None if rest is None else target.decoder.decoder.embed_tokens.weight[rest].float()
    prompt = tr.prompt([], "en", "transcribe", True)
    n, right, rest_right = (defaultdict(Counter) for _ in range(3))
    for start in range(0, len(items), 8):
        batch = items[start:start + 8]
        mem = tr.encode(torch.stack([window(log_mel(ds.audio(it)), 0) for it in batch]))
        for j, it in enumerate(batch):
            pair = Pair(mem.target[j:j + 1], mem.draft[j:j + 1])
            tokens = tr.decode(pair, [prompt], 0.0, True, k=0, use_draft=False)[0].tokens
            seq = prompt.prompt + tokens + [vocab.eot]
            logits, hidden = dec(dec.new_cache(pair.draft, len(seq) + 1), torch.tensor([seq]),
                                 torch.arange(len(seq))[None], hidden=True)
            guess = logits[0].argmax(-1)
            corpus = it.get("corpus", "?")
            for p in range(len(prompt.prompt) - 1, len(seq) - 1):
                k = kind(seq[p + 1], seq[p], vocab, shortlist)
                for c in (corpus, "all"):
                    n[c][k] += 1
                    right[c][k] += int(guess[p] == seq[p + 1])
                    if k == "text outside the shortlist":
                        best = rest[int((hidden[0, p].float() @ rest_rows.T).argmax())]
                        rest_right[c][k] += int(best == seq[p + 1])
        print(f"{start + len(batch)}/{len(items)} clips", flush=True)
    table = {c: {"positions": sum(n[c].values()), "agree": round(100 * sum(right[c].values()) / sum(n[c].values()), 1),
                 "kinds": {k: {"positions": n[c][k], "agree": right[c][k], "misses": n[c][k] - right[c][k],
                               **({"target_layer_picks_it": rest_right[c][k]} if k == KINDS[1] else {})}
                           for k in KINDS if n[c][k]}}
             for c in sorted(n, key=lambda c: (c == "all", c))}
    for c, row in table.items():
        misses = ", ".join(f"{k} {v['misses']}/{v['positions']}" for k, v in row["kinds"].items())
        print(f"{c}: {row['agree']} % of {row['positions']} positions; misses: {misses}")
    if a.out:
        write_results(a.out, {"manifest": f"{ds.path.parent.name}/{ds.path.name}", "clips": len(items), "held_aside": a.held_aside,
                              "draft": a.draft or "the shipped draft (asr_spec/drafts/whisper-base)",
                              "compute_type": a.compute_type, "by_corpus": table}, a.threads)


if __name__ == "__main__":
    main()
