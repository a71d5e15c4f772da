"""Where, when and how a measurement was taken: recorded in every JSON that ``asr_spec eval`` and the ``eval/``
benchmarks write, read back by ``eval/results_page.py``."""
from __future__ import annotations

import os
import platform
import shlex
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path


def cpu_name() -> str:
    """The CPU's model name (/proc/cpuinfo on Linux), else what ``platform`` knows."""
    info = Path("/proc/cpuinfo")
    if info.exists():
        for line in info.read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def command_line(argv: list[str] | None = None) -> str:
    """The command as typed: ``asr_spec eval ...`` for the console script, ``python -m pkg ...`` for a package,
    ``python eval/x.py ...`` for a script (relative to the working directory when inside it)."""
    argv = sys.argv if argv is None else argv
    prog = Path(argv[0])
    if prog.name == "asr_spec":
        head = "asr_spec"
    elif prog.name == "__main__.py":
        head = f"python -m {prog.parent.name}"
    elif prog.suffix == ".py":
        try:
            head = f"python {prog.resolve().relative_to(Path.cwd())}"
        except ValueError:
            head = f"python {prog}"
    else:
        head = str(prog)
    return " ".join([head, *map(shlex.quote, argv[1:])])


def git_commit() -> str | None:
    """The checkout's commit (None outside a git checkout, or without git)."""
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=Path(__file__).parent,
                              check=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None


def provenance(threads: int, device: str = "cpu") -> dict:
    """machine (CPU, cores; with a CUDA ``device``, its GPU too), threads, date (UTC, ISO 8601), command, Python and
    torch versions and git commit of this run."""
    import torch

    out = {"machine": cpu_name(), "cores": os.cpu_count(), "threads": threads,
           "date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "command": command_line(),
           "python": platform.python_version(), "torch": torch.__version__, "git_commit": git_commit()}
    if device.startswith("cuda"):
        out["gpu"] = torch.cuda.get_device_name(torch.device(device))
    return out
