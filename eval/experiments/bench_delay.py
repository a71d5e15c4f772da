"""What the OpenAI Realtime ``delay`` levels cost and buy: the dev set streamed through the engine at each level
(server/realtime_events.py ``DELAYS``: AlignAtt's margins), as serve streams it (its compute type, step and draft,
a fixed step so that the text does not depend on the machine's speed), 0.5 s of audio at a time with instant
decoding. For each level: WER against the references, and the commit lag of the words that finals bring while audio
still arrives (how much audio had arrived after a word's end, by Whisper's word alignment, when its final was sent:
the latency a client sees on top of the decoding time).

    python eval/experiments/bench_delay.py --threads 2 [--limit N] [--dev DIR]
    # writes eval/results/realtime-delay/results.{json,md}
"""
from __future__ import annotations

import argparse
import statistics
from dataclasses import replace
from pathlib import Path

import torch
from asr_spec.server.realtime_events import DELAYS, Settings
from asr_spec.server.settings import ServeSettings

from asr_spec.evaluation.harness import add_data_args, data, write_results
from asr_spec.evaluation.metrics import wer
from asr_spec.models.loader import ModelOptions, load
from asr_spec.recognizer import Recognizer
from asr_spec.streaming.config import EngineConfig
from asr_spec.streaming.engine import Engine
from asr_spec.streaming.policy import AlignAtt

ROOT = Path(__file__).resolve().parents[2]
SERVE = ServeSettings()  # serve's own settings (its defaults, or ASR_SPEC_* as serve would read them)
CHUNK_S = 0.5


def stream(engine: Engine, audio, config) -> tuple[str, list[float]]:
    """The stream's text and each committed word's lag (seconds of audio fed after the word's end when its final
    came), for the finals that came before the close."""
    sid, text, lags, step = engine.open(config), "", [], int(CHUNK_S * 16000)
    try:
        for start in range(0, len(audio), step):
            engine.feed(sid, audio[start:start + step])
            fed = min(len(audio), start + step) / 16000
            while engine.poll():
                for e in engine.step().get(sid, []):
                    if e.type == "final" and e.text:
                        text += e.join + e.text
                        lags += [fed - w.end for w in e.words or []]
        engine.flush(sid, close=True)
        while engine.poll():
            text += "".join(e.join + e.text for e in engine.step().get(sid, []) if e.type == "final")
    finally:
        engine.close(sid)
    return text, lags


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--limit", type=int, default=0, help="dev utterances (0: all)")
    ap.add_argument("--out", default=str(ROOT / "eval" / "results" / "realtime-delay" / "results"))
    add_data_args(ap)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    target, draft = load(ModelOptions(compute_type=SERVE.compute_type))
    dev = data(args, args.limit)
    items, audios = dev.items, [dev.audio(it) for it in dev.items]
    results = {"compute_type": target.precision.name, "step_s": SERVE.step,
               "policy": "alignatt", "utterances": len(items), "levels": {}}
    for level, delay in DELAYS.items():
        engine = Engine(Recognizer(target, draft), EngineConfig(max_batch=SERVE.batch(), max_step_s=0.0))
        config = replace(Settings(language="en", delay=level).stream(SERVE.step, AlignAtt()), word_timestamps=True)
        texts, lags = [], []
        for audio in audios:
            text, lag = stream(engine, audio, config)
            texts.append(text)
            lags += lag
        lags.sort()
        row = {"margin_s": delay.margin_s, "sure_probability": delay.min_probability,
               "unsure_margin_s": delay.unsure_margin_s, "wer": round(wer(dev.texts(), texts), 2),
               "words_before_the_end": len(lags),
               "commit_lag_median_s": round(statistics.median(lags), 2) if lags else None,
               "commit_lag_p90_s": round(lags[int(0.9 * (len(lags) - 1))], 2) if lags else None,
               "engine_busy_s": round(engine.busy_s, 1)}
        results["levels"][level] = row
        print(level, row, flush=True)
    out = Path(args.out)
    p = write_results(out.with_suffix(".json"), results, args.threads)["provenance"]
    lines = [f"Realtime `delay` levels: {len(items)} dev utterances streamed at serve's settings ({results['compute_type']}, "
             f"step {SERVE.step} s fixed, AlignAtt), {p['machine']}, {args.threads} threads, {p['date'][:10]}; "
             f"`{p['command']}`", "",
             "| delay | margin s (sure / other words) | sure if p >= | WER % | words committed before the end | "
             "commit lag median / p90 s | engine busy s |", "|---|---|---|---|---|---|---|"]
    for level, r in results["levels"].items():
        lines.append(f"| {level} | {r['margin_s']} / {r['unsure_margin_s']} | {r['sure_probability']} | {r['wer']} | "
                     f"{r['words_before_the_end']} | {r['commit_lag_median_s']} / {r['commit_lag_p90_s']} | "
                     f"{r['engine_busy_s']} |")
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print(f"wrote {out}.json and .md")


if __name__ == "__main__":
    main()
