"""The decoders' linear layers, computed so that a row's result never depends on the other rows of the call.

Speculative == target-only and batch 8 == batch 1 rest on it: a position's numbers must be the same in a 1-token
step, a verify pass of K+1 tokens, a prompt's prefill and beside any other rows of a batch. BLAS libraries pick
their kernel, and with it the order of each output's sums, by the call's shapes, the row count included (torch's
CPU float32 products differ from 2 rows on; cuBLAS's on CUDA; eval/experiments/exact_linear.py). Two ways keep rows apart:

- **fixed blocks**: every call multiplies blocks of exactly ``size`` rows (zero rows added to the last), so every
  call runs the one kernel of that shape and rows, which never mix in a product, keep their bits;
- **a kernel that is row-exact at every count** (torch's bfloat16 products on the CPUs measured here; oneDNN's with
  the weight packed once for one-row calls), the fastest when there is one.

Which way is row-exact is a property of the machine's kernels, so on a CPU it is measured, not assumed: for each
layer shape, dtype, thread count and oneDNN's kernel set, :func:`exact_way` tries the ways on random
rows (16 rows each alone, and first and last among 2..2000 rows), fastest first as timed here for a decode step's
rows, and keeps the first that never differs. On CUDA, blocks of
``CUDA_ROWS`` rows (H200: float16 speculative text differed from target-only on 3 of 65 dev utterances before).
int8 layers (:class:`Int8`) are exact by construction: each row is quantized with its own scale and summed in
integers.
"""
from __future__ import annotations

import json
import os
import re
import time
import warnings
from pathlib import Path
from typing import Any, Callable, NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

CUDA_ROWS = 256  # a GPU's decode step is bound by its weights and its launches, not by its rows
# row counts a way is tried at (the output layer: to 100): every count to 33, where kernels change by count (AMX)
PROBE_ROWS = (*range(2, 34), 100, 300, 2000)
PROBE_EACH = 16  # rows compared, each computed alone and among the others
PROBE = 3  # the probe's version, part of the kept file's name: a stronger probe measures again
WIDE_CALL = 64  # rows from which an int8 layer's bookkeeping is written for size, below it for few operations
HEAD_ROWS = 100  # the output layer scores at most a pass's positions of a batch; wider layers see whole prompts
WIDE_ROWS = (2, 17, 256, 300, 1500, 3000)  # a wide layer's row counts (cross-attention keys of encoder outputs)


