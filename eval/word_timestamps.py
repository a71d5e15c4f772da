"""Word timestamps against faster-whisper's on the same weights, and what they cost.

For every utterance of a manifest: asr_spec's speculative transcription with word timestamps, the same without
(the speed cost, same run, alternating order), and faster-whisper (float32, beam 1, word_timestamps=True) on the
CTranslate2 checkpoint our weights are converted from. Words are paired by aligning the two word sequences
(normalised text); reported: median / p90 |start and end difference| over paired words, and checks that our times
are monotonic and inside their segment.

    python eval/word_timestamps.py [--dev DIR | --manifest FILE] [--limit N] [--threads 2] [--out DIR]
"""
from __future__ import annotations

import argparse
import difflib
import json
import re
import statistics
import time
from pathlib import Path

import numpy as np
import torch

from asr_spec.evaluation.harness import add_data_args, data, write_results
from asr_spec.models.loader import default_draft, load_draft, load_target
from asr_spec.models.sources import embedded_ct2_dir
from asr_spec.transcribe import TranscribeOptions, Transcriber


def norm(word: str) -> str:
    return re.sub(r"[^\w']", "", word.lower())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--limit", type=int, default=0)
    ap.add_argument("--out", default="")
    add_data_args(ap)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    dev = data(args, args.limit)
    items, audios = dev.items, [dev.audio(it) for it in dev.items]

    target = load_target()
    tr = Transcriber(target, load_draft(default_draft("whisper-base"), target))
    plain, worded = TranscribeOptions(), TranscribeOptions(word_timestamps=True)
    tr.transcribe(audios[0], worded)  # warm-up
    ours, seconds = [], {"without": [], "with": []}
    for i, audio in enumerate(audios):  # alternate which goes first: this VM drifts
        order = [("without", plain), ("with", worded)] if i % 2 == 0 else [("with", worded), ("without", plain)]
        for name, opts in order:
            t0 = time.perf_counter()
            result = tr.transcribe(audio, opts)
            seconds[name].append(time.perf_counter() - t0)
            if name == "with":
                ours.append(result)

    from faster_whisper import WhisperModel

    fw = WhisperModel(str(embedded_ct2_dir()), device="cpu", compute_type="float32", cpu_threads=args.threads)
    theirs = []
    for audio in audios:
        segments, _ = fw.transcribe(audio, beam_size=1, word_timestamps=True, vad_filter=False)
        theirs.append([w for s in segments for w in s.words])

    deltas, paired, total, bad_order, outside = [], 0, 0, 0, 0
    for mine, other in zip(ours, theirs):
        words = [w for s in mine.segments for w in s.words]
        for s in mine.segments:
            outside += sum(not (s.start - 1e-6 <= w.start <= w.end <= s.end + 1e-6) for w in s.words)
        bad_order += sum(b.start < a.start for a, b in zip(words, words[1:]))
        a, b = [norm(w.word) for w in words], [norm(w.word) for w in other]
        total += len(a)
        for block in difflib.SequenceMatcher(a=a, b=b, autojunk=False).get_matching_blocks():
            for k in range(block.size):
                mw, tw = words[block.a + k], other[block.b + k]
                deltas += [abs(mw.start - tw.start), abs(mw.end - tw.end)]
                paired += 1
    d = np.array(deltas)
    report = {
        "utterances": len(items), "words": total, "paired_with_faster_whisper": paired,
        "median_abs_diff_s": round(float(np.median(d)), 3), "p90_abs_diff_s": round(float(np.percentile(d, 90)), 3),
        "share_within_0.1s": round(float((d <= 0.1).mean()), 3),
        "words_out_of_order": bad_order, "words_outside_their_segment": outside,
        "seconds_without": round(sum(seconds["without"]), 2), "seconds_with": round(sum(seconds["with"]), 2),
        "cost_ratio_median_per_file": round(statistics.median(w / o for w, o in zip(seconds["with"], seconds["without"])), 3),
    }
    report["cost_ratio_total"] = round(report["seconds_with"] / report["seconds_without"], 3)
    print(json.dumps(report, indent=1))
    if args.out:
        write_results(Path(args.out) / "word_timestamps.json", report, args.threads)


if __name__ == "__main__":
    main()
