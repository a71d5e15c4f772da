"""Streaming WER and engine time of one engine setting: how the streaming encoder's defaults were chosen.

    python eval/experiments/stream_settings.py NAME [field=value ...] [--limit 65] [--long 120] [--threads 2] [--compute-type int8]
        [--texts FILE] [--dev DIR]

``field=value``: an ``EngineConfig`` field (``lookahead_s=2.0``, ``pad_s=3.0``, ``alignment=decode``,
``encoder_window=audio``); ``stream.field=value`` a ``StreamConfig`` one, ``policy.field=value`` one of its commit
policy's (``policy.min_probability=0.9``). The dev utterances (the first ``--limit``)
and the first ``--long`` seconds of the long-form talk are streamed through one engine in 0.5 s chunks at the default
fixed step (as ``eval/bench_streaming.py``'s WER part), int8 unless told. Prints one JSON line: dev WER against the references,
engine seconds per stream second, padded-window retries, and the long-form stream's WER against the offline text of
the same audio (``asr_spec transcribe``'s, at the same type). Appends it to ``eval/out/stream_settings.jsonl``.
"""
from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path

import torch

from asr_spec.evaluation.harness import add_data_args, data, longform
from asr_spec.evaluation.metrics import wer
from asr_spec.models.loader import ModelOptions, load
from asr_spec.streaming.config import EngineConfig, StreamConfig
from asr_spec.streaming.engine import Engine, stream_audio
from asr_spec.transcribe import TranscribeOptions, Transcriber

ROOT = Path(__file__).resolve().parents[2]


def value(text: str) -> object:
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return {"true": True, "false": False}.get(text.lower(), text)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("name")
    ap.add_argument("settings", nargs="*", help="field=value (EngineConfig) or stream.field=value (StreamConfig)")
    ap.add_argument("--limit", type=int, default=65)
    ap.add_argument("--long", type=float, default=120.0, help="seconds of the long-form talk (0: none)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--compute-type", default="int8", help="the decoders' type (default int8: the settings' runs)")
    ap.add_argument("--texts", type=Path, help="also write each dev utterance's streamed text here (JSON)")
    add_data_args(ap)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    fields = dict(s.split("=", 1) for s in args.settings)
    engine_fields = {k: value(v) for k, v in fields.items() if not k.startswith(("stream.", "policy."))}
    stream = StreamConfig(**{k.removeprefix("stream."): value(v) for k, v in fields.items() if k.startswith("stream.")})
    stream = replace(stream, policy=replace(stream.policy, **{k.removeprefix("policy."): value(v)
                                                              for k, v in fields.items() if k.startswith("policy.")}))
    target, draft = load(ModelOptions(compute_type=args.compute_type))
    tr = Transcriber(target, draft)
    engine = Engine(tr, EngineConfig(**engine_fields))
    dev = data(args, args.limit)
    hyps, stats, seconds = [], [], 0.0
    for it in dev.items:
        audio = dev.audio(it)
        seconds += len(audio) / 16000
        events = stream_audio(engine, audio, stream, stats=stats)
        hyps.append("".join(e.join + e.text for e in events if e.type == "final"))
    if args.texts:
        args.texts.write_text(json.dumps(dict(zip((it["id"] for it in dev.items), hyps)), indent=1))
    out = {"name": args.name, "settings": fields, "dev_files": len(dev.items),
           "dev_wer": round(wer(dev.texts(), hyps), 2),
           "engine_s_per_stream_s": round(engine.busy_s / seconds, 3),
           "padded_retries": sum(s.fallbacks for s in stats), "decodes": sum(s.decodes for s in stats)}
    if args.long:
        talks = longform(args)
        audio = talks.audio(talks.items[0])[: int(args.long * 16000)]
        engine.busy_s, stats = 0.0, []
        events = stream_audio(engine, audio, stream, stats=stats)
        streamed = "".join(e.join + e.text for e in events if e.type == "final")
        offline = tr.transcribe(audio, TranscribeOptions(language="en")).text
        out |= {"long_s": args.long, "long_wer_vs_offline": round(wer([offline], [streamed]), 2),
                "long_engine_s_per_stream_s": round(engine.busy_s / (len(audio) / 16000), 3)}
    print(json.dumps(out), flush=True)
    log = ROOT / "eval" / "out" / "stream_settings.jsonl"
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("a") as f:
        f.write(json.dumps(out) + "\n")


if __name__ == "__main__":
    main()
