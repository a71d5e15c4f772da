"""docs/results.md and its plots (docs/results/*.png), regenerated from the JSON that ``asr_spec eval`` and the
``eval/`` benchmarks save: eval/results/index.json names the runs of the summary (one row per CPU and workload: the
current code with the shipped draft, speed-ups, WER, tokens a pass, a pass's cost, live speakers, commit) and, per topic of the page, its current run. Every
table is headed by the machine, date, commit and command of its run, as its JSON records them, else as the index gives
them; commands are shown without the absolute paths of the machine that ran them (``portable``). Runs that are no
longer current are not kept: eval/results/README.md says what they measured, and git keeps them.

    python eval/results_page.py [--index eval/results/index.json] [--out docs/results.md]

The same JSON gives a byte-identical page and plots (PNG written without software version or timestamp).
"""
from __future__ import annotations

import argparse
import json
import os
import re
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
    cost = doc.get("pass_cost_vs_target", {})
    head = ["system", "compute type", "WER %", "identical to target", "α", "tokens/pass", "pass in target passes",
            "encoder s", "decode s", "wall s", "peak RSS MB", "decode speed-up vs target", "wall speed-up vs target",
            *(f"wall vs {p}" for p in peers)]
    rows = [[name, m.get("compute_type") or "—", m["wer"],
             "—" if m["identical_to_target"] is None else f"{m['identical_to_target']}/{m['utterances']}",
             pct(m.get("acceptance")), m.get("tokens_per_pass"), cost.get(name), m["encoder_s"], m["decode_s"],
             m["wall_s"],
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


def misses_table(doc: dict) -> str:
    """eval/experiments/draft_misses.py: per corpus, the draft's teacher-forced agreement and its misses by kind (a
    long-form run's windows' first text tokens after a previous-text prompt apart), and of its misses how many the
    draft's best 2 or 4 of their kind hold (what a small tree of candidates could win)."""
    order = ("first 3 text tokens after a previous-text prompt", "first 3 text tokens, no prompt", "text",
             "text outside the shortlist",
             "timestamp closing a segment", "timestamp opening a segment")
    kinds = [k for k in order if any(k in r["kinds"] for r in doc["by_corpus"].values())]
    stamps = [k for k in kinds if k.startswith("timestamp")]
    texts = [k for k in kinds if "text" in k and "outside" not in k]

    def best(r: dict, of: list[str], tops: tuple[int, ...]) -> str:
        """Of the misses of kinds ``of``, how many hold the target's token in the draft's best 2 / 4 of their kind."""
        said = [r["kinds"][k].get("misses_the_draft") for k in of if k in r["kinds"]]
        if not all(said) or not said:
            return "—"
        found = " / ".join(str(sum(d.get(f"target's among its best {t}", 0) for d in said)) for t in tops)
        return f"{found} of {sum(r['kinds'][k]['misses'] for k in of if k in r['kinds'])}"
    head = ["corpus", "positions", "draft agrees", *(f"{k}: missed / all" for k in kinds),
            "outside the shortlist: the target's layer picks it", "missed text: in the draft's best 2 / 4",
            "missed timestamps: in its best 2 / 4 timestamps"]
    rows = [[corpus, r["positions"], f"{r['agree']} %",
             *(f"{r['kinds'][k]['misses']} / {r['kinds'][k]['positions']}" if k in r["kinds"] else "—" for k in kinds),
             r["kinds"].get("text outside the shortlist", {}).get("target_layer_picks_it", "—"),
             best(r, texts, (2, 4)), best(r, stamps, (2, 4))]
            for corpus, r in doc["by_corpus"].items()]
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
    """eval/experiments/project_large.py: per compute type, the measured costs of the large shapes and the projected
    speed-up."""
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
            "encoder calls / decoder passes per tick", "engine s per stream s / offline s per audio s (cost vs offline)"]
    rows = [[r["sessions"], r["rtf"], f"{num(r['partial_latency_median_s'])} / {num(r['partial_latency_p90_s'])}",
             f"{num(r['final_latency_median_s'])} / {num(r['final_latency_p90_s'])}", r["words"],
             f"{r['words_missing']} / {r['words_offline']}" if "words_missing" in r else "—", r["close_lag_max_s"],
             f"{num(r['encoder_calls_per_tick'])} / {num(r['decoder_passes_per_tick'])}"
             if "encoder_calls_per_tick" in r else "—",
             f"{r['engine_s_per_stream_s']:.3f} / {r['offline_s_per_audio_s']:.3f} ({r['cost_vs_offline']}x)"
             if "cost_vs_offline" in r else "—"] for r in doc["capacity"]]
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
    """eval/experiments/ray_dev.py: the local command and --ray, wall times per round."""
    head = ["run", "wall s (median)", "rounds, s", "against local", "outputs differing from local"]
    rows = [[name, doc["median_wall_s"][name], ", ".join(num(w) for w in doc["wall_s"][name]),
             "—" if name == "local" else times(doc["ray_over_local"]),
             "—" if name == "local" else str(len(doc["differing_outputs"]))] for name in ("local", "ray")]
    return md_table(head, rows)


def encoder_table(doc: dict) -> str:
    """eval/experiments/profile_encoder.py: one row per compute type."""
    kinds = ["products", "attention", "convolutions", "GELU", "layer norms", "the rest"]

    def cell(k: dict | None) -> str:
        if k is None:
            return "—"
        rate = f", {k['gflops']:.0f} GFLOPS" if k["gflops"] else ""
        return f"{100 * k['share']:.0f} % ({1e3 * k['s_per_window']:.0f} ms{rate})"
    head = ["type", "s a window", "GFLOPS (a large product alone)", *kinds, "one layer's attention: fused / blocks, ms"]
    rows = [[r["type"], f"{r['s_per_window']:.3f}", f"{r['gflops']:.0f} ({r['peak_gflops']:.0f})",
             *(cell(r["kinds"].get(k)) for k in kinds),
             " / ".join(f"{ms:.1f}" for ms in r["attention_ms_per_layer"].values())] for r in doc["rows"]]
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


def parity_table(doc: dict) -> str:
    """eval/whisper_parity.py: per padding mode, asr_spec's text against openai-whisper's own code."""
    call = {"mel": "whisper.transcribe()", "audio": "whisper.decode() on pad_or_trim(audio)"}
    rows = [[f"`--window-padding {mode}`", call[mode], doc.get("beam", 1),
             f"{m['identical']}/{m['compared']}" if m["compared"] else "— (no such call: decode() reads one window)",
             m["wer_asr_spec"], m["wer_openai_whisper"] if m["compared"] else "—"] for mode, m in doc["modes"].items()]
    return md_table(["asr_spec", "openai-whisper", "beams", "identical texts", "WER % asr_spec",
                     "WER % openai-whisper"], rows)


def shared_table(doc: dict) -> str:
    s = doc["summary"]
    first, up, adm = s["first_session"], s["uploads"], s["admission"]
    said = {"pending": "the machine's measurement pending", "measured": "nothing left to measure"}
    rows = [[f"a new server's first live session (JFK at real time), {said[mode]}",
             f"final median {num(first[mode]['first_median_s'])} s against {num(first[mode]['idle_median_s'])} s "
             f"once idle: {times(first[mode]['ratio'])}", "≤ 2x"] for mode in ("pending", "measured")]
    rows += [["JFK's upload beside eight 59-minute uploads", f"answered in {num(up['jfk_answer_s'])} s", "≤ 5 s"],
             ["the server's memory with those eight", f"grew {num(up['rss_growth_mb'])} MB (one upload alone: "
              f"{num(up['rss_growth_one_upload_mb'])} MB)", "≤ 600 MB"],
             ["a second speaker after 10 s of a CPU-heavy neighbour", f"admitted {num(adm['admitted_after_s'])} s "
              f"after ({num(adm['refusals'])} refusals)", "≤ 10 s"]]
    return md_table(["what", "measured (medians of the runs)", "bar"], rows)


KINDS: dict[str, tuple[Callable[..., str], Callable[[dict, str], Figure] | None]] = {
    "eval": (eval_table, eval_plot), "steps": (steps_table, steps_plot), "budget": (budget_table, None),
    "projection": (projection_table, None), "host": (host_table, None),
    "streaming-wer": (wer_table, None),
    "streaming-capacity": (capacity_table, capacity_plot), "live-uploads": (live_table, None),
    "word-timestamps": (word_table, None), "ray": (ray_table, None), "encoder": (encoder_table, None),
    "draft-misses": (misses_table, None), "shared-machine": (shared_table, None),
    "parity": (parity_table, None)}


def save(fig: Figure, path: Path) -> None:
    fig.savefig(path, dpi=100, metadata={"Software": None})
    plt.close(fig)


# --- the page -------------------------------------------------------------------------------------------------------

# Absolute paths of the machine that ran a command, shortened so that a command reads the same on any machine: the dev
# set beside the checkout (or eval/gpu_check.sh's copy of it) as ``../shared/data/...``, a checkout's files relative
# to it, and any other folder (temporary, output, home) as ``eval/out/`` and its last name.
DATA = re.compile(r"(?<![\w.~-])(?:/[^\s/'\"`]+)*/shared/data/")
GPU_DATA = re.compile(r"(?<![\w.~-])/tmp/gpu(?=/|\b)")
CHECKOUT = re.compile(r"(?<![\w.~-])/(?:work|home|root|tmp)(?:/[^\s/'\"`]+)*?"
                      r"/(?=(?:eval|asr_spec|tests|server|clients)/)")
MACHINE_PATH = re.compile(r"(?<![\w.~-])/(?:tmp|work|root|home|private/var|Users|var/folders)(?:/[^\s'\"`),;]*)?")


def portable(command: str, renamed: dict[str, str] | None = None) -> str:
    """``command`` without the machine's absolute paths (see above), and with results folders and scripts renamed
    since it ran (``renamed``: old path -> new path, relative to the checkout) under their names of today."""
    for old, new in (renamed or {}).items():
        command = re.sub(rf"(?<![\w/-]){re.escape(old)}(?![\w-])", new, command)
    command = DATA.sub("../shared/data/", command)
    command = GPU_DATA.sub("../shared/data", command)
    command = CHECKOUT.sub("", command)
    return MACHINE_PATH.sub(lambda m: "eval/out/" + name if (name := m.group(0).rstrip("/").rsplit("/", 1)[-1])
                            else "eval/out", command)


def provenance(doc: dict | list, run: dict, renamed: dict[str, str] | None = None) -> dict[str, str]:
    """Machine, threads, date, command and commit of a run: from its JSON (``provenance``, ``environment`` of
    ``asr_spec eval``, or top-level fields) where it records them, else from its index entry. The command as
    ``portable`` gives it; the commit abbreviated, "not recorded" where neither gives one."""
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
    out["command"] = portable(out["command"], renamed)
    commit = next((r[k] for r in [*records, run] for k in ("git_commit", "commit") if r.get(k)), None)
    out["commit"] = str(commit)[:7] if commit else "not recorded"
    return out


def machine_of(doc: dict, features: str = "") -> str:
    """A run's machine as the summary names it: the GPU or the CPU the JSON records (without the vendors' (R)), the
    CPU's features as the index gives them (the JSON does not record them), and the cores."""
    rec = next((r for r in (doc.get("environment"), doc.get("provenance")) if r), doc)
    cpu = re.sub(r"\s*\(R\)|\s+Processor$", "", str(rec.get("machine") or rec.get("cpu") or "?"))
    if rec.get("gpu"):
        return f"{rec['gpu']}; host {cpu}, {rec['cores']} cores"
    return ", ".join(x for x in (cpu, features, f"{rec['cores']} cores" if rec.get("cores") else "") if x)


def summary(rows: list[dict], docs: dict[str, dict], stated: dict[str, dict[str, str]],
            link: Callable[[str], str]) -> list[str]:
    """The summary's table, one row per machine and workload (the index names it: dev clips, dev recordings), each
    figure read from the runs the index names for it, and below it each row's runs with date, commit, command and
    JSON. A row's runs must record their commit."""
    head = ["machine", "workload", "compute type", "decode speed-up vs target-only",
            "end-to-end speed-up vs target-only", "end-to-end speed-up vs faster-whisper int8",
            "WER % (faster-whisper int8)", "text identical to target-only", "tokens / pass",
            "a pass in target passes", "live speakers at real time (final latency median)", "commit", "date"]
    table, runs = [], []
    for row in rows:
        doc = docs[row["file"]]
        name, target, peer = row["spec"], row.get("target", "target"), row.get("peer", "faster-whisper-int8")
        systems = doc["systems"]
        if name not in systems or target not in systems:
            raise ResultsError(f"{row['file']}: the summary names systems {name!r} and {target!r}; the run has "
                               f"{', '.join(systems)}")
        for f in (row["file"], row.get("live")):
            if f and stated[f]["commit"] == "not recorded":
                raise ResultsError(f"{f}: a summary row's run records no commit")
        s = systems[name]
        machine = machine_of(doc, row.get("features", ""))
        ctype = s.get("compute_type") or doc.get("options", {}).get("compute_type") or row.get("compute_type")
        if ctype is None:
            raise ResultsError(f"{row['file']}: no compute type recorded in the JSON, and the summary gives none")
        if doc.get("options", {}).get("compute_type") == "auto":
            ctype = f"{ctype} (`auto`)"
        vs_peer = doc["speedup_vs_peer"].get(peer, {}).get(name)
        wer = num(s["wer"]) + (f" ({num(systems[peer]['wer'])})" if peer in systems else "")
        same = "—" if s["identical_to_target"] is None else f"{s['identical_to_target']}/{s['utterances']}"
        p = stated[row["file"]]
        workload = f"{row['workload']} ({doc['utterances']}, {doc['audio_s']:.0f} s)"
        runs.append(f"- **{machine}, {row['workload']}**: files, {p['date'][:10]} ({p['commit']}): `{p['command']}` "
                    f"({link(row['file'])})")
        live = "—"
        if row.get("live"):
            ldoc, lp = docs[row["live"]], stated[row["live"]]
            if machine_of(ldoc, row.get("features", "")) != machine:
                raise ResultsError(f"{row['live']}: measured on {machine_of(ldoc, row.get('features', ''))}, not on "
                                   f"{machine} as {row['file']}")
            n = ldoc.get("largest_real_time_sessions")
            at = {r["sessions"]: r for r in ldoc["capacity"]}
            most = max(at)
            live = "none" if n is None else (f"{'at least ' if n == most else ''}{n} "
                                             f"({num(at[n]['final_latency_median_s'])} s)")
            runs[-1] += f"; live, {lp['date'][:10]} ({lp['commit']}): `{lp['command']}` ({link(row['live'])})"
        cost = doc.get("pass_cost_vs_target", {}).get(name)
        table.append([machine, workload, ctype, times(doc["speedup_vs_target"]["decode"].get(name)),
                      times(doc["speedup_vs_target"]["wall"].get(name)), times(vs_peer), wer, same,
                      num(s.get("tokens_per_pass")), num(cost), live,
                      p["commit"], p["date"][:10]])
    return [md_table(head, table), "", *runs]


def topics_of(spec: dict) -> list[dict]:
    """The index's topics; an index without them (one list of sections) is one topic without a title."""
    return spec.get("topics") or [{"sections": spec.get("sections", [])}]


def build(index: Path, out: Path) -> list[Path]:
    """Write the page ``out`` and its plots in ``out`` without suffix (a folder); returns the files written."""
    matplotlib.rcdefaults()
    spec = json.loads(index.read_text())
    base = index.parent
    renamed = spec.get("renamed", {})
    topics = topics_of(spec)
    runs = [run for topic in topics for section in topic["sections"] for run in section["runs"]]
    rows = spec.get("summary", {}).get("rows", [])
    entries = runs + rows + [{"file": row["live"]} for row in rows if row.get("live")]
    listed = [base / run["file"] for run in entries]
    if missing := sorted({str(p) for p in listed if not p.is_file()}):
        raise ResultsError(f"{index} lists results that do not exist: {', '.join(missing)}")
    docs = {run["file"]: json.loads((base / run["file"]).read_text()) for run in entries}
    stated = {run["file"]: provenance(docs[run["file"]], run, renamed) for run in entries}  # all checked before writing
    plots = out.with_suffix("")
    plots.mkdir(parents=True, exist_ok=True)
    for old in sorted(plots.glob("*.png")):
        old.unlink()

    def rel(path: Path) -> str:
        return os.path.relpath(path, out.parent)

    def link(path: Path | str, text: str | None = None) -> str:
        path = base / path if isinstance(path, str) else path
        return f"[`{text or rel(path).removeprefix('../')}`]({rel(path)})"

    lines = ["# Results", "",
             f"Generated by `python eval/results_page.py` from the JSON that {link(index)} lists; edit the index and "
             "rerun, not this page. Each table gives the machine, date, commit and command of its run."
             + (f" Older runs: {link(base / 'README.md')}." if (base / "README.md").is_file() else ""), ""]
    written = [out]
    if "summary" in spec:
        lines += ['<a id="summary"></a>', "", f"## {spec['summary'].get('title', 'Summary')}", "",
                  spec["summary"]["note"], "", *summary(rows, docs, stated, link), ""]
    titled = [topic for topic in topics if topic.get("title")]
    if titled:
        lines += ["On this page:", "", *(f"- [{topic['title']}](#{topic['id']})" for topic in titled), ""]
    lines += [spec["intro"], ""] if spec.get("intro") else []
    for topic in topics:
        if topic.get("title"):
            lines += [f'<a id="{topic["id"]}"></a>', "", f"## {topic['title']}", ""]
            lines += [topic["note"], ""] if topic.get("note") else []
        for section in topic["sections"]:
            table, plot = KINDS[section["kind"]]
            if section.get("title"):  # a topic of several sections
                lines += [f'<a id="{section["id"]}"></a>', "", f"### {section['title']}", ""]
            lines += [section["note"], ""] if section.get("note") else []
            for run in section["runs"]:
                path = base / run["file"]
                doc, p = docs[run["file"]], stated[run["file"]]
                if isinstance(doc, dict):  # the index's "fields": what the JSON does not record
                    doc = run.get("fields", {}) | doc
                lines += [f"#### {run['label']}", "", f"- Machine: {p['machine']}; threads: {p['threads']}",
                          f"- Date: {p['date']}", f"- Commit: {p['commit']}", f"- Command: `{p['command']}`",
                          f"- JSON: {link(path)}", "", table(doc), ""]
                if plot is not None:
                    png = plots / ("-".join(Path(run["file"]).with_suffix("").parts).removesuffix("-results") + ".png")
                    save(plot(doc, run["label"]), png)
                    written.append(png)
                    lines += [f"![{topic.get('title') or section.get('title', '')}: {run['label']}]({rel(png)})", ""]
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
