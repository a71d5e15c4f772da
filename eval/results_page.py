"""docs/results.md and its plots (docs/results/*.png), regenerated from the JSON that ``asr_spec eval`` and the
``eval/`` benchmarks save: eval/results/index.json lists, per section of the page, the current run(s) of each
measurement. Every table is headed by the machine, date and command of its run, as its JSON records them, else
as the index gives them. Runs the index no longer lists leave the page; their JSON stays in eval/results/.

    python eval/results_page.py [--index eval/results/index.json] [--out docs/results.md]

The same JSON gives a byte-identical page and plots (PNG written without software version or timestamp).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


class ResultsError(Exception):
    """The index lists a JSON file that is not there, or a run whose machine, date or command nobody gives."""


def num(v: float | int | None) -> str:
    if v is None:
        return "—"
    if isinstance(v, int):
        return str(v)
    return f"{v:.0f}" if abs(v) >= 100 else f"{v:.1f}" if abs(v) >= 10 else f"{v:.2f}"


def times(v: float | None) -> str:
    return "—" if v is None else f"{v:.2f}x"


def pct(v: float | None) -> str:
    return "—" if v is None else f"{100 * v:.1f} %"


def md_table(head: list[str], rows: list[list]) -> str:
    cells = [head, ["---"] * len(head), *([c if isinstance(c, str) else num(c) for c in r] for r in rows)]
    return "\n".join("| " + " | ".join(r) + " |" for r in cells)


# --- tables, one per kind of JSON ---------------------------------------------------------------------------------

def eval_table(doc: dict) -> str:
    """``asr_spec eval``'s results.json: one row per system."""
    peers, vs = doc["speedup_vs_peer"], doc["speedup_vs_target"]
    head = ["system", "compute type", "WER %", "identical to target", "α", "tokens/pass", "encoder s", "decode s",
            "wall s", "peak RSS MB", "decode speed-up vs target", "wall speed-up vs target",
            *(f"wall vs {p}" for p in peers)]
    rows = [[name, m.get("compute_type") or "—", m["wer"],
             "—" if m["identical_to_target"] is None else f"{m['identical_to_target']}/{m['utterances']}",
             pct(m.get("acceptance")), m.get("tokens_per_pass"), m["encoder_s"], m["decode_s"], m["wall_s"],
             m["peak_rss_mb"], times(vs["decode"].get(name)), times(vs["wall"].get(name)),
             *(times(peers[p].get(name)) for p in peers)] for name, m in doc["systems"].items()]
    return md_table(head, rows)


def steps_table(doc: dict) -> str:
    """eval/bench_steps.py: per compute type, the target step and what verifying and drafting cost in steps."""
    first = doc["results"][0]
    base = first["ms"]["target"]["1"]
    graphs = "target, CUDA graph" in first["ms"]  # bench_steps.py --cuda-graphs
    head = ["compute type", f"target step ms (x {first['compute_type']})", "verify 4 tokens (x its step)",
            "draft step, audio view (x its step)", "draft step, whole window (x its step)", "encoder, one 30 s window ms",
            *(["target step as a CUDA graph ms (x eager)", "draft step as a CUDA graph (x the graph's target step)"]
              if graphs else [])]
    rows = []
    for r in doc["results"]:
        ms, step = r["ms"], r["ms"]["target"]["1"]
        rows.append([r["compute_type"], f"{num(step)} ({times(step / base)})", times(ms["target"]["4"] / step),
                     times(ms["draft"]["1"] / step), times(ms["draft, whole window"]["1"] / step), r["encoder_ms"],
                     *([f"{num(g := ms['target, CUDA graph']['1'])} ({times(g / step)})",
                        times(ms["draft, CUDA graph"]["1"] / g)] if graphs else [])])
    return md_table(head, rows)


def budget_table(doc: dict) -> str:
    """eval/pass_budget.py: per compute type and system, a pass's milliseconds by phase."""
    phases = ("target", "draft", "rules", "acceptance", "host", "bookkeeping")
    head = ["compute type", "system", "decode s", "passes", "tokens/pass", "pass ms", *(f"{p} ms" for p in phases),
            "loop ms (share)"]
    rows = [[r["compute_type"], r["system"], r["decode_s"], r["passes"], r["tokens_per_row_pass"],
             r["ms_per_pass"]["pass"], *(r["ms_per_pass"][p] for p in phases),
             f"{num(r['loop_ms_per_pass'])} ({pct(r['loop_share'])})"] for r in doc["rows"]]
    return md_table(head, rows)


