"""The model card written next to a distilled draft."""
from __future__ import annotations

from pathlib import Path

from ..writers import write_atomic


def write_card(out: Path, report: dict, command: str) -> None:
    ex = report["examples"]
    history = "\n".join(f"| {h['step']} | {h['seconds'] / 60:.1f} | {100 * h['acceptance']:.1f} % |"
                        for h in report["history"])
    card = f"""# Distilled draft for `{report['target']}`

A draft decoder for exact speculative decoding with asr_spec: {report['decoder_layers']} decoder layers initialised
{f"from the draft {report['options']['init']} (itself started " if report['options'].get('init') else ""}from the target's layers {report['layers_from']}{")" if report['options'].get('init') else ""}, reading the target's encoder output (shared encoder) and its
token/position embeddings, with a {report['head_tokens']}-token output layer{_widened(report)}{_deepened(report)}. The target verifies every drafted
token, so transcripts are the target's own whatever the draft proposes.

- Trained with: `{command}`
- Seed {report['options']['seed']}; {report['steps']} steps of batch {report['options']['batch']} in
  {report['train_seconds'] / 60:.1f} min, {report['train_seconds'] / 3600:.2f} h (labelling the data with the target:
  {report['label_seconds'] / 60:.1f} min), on {report['options'].get('device', 'cpu')}.
- Data: {ex['real']} real-audio examples, {ex.get('aug', 0)} augmented copies of them (speed, noise, reverberation,
  telephone band), {ex['tts']} synthesized ones and {ex.get('session', 0)} windows of real clips
  joined into recordings of up to {report['options'].get('session_s', 0):g} s and decoded the way `transcribe` decodes
  them (previous text as prompt, timestamps, seeking), all labelled by the target's greedy decoding
  ({ex['held_aside']} held aside). Audio: {', '.join(report['options']['audio']) or 'none'}{_made_elsewhere(report)}; text for synthesis:
  {', '.join(Path(t).name for t in report['options']['text']) or 'none'}. No evaluation data.
- Hours of audio by kind: {_hours(report.get('audio_hours', {}))}.
- Loss: KL to the target's top-{report['options']['top_k']} distribution (renormalised on the head) +
  {report['options']['ce_weight']} x cross-entropy on its greedy tokens; {100 * report['options'].get('on_policy', 0):.0f} % of
  each batch on the draft's own proposals ({report['options'].get('policy_steps', 0)} tokens from a random point of
  an example, each labelled by the target's choice after it: on-policy).
- Held-aside per-token acceptance (teacher-forced argmax = target's token): **{100 * report['held_aside_acceptance']:.1f} %**;
  tokens the head cannot propose: {100 * (1 - report['held_aside_label_coverage']):.1f} % of held-aside labels.

| step | minutes | held-aside acceptance |
|---|---|---|
{history}
{_lineage(report)}"""
    write_atomic(out / "README.md", card)


def _made_elsewhere(report: dict) -> str:
    where = report["options"].get("tts_audio")
    return f"; synthesized clips made beforehand: {where}" if where else ""


def _widened(report: dict) -> str:
    before = report.get("init_head_tokens")
    if not before or before == report["head_tokens"]:
        return ""
    return f" (widened from the initial draft's {before}: each new row started as the target's embedding of its token)"


def _deepened(report: dict) -> str:
    before = report.get("init_layers") or report["layers_from"]
    if len(before) == len(report["layers_from"]):
        return ""
    return (f"; the initial draft's layers started from the target's {before}, and the layers added among them as "
            "the target's with their output projections zeroed (adding nothing until trained)")


def _hours(hours: dict[str, float]) -> str:
    names = {"real": "real clips", "aug": "augmented copies", "tts": "synthesized", "session": "real clips joined into recordings (the same audio again)"}
    return "; ".join(f"{names.get(k, k)} {v:.2f} h" for k, v in hours.items()) or "not recorded"


def _lineage(report: dict) -> str:
    """The runs this draft continues (``--init``, run after run) and the training time of all of them."""
    runs = report.get("earlier_runs") or []
    if not runs:
        return ""
    rows = "\n".join(f"| {r.get('draft', '?')} | {r['steps']} | {r['train_seconds'] / 60:.1f} | "
                     f"{100 * r['held_aside_acceptance']:.1f} % |" for r in runs)
    total = sum(r["train_seconds"] for r in runs) + report["train_seconds"]
    return f"""
Trained in {len(runs) + 1} runs, each continuing the draft before it: **{total / 3600:.2f} h of training in all**
(this run {report['train_seconds'] / 3600:.2f} h). The runs before this one (each on its own held-aside set):

| draft | steps | minutes | held-aside acceptance |
|---|---|---|---|
{rows}
"""
