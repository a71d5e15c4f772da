"""Streams a clip through the engine with random arrival patterns (pieces of 0.2-3 s, a decode after most
pieces, sometimes none) and checks that the streamed words equal the offline transcript: how the streaming
word-loss bugs ("is not" for "ask not", a second "Country.") were found.

    python eval/stream_arrivals.py [--file WAV] [--seeds 40]
"""
from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from asr_spec.audio import load_audio
from asr_spec.evaluation.metrics import normalize
from asr_spec.models.loader import default_draft, load_draft, load_target
from asr_spec.streaming.engine import Engine
from asr_spec.streaming.config import StreamConfig
from asr_spec.transcribe import TranscribeOptions, Transcriber

JFK = Path(__file__).resolve().parents[2] / "shared/data/dev/jfk-inaugural-1961-ask-not.wav"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--file", default=str(JFK))
    ap.add_argument("--seeds", type=int, default=40)
    args = ap.parse_args()
    target = load_target("whisper-base")
    tr = Transcriber(target, load_draft(default_draft("whisper-base"), target))
    audio = load_audio(args.file)
    offline = normalize(tr.transcribe(audio, TranscribeOptions(language="en")).text)
    engine, bad = Engine(tr), 0
    for seed in range(args.seeds):
        rng = np.random.default_rng(seed)
        sid, events, pos = engine.open(StreamConfig()), [], 0
        while pos < len(audio):
            n = int(rng.uniform(0.2, 3.0) * 16000)
            engine.feed(sid, audio[pos:pos + n])
            pos += n
            if engine.poll() and rng.random() < 0.8:
                events += engine.step().get(sid, [])
        engine.flush(sid, close=True)
        while engine.poll():
            events += engine.step().get(sid, [])
        engine.close(sid)
        streamed = " ".join(e.text for e in events if e.type == "final" and e.text)
        if normalize(streamed) != offline:
            bad += 1
            print(f"seed {seed}: {streamed}")
    print(f"{args.seeds - bad}/{args.seeds} arrival patterns give the offline words: {offline}")


if __name__ == "__main__":
    main()