def host_table(doc: dict) -> str:
    """eval/host_ceiling.py before and after: engine seconds per second of audio with the tiny model."""
    head = ["sessions", "before: engine s per audio s", "after: engine s per audio s", "after / before"]
    after = {r["sessions"]: r for r in doc["after"]}
    rows = [[r["sessions"], f"{r['engine_seconds_per_audio_second']:.4f}",
             f"{after[r['sessions']]['engine_seconds_per_audio_second']:.4f}",
             times(after[r["sessions"]]["engine_seconds_per_audio_second"] / r["engine_seconds_per_audio_second"])]
            for r in doc["before"] if r["sessions"] in after]
    return md_table(head, rows)


def projection_table(doc: dict) -> str:
    """eval/project_large.py: per compute type, the measured costs of the large shapes and the projected speed-up."""
    head = ["compute type", "target step ms", "verify 4 tokens ms (x step)", "draft step ms (x step)",
            f"projected decode speed-up (E = {doc['tokens_per_pass']}, loop {doc['overhead_ms']} ms a pass)"]
    rows = [[r["compute_type"], r["target_1_ms"], f"{num(r['target_4_ms'])} ({times(r['verify_steps'])})",
             f"{num(r['draft_1_ms'])} ({r['draft_steps']:.3f})", times(r["projected_speedup"])] for r in doc["rows"]]
    return md_table(head, rows)


ENCODER_ON = {"stream": "new audio + 2 s look-ahead + 3 s silence", "audio": "the buffer + 2 s of silence",
              "full": "padded 30 s windows"}  # eval/bench_streaming.py --encoder-windows


def wer_table(doc: dict) -> str:
    """eval/bench_streaming.py's WER part: one row per set and encoder window (the first of ``encoder_windows`` is
    the one without a suffix; runs before the streaming encoder encoded the buffer)."""
    head = ["set", "encoder on", "files", "offline WER %", "streaming WER %", "streaming against offline text, WER %",
            "engine busy s", "engine busy s without hints"]
    first = doc.get("encoder_windows", "audio").split(",")[0]
    rows = [["long-form" if "longform" in key else "dev set",
             ENCODER_ON[key.split("_")[-2] if key.endswith("_window") else first], r["utterances"],
             r["wer_offline"], r["wer_streaming"], r["wer_streaming_vs_offline"], r["with_hints"]["engine_busy_s"],
             r.get("without_hints", {}).get("engine_busy_s")] for key, r in doc.items() if key.startswith("wer_")]
    return md_table(head, rows)


def capacity_table(doc: dict) -> str:
    """eval/bench_streaming.py's capacity part: one row per number of simultaneous sessions."""
    head = ["real-time sessions", "RTF (engine busy / stream)", "partial latency median / p90 s",
            "final latency median / p90 s", "words", "words missing / offline", "close lag max s",
            "encoder calls / decoder passes per tick"]
    rows = [[r["sessions"], r["rtf"], f"{num(r['partial_latency_median_s'])} / {num(r['partial_latency_p90_s'])}",
             f"{num(r['final_latency_median_s'])} / {num(r['final_latency_p90_s'])}", r["words"],
             f"{r['words_missing']} / {r['words_offline']}" if "words_missing" in r else "—", r["close_lag_max_s"],
             f"{num(r['encoder_calls_per_tick'])} / {num(r['decoder_passes_per_tick'])}"
             if "encoder_calls_per_tick" in r else "—"] for r in doc["capacity"]]
    return md_table(head, rows)


def live_table(doc: dict | list) -> str:
    """eval/live_with_uploads.py: one row per setting (older runs saved the bare list of rows)."""
    head = ["setting", "live final latency median / p90 / max s", "uploads finished", "upload s median", "finals",
            "stream wall s", "uploaders", "uploads refused", "server peak RSS MB"]
    rows = [[r["setting"], " / ".join(num(r[f"final_latency_{q}_s"]) for q in ("median", "p90", "max")),
             r["uploads_finished"], r["upload_seconds_median"], r["finals"], r["stream_wall_s"],
             *(r.get(k, "—") for k in ("uploaders", "uploads_refused", "server_peak_rss_mb"))]
            for r in (doc["settings"] if isinstance(doc, dict) else doc)]
    return md_table(head, rows)