def in_blocks(rows: torch.Tensor, weight: Any, size: int, streamed: bool = False,
              product: Callable[[torch.Tensor, Any], torch.Tensor] | None = None) -> torch.Tensor:
    """``rows @ weight.T`` [m, n], multiplied in blocks of exactly ``size`` rows (zero rows added to the last).
    ``streamed``: each block as ``weight @ block.T``, all blocks in one batched product (on a CPU this streams the
    weight at full memory bandwidth for a few rows, where ``block @ weight.T`` picks kernels 1.5-5x slower in
    float32). ``product``: each block as ``product(block, weight)`` (a prepared weight's)."""
    m = rows.shape[0]
    n = -(-m // size)
    blocks = F.pad(rows, (0, 0, 0, n * size - m)).view(n, size, -1)
    if streamed:
        out = torch.bmm(weight.expand(n, *weight.shape), blocks.transpose(1, 2)).transpose(1, 2)
    else:
        product = product or (lambda b, w: b @ w.t())
        out = torch.cat([product(b, weight) for b in blocks]) if n > 1 else product(blocks[0], weight)
    return out.reshape(n * size, -1)[:m]


def in_slices(rows: torch.Tensor, weight: torch.Tensor, size: int) -> torch.Tensor:
    """``F.linear(rows, weight)`` a call per ``size`` rows, the last call with the rest: row-exact where the kernels for
    1..``size`` rows sum alike (a Xeon with AMX: its bfloat16 kernels change from ~33 rows on), at a single call's cost
    for a decode step's few rows (blocks of fixed size pay for their zero rows: 2.9 against 2.3 ms for one row of
    the output layer)."""
    if rows.shape[0] <= size:
        return F.linear(rows, weight)
    return torch.cat([F.linear(part, weight) for part in rows.split(size)])


def packed(weight: torch.Tensor, rows: int = 1) -> torch.Tensor:
    """``weight`` reordered once into oneDNN's layout for calls of ``rows`` rows (an opaque tensor for
    :func:`on_packed`)."""
    return torch.ops.mkldnn._reorder_linear_weight(weight, rows)


def on_packed(rows: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``rows @ weight.T`` with a weight from :func:`packed`: oneDNN's product without reordering the weight at every
    call, as ``F.linear`` does (a Xeon with AMX, 2 threads, one row of the output layer: bfloat16 1.2 against 2.7 ms,
    float32 3.2 against 7.9 ms for ``weight @ x.T`` in blocks of 4)."""
    return torch.ops.mkldnn._linear_pointwise(rows, weight, None, "none", [], "")


class Way(NamedTuple):
    """One way to compute ``rows @ weight.T`` [m, out]: ``call(rows, prepare(weight))``, the weight prepared once."""
    name: str
    call: Callable[[torch.Tensor, Any], torch.Tensor]
    prepare: Callable[[torch.Tensor], Any] = lambda weight: weight


# per float type, tried in the order of their speed here (:func:`step_seconds`); as measured (2 threads; the 51865-row
# output layer, 1 / 4 / 32 rows, ms):
# float32 packed 3.2 / 3.5 / - (Xeon with AMX, weights not in cache), weight @ x.T in blocks of 4: 2.4 / 2.4 / 19
# (unblocked: 2.1 / 2.6 / 15, not row-exact); bfloat16 packed 1.1 / 1.1 / - (Xeon with AMX), F.linear: 1.7 / 1.7 / 3
# (weight @ x.T: 3.8 / 3.9 / 9). oneDNN packed for 4 rows in float32 is row-exact on a Xeon with AMX for every
# whisper-base layer but fc2 (512x2048), which blocks of 4 rows keep exact.
WAYS: dict[torch.dtype, list[Way]] = {
    torch.float32: [Way("oneDNN, packed for 4 rows", on_packed, lambda w: packed(w, 4)),
                    Way("oneDNN, packed for 4 rows, in blocks of 4", lambda x, w: in_blocks(x, w, 4, product=on_packed),
                        lambda w: packed(w, 4)),
                    Way("weight @ x.T in blocks of 4", lambda x, w: in_blocks(x, w, 4, streamed=True)),
                    Way("F.linear in blocks of 16", lambda x, w: in_blocks(x, w, 16))],
}
WAYS[torch.float16] = [Way("F.linear", lambda x, w: F.linear(x, w)),
                       Way("F.linear per 32 rows", lambda x, w: in_slices(x, w, 32)),
                       Way("F.linear in blocks of 16", lambda x, w: in_blocks(x, w, 16))]
WAYS[torch.bfloat16] = [Way("oneDNN, packed for one row", on_packed, packed), *WAYS[torch.float16]]
# wide layers (the cross-attention keys and values of whole encoder outputs, hundreds of rows and more)
WIDE_WAYS = [Way("F.linear", lambda x, w: F.linear(x, w)), Way("F.linear in blocks of 256", lambda x, w: in_blocks(x, w, 256))]
_CHOSEN: dict[tuple, Way] = {}
_MEASURING_S = [0.0]  # seconds this process spent measuring ways (:func:`measuring_seconds`)


def probe_weight(out: int, inp: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """The random weight every way of a layer's shape is timed and probed with (made once: for the 51865-row output
    layer its random numbers took 0.3 s, once per way timed and probed before)."""
    g = torch.Generator().manual_seed(0)
    return (torch.randn(out, inp, generator=g) / inp ** 0.5).to(device, dtype)


def row_exact(way: Way, weight: torch.Tensor, counts: tuple[int, ...]) -> bool:
    """Whether ``way`` gives each of :data:`PROBE_EACH` rows the same bits alone and among ``counts`` rows (first, last),
    with ``weight`` (:func:`probe_weight`). Every output of those rows is compared: two kernels that sum in other
    orders differ only where the rounding to the output's type falls apart (a few outputs in 10,000 in bfloat16),
    which one row alone often misses (on a Xeon with AMX a 2-row call's kernel differed from a 1-row call's in 3 of
    51865 outputs of a row)."""
    g = torch.Generator().manual_seed(1)
    x = torch.randn(max(counts), weight.shape[1], generator=g).to(weight.device, weight.dtype)
    try:  # a way this machine's torch cannot run (oneDNN's packed products elsewhere) is not this machine's
        w = way.prepare(weight)
        alone = torch.cat([way.call(x[i:i + 1], w) for i in range(PROBE_EACH)])
        for m in counts:
            r = min(m, PROBE_EACH)
            if not (torch.equal(way.call(x[:m], w)[:r], alone[:r])
                    and torch.equal(way.call(torch.roll(x[:m], m - r, 0), w)[m - r:], alone[:r])):
                return False
    except (RuntimeError, AttributeError):  # AttributeError: a torch without oneDNN's operators
        return False
    return True


def step_seconds(ways: list[Way], weight: torch.Tensor, rounds: int = 3) -> list[float]:
    """What each of ``ways`` takes here for a decode step's rows with ``weight``: one row and four (a verify pass),
    each the fastest of ``rounds`` calls after a first (another process's work only ever slows a call), the ways
    timed in turn in each round, so that a slower moment of the machine falls on all of them (inf for a way this
    machine's torch cannot run)."""
    g = torch.Generator().manual_seed(2)
    xs = [torch.randn(m, weight.shape[1], generator=g).to(weight.device, weight.dtype) for m in (1, 4)]
    prepared: list[Any] = []
    for way in ways:
        try:
            w = way.prepare(weight)
            for x in xs:
                way.call(x, w)
        except (RuntimeError, AttributeError):
            w = None
        prepared.append(w)
    best = [[float("inf")] * len(xs) for _ in ways]
    for _ in range(rounds):
        for i, (way, w) in enumerate(zip(ways, prepared)):
            for j, x in enumerate(xs):
                if w is not None:
                    t = time.perf_counter()
                    way.call(x, w)
                    best[i][j] = min(best[i][j], time.perf_counter() - t)
    return [sum(b) for b in best]


def by_speed(ways: list[Way], weight: torch.Tensor, tie: float = 1.2) -> list[Way]:
    """``ways`` fastest first as timed here (:func:`step_seconds`), those within ``tie`` of the fastest in their listed
    order: timings drift 10-20 % within a run, and a way that only seemed faster must not be chosen by chance (on an
    AVX2 EPYC oneDNN's packed output layer and the streamed blocks both take ~20 ms a step; probing the streamed
    blocks takes 2 s more)."""
    seconds = step_seconds(ways, weight)
    fastest = min(seconds)
    order = sorted(range(len(ways)), key=lambda i: 0.0 if seconds[i] <= tie * fastest else seconds[i])
    return [ways[i] for i in order]


def exact_way(out: int, inp: int, dtype: torch.dtype, device: torch.device, wide: bool = False) -> Way:
    """The fastest row-exact way for a layer of that shape here (:func:`step_seconds`, :func:`row_exact`), measured
    once per machine (CPU model, torch version, shape, type and thread count) and kept on disk
    (:func:`measured_ways`): later processes measure nothing. ``wide``: for calls of hundreds of rows and more
    (encoder outputs)."""
    if device.type == "cuda":
        return Way(f"blocks of {CUDA_ROWS}", lambda x, w: in_blocks(x, w, CUDA_ROWS))
    key = (out, inp, dtype, device.type, torch.get_num_threads(), wide)
    if key not in _CHOSEN:
        ways = WIDE_WAYS if wide else WAYS[dtype]
        kept = measured_ways()
        name = f"{out}x{inp} {str(dtype).removeprefix('torch.')} {torch.get_num_threads()} threads{' wide' * wide}"
        way = next((w for w in ways if w.name == kept.get(name)), None)
        if way is None:
            t0 = time.perf_counter()
            counts = WIDE_ROWS if wide else tuple(m for m in PROBE_ROWS if out <= 8 * inp or m <= HEAD_ROWS)
            weight = probe_weight(out, inp, dtype, device)
            if not wide:  # the order measured elsewhere need not be this CPU's (oneDNN's packed bfloat16 without AMX)
                ways = by_speed(ways, weight)
            way = next((w for w in ways if row_exact(w, weight, counts)), ways[-1])
            keep_way(name, way.name)
            _MEASURING_S[0] += time.perf_counter() - t0
        _CHOSEN[key] = way
    return _CHOSEN[key]


def measuring_seconds() -> float:
    """Seconds this process has spent measuring ways (a machine's first process, or a new thread count)."""
    return _MEASURING_S[0]


def _ways_file() -> Path:
    from .compute import machine
    from .sources import cache_dir

    cpu = machine("cpu").rsplit(",", 1)[0]  # the thread count is part of each entry's name
    isa = os.environ.get("ONEDNN_MAX_CPU_ISA", "")  # oneDNN's kernels (AMX or not) are the machine's too
    slug = re.sub(r"[^A-Za-z0-9._-]+", "_", f"{cpu} torch {torch.__version__} {isa} probe {PROBE}").strip("_")[:150]
    return cache_dir() / "exact-ways" / f"{slug}.json"


def measured_ways() -> dict[str, str]:
    """The ways measured row-exact on this CPU with this torch (layer -> way), from the cache directory; an unreadable
    file, or one of another shape, holds none (they are measured again)."""
    try:
        ways = json.loads(_ways_file().read_text())["ways"]
        return {k: v for k, v in ways.items() if isinstance(k, str) and isinstance(v, str)}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return {}


def keep_way(name: str, way: str) -> None:
    """Add one measured way to this machine's file: read, added to and replaced whole under the file's lock, so that
    processes measuring at once keep every way (a read-only cache, or a lock held past a few seconds: measured again
    by a later process)."""
    from .cache import locked

    path = _ways_file()
    try:
        with locked(path.with_suffix(".lock"), timeout=5.0) as held:
            if held:
                tmp = path.with_suffix(f".{os.getpid()}.tmp")
                tmp.write_text(json.dumps({"ways": {**measured_ways(), name: way}}, indent=1))
                tmp.replace(path)
    except OSError:
        pass


def project(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, wide: bool = False
            ) -> torch.Tensor:
    """``F.linear(x, weight, bias)``, each row's result independent of the other rows (see :func:`exact_way`); the
    weight prepared at every call (:class:`Dense` prepares it once)."""
    way = exact_way(*weight.shape, weight.dtype, weight.device, wide)
    return _apply(way, x, way.prepare(weight), bias, weight.shape[0])


def _apply(way: Way, x: torch.Tensor, prepared: Any, bias: torch.Tensor | None, out: int) -> torch.Tensor:
    rows = x.reshape(-1, x.shape[-1]).contiguous()  # a strided view takes other kernels (other bits)
    # contiguous out: elementwise operations after it take other paths (other bits) over a transposed layout
    y = way.call(rows, prepared).contiguous()
    if bias is not None:
        y = y + bias
    return y.reshape(*x.shape[:-1], out)


class Dense:
    """A linear layer applied as :func:`project` does in the weights' own precision, its weight prepared for the
    chosen way once (``wide``: see :func:`exact_way`)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None, wide: bool = False):
        self.weight: torch.Tensor | None = weight  # None while a packed copy (:func:`packed`) holds it
        self.bias, self.wide = bias, wide
        self.shape, self.dtype, self.device = weight.shape, weight.dtype, weight.device
        self._prepared: tuple[str, Any] = ("", None)  # (way's name, its weight)
        # chosen now: a machine's first process measures its ways while it loads, not in its first decode
        exact_way(*self.shape, self.dtype, self.device, self.wide)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        way = exact_way(*self.shape, self.dtype, self.device, self.wide)
        if way.name != self._prepared[0]:  # the first call, or another thread count
            weight = self.weight if self.weight is not None else self._prepared[1].to_dense()
            self._prepared = (way.name, way.prepare(weight))
            self.weight = weight if self._prepared[1] is weight else None  # not kept twice
        return _apply(way, x, self._prepared[1], self.bias, self.shape[0])

    def fixed(self, x: torch.Tensor) -> torch.Tensor:
        """One ``F.linear``, for calls whose shape never changes: a row's bits then depend on that shape only (a
        kernel is chosen by the shape), and the blocks' launches are spared."""
        return F.linear(x, self.weight, self.bias)


class Plain(Dense):
    """A linear layer as one ``F.linear`` (bias fused): for a draft on CUDA, whose rows need not be exact (the target
    verifies what it proposes), where ``project``'s fixed blocks cost three more kernels a layer (H100: a draft step
    launches ~110 kernels, replayed ~4 us each)."""

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)


class Int8:
    """A linear layer with int8 weights (one scale per output row) and int8 activations.

    ``rows`` True (targets): each row of the input is quantized with its own scale and the products are summed
    in integers, so a row's result is bitwise the same whatever the other rows of the call are (the batch, the
    other verified positions): speculative and target-only decoding, batch 8 and batch 1, see the same numbers.
    On a CPU the fbgemm/x86 dynamic kernel quantizes with one range per call, so each row is scaled to peak 1
    and a fixed extra row holding -1 and +1 pins that range: the kernel's scale is the same for every call and a
    row's scale is its own peak (7-bit activations: fbgemm's ``reduce_range``, which keeps AVX2's 16-bit pair
    sums from saturating). Elsewhere (CUDA) ``torch._int_mm`` with per-row symmetric int8.
    ``rows`` False (drafts on a CPU): one scale per call, a little faster; a draft's precision changes how often
    it is accepted, never the text. Inputs and outputs are in the caller's float type. ``kernel``: "fbgemm" or
    "int_mm" (default: fbgemm on a CPU, int_mm elsewhere; int_mm runs on a CPU too, slowly: for tests)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None, rows: bool = True,
                 kernel: str | None = None):
        w = weight.detach().float()
        self.out_features, self.in_features = w.shape
        self.rows = rows
        self.bias = None if bias is None else bias.detach().float()
        scales = (w.abs().amax(1) / 127).clamp(min=1e-12)
        self.cpu = (kernel or ("fbgemm" if w.device.type == "cpu" else "int_mm")) == "fbgemm"
        if self.cpu:
            zeros = torch.zeros(w.shape[0], dtype=torch.long)
            with warnings.catch_warnings():  # quantized tensors are deprecated in favour of torchao; still in 2.13
                warnings.simplefilter("ignore", UserWarning)
                q = torch.quantize_per_channel(w, scales.double(), zeros, 0, torch.qint8)
            self.packed = torch.ops.quantized.linear_prepack(q, None if rows else self.bias)
            self.pin = w.new_zeros(1, self.in_features)
            self.pin[0, :2] = torch.tensor([-1.0, 1.0])
        else:  # torch._int_mm wants at least 17 rows and a multiple of 8 columns
            pad = -self.out_features % 8
            self.weight_t = F.pad(torch.round(w / scales[:, None]), (0, 0, 0, pad)).to(torch.int8).t().contiguous()
            self.scales = scales

    def fixed(self, x: torch.Tensor) -> torch.Tensor:
        """:meth:`__call__` (row-exact at every shape already)."""
        return self(x)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features).float()
        m = rows.shape[0]
        if self.cpu and not self.rows:
            y = torch.ops.quantized.linear_dynamic(rows, self.packed, True)
        else:
            peak = rows.abs().amax(1, keepdim=True).clamp_(min=1e-30)
            if self.cpu and m >= WIDE_CALL:  # an encoder's rows: scaled into one buffer with the pin, no
                scaled = torch.empty(m + 1, self.in_features, device=x.device)  # concatenation (8 % of an encoder)
                torch.div(rows, peak, out=scaled[:m])
                scaled[m:] = self.pin
                y = torch.ops.quantized.linear_dynamic(scaled, self.packed, True)[:m].mul_(peak)
            elif self.cpu:  # a decoder's few rows: fewer operations (the same bits)
                y = torch.ops.quantized.linear_dynamic(torch.cat([rows / peak, self.pin]), self.packed, True)[:-1] * peak
            else:
                q = F.pad(torch.round(rows * (127 / peak)), (0, 0, 0, max(0, 17 - m))).to(torch.int8)
                y = torch._int_mm(q, self.weight_t)[:m, :self.out_features].float() * (peak / 127) * self.scales
            if self.bias is not None and m >= WIDE_CALL:  # summed in float32, rounded once into the caller's type
                y = torch.add(y, self.bias, out=torch.empty(y.shape, dtype=x.dtype, device=x.device))
            elif self.bias is not None:
                y += self.bias
        return y.to(x.dtype).reshape(*x.shape[:-1], self.out_features)


class Int8Module(nn.Module):
    """:class:`Int8` (per row) in place of an ``nn.Linear`` inside a transformers module (the encoder)."""

    def __init__(self, linear: nn.Linear):
        super().__init__()
        self.layer = Int8(linear.weight, linear.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layer(x)


def quantize_linears(module: nn.Module) -> nn.Module:
    """Replace every ``nn.Linear`` inside ``module`` with :class:`Int8Module`, in place; returns ``module``."""
    for name, child in module.named_children():
        if isinstance(child, nn.Linear):
            setattr(module, name, Int8Module(child))
        else:
            quantize_linears(child)
    return module


Linear = Callable[..., Callable[[torch.Tensor], torch.Tensor]]  # (weight, bias=None) -> layer: Dense or Int8
INT8_MODES: dict[str, Linear] = {"rows": Int8, "tensor": lambda weight, bias=None: Int8(weight, bias, rows=False)}
