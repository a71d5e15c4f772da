"""report.md and the PNG plots of an ``asr_spec eval`` run."""
from __future__ import annotations

from pathlib import Path


def _fmt(v, pct: bool = False) -> str:
    if v is None:
        return "—"
    if pct:
        return f"{100 * v:.1f} %"
    return f"{v:g}" if isinstance(v, (int, float)) else str(v)


def _x(v) -> str:
    return "—" if v is None else f"{v:g}x"


def table(results: dict) -> str:
    s = results["systems"]
    vt_wall, vt_dec = results["speedup_vs_target"]["wall"], results["speedup_vs_target"]["decode"]
    cost = results.get("pass_cost_vs_target", {})
    head = ("| system | compute type | WER % | identical to target | α | accepted/drafted | tokens/pass | ms/pass "
            "| pass in target passes | encoder s | decode s | wall s | RTF | tokens/s | peak RSS MB "
            "| wall speed-up vs target | decode speed-up vs target |")
    rows = [head, "|" + "---|" * 17]
    for name, m in s.items():
        rows.append(f"| {name} | {_fmt(m.get('compute_type'))} | {_fmt(m['wer'])} | {_fmt(m['identical_to_target'])}/{m['utterances']} "
                    f"| {_fmt(m.get('acceptance'), True)} | {_fmt(m.get('accepted_per_drafted'), True)} "
                    f"| {_fmt(m.get('tokens_per_pass'))} | {_fmt(m.get('ms_per_pass'))} | {_fmt(cost.get(name))} "
                    f"| {_fmt(m['encoder_s'])} | {_fmt(m['decode_s'])} "
                    f"| {_fmt(m['wall_s'])} | {_fmt(m['rtf'])} | {_fmt(m['tokens_per_s'])} | {_fmt(m['peak_rss_mb'])} "
                    f"| {_x(vt_wall.get(name))} | {_x(vt_dec.get(name))} |")
    return "\n".join(rows)


def peer_table(results: dict) -> str:
    peers = results["speedup_vs_peer"]
    if not peers:
        return "No peer systems ran."
    rows = ["| system | " + " | ".join(f"vs {p}" for p in peers) + " |", "|---|" + "---|" * len(peers)]
    for name in results["systems"]:
        rows.append(f"| {name} | " + " | ".join(_x(peers[p].get(name)) for p in peers) + " |")
    return "\n".join(rows)


def like_for_like(results: dict) -> str:
    """The pairs of one of ours and one peer that compute at the same type (weights and activations)."""
    s = results["systems"]
    peers = set(results["speedup_vs_peer"])
    pairs = [f"{a} and {b} ({s[a]['compute_type']})" for a in s if a not in peers for b in sorted(peers)
             if s[a].get("compute_type") and s[a]["compute_type"] == s[b].get("compute_type")]
    return "; ".join(pairs) or "none in this run"


def write_report(results: dict, out: Path) -> None:
    env = results["environment"]
    plots = make_plots(results, out)
    skipped = "\n".join(f"- {n}: skipped ({why})" for n, why in results["skipped"].items()) or "- none"
    md = f"""# asr_spec eval

{env['date']} · {env['machine']} · {env['threads']} threads · torch {env['torch']} · transformers {env['transformers']}
· commit {env['git_commit'] or 'unknown'} · `{env['command']}`

Manifest `{results['manifest']}`: {results['utterances']} utterances, {results['audio_s']} s of audio. Every system ran
on the same audio in this run, in rounds: each round runs every system once, in turn (every other round in reverse
order, so that the machine's drift falls on all alike), each in a fresh process (peak RSS is the highest of its
processes'). Timings are medians over {results['options']['repeat']} round(s), summed over utterances. WER: jiwer after
Whisper's English normaliser. α = accepted / (accepted + rejected) drafts; tokens/pass counts every token a
target pass emits. Peers report wall time only. Decoding mode: every system decodes with timestamps (ours as
`transcribe` does, transformers with `return_timestamps=True`, faster-whisper by default), so "identical to target"
compares like with like; `spec-sample` is compared with `target-sample` (the same seeds, no draft).

{table(results)}

"identical to target" and the speed-ups vs target compare each of our systems with target-only decoding at its
own compute type (spec-int8 with target-int8). Like for like (ours and a peer at the same compute type; CTranslate2's
int8 on a CPU is int8 weights with float32 activations): {like_for_like(results)}.

Wall-clock speed-up against each peer (peer wall / system wall):

{peer_table(results)}

Skipped:
{skipped}

{chr(10).join(f'![{p.stem}]({p.name})' for p in plots)}
"""
    (out / "report.md").write_text(md)


def make_plots(results: dict, out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    s = results["systems"]
    paths = []
    spec = {n: m for n, m in s.items() if n.startswith("spec-k")}
    dec = results["speedup_vs_target"]["decode"]
    fig, ax = plt.subplots(figsize=(5, 3.5))
    lines: dict[str, list[tuple[int, float]]] = {}
    for n in spec:
        k, _, stop = n[len("spec-k"):].partition("-stop")
        if dec.get(n) is not None:
            lines.setdefault(f"draft stop {stop}" if stop else "fixed K", []).append((int(k), dec[n]))
    for label, ks in sorted(lines.items()):
        ks.sort()
        ax.plot([k for k, _ in ks], [v for _, v in ks], "o-", label=label)
    if len(lines) > 1:
        ax.legend()
    ax.axhline(1.0, color="grey", lw=0.8, ls="--")
    ax.set(xlabel="K (drafted tokens per target pass)", ylabel="decode speed-up vs target", title="Decode speed-up vs K")
    paths.append(_save(fig, out / "speedup_vs_k.png"))

    fig, ax = plt.subplots(figsize=(5, 3.5))
    for n, m in spec.items():
        rates = m.get("acceptance_by_position") or []
        ax.plot(range(1, len(rates) + 1), [r if r is not None else float("nan") for r in rates], "o-", label=n)
    ax.set(xlabel="draft position", ylabel="P(accepted | earlier accepted)", title="Acceptance by token position",
           ylim=(0, 1.02))
    if spec:
        ax.legend()
    paths.append(_save(fig, out / "acceptance_by_position.png"))

    fig, ax = plt.subplots(figsize=(max(5, 1.1 * len(s)), 3.8))
    names = list(s)
    enc = [s[n]["encoder_s"] or 0 for n in names]
    decs = [s[n]["decode_s"] or 0 for n in names]
    other = [max(0.0, (s[n]["wall_s"] or 0) - e - d) for n, e, d in zip(names, enc, decs)]
    ax.bar(names, enc, label="encoder")
    ax.bar(names, decs, bottom=enc, label="decode")
    ax.bar(names, other, bottom=[e + d for e, d in zip(enc, decs)], label="other / unsplit (peers)")
    ax.set(ylabel="seconds", title="Time split per system")
    ax.tick_params(axis="x", rotation=30)
    ax.legend()
    paths.append(_save(fig, out / "time_split.png"))
    return paths


def _save(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    import matplotlib.pyplot as plt

    plt.close(fig)
    return path