def word_table(doc: dict) -> str:
    """eval/word_timestamps.py: one row."""
    head = ["words (ours)", "paired with faster-whisper's", "median \\|Δ\\| start/end s", "p90 \\|Δ\\| s",
            "within 0.1 s", "out of order", "outside their segment", "time with words ÷ without (total; median per file)"]
    return md_table(head, [[doc["words"], doc["paired_with_faster_whisper"], doc["median_abs_diff_s"],
                            doc["p90_abs_diff_s"], pct(doc["share_within_0.1s"]), doc["words_out_of_order"],
                            doc["words_outside_their_segment"],
                            f"{times(doc['cost_ratio_total'])}; {times(doc['cost_ratio_median_per_file'])}"]])


def ray_table(doc: dict) -> str:
    """eval/ray_dev.py: the local command and --ray, wall times per round."""
    head = ["run", "wall s (median)", "rounds, s", "against local", "outputs differing from local"]
    rows = [[name, doc["median_wall_s"][name], ", ".join(num(w) for w in doc["wall_s"][name]),
             "—" if name == "local" else times(doc["ray_over_local"]),
             "—" if name == "local" else str(len(doc["differing_outputs"]))] for name in ("local", "ray")]
    return md_table(head, rows)


# --- plots ----------------------------------------------------------------------------------------------------------

def eval_plot(doc: dict, title: str) -> Figure:
    """Wall time per system, split into encoder, decode and the rest (peers: unsplit)."""
    s = doc["systems"]
    names = list(s)[::-1]
    enc = [s[n]["encoder_s"] or 0.0 for n in names]
    dec = [s[n]["decode_s"] or 0.0 for n in names]
    rest = [max(0.0, s[n]["wall_s"] - e - d) for n, e, d in zip(names, enc, dec)]
    fig, ax = plt.subplots(figsize=(7.0, 1.5 + 0.35 * len(names)), layout="constrained")
    ax.barh(names, enc, label="encoder")
    ax.barh(names, dec, left=enc, label="decode")
    ax.barh(names, rest, left=[e + d for e, d in zip(enc, dec)], label="other (peers: all)")
    ax.set(xlabel="wall seconds", title=f"{title}: wall time per system")
    fig.legend(loc="outside lower center", ncol=3, fontsize="small")
    return fig


def steps_plot(doc: dict, title: str) -> Figure:
    """ms per call against new tokens: the target (verify) and the draft, per compute type."""
    fig, ax = plt.subplots(figsize=(7.0, 4.0), layout="constrained")
    for r in doc["results"]:
        tokens = [int(t) for t in r["ms"]["target"]]
        line, = ax.plot(tokens, list(r["ms"]["target"].values()), "o-", label=f"target, {r['compute_type']}")
        ax.plot(tokens, [r["ms"]["draft"][str(t)] for t in tokens], "s--", color=line.get_color(),
                label=f"draft (audio view), {r['compute_type']}")
    ax.set(xlabel="new tokens in the pass", ylabel="ms per pass", title=f"{title}: cost of a pass", ylim=(0, None))
    ax.legend(fontsize="small")
    return fig


def capacity_plot(doc: dict, title: str) -> Figure:
    """Median partial and final latency against the number of simultaneous sessions."""
    rows = doc["capacity"]
    n = [r["sessions"] for r in rows]
    fig, ax = plt.subplots(figsize=(7.0, 4.0), layout="constrained")
    for key, label in (("partial_latency_median_s", "partial, median"), ("final_latency_median_s", "final, median")):
        ax.plot(n, [r[key] for r in rows], "o-", label=label)
    ax.set(xlabel="simultaneous real-time sessions", ylabel="latency, s", title=f"{title}: latency", xticks=n)
    ax.legend()
    return fig


KINDS: dict[str, tuple[Callable[..., str], Callable[[dict, str], Figure] | None]] = {
    "eval": (eval_table, eval_plot), "steps": (steps_table, steps_plot), "budget": (budget_table, None),
    "projection": (projection_table, None), "host": (host_table, None),
    "streaming-wer": (wer_table, None),
    "streaming-capacity": (capacity_table, capacity_plot), "live-uploads": (live_table, None),
    "word-timestamps": (word_table, None), "ray": (ray_table, None)}


