"""``asr_spec eval``: WER parity, speed-up and memory against target-only and peer systems (asr_spec.evaluation)."""
from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from ..arguments import option, variant
from ..models.compute import COMPUTE_TYPES
from ..models.settings import ModelSettings

if TYPE_CHECKING:
    from ..evaluation.run import EvalOptions


EvalModelSettings = variant(
    ModelSettings, "EvalModelSettings", "eval's model options: every system's model, device and threads; our systems' "
    "draft, compute type and speculation (a system may name its own type: spec-int8).", __name__, only=(
        "model", "draft", "torch_device", "compute_type", "threads", "speculation"),
    helps={"threads": "threads for every system (default: torch's)",
           "compute_type": "our systems' compute type where their name gives none (spec-int8 names its own): "
                           + ", ".join(COMPUTE_TYPES) + " (default %(default)s)"})


@dataclass(frozen=True, kw_only=True)
class EvalSettings:
    manifest: str = option(help='JSON lines of {"id", "audio", "text"} (audio relative to the file)')
    limit: int = option(0, "first N utterances only")
    systems: str = option("target,spec,draft,hf,hf-assisted,faster-whisper", (
        "comma list (default %(default)s) of target, spec (K drafts where drafting pays, see --speculation), spec-fixed (the same), spec-adaptive (each pass "
        "drafts the K measured to pay most), spec-chunked (--chunked), spec-fp32draft (the draft in float32 where spec "
        "runs it in int8), spec-fullview (the draft reads the whole 30 s window, not only the audio's frames), "
        "spec-sample, target-sample (sampling without the draft, same seeds), draft, hf, hf-assisted, faster-whisper, "
        "faster-whisper-batched (its BatchedInferencePipeline), whisper.cpp (pywhispercpp on the model written as a "
        "ggml file, once, into the cache); the faster-whisper systems run int8 and float32, or one of them with -int8 "
        "/ -float32 (faster-whisper-int8); a peer with -beamN runs its beam search with N beams "
        "(faster-whisper-int8-beam5, whisper.cpp-beam5: their own defaults), greedy otherwise"))
    k: str = option("3", "comma list of K for spec (one run each)")
    window_padding: Literal["audio", "mel"] = option("audio", "our systems': what follows a window's audio when it holds less than 30 s: audio (the log-mel of silence: openai-whisper's decode() on padded audio, default) or mel (zeros after the audio's frames: openai-whisper's transcribe() and faster-whisper); changes the text slightly (README)")
    encoder_window: Literal["full", "audio"] = option("full", "our systems' encoder input: padded 30 s windows "
                                                      "(default) or only the audio")
    draft_stop: str = option("0.3", "comma list of adaptive draft-length thresholds (one run per K and each)")
    temperature: float = option(0.5, "temperature of spec-sample and target-sample")
    seeds: int = option(1, "spec-sample and target-sample runs (seeds 0..N-1)")
    repeat: int = option(1, "timing rounds: each runs every system once, in turn (medians reported)")
    out: str = option("eval/out", "directory for results.json, report.md and plots")
    language: str = option("en", "language for every system ('' = detect)")
    hotwords: str | None = option(None, "our systems' hotwords (as transcribe's)")
    models: EvalModelSettings
    batch_size: str = option("1", "comma list (one run of each of our systems per size): files decoded together; "
                             "faster-whisper-batched: its batch size (it batches the chunks of one file)")

    def options(self) -> EvalOptions:
        from ..evaluation.run import EvalOptions

        m = self.models
        return EvalOptions(manifest=Path(self.manifest), out=Path(self.out),
                           systems=tuple(s.strip() for s in self.systems.split(",") if s.strip()),
                           ks=tuple(int(k) for k in self.k.split(",")),
                           draft_stops=tuple(float(p) for p in self.draft_stop.split(",")), limit=self.limit,
                           repeat=self.repeat, compute_type=m.compute_type, encoder_window=self.encoder_window,
                           window_padding=self.window_padding,
                           temperature=self.temperature, seeds=self.seeds, model=m.model, draft=m.draft,
                           language=self.language or None, threads=m.threads, device=m.torch_device,
                           hotwords=self.hotwords or None, speculation=m.speculation,
                           batch_sizes=tuple(int(n) for n in self.batch_size.split(",")))


def evaluate(settings: EvalSettings) -> int:
    from ..evaluation.report import table
    from ..evaluation.run import evaluate as run

    if not Path(settings.manifest).is_file():
        print(f"error: no manifest at {settings.manifest}", file=sys.stderr)
        return 1
    options = settings.options()
    try:
        results = run(options)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(table(results))
    print(f"\nreport: {options.out / 'report.md'}  results: {options.out / 'results.json'}")
    return 0
