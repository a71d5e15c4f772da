"""Where does a draft disagree with the target, and on what speech? Teacher-forced over the target's own greedy
tokens (English, timestamps, one 30 s window per clip): at every position, is the draft's argmax the target's token,
counted per corpus and per kind of token (a text token its shortlist has, one it lacks, a timestamp that closes a
segment, one that opens the next, the end). For the tokens a shortlist lacks, also whether the target's tied output
layer over the draft's hidden state would pick them (what ``CachedDecoder.rest`` scores on CUDA).

    python eval/experiments/draft_misses.py [--manifest FILE] [--sample N | --held-aside] [--seed S] [--draft DIR]
                                            [--long-form] [--compute-type float32] [--threads 2] [--out FILE.json]

Labels are the target's decode of the audio, so any manifest works, references or not: the dev set (measured, never
trained on) or clips of ``../shared/data/train/audio/manifest.jsonl`` (``--sample``: that many, drawn per corpus in
proportion, English only), the draft's own kind of speech; ``--held-aside``: the English clips ``asr_spec distill``
holds aside by id (about 1 in 16: speech of the training kinds the draft was not trained on, though a clip's
no-timestamp example may have been).

``--long-form`` (recordings of any length, e.g. the dev set's ``recordings/manifest.jsonl``): each file goes
through the product's own window loop as ``asr_spec transcribe`` runs it by default (the target alone, greedy with
Whisper's temperature fallback, timestamps, the language detected, each window prompted with the previous windows'
text), one file at a time, and every window it decodes greedily (those its checks then sent to a higher temperature
too; not the sampled decodes) is teacher-forced as above over the exact prompt the loop gave it, the target's tokens
and the end (the draft reading the whole 30 s window, as above; the product's reads a short last window's audio and
1 s after it). Text tokens the shortlist has are split further: a window's first 3 text tokens after a previous-text
prompt, its first 3 with no prompt (a file's first window, or after a hot fallback), and the rest ("text"). Rows per
corpus, per file (its id) and "all".
"""
from __future__ import annotations

import argparse
import random
from collections import Counter, defaultdict
from pathlib import Path
from typing import NamedTuple

import torch

from asr_spec.audio import AudioFile
from asr_spec.decoding.rows import SAMPLE_LEN, RowRequest, RowResult
from asr_spec.distill.data import held_aside
from asr_spec.evaluation.harness import add_data_args, data, write_results
from asr_spec.features import log_mel, window
from asr_spec.models.loader import default_draft, load_draft, load_target, outside
from asr_spec.models.pair import Pair
from asr_spec.transcribe import TranscribeOptions, Transcriber

KINDS = ("text", "text outside the shortlist", "timestamp closing a segment", "timestamp opening a segment", "end")
TOP = (2, 4)  # a missed token: is the target's among the draft's best 2 / 4 (of its kind: timestamps, text)
FIRST = 3  # a window's first text tokens, counted apart in long-form mode
PROMPTED, UNPROMPTED = f"first {FIRST} text tokens after a previous-text prompt", f"first {FIRST} text tokens, no prompt"
LONG_KINDS = (PROMPTED, UNPROMPTED, *KINDS)


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