def save(fig: Figure, path: Path) -> None:
    fig.savefig(path, dpi=100, metadata={"Software": None})
    plt.close(fig)


# --- the page -------------------------------------------------------------------------------------------------------

def provenance(doc: dict | list, run: dict) -> dict[str, str]:
    """Machine, threads, date and command of a run: from its JSON (``provenance``, ``environment`` of ``asr_spec
    eval``, or top-level fields) where it records them, else from its index entry."""
    records = [r for r in (doc.get("provenance"), doc.get("environment"), doc) if r] if isinstance(doc, dict) else []
    out = {}
    for field, keys in (("machine", ("machine", "cpu")), ("threads", ("threads",)), ("date", ("date",)),
                        ("command", ("command",))):
        found = next(((r, r[k]) for r in [*records, run] for k in keys if r.get(k) is not None), None)
        if found is None:
            raise ResultsError(f"{run['file']}: no {field} recorded in the JSON, and the index gives none")
        record, value = found
        out[field] = f"{value} ({record['cores']} cores)" if field == "machine" and record.get("cores") else str(value)
        if field == "machine" and record.get("gpu"):
            out[field] = f"{record['gpu']} GPU; host {out[field]}"
    return out


def build(index: Path, out: Path) -> list[Path]:
    """Write the page ``out`` and its plots in ``out`` without suffix (a folder); returns the files written."""
    matplotlib.rcdefaults()
    spec = json.loads(index.read_text())
    base = index.parent
    runs = [run for section in spec["sections"] for run in section["runs"]]
    listed = [base / run["file"] for run in runs]
    if missing := [str(p) for p in listed if not p.is_file()]:
        raise ResultsError(f"{index} lists results that do not exist: {', '.join(missing)}")
    docs = {run["file"]: json.loads((base / run["file"]).read_text()) for run in runs}
    stated = {run["file"]: provenance(docs[run["file"]], run) for run in runs}  # all checked before writing
    plots = out.with_suffix("")
    plots.mkdir(parents=True, exist_ok=True)
    for old in sorted(plots.glob("*.png")):
        old.unlink()

    def link(path: Path) -> str:
        rel = os.path.relpath(path, out.parent)
        return f"[`{rel.removeprefix('../')}`]({rel})"

    lines = ["# Results", "",
             f"Generated by `python eval/results_page.py` from the JSON that {link(index)} lists as the current run of "
             "each measurement; edit the index and rerun, not this page. Each table gives the machine, date and command "
             f"of its run. {spec.get('intro', '')}".rstrip(), ""]
    lines += [f"- [{section['title']}](#{section['id']})" for section in spec["sections"]] + [""]
    written = [out]
    for section in spec["sections"]:
        table, plot = KINDS[section["kind"]]
        lines += [f'<a id="{section["id"]}"></a>', "", f"## {section['title']}", "", section["note"], ""]
        for run in section["runs"]:
            path = base / run["file"]
            doc, p = docs[run["file"]], stated[run["file"]]
            if isinstance(doc, dict):  # the index's "fields": what the JSON does not record
                doc = run.get("fields", {}) | doc
            lines += [f"### {run['label']}", "", f"- Machine: {p['machine']}; threads: {p['threads']}",
                      f"- Date: {p['date']}", f"- Command: `{p['command']}`", f"- JSON: {link(path)}", "", table(doc), ""]
            if plot is not None:
                png = plots / ("-".join(Path(run["file"]).with_suffix("").parts).removesuffix("-results") + ".png")
                save(plot(doc, run["label"]), png)
                written.append(png)
                lines += [f"![{section['title']}: {run['label']}]({os.path.relpath(png, out.parent)})", ""]
    older = sorted(p for p in base.rglob("*.json") if p != index and p not in listed)
    lines += ["## Older runs", "", "Replaced by the runs above, or measuring what the code no longer does; kept as they "
              "were saved:", "", *(f"- {link(p)}" for p in older), ""]
    out.write_text("\n".join(lines))
    return written


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--index", type=Path, default=ROOT / "eval" / "results" / "index.json")
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "results.md", help="the page; plots go to its name "
                    "without .md")
    args = ap.parse_args()
    try:
        written = build(args.index, args.out)
    except ResultsError as e:
        sys.exit(f"results_page: {e}")
    print("\n".join(str(p) for p in written))


if __name__ == "__main__":
    main()
