"""Where a speculative decode's time goes besides the decoder forwards: cProfile over `transcribe` of the first
N dev-set files with the shipped draft; prints the loop's steps and everything they call directly (cumulative
seconds; cProfile inflates Python-heavy parts) and the number of target passes, to get the per-pass overhead.

    python eval/experiments/profile_loop.py [--files 12] [--threads 2] [--device cuda] [--compute-type float16]
                                 [--dev DIR | --manifest FILE]
"""
from __future__ import annotations

import argparse
import cProfile
import pstats
from pathlib import Path

import torch

from asr_spec.evaluation.harness import add_data_args, data
from asr_spec.models.loader import default_draft, load_draft, load_target
from asr_spec.transcribe import TranscribeOptions, Transcriber

STEPS = ("run", "prefill", "propose", "draft_tokens", "verify", "commit", "finish", "noise")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--files", type=int, default=12)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--compute-type", default="float32")
    add_data_args(ap)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    dev = data(args, args.files)
    target = load_target("whisper-base", args.device, args.compute_type)
    tr = Transcriber(target, load_draft(default_draft("whisper-base"), target))
    audios = [dev.audio(it) for it in dev.items]
    tr.transcribe(audios[0], TranscribeOptions(language="en"))  # warm-up (and the cost model's first tries)
    profile, passes = cProfile.Profile(), 0
    profile.enable()
    for audio in audios:
        passes += tr.transcribe(audio, TranscribeOptions(language="en")).stats.decode.target_passes
    profile.disable()
    stats = pstats.Stats(profile).stats
    print(f"{passes} target passes")
    for (path, _, name), (_, _, _, cum, callers) in sorted(stats.items(), key=lambda kv: -kv[1][3]):
        from_loop = any(c[2] in STEPS and c[0].endswith("speculative.py") for c in callers)
        forward = name == "decorate_context" or (name == "__call__" and path.endswith("kv_decoder.py"))
        if from_loop and not forward:  # the decoders' forwards (inference-mode wrapped) are not overhead
            print(f"{cum:8.3f} s  {cum / passes * 1000:7.2f} ms/pass  {name}  ({Path(path).name})")


if __name__ == "__main__":
    main()
