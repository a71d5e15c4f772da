"""Scoring: pure functions over per-utterance outputs (tested against hand-computed values)."""
from __future__ import annotations

from functools import lru_cache
from statistics import median

import jiwer

from ..decoding.rows import acceptance


@lru_cache(maxsize=1)
def _normalizer():
    from whisper_normalizer.english import EnglishTextNormalizer

    return EnglishTextNormalizer()


def normalize(text: str) -> str:
    return _normalizer()(text)


def wer(refs: list[str], hyps: list[str]) -> float:
    """Corpus WER in percent after Whisper's English normaliser (empty normalised references skipped)."""
    pairs = [(normalize(r), normalize(h)) for r, h in zip(refs, hyps)]
    pairs = [(r, h) for r, h in pairs if r.strip()]
    return 100.0 * jiwer.wer([r for r, _ in pairs], [h for _, h in pairs]) if pairs else 0.0


def acceptance_by_position(accepted_at: list[int], k: int) -> list[float | None]:
    """P(draft i accepted | drafts before it accepted), i = 1..k, from accepted drafts per pass."""
    rates = []
    for i in range(1, k + 1):
        reached = sum(a >= i - 1 for a in accepted_at)
        rates.append(sum(a >= i for a in accepted_at) / reached if reached else None)
    return rates


def summarize(run: dict, refs: dict[str, str], target_texts: dict[str, str] | None) -> dict:
    """Totals of one system over all utterances. ``run['items'][id]`` holds text, timings (lists, one per
    repeat; medians are used) and, for our decoders, the decode statistics."""
    items = run["items"]
    ids = [i for i in refs if i in items]
    med = lambda i, key: median(items[i][key]) if items[i].get(key) else None  # noqa: E731

    def total(key: str) -> float | None:
        vals = [med(i, key) for i in ids]
        return None if any(v is None for v in vals) else sum(vals)

    stat = lambda key: sum(items[i].get("stats", {}).get(key, 0) for i in ids)  # noqa: E731
    audio = sum(items[i]["audio_seconds"] for i in ids)
    wall = total("wall_s")
    out = {
        "utterances": len(ids),
        "wer": round(wer([refs[i] for i in ids], [items[i]["text"] for i in ids]), 2),
        "identical_to_target": (sum(items[i]["text"] == target_texts.get(i) for i in ids) if target_texts else None),
        "audio_s": round(audio, 2),
        "wall_s": round(wall, 3) if wall is not None else None,
        "encoder_s": round(v, 3) if (v := total("encoder_s")) is not None else None,
        "decode_s": round(v, 3) if (v := total("decode_s")) is not None else None,
        "rtf": round(wall / audio, 4) if wall else None,
        "text_tokens": sum(items[i]["text_tokens"] for i in ids),
        "peak_rss_mb": run.get("peak_rss_mb"),
    }
    out["tokens_per_s"] = round(out["text_tokens"] / wall, 1) if wall else None
    if any("stats" in items[i] for i in ids):
        passes, accepted, rejected, drafted = stat("target_passes"), stat("accepted"), stat("rejected"), stat("drafted")
        out.update({
            "decoded_tokens": stat("tokens"), "target_passes": passes, "drafted": drafted, "accepted": accepted,
            "rejected": rejected,
            "acceptance": round(a, 4) if (a := acceptance(accepted, rejected)) is not None else None,
            "accepted_per_drafted": round(accepted / drafted, 4) if drafted else None,
            "tokens_per_pass": round((accepted + passes) / passes, 3) if passes else None,
            "decode_tokens_per_s": round(stat("tokens") / out["decode_s"], 1) if out["decode_s"] else None,
            "ms_per_pass": round(1000 * out["decode_s"] / passes, 3) if passes and out["decode_s"] else None,
        })
        positions = [a for i in ids for a in items[i].get("stats", {}).get("accepted_at", [])]
        if run["system"].get("k"):
            out["acceptance_by_position"] = acceptance_by_position(positions, run["system"]["k"])
    return out


def speedups(summaries: dict[str, dict], baseline: str | dict[str, str], key: str) -> dict[str, float | None]:
    """baseline[key] / system[key] for every system (how many times faster than the baseline); ``baseline``: one
    system's name, or each system's own baseline by name (a system without one in ``summaries`` gets None)."""
    def ratio(name: str, s: dict) -> float | None:
        base = summaries.get(baseline if isinstance(baseline, str) else baseline.get(name, ""), {}).get(key)
        return round(base / s[key], 3) if base and s.get(key) else None

    return {name: ratio(name, s) for name, s in summaries.items()}


def pass_costs(summaries: dict[str, dict], baseline: dict[str, str]) -> dict[str, float | None]:
    """What a system's decoder pass costs in its baseline's (target-only) passes: its decode seconds per target pass
    over the baseline's (1.0 for the baseline; a speculative pass also runs the draft's steps and a wider verify)."""
    def ratio(name: str, s: dict) -> float | None:
        base = summaries.get(baseline.get(name, ""), {}).get("ms_per_pass")
        return round(s["ms_per_pass"] / base, 3) if base and s.get("ms_per_pass") else None

    return {name: ratio(name, s) for name, s in summaries.items()}