class Tally:
    """Teacher-forced agreement of the draft, counted per group and kind of token."""

    def __init__(self, target, draft):
        self.dec, self.vocab, self.max_positions = draft.decoder, target.vocab, target.decoder.max_positions
        ids = self.dec.head_ids
        self.shortlist = None if ids is None else set(ids.tolist())
        self.rest = outside(target, ids)
        self.rest_rows = None if self.rest is None else target.decoder.decoder.embed_tokens.weight[self.rest].float()
        self.n, self.right, self.rest_right = (defaultdict(Counter) for _ in range(3))
        self.said: dict[str, Counter] = defaultdict(Counter)  # a kind's misses: what the draft said

    def force(self, memory: torch.Tensor, prompt: list[int], tokens: list[int], groups: tuple[str, ...],
              prompted: bool | None = None) -> None:
        """Teacher-force the draft (encoder output ``memory`` [1, S, D]) over ``prompt`` + ``tokens`` + the end and
        count its guesses at every position after the prompt (the end only where the decode ended on it, not on its
        room: Whisper's 224 tokens or the decoder's positions). ``prompted`` (long-form): whether ``prompt`` holds
        previous text, which names the kind of the window's first text tokens (None: they are plain text)."""
        v, dec = self.vocab, self.dec
        ended = len(tokens) < SAMPLE_LEN and len(prompt) + len(tokens) <= self.max_positions
        seq = prompt + tokens + ([v.eot] if ended else [])
        logits, hidden = dec(dec.new_cache(memory, len(seq) + 1), torch.tensor([seq[:-1]]),
                             torch.arange(len(seq) - 1)[None], hidden=True)
        guess, said = logits[0].argmax(-1), 0
        for p in range(len(prompt) - 1, len(seq) - 1):
            k = kind(seq[p + 1], seq[p], v, self.shortlist)
            if k == "text" and prompted is not None and said < FIRST:
                k = PROMPTED if prompted else UNPROMPTED
            said += seq[p + 1] < v.eot
            for c in groups:
                self.n[c][k] += 1
                self.right[c][k] += int(guess[p] == seq[p + 1])
                if k != KINDS[1] and k != "end" and guess[p] != seq[p + 1]:
                    self.missed(c, k, logits[0, p], int(guess[p]), seq[p + 1])
                if k == "text outside the shortlist":
                    best = self.rest[int((hidden[0, p].float() @ self.rest_rows.T).argmax())]
                    self.rest_right[c][k] += int(best == seq[p + 1])

    def missed(self, group: str, k: str, logits: torch.Tensor, guess: int, token: int) -> None:
        """A missed token: did the draft say one of the same kind (a timestamp of another time, other text) or not,
        and is the target's among the draft's best TOP of its kind (what a small tree of candidates would verify)?"""
        begin = self.vocab.timestamp_begin
        stamp = k.startswith("timestamp")
        best = (logits[begin:].float().topk(max(TOP)).indices + begin) if stamp else \
            logits[:self.vocab.eot].float().topk(max(TOP)).indices
        said = self.said[f"{group}\0{k}"]
        same = guess >= begin if stamp else guess < self.vocab.eot
        said[f"said {'a timestamp' if stamp else 'text'} (another)" if same else "said another kind"] += 1
        for top in TOP:
            said[f"target's among its best {top}"] += int(token in best[:top].tolist())

    def table(self, groups: list[str], kinds: tuple[str, ...]) -> dict:
        n, right = self.n, self.right
        return {c: {"positions": sum(n[c].values()), "agree": round(100 * sum(right[c].values()) / sum(n[c].values()), 1),
                    "kinds": {k: {"positions": n[c][k], "agree": right[c][k], "misses": n[c][k] - right[c][k],
                                  **({"target_layer_picks_it": self.rest_right[c][k]} if k == KINDS[1] else {}),
                                  **({"misses_the_draft": dict(self.said[f"{c}\0{k}"])} if self.said[f"{c}\0{k}"] else {})}
                              for k in kinds if n[c][k]}}
                for c in groups if n[c]}


class Window(NamedTuple):
    """One decode of the window loop: the window's encoder outputs, the request (prompt) the loop made, its result."""
    memory: Pair[torch.Tensor]
    request: RowRequest
    result: RowResult
    temperature: float


class Windows(Transcriber):
    """The product's window loop, keeping every decode it makes (``Transcriber.decoded``, the hook distillation's
    labels use) with the encoder outputs of its window (the latest ``encode``: one file at a time)."""

    def __init__(self, target, draft):
        super().__init__(target, draft)
        self.windows: list[Window] = []
        self._encoded: Pair[torch.Tensor] | None = None

    def encode(self, mel: torch.Tensor) -> Pair[torch.Tensor]:
        self._encoded = super().encode(mel)
        return self._encoded

    def decoded(self, memory: torch.Tensor, request: RowRequest, result: RowResult, temperature: float) -> None:
        assert self._encoded is not None and memory.data_ptr() == self._encoded.target.data_ptr()
        self.windows.append(Window(self._encoded, request, result, temperature))


