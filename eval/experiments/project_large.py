"""A projection for large targets: what speculation would buy whisper-large-v3 with a distil-large-v3-shaped draft,
from the measured costs of their shapes (random weights: the arithmetic and memory traffic are the real ones, the
acceptance is not) and the acceptance our whisper-base draft reaches on the dev set.

    python eval/experiments/project_large.py [--compute-type float32,int8] [--threads 2] [--device cpu]
        [--tokens-per-pass 2.4] [--overhead-ms 1.4] [--cuda-graphs] [--out FILE.json]

Builds a Whisper decoder in large-v3's layout (width 1280, 20 heads, 32 decoder layers, vocabulary 51866) and a
2-layer draft of the same width (distil-large-v3's decoder; its output layer the full vocabulary), both as the
decode loop runs them (the target exact, the draft's layers in int8 on a CPU), times a target step (1 new token), a
verify pass (K + 1 = 4 tokens) and a draft step over a 30 s window's encoder output with 40 cached tokens, and
projects the decode speed-up S = E / (v + K d + o), in target steps: E tokens per pass (``--tokens-per-pass``: the
dev set's with our draft at K = 3), v the verify pass, d a draft step, o the loop's own work per pass
(``--overhead-ms``: measured for whisper-base by eval/pass_budget.py; the rules and acceptance run over the same
vocabulary). A projection, not a measurement: the acceptance of distil-large-v3 on this dev set is not known here.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
from transformers import WhisperConfig, WhisperForCausalLM, WhisperForConditionalGeneration

from asr_spec.decoding.static import capture
from asr_spec.evaluation.provenance import provenance
from asr_spec.models.compute import resolve_compute_type
from asr_spec.models.kv_decoder import CachedDecoder

LARGE_V3 = dict(vocab_size=51866, num_mel_bins=128, d_model=1280, decoder_layers=32, decoder_attention_heads=20,
                decoder_ffn_dim=5120, encoder_layers=1, encoder_attention_heads=20, encoder_ffn_dim=5120,
                max_source_positions=1500, max_target_positions=448)
K = 3


def ms(fn, rounds: int = 5, repeat: int = 5) -> float:
    """Median over rounds of the mean ms per call (waiting for the device at each round's end)."""
    fn()
    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    means = []
    for _ in range(rounds):
        sync()
        t0 = time.perf_counter()
        for _ in range(repeat):
            fn()
        sync()
        means.append((time.perf_counter() - t0) / repeat * 1000)
    return statistics.median(means)


@torch.inference_mode()
def measure(compute_type: str, device: str, graphs: bool = False) -> dict:
    p = resolve_compute_type(compute_type, device)
    torch.manual_seed(0)
    cfg = WhisperConfig(**LARGE_V3)
    target_hf = WhisperForConditionalGeneration(cfg).to(device, p.float).eval()
    draft_hf = WhisperForCausalLM(WhisperConfig(**LARGE_V3 | {"decoder_layers": 2})).to(device, p.float).eval()
    cpu = torch.device(device).type == "cpu"
    target = CachedDecoder(target_hf.model.decoder, target_hf.proj_out.weight, int8="rows" if p.int8 else None,
                           exact=True)
    draft = CachedDecoder(draft_hf.model.decoder, draft_hf.proj_out.weight, int8="tensor" if cpu else None,
                          dtype=torch.float32 if cpu else p.float)
    memory = torch.randn(1, 1500, 1280, device=device)
    tokens = torch.randint(0, 50000, (1, 48), device=device)
    pos = torch.arange(48, device=device)[None]
    out = {"compute_type": p.name}
    for name, dec in (("target", target), ("draft", draft)):
        cache = dec.new_cache(memory, 64)
        dec(cache, tokens[:, :40], pos[:, :40])
        widths = (1, K + 1) if name == "target" else (1,)
        for w in widths:
            call = lambda w=w, dec=dec, cache=cache: dec(cache, tokens[:, 40:40 + w], pos[:, 40:40 + w],  # noqa: E731
                                                         static=graphs)
            out[f"{name}_{w}_ms"] = ms(capture(call).replay if graphs else call)
    del target_hf, draft_hf
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--compute-type", default="float32,int8")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--tokens-per-pass", type=float, default=2.4)
    ap.add_argument("--overhead-ms", type=float, default=1.4)
    ap.add_argument("--cuda-graphs", action="store_true",
                    help="time each call replayed as a CUDA graph (the static decode's passes; draft over the whole cache)")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    rows = []
    for ct in args.compute_type.split(","):
        r = measure(ct, args.device, args.cuda_graphs) | {"cuda_graphs": args.cuda_graphs}
        step, verify, d = r["target_1_ms"], r[f"target_{K + 1}_ms"], r["draft_1_ms"]
        r["projected_speedup"] = round(args.tokens_per_pass / ((verify + K * d + args.overhead_ms) / step), 3)
        r |= {"verify_steps": round(verify / step, 3), "draft_steps": round(d / step, 4)}
        rows.append(r)
        print(f"{r['compute_type']:14s} target step {step:7.1f} ms  verify {K + 1} {verify:7.1f} ms ({verify / step:.2f})"
              f"  draft step {d:6.2f} ms ({d / step:.3f})  projected decode speed-up {r['projected_speedup']:.2f}x",
              flush=True)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"provenance": provenance(args.threads, args.device), "layout": LARGE_V3,
                                        "k": K, "tokens_per_pass": args.tokens_per_pass,
                                        "overhead_ms": args.overhead_ms, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
