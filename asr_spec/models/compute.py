"""Compute types, in CTranslate2's vocabulary (what faster-whisper users already pass): which float the model
computes in, and whether its linear layers hold int8 weights. One type applies to the whole model: the encoder,
the target decoder and the draft's floats. Speculative output equals target-only output at the same type.
"""
from __future__ import annotations

import os
import platform
from dataclasses import dataclass
from typing import Callable

import torch

COMPUTE_TYPES = ("auto", "float32", "bfloat16", "float16", "int8", "int8_float32", "int8_bfloat16", "int8_float16")
CPUINFO = "/proc/cpuinfo"


class ComputeTypeError(ValueError):
    """A compute type that is unknown, or that the device cannot run."""


@dataclass(frozen=True)
class Precision:
    """A resolved compute type: ``name`` (concrete, e.g. ``int8_float32``), the float the model computes in and
    whether its linear layers run with int8 weights (one scale per output channel) and int8 activations (one
    scale per row: a row's numbers never depend on the other rows of a batch or the other verified positions)."""

    name: str
    float: torch.dtype
    int8: bool
    guessed: bool = False  # ``auto`` before it was measured on this machine (models/auto.py: guessed_type)


_FLOATS = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def cpu_flags(cpuinfo: str = CPUINFO) -> set[str]:
    if not os.path.exists(cpuinfo):
        return set()
    with open(cpuinfo) as f:
        return set(next((line for line in f if line.startswith("flags")), "").split(":", 1)[-1].split())


def machine(device: str | torch.device = "cpu") -> str:
    """The processor a measurement holds for: the GPU's name, or the CPU's model name, with torch's threads."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    name = None
    if os.path.exists(CPUINFO):
        with open(CPUINFO) as f:
            name = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), None)
    return f"{name or platform.processor() or platform.machine()}, {torch.get_num_threads()} threads"


def native_bfloat16(device: str | torch.device = "cpu", cpuinfo: str = CPUINFO) -> bool:
    """Whether ``device`` computes bfloat16 natively: CUDA with bf16, or a CPU with AVX512-BF16 or AMX-BF16
    (elsewhere torch emulates it, several times slower than float32)."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    return device.type == "cpu" and bool({"avx512_bf16", "amx_bf16"} & cpu_flags(cpuinfo))


def amx(device: str | torch.device = "cpu", cpuinfo: str = CPUINFO) -> bool:
    """Whether ``device`` is a CPU with AMX tiles for bfloat16 (Intel Xeon since Sapphire Rapids) that oneDNN may use
    (``ONEDNN_MAX_CPU_ISA`` unset, or naming an AMX set or ``ALL``)."""
    isa = os.environ.get("ONEDNN_MAX_CPU_ISA", "ALL").upper()
    return torch.device(device).type == "cpu" and "amx_bf16" in cpu_flags(cpuinfo) and ("AMX" in isa or isa in ("ALL", "DEFAULT"))


def int8_kernels(device: str | torch.device = "cpu") -> bool:
    """Whether int8 linear layers have kernels on ``device``: the CPU's fbgemm/x86 quantized engine, or CUDA's
    ``torch._int_mm``."""
    device = torch.device(device)
    if device.type == "cuda":
        return True
    return device.type == "cpu" and bool({"fbgemm", "x86"} & set(torch.backends.quantized.supported_engines))


def runnable(device: str | torch.device = "cpu") -> list[str]:
    """The concrete compute types ``device`` can run (float16 only on CUDA, as in CTranslate2)."""
    cuda = torch.device(device).type == "cuda"
    floats = ["float32", "bfloat16"] + (["float16"] if cuda else [])
    ints = [f"int8_{f}" for f in floats] if int8_kernels(device) else []
    return floats + ints


def _best_float(device: str | torch.device, cpuinfo: str) -> str:
    if torch.device(device).type == "cuda":
        return "float16"
    return "bfloat16" if native_bfloat16(device, cpuinfo) else "float32"


def resolve_compute_type(name: str, device: str | torch.device = "cpu", cpuinfo: str = CPUINFO,
                         auto: Callable[[], str] | None = None) -> Precision:
    """The concrete type for ``name`` on ``device``. ``int8``: int8 weights with the best float the device computes
    natively (float16 on CUDA, bfloat16 on CPUs with AVX512-BF16 or AMX, else float32). ``auto``: what ``auto()``
    measures fastest (``models/auto.py``; a model's ``ModelOptions.precision`` gives it). A type the device cannot
    run is refused, naming the types it can."""
    if name not in COMPUTE_TYPES:
        raise ComputeTypeError(f"unknown compute type {name!r}; choose from {', '.join(COMPUTE_TYPES)}")
    if name == "auto":
        if auto is None:
            raise ComputeTypeError("compute type auto is measured per model: resolve it with ModelOptions.precision()")
        name = auto()
    if name == "int8":
        name = f"int8_{_best_float(device, cpuinfo)}"
    if name not in runnable(device):
        raise ComputeTypeError(f"compute type {name} cannot run on {device}; it runs "
                               f"{', '.join(['auto'] + ['int8'] * int8_kernels(device) + runnable(device))}")
    int8 = name.startswith("int8_")
    return Precision(name, _FLOATS[name.removeprefix("int8_")], int8)