def print_table(table: dict) -> None:
    for c, row in table.items():
        misses = ", ".join(f"{k} {v['misses']}/{v['positions']}" for k, v in row["kinds"].items())
        print(f"{c}: {row['agree']} % of {row['positions']} positions; misses: {misses}")
        for k, v in row["kinds"].items():
            if v.get("misses_the_draft"):
                print(f"  {k}, missed: " + ", ".join(f"{n} {m}" for n, m in v["misses_the_draft"].items()))


def long_form(ds, items: list[dict], target, draft) -> tuple[dict, dict]:
    """Every greedy window decode of each file's window loop, teacher-forced: (by corpus, by file)."""
    tr, tally, files = Windows(target, draft), Tally(target, draft), {}
    for i, it in enumerate(items):
        tr.windows = []
        transcript = tr.transcribe(AudioFile(ds.audio_path(it)), TranscribeOptions(), use_draft=False)
        greedy = [w for w in tr.windows if w.temperature == 0.0]
        for w in greedy:
            tally.force(w.memory.draft, w.request.prompt, w.result.tokens, (it["id"], it.get("corpus", "?"), "all"),
                        prompted=w.request.sot_index > 0)
        files[it["id"]] = {"decodes": len(tr.windows), "greedy": len(greedy),
                           "with previous text": sum(w.request.sot_index > 0 for w in greedy),
                           "windows kept": transcript.stats.windows, "text": transcript.text}
        print(f"{i + 1}/{len(items)} files: {it['id']}: {transcript.stats.windows} windows kept of {len(tr.windows)} "
              f"decodes, {len(greedy)} greedy ({files[it['id']]['with previous text']} after previous text)", flush=True)
    corpora = sorted({it.get("corpus", "?") for it in items}) + ["all"]
    by_file = tally.table(list(files), LONG_KINDS)
    for key, row in by_file.items():
        row["windows"] = files[key]
    return tally.table(corpora, LONG_KINDS), by_file


def windows_of_clips(ds, items: list[dict], target, draft) -> dict:
    """One 30 s window per clip: by corpus."""
    tr, tally = Transcriber(target, draft), Tally(target, draft)
    prompt = tr.prompt([], "en", "transcribe", True)
    for start in range(0, len(items), 8):
        batch = items[start:start + 8]
        mem = tr.encode(torch.stack([window(log_mel(ds.audio(it)), 0) for it in batch]))
        for j, it in enumerate(batch):
            pair = Pair(mem.target[j:j + 1], mem.draft[j:j + 1])
            tokens = tr.decode(pair, [prompt], 0.0, True, k=0, use_draft=False)[0].tokens
            tally.force(pair.draft, prompt.prompt, tokens, (it.get("corpus", "?"), "all"))
        print(f"{start + len(batch)}/{len(items)} clips", flush=True)
    return tally.table(sorted(tally.n, key=lambda c: (c == "all", c)), KINDS)


@torch.inference_mode()
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_data_args(ap)
    ap.add_argument("--sample", type=int, default=0, help="this many clips of the manifest (0: all)")
    ap.add_argument("--held-aside", action="store_true", help="only the clips distill holds aside")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--draft", default=None, help="default: the shipped draft")
    ap.add_argument("--long-form", action="store_true",
                    help="recordings of any length: every window of asr_spec transcribe's loop (previous-text prompts)")
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
    by_file = None
    if a.long_form:
        table, by_file = long_form(ds, items, target, draft)
        print_table(by_file)
    else:
        table = windows_of_clips(ds, items, target, draft)
    print_table(table)
    if a.out:
        write_results(a.out, {"manifest": f"{ds.path.parent.name}/{ds.path.name}", "clips": len(items), "held_aside": a.held_aside,
                              "long_form": a.long_form, "draft": a.draft or "the shipped draft (asr_spec/drafts/whisper-base)",
                              "compute_type": a.compute_type, "by_corpus": table,
                              **({"by_file": by_file} if by_file is not None else {})}, a.threads)


if __name__ == "__main__":
    main()
