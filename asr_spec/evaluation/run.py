"""Orchestrates one ``asr_spec eval`` run: every system on the same audio, in rounds (each repeat runs every system
once, in turn, each in a fresh process of its own with the same thread count); then scores, report and plots."""
from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

from .metrics import pass_costs, speedups, summarize
from .provenance import provenance
from .report import write_report
from .systems import OURS, Setup, SystemSpec, expand, missing


@dataclass(frozen=True)
class EvalOptions:
    manifest: Path
    out: Path
    systems: tuple[str, ...] = ("target", "spec", "draft", "hf", "hf-assisted", "faster-whisper")
    ks: tuple[int, ...] = (3,)
    draft_stops: tuple[float, ...] = (0.3,)
    compute_type: str = "float32"  # our systems without a compute type in their name
    encoder_window: str = "full"
    window_padding: str = "audio"
    limit: int = 0
    repeat: int = 1
    temperature: float = 0.5
    seeds: int = 1
    model: str = "whisper-base"
    draft: str = "auto"  # auto: the draft shipped for the model, else an untrained layers:0,5
    language: str | None = "en"
    threads: int = 0
    device: str = "cpu"  # every system's device
    hotwords: str | None = None  # our systems' hotwords
    batch_sizes: tuple[int, ...] = (1,)  # windows in flight (ours), chunks per batch (faster-whisper-batched)
    speculation: str = "auto"  # our drafting systems: drafting widths measured here, or "on" (every width)


def read_manifest(path: Path, limit: int = 0) -> list[dict]:
    rows = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        row = json.loads(line)
        if not {"id", "audio", "text"} <= row.keys():
            raise ValueError(f"{path}:{n}: each line needs id, audio and text")
        rows.append({"id": row["id"], "path": str((path.parent / row["audio"]).resolve()), "text": row["text"]})
    return rows[:limit] if limit else rows


def environment(threads: int, device: str = "cpu") -> dict:
    """provenance() (machine, threads, date, command, Python, torch, commit) and the other software versions."""
    import transformers

    def version(pkg: str) -> str | None:
        try:
            from importlib.metadata import version as v

            return v(pkg)
        except Exception:  # noqa: BLE001
            return None

    return {**provenance(threads, device), "transformers": transformers.__version__, "asr_spec": version("asr_spec"),
            "faster_whisper": version("faster-whisper"), "ctranslate2": version("ctranslate2")}


def run_system(spec: SystemSpec, setup: Setup, items: list[dict]) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        job, out = Path(tmp) / "job.json", Path(tmp) / "out.json"
        job.write_text(json.dumps({"system": asdict(spec), "setup": asdict(setup), "items": items}))
        proc = subprocess.run([sys.executable, "-m", "asr_spec.evaluation.worker", str(job), str(out)],
                              stdout=subprocess.PIPE, text=True)
        if proc.returncode != 0 or not out.exists():
            return {"system": asdict(spec), "error": f"worker exited with status {proc.returncode}"}
        return json.loads(out.read_text())


def fold(kept: dict | None, run: dict) -> dict:
    """A system's run in one more round folded into its earlier rounds' (``kept``): each utterance's timings and the
    run's wall time appended, its text and statistics the last round's, peak RSS the highest, the load the first's."""
    if kept is None:
        return run
    for i, rec in run["items"].items():
        mine = kept["items"][i]
        for key in ("wall_s", "encoder_s", "decode_s"):
            mine[key] += rec[key]
        mine.update({k: v for k, v in rec.items() if k not in ("wall_s", "encoder_s", "decode_s")})
    kept["run_wall_s"] += run["run_wall_s"]
    kept["peak_rss_mb"] = max(kept["peak_rss_mb"], run["peak_rss_mb"])
    return kept


def _baseline(run: dict, runs: dict[str, dict]) -> str:
    """The target-only run a system is compared with: the one its spec names (``target-int8`` for ``spec-int8``),
    or a target-only run at the same concrete compute type (``target`` at float32 for ``spec-float32``)."""
    name = run["system"]["baseline"]
    if name in runs or not name.startswith("target-") or name.startswith("target-sample"):
        return name
    same = [n for n, r in runs.items() if r["system"]["kind"] == "target" and r["system"]["batch_size"] == 1
            and r.get("compute_type") == run.get("compute_type")]
    return same[0] if same else name


def evaluate(o: EvalOptions) -> dict:
    import torch

    from ..models.loader import default_draft

    threads = o.threads or torch.get_num_threads()
    items = read_manifest(o.manifest, o.limit)
    draft = (default_draft(o.model) or "layers:0,5") if o.draft == "auto" else o.draft
    setup = Setup(o.model, draft, o.language, threads, o.compute_type, o.encoder_window, o.hotwords, o.device,
                  o.speculation, o.window_padding)
    specs = expand(list(o.systems), list(o.ks), o.temperature, o.seeds, list(o.draft_stops), list(o.batch_sizes))
    runs, skipped = {}, {}
    for spec in specs:
        if reason := missing(spec):
            skipped[spec.name] = reason
            print(f"skipping {spec.name}: {reason}", file=sys.stderr)
    # a machine's speed drifts within a run (10-20 % here, more on a shared VM): repeats taken system after system
    # would credit that drift to whichever system ran in the fast stretch, so each round runs every system once,
    # every other round in reverse order
    for r in range(o.repeat):
        for spec in specs if r % 2 == 0 else specs[::-1]:
            if spec.name in skipped:
                continue
            print(f"round {r + 1}/{o.repeat}: {spec.name}", file=sys.stderr)
            run = run_system(spec, setup, items)
            if "error" in run:
                skipped[spec.name] = run["error"]
                runs.pop(spec.name, None)
                print(f"{spec.name} failed: {run['error']}", file=sys.stderr)
                continue
            runs[spec.name] = fold(runs.get(spec.name), run)
    refs = {it["id"]: it["text"] for it in items}
    def texts(name: str) -> dict | None:
        return {i: r["text"] for i, r in runs[name]["items"].items()} if name in runs else None

    # "identical to target": to target-only decoding in the same mode and at the same compute type (sampling:
    # same temperature and seed)
    baselines = {name: _baseline(run, runs) for name, run in runs.items()}
    summaries = {name: summarize(run, refs, texts(baselines[name])) for name, run in runs.items()}
    for name, run in runs.items():
        summaries[name]["load_s"] = run["load_s"]
        summaries[name]["run_wall_s"] = run["run_wall_s"]  # each repeat's wall time over the whole manifest
        summaries[name]["compute_type"] = run.get("compute_type")
    peers = [n for n, r in runs.items() if r["system"]["kind"] not in OURS]
    results = {
        "environment": environment(threads, o.device),
        "options": {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(o).items()},
        "manifest": str(o.manifest), "utterances": len(items), "audio_s": summaries and next(iter(summaries.values()))["audio_s"],
        "systems": summaries,
        "skipped": skipped,
        "speedup_vs_target": {"wall": speedups(summaries, baselines, "wall_s"),
                              "decode": speedups(summaries, baselines, "decode_s")},
        "speedup_vs_peer": {p: speedups(summaries, p, "wall_s") for p in peers},
        "pass_cost_vs_target": pass_costs(summaries, baselines),
        "per_utterance": {name: {i: {"text": r["text"], "wall_s": r["wall_s"]} for i, r in run["items"].items()}
                          for name, run in runs.items()},
    }
    o.out.mkdir(parents=True, exist_ok=True)
    (o.out / "results.json").write_text(json.dumps(results, indent=1))
    write_report(results, o.out)
    return results
