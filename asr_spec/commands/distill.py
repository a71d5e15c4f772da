"""``asr_spec distill``: train a cheap draft for a Whisper target from unlabeled audio and text (asr_spec.distill)."""
from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from ..arguments import option, variant
from ..distill import LABEL_BATCH
from ..models.compute import COMPUTE_TYPES
from ..models.settings import ModelSettings

if TYPE_CHECKING:
    from ..distill.train import DistillOptions


DistillModelSettings = variant(
    ModelSettings, "DistillModelSettings", "distill's model options: where and how the target labels the audio.",
    __name__, only=("torch_device", "compute_type", "threads"),
    helps={"threads": "torch CPU threads (default: torch's choice)",
           "torch_device": "where the target labels and the draft trains (cuda: a GPU)",
           "compute_type": "compute type of the target that labels the audio (the draft learns that target's tokens; "
                           "training itself runs in float32): " + ", ".join(COMPUTE_TYPES) + " (default %(default)s)"})


@dataclass(frozen=True, kw_only=True)
class DistillSettings:
    target: str = option("whisper-base", "the Whisper model the draft will serve")
    audio: tuple[str, ...] = option((), "folders of unlabeled audio (the target labels it)", nargs="+")
    text: tuple[str, ...] = option((), "sentence files (one per line) to synthesize speech from", nargs="*")
    out: str = option(help="output folder: the draft, checkpoints, cache, report, model card")
    work: str | None = option(None, "label cache and checkpoints (default: OUT/work); rerunning resumes from it")
    layers: str = option("", "target decoder layers to initialise from (default: first,last; with --init, "
                                 "a list that keeps the draft's own in order deepens it: each added layer starts as "
                                 "the target's with zeroed output projections)")
    head_size: int = option(4000, "text tokens in the draft's output layer (0: all; with --init, a size above the "
                                  "draft's widens its layer)")
    tts_clips: int = option(600, "clips to synthesize from --text")
    real_clips: int = option(0, "label only the first N real clips one by one (0: all; --session-seconds' recordings "
                             "use every clip)")
    tts_engines: str = option("", "comma list of espeak-ng, flite, festival (default: installed)")
    tts_audio: str | None = option(None, "synthesized clips made elsewhere (eval/gpu_data.sh, for a machine without "
                                   "the engines): the first --tts-clips of them instead of synthesizing")
    session_seconds: float = option(120.0, "also join consecutive real clips into recordings this long and label "
                                    "them window by window as transcribe decodes them (previous text as prompt); 0: off")
    init: str | None = option(None, "continue training this draft (its layers, output layer and shortlist; see "
                              "--head-size)")
    minutes: float = option(20.0, "training time budget (a rerun resumes the checkpoint with any budget; a raised one "
                                 "restarts the learning rate's decay, so give a long run its whole budget at once)")
    steps: int = option(0, "train this many steps instead of a time budget")
    checkpoint_every: int = option(50, "steps between checkpoints, each measuring the held-aside acceptance and "
                                   "writing the draft to OUT")
    batch: int = option(16)
    label_batch: int = option(LABEL_BATCH, "clips the target labels at once (a GPU takes 32 or more)")
    lr: float = option(7e-4)
    seed: int = option(0)
    augment: int = option(0, "augmented copies of every real clip (speed, noise, reverberation, telephone band), "
                          "each labelled by the target")
    on_policy: float = option(0.0, "share of each training batch made on the draft's own proposals, labelled by "
                              "the target (DistillSpec's on-policy data); 0: teacher forcing only")
    policy_steps: int = option(8, "draft tokens per on-policy example")
    models: DistillModelSettings
    window_padding: Literal["audio", "mel"] = option("audio", "how the target that labels the audio pads a window "
                                                     "shorter than 30 s (as transcribe's --window-padding)")

    def options(self) -> DistillOptions:
        from ..distill.train import DistillOptions

        return DistillOptions(target=self.target, out=Path(self.out), work=Path(self.work) if self.work else None,
                              audio=tuple(Path(a) for a in self.audio), text=tuple(Path(t) for t in self.text),
                              layers=tuple(int(i) for i in self.layers.split(",")) if self.layers else (),
                              head_size=self.head_size, tts_clips=self.tts_clips, real_clips=self.real_clips,
                              tts_engines=tuple(e for e in self.tts_engines.split(",") if e), minutes=self.minutes,
                              tts_audio=Path(self.tts_audio) if self.tts_audio else None,
                              max_steps=self.steps, batch=self.batch, lr=self.lr, seed=self.seed,
                              label_batch=self.label_batch,
                              session_s=self.session_seconds, init=Path(self.init) if self.init else None,
                              compute_type=self.models.compute_type, window_padding=self.window_padding,
                              device=self.models.torch_device, augment=self.augment,
                              on_policy=self.on_policy, policy_steps=self.policy_steps,
                              eval_every=self.checkpoint_every)


def distill(settings: DistillSettings) -> int:
    import shlex

    import torch

    from ..distill.card import write_card
    from ..distill.train import distill as train
    from ..models.sources import ModelError

    if settings.models.threads:
        torch.set_num_threads(settings.models.threads)
    missing = [p for p in settings.audio + settings.text + (settings.tts_audio or "",) if p and not Path(p).exists()]
    if missing:
        print(f"error: not found: {', '.join(missing)}", file=sys.stderr)
        return 1
    command = "asr_spec distill " + " ".join(shlex.quote(a) for a in sys.argv[2:])
    try:  # the draft, its report and its card at every checkpoint: a run stopped at any time leaves its last draft
        report = train(settings.options(), published=lambda r: write_card(Path(settings.out), r, command))
    except (ModelError, RuntimeError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(f"draft written to {settings.out}: held-aside acceptance {report['held_aside_acceptance']:.1%} after "
          f"{report['steps']} steps ({report['train_seconds'] / 60:.1f} min); use it with --draft {settings.out}")
    return 0
