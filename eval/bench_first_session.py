"""A new server's first live session, with the machine's background measurement pending and without (issue 77).

    python eval/bench_first_session.py [--repeat 3] [--threads 2] [--out eval/results/shared-machine/first-session.json]

``asr_spec serve`` starts on a cache holding only the converted model (what a new machine's first server finds:
``auto``'s type and where the draft pays not measured yet, so it starts ``asr_spec.measure`` in the background), and
the bundled JFK sample is streamed to it at real time as soon as it is listening; then, on the same server once
that measurement has finished, the same stream again. Then a server on the cache that measurement filled (nothing
pending) gets the same two streams. Per stream: the words' final latency (when a word was committed minus when its
audio ended, by the offline transcript's word times) and its median. ``--repeat`` runs the whole in turn.
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from asr_spec.clients.stream import stream_file

from asr_spec.audio import SAMPLE, load_audio
from asr_spec.evaluation.harness import served, write_results
from asr_spec.evaluation.streaming import timed_words, word_latencies
from asr_spec.measure import LOCK
from asr_spec.models.cache import locked
from asr_spec.models.loader import ModelOptions, load
from asr_spec.models.sources import embedded_dir
from asr_spec.transcribe import TranscribeOptions, Transcriber

ROOT = Path(__file__).resolve().parents[1]


def stream(url: str, audio) -> dict:
    log, t0 = [], time.monotonic()
    stream_file(url, audio, 1.0, lambda e: log.append((time.monotonic() - t0, e)))
    return log


def pending(cache: Path) -> bool:
    """Whether the machine's measurement has not finished: ``auto``'s type or the draft widths not kept yet, or a
    measurement still holding the cache's lock."""
    if not list((cache / "auto").glob("*.json")) or not list((cache / "draft-widths").glob("*.json")):
        return True
    with locked(cache / LOCK, timeout=0) as free:
        return not free


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--wait", type=float, default=900.0, help="most seconds to wait for the measurement to finish")
    p.add_argument("--out", type=Path, default=ROOT / "eval/results/shared-machine/first-session.json")
    a = p.parse_args()
    audio = load_audio(SAMPLE)
    model = embedded_dir()  # converted once, in the user's cache
    target, _ = load(ModelOptions(draft=None, threads=a.threads))
    offline = timed_words(Transcriber(target).transcribe(audio, TranscribeOptions(language="en",
                                                                                 word_timestamps=True)).segments)
    runs = []
    for r in range(a.repeat):
        cache = Path(tempfile.mkdtemp(prefix="asr_spec_first_"))
        shutil.copytree(model, cache / model.name)
        os.environ["ASR_SPEC_CACHE"] = str(cache)
        run = {}
        try:
            for mode in ("pending", "measured"):
                with served(["--threads", str(a.threads)]) as server:
                    first = word_latencies(stream(server.ws, audio), offline)["final_latency"]
                    pending_after = pending(cache)
                    deadline = time.monotonic() + a.wait
                    while pending(cache) and time.monotonic() < deadline:
                        time.sleep(1.0)
                    idle = word_latencies(stream(server.ws, audio), offline)["final_latency"]
                run[mode] = {"first_median_s": statistics.median(first), "idle_median_s": statistics.median(idle),
                             "ratio": statistics.median(first) / statistics.median(idle),
                             "measuring_after_first": pending_after, "first": first, "idle": idle}
                print(f"run {r + 1} {mode}: first session final median {run[mode]['first_median_s']:.2f} s, "
                      f"the same stream once idle {run[mode]['idle_median_s']:.2f} s "
                      f"(measurement still pending after the first: {pending_after})", flush=True)
        finally:
            shutil.rmtree(cache, ignore_errors=True)
        runs.append(run)
    summary = {mode: {"first_median_s": statistics.median(r[mode]["first_median_s"] for r in runs),
                      "idle_median_s": statistics.median(r[mode]["idle_median_s"] for r in runs),
                      "ratio_median": statistics.median(r[mode]["ratio"] for r in runs)} for mode in runs[0]}
    write_results(a.out, {"summary": summary, "runs": runs}, a.threads)
    print(summary)


if __name__ == "__main__":
    main()
