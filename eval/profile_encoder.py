"""Where the encoder's time goes at each compute type, against what this CPU's products reach (issue 49, item 5).

One padded 30 s window (or ``--batch`` of them) through the target's encoder, timed (median of ``--rounds``) and
profiled: its time split by kind of operation (matrix products, attention, convolutions, GELU, layer norms, the rest:
residual additions, dtype conversions and int8 layers' activation scaling), each kind's GFLOPS from whisper's shapes,
against the attainable peak of this CPU's products at the type (a large product timed alone). Then the attention of
one layer three ways: the fused kernel the encoder uses (``scaled_dot_product_attention``), and the same as two
products per block of queries in the float type (scores rounded to it: faster with bfloat16 products, but it moves the
text, so it is measured here, not taken).

    python eval/profile_encoder.py [--types float32,bfloat16,int8_float32,int8_bfloat16] [--batch 1] [--threads 2]
                                   [--rounds 5] [--model whisper-base] [--out DIR]
"""
from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile

from asr_spec.evaluation.provenance import cpu_name
from asr_spec.models.loader import load_target

KINDS = {  # profiler op name -> kind; what is not here is "the rest"
    "aten::addmm": "products", "aten::mm": "products", "aten::bmm": "products",
    "quantized::linear_dynamic": "products", "aten::_scaled_dot_product_flash_attention_for_cpu": "attention",
    "aten::mkldnn_convolution": "convolutions", "aten::gelu": "GELU", "aten::native_layer_norm": "layer norms",
}


def median_s(fn, rounds: int) -> float:
    fn()
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def flops(config, frames: int, batch: int) -> dict[str, float]:
    """Each kind's floating-point operations (2 per multiply-add) for ``batch`` windows of ``frames`` mel frames."""
    d, f, layers, t, mels = (config.d_model, config.encoder_ffn_dim, config.encoder_layers, frames // 2,
                             config.num_mel_bins)
    return {k: batch * v for k, v in {
        "products": layers * t * 2 * (4 * d * d + 2 * d * f),
        "attention": layers * 2 * 2 * t * t * d,
        "convolutions": 2 * 3 * (mels * d * frames + d * d * t),
    }.items()}


def peak_gflops(precision, rounds: int) -> float:
    """GFLOPS of a [1500, 2048] x [2048, 2048] product at the type (int8: the int8 layer the encoder runs)."""
    from asr_spec.models.linear import Int8
    x, w = torch.randn(1500, 2048), torch.randn(2048, 2048)
    if precision.int8:
        layer = Int8(w)
        kernel = lambda: torch.ops.quantized.linear_dynamic(x, layer.packed, True)  # noqa: E731
    else:
        xt, wt = x.to(precision.float), w.to(precision.float)
        kernel = lambda: torch.mm(xt, wt)  # noqa: E731
    return 2 * 1500 * 2048 * 2048 / median_s(kernel, rounds) / 1e9


def attention_ways(dtype: torch.dtype, batch: int, heads: int, positions: int, dim: int, rounds: int,
                   block: int = 128) -> dict[str, float]:
    """Milliseconds of one layer's self-attention: the fused kernel, and two products per block of queries."""
    q, k, v = (torch.randn(batch, heads, positions, dim).to(dtype) for _ in range(3))
    kt = k.transpose(-1, -2).contiguous()

    def blocked() -> torch.Tensor:
        out = torch.empty_like(q)
        for i in range(0, positions, block):
            out[:, :, i:i + block] = torch.matmul(torch.matmul(q[:, :, i:i + block], kt).softmax(-1), v)
        return out
    return {"fused kernel": 1e3 * median_s(lambda: F.scaled_dot_product_attention(q, k, v, scale=1.0), rounds),
            f"products in blocks of {block} queries": 1e3 * median_s(blocked, rounds)}


@torch.inference_mode()
def profile_type(name: str, batch: int, rounds: int, model: str) -> dict:
    target = load_target(model, compute_type=name)
    frames = 3000
    mel = torch.randn(batch, target.n_mels, frames)
    seconds = median_s(lambda: target.encode(mel), rounds)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(rounds):
            target.encode(mel)
    by_kind: dict[str, float] = {}
    for event in prof.key_averages():
        kind = KINDS.get(event.key, "the rest")
        by_kind[kind] = by_kind.get(kind, 0.0) + event.self_cpu_time_total / 1e6 / rounds
    total = sum(by_kind.values())
    work = flops(target.config, frames, batch)
    c = target.config
    return {
        "type": target.precision.name, "batch": batch, "s_per_window": seconds / batch,
        "gflop_per_window": sum(work.values()) / batch / 1e9,
        "gflops": sum(work.values()) / seconds / 1e9,
        "peak_gflops": peak_gflops(target.precision, rounds),
        "kinds": {kind: {"share": s / total, "s_per_window": seconds * s / total / batch,
                         "gflops": work[kind] / (seconds * s / total) / 1e9 if kind in work else None}
                  for kind, s in sorted(by_kind.items(), key=lambda kv: -kv[1])},
        "attention_ms_per_layer": attention_ways(target.precision.float, batch, c.encoder_attention_heads,
                                                 frames // 2, c.d_model // c.encoder_attention_heads, rounds),
    }


def table(rows: list[dict]) -> str:
    kinds = ["products", "attention", "convolutions", "GELU", "layer norms", "the rest"]
    head = ("| type | s / window | GFLOPS | peak GFLOPS | " + " | ".join(kinds)
            + " | attention a layer: fused / blocked products ms |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        cells = []
        for kind in kinds:
            k = r["kinds"].get(kind)
            if k is None:
                cells.append("—")
                continue
            rate = f", {k['gflops']:.0f} GFLOPS" if k["gflops"] else ""
            cells.append(f"{100 * k['share']:.0f} % ({1e3 * k['s_per_window']:.0f} ms{rate})")
        fused, blocked = r["attention_ms_per_layer"].values()
        lines.append(f"| {r['type']} | {r['s_per_window']:.3f} | {r['gflops']:.0f} | {r['peak_gflops']:.0f} | "
                     + " | ".join(cells) + f" | {fused:.1f} / {blocked:.1f} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--types", default="float32,bfloat16,int8_float32,int8_bfloat16")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--model", default="whisper-base")
    ap.add_argument("--out", type=Path)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    rows = [profile_type(t, a.batch, a.rounds, a.model) for t in a.types.split(",")]
    report = table(rows)
    print(f"{cpu_name()}, {a.threads} threads, {a.model}, batch {a.batch}, medians of {a.rounds}\n\n{report}")
    if a.out:
        a.out.mkdir(parents=True, exist_ok=True)
        (a.out / "results.json").write_text(json.dumps({
            "cpu": cpu_name(), "machine": platform.machine(), "threads": a.threads, "model": a.model,
            "batch": a.batch, "rounds": a.rounds, "torch": torch.__version__, "rows": rows}, indent=1) + "\n")
        (a.out / "report.md").write_text(report + "\n")


if __name__ == "__main__":
    main()
