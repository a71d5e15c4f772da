"""The dev set through ``asr_spec transcribe --ray`` on a local Ray cluster (started here with ``ray start``)
beside the same command run locally: wall times (alternating order, ``--repeat`` rounds) and whether every
output file is identical (json compared without its timing statistics).

    python eval/experiments/ray_dev.py [--dev DIR | --manifest FILE] --cpus 2 --workers 2 --out eval/results/ray
"""
from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from asr_spec.evaluation.harness import add_data_args, data, free_port, write_results

# 'ray start' clusters use token authentication (Ray >= 2.59): this cluster and its driver share a token of their own
ENV = {**os.environ, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32)}


def transcribe(files: list[str], out: Path, extra: list[str]) -> tuple[float, subprocess.CompletedProcess]:
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "asr_spec", "transcribe", "--quiet", "--format", "all", "--language",
                        "en", "--output-dir", str(out), *files, *extra], capture_output=True, text=True, env=ENV,
                       timeout=3600)
    wall = time.perf_counter() - t0
    if r.returncode != 0:
        sys.exit(f"transcribe {' '.join(extra)} failed:\n{r.stderr[-3000:]}")
    return wall, r


def differences(a: Path, b: Path) -> list[str]:
    names = sorted(p.name for p in a.iterdir())
    diff = [] if names == sorted(p.name for p in b.iterdir()) else ["file lists differ"]
    for name in names:
        x, y = ((d / name).read_text() for d in (a, b)) if (b / name).exists() else ("", None)
        if name.endswith(".json") and y is not None:
            x, y = json.loads(x), json.loads(y)
            x.pop("statistics"), y.pop("statistics")
        if x != y:
            diff.append(name)
    return diff


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cpus", type=int, default=2, help="CPUs of the local Ray cluster")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=8, help="files in flight per process (local) or worker (ray)")
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--out", default="eval/out/ray")
    add_data_args(ap)
    a = ap.parse_args()
    dev = data(a)
    files = [str(dev.audio_path(it)) for it in dev.items]
    ray, port = str(Path(sys.executable).parent / "ray"), free_port()
    subprocess.run([ray, "start", "--head", "--node-ip-address", "127.0.0.1", "--port", str(port), "--num-cpus",
                    str(a.cpus), "--num-gpus", "0", "--include-dashboard", "false", "--disable-usage-stats"],
                   check=True, capture_output=True, env=ENV, timeout=300)
    runs: dict[str, list[float]] = {"local": [], "ray": []}
    work = Path(tempfile.mkdtemp())
    try:
        for n in range(a.repeat):
            for name in (("local", "ray") if n % 2 == 0 else ("ray", "local")):
                out = work / f"{name}-{n}"
                extra = (["--threads", str(a.cpus), "--batch-size", str(a.batch_size)] if name == "local" else
                         ["--ray", f"127.0.0.1:{port}", "--workers", str(a.workers), "--threads",
                          str(max(1, a.cpus // a.workers)), "--batch-size", str(a.batch_size)])
                wall, r = transcribe(files, out, extra)
                runs[name].append(wall)
                print(f"{name} round {n}: {wall:.1f} s", flush=True)
                if name == "ray":
                    workers = {ln.rsplit(", on ", 1)[1].split(";")[0] for ln in r.stderr.splitlines() if ", on " in ln}
                    print(f"  files spread over {len(workers)} worker(s)", flush=True)
        diffs = [d for n in range(a.repeat) for d in differences(work / f"local-{n}", work / f"ray-{n}")]
    finally:
        subprocess.run([ray, "stop", "--force"], capture_output=True, env=ENV, timeout=120)
    result = {"files": len(files), "cpus": a.cpus, "workers": a.workers,
              "batch_size": a.batch_size, "wall_s": runs,
              "median_wall_s": {k: statistics.median(v) for k, v in runs.items()},
              "ray_over_local": statistics.median(runs["ray"]) / statistics.median(runs["local"]),
              "differing_outputs": diffs}
    shutil.rmtree(work, ignore_errors=True)
    print(json.dumps(write_results(Path(a.out) / "results.json", result, a.cpus, indent=2), indent=2))


if __name__ == "__main__":
    main()
