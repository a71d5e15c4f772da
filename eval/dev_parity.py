"""Target-only vs speculative greedy on the whole dev set (65 utterances + the long-form file).

    python eval/dev_parity.py [--draft layers:0,5] [--k 4] [--dev ../shared/data/dev] [--out eval/results]

Prints one table and writes it as JSON. Both systems run in this one process, on the same audio, one
file at a time, with the same thread count; WER uses Whisper's English normaliser.
"""
from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

import jiwer
import torch
from tqdm import tqdm
from whisper_normalizer.english import EnglishTextNormalizer

from asr_spec.audio import load_audio
from asr_spec.models.loader import load_draft, load_target
from asr_spec.transcribe import TranscribeOptions, Transcriber

ROOT = Path(__file__).resolve().parents[1]


def items(dev: Path) -> list[dict]:
    rows = [json.loads(x) | {"dir": dev} for x in (dev / "manifest.jsonl").read_text().splitlines() if x.strip()]
    long = [json.loads(x) | {"dir": dev / "longform"} for x in (dev / "longform" / "manifest.jsonl").read_text().splitlines() if x.strip()]
    return rows + long


def run(tr: Transcriber, data: list[dict], audio: dict, use_draft: bool, k: int, label: str) -> dict:
    opts = TranscribeOptions(k=k)
    out = {}
    for it in tqdm(data, desc=label, unit="file"):
        t0 = time.perf_counter()
        t = tr.transcribe(audio[it["id"]], opts, use_draft=use_draft)
        out[it["id"]] = {"text": t.text, "tokens": [s.tokens for s in t.segments], "wall": time.perf_counter() - t0,
                         **t.stats.as_dict()}
    return out


def summary(res: dict, data: list[dict], ids: list[str]) -> dict:
    norm = EnglishTextNormalizer()
    refs = [norm(next(d["text"] for d in data if d["id"] == i)) for i in ids]
    hyps = [norm(res[i]["text"]) for i in ids]
    tot = lambda key: sum(res[i][key] for i in ids)  # noqa: E731
    judged = tot("accepted") + tot("rejected")
    return {"files": len(ids), "wer": round(100 * jiwer.wer(refs, hyps), 2), "audio_s": round(tot("audio_seconds"), 1),
            "encoder_s": round(tot("encoder_seconds"), 2), "decode_s": round(tot("decode_seconds"), 2),
            "wall_s": round(tot("wall"), 2), "tokens": tot("tokens"), "target_passes": tot("target_passes"),
            "drafted": tot("drafted"), "accepted": tot("accepted"),
            "acceptance_alpha": round(tot("accepted") / judged, 4) if judged else None,
            "tokens_per_pass": round((tot("accepted") + tot("target_passes")) / tot("target_passes"), 3)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--draft", default="layers:0,5")
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--dev", type=Path, default=ROOT.parent / "shared" / "data" / "dev")
    ap.add_argument("--limit", type=int, default=0, help="first N utterances only (0 = all)")
    ap.add_argument("--out", type=Path, default=ROOT / "eval" / "results")
    args = ap.parse_args()

    target = load_target()
    tr = Transcriber(target, load_draft(args.draft, target))
    data = items(args.dev)
    if args.limit:
        data = data[: args.limit] + data[-1:]
    audio = {it["id"]: load_audio(it["dir"] / it["audio"]) for it in data}
    base = run(tr, data, audio, False, 0, "target-only")
    spec = run(tr, data, audio, True, args.k, f"speculative K={args.k}")
    long_ids = [data[-1]["id"]]
    short_ids = [it["id"] for it in data[:-1]]
    report = {"date": time.strftime("%Y-%m-%d"), "machine": platform.processor() or platform.machine(),
              "threads": torch.get_num_threads(), "draft": args.draft, "k": args.k,
              "exact_match": sum(base[i]["tokens"] == spec[i]["tokens"] for i in base), "files": len(base)}
    for name, ids in (("utterances", short_ids), ("longform", long_ids)):
        b, s = summary(base, data, ids), summary(spec, data, ids)
        report[name] = {"target": b, "speculative": s, "decode_speedup": round(b["decode_s"] / s["decode_s"], 3),
                        "wall_speedup": round(b["wall_s"] / s["wall_s"], 3)}
    report["differing_ids"] = [i for i in base if base[i]["tokens"] != spec[i]["tokens"]]
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"dev_parity_{args.draft.replace(':', '_').replace(',', '-')}_k{args.k}.json"
    path.write_text(json.dumps(report, indent=1))
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
