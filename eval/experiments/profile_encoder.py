"""Where the encoder's time goes at each compute type, against what this CPU's products reach (issue 49, item 5).

One padded 30 s window (or ``--batch`` of them) through the target's encoder, timed (median of ``--rounds``) and
profiled: its time split by kind of operation (matrix products, attention, convolutions, GELU, layer norms, the rest:
residual additions, dtype conversions and int8 layers' activation scaling), each kind's GFLOPS from whisper's shapes,
against the attainable peak of this CPU's products at the type (a large product timed alone, the best of the rounds).
*attention* is the time inside ``network.attend``, whichever way it computes: PyTorch's fused kernel, or (bfloat16 on
a CPU without AMX) bfloat16 products per block of queries. Then one layer's attention both ways, timed alone.

    python eval/experiments/profile_encoder.py [--types float32,bfloat16,int8_float32,int8_bfloat16] [--batch 1]
                                               [--threads 2] [--rounds 5] [--model whisper-base] [--out DIR]
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile, record_function

from asr_spec.evaluation.provenance import cpu_name, provenance
from asr_spec.models import network
from asr_spec.models.loader import load_target

KINDS = {  # profiler op name -> kind; what is not here is "the rest"
    "aten::addmm": "products", "aten::mm": "products", "quantized::linear_dynamic": "products",
    "aten::mkldnn_convolution": "convolutions", "aten::gelu": "GELU", "aten::native_layer_norm": "layer norms",
}


def median_s(fn, rounds: int, best: bool = False) -> float:
    """The median (``best``: the least) of ``rounds`` timed calls after one untimed."""
    fn()
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times) if best else statistics.median(times)


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
    """GFLOPS of a [1500, 2048] x [2048, 2048] product at the type, the best of ``rounds`` (int8: the int8 layers' kernel)."""
    from asr_spec.models.linear import Int8
    x, w = torch.randn(1500, 2048), torch.randn(2048, 2048)
    if precision.int8:
        layer = Int8(w)
        kernel = lambda: torch.ops.quantized.linear_dynamic(x, layer.packed, True)  # noqa: E731
    else:
        xt, wt = x.to(precision.float), w.to(precision.float)
        kernel = lambda: torch.mm(xt, wt)  # noqa: E731
    return 2 * 1500 * 2048 * 2048 / median_s(kernel, rounds, best=True) / 1e9


def attention_ways(dtype: torch.dtype, batch: int, heads: int, positions: int, dim: int, rounds: int,
                   block: int = network.BLOCK) -> dict[str, float]:
    """Milliseconds of one layer's self-attention: the fused kernel, and two products per block of queries."""
    q, k, v = (torch.randn(batch, heads, positions, dim).to(dtype) for _ in range(3))
    fused = lambda: F.scaled_dot_product_attention(q, k, v, scale=1.0)  # noqa: E731
    blocked = lambda: network.blocked_attention(q, k, v, block=block)  # noqa: E731
    return {"fused kernel": 1e3 * median_s(fused, rounds),
            f"products in blocks of {block} queries": 1e3 * median_s(blocked, rounds)}


def timed_attention(attend):
    """``network.attend`` inside a profiler range named "attention" (whichever way it computes)."""
    def wrapped(*args, **kwargs):
        with record_function("attention"):
            return attend(*args, **kwargs)
    return wrapped


def split(events) -> dict[str, float]:
    """Self CPU seconds by kind: everything inside an "attention" range is attention, the rest by ``KINDS``."""
    out: dict[str, float] = {}

    def walk(event) -> None:
        if event.name == "attention":
            out["attention"] = out.get("attention", 0.0) + event.cpu_time_total / 1e6
            return
        kind = KINDS.get(event.name, "the rest")
        out[kind] = out.get(kind, 0.0) + event.self_cpu_time_total / 1e6
        for child in event.cpu_children:
            walk(child)
    for event in events:
        if event.cpu_parent is None:
            walk(event)
    return out


@torch.inference_mode()
def profile_type(name: str, batch: int, rounds: int, model: str) -> dict:
    target = load_target(model, compute_type=name)
    frames = 3000
    mel = torch.randn(batch, target.n_mels, frames)
    seconds = median_s(lambda: target.encode(mel), rounds)
    attend = network.attend
    network.attend = timed_attention(attend)
    try:
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range(rounds):
                target.encode(mel)
    finally:
        network.attend = attend
    by_kind = split(prof.events())
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


def summary(row: dict) -> str:
    """One type's line: seconds a window, GFLOPS against the peak, and each kind's share."""
    kinds = ", ".join(f"{kind} {100 * k['share']:.0f} %" + (f" ({k['gflops']:.0f} GFLOPS)" if k["gflops"] else "")
                      for kind, k in row["kinds"].items())
    fused, blocked = row["attention_ms_per_layer"].values()
    return (f"{row['type']}: {row['s_per_window']:.3f} s a window, {row['gflops']:.0f} GFLOPS (products alone: "
            f"{row['peak_gflops']:.0f}); {kinds}; attention a layer {fused:.1f} ms fused, {blocked:.1f} ms in blocks")


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
    print(f"{cpu_name()}, {a.threads} threads, {a.model}, batch {a.batch}, medians of {a.rounds}")
    for row in rows:
        print(summary(row))
    if a.out:
        a.out.mkdir(parents=True, exist_ok=True)
        (a.out / "results.json").write_text(json.dumps({
            "provenance": provenance(a.threads), "model": a.model, "batch": a.batch, "rounds": a.rounds,
            "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
