"""The model options every command that loads models shares (``--model``, ``--draft``, ``--no-draft``, ``--device``,
``--compute-type``, ``--threads``, ``--speculation``), declared once: the commands nest :class:`ModelSettings` (a
command that wants other defaults takes an :func:`~asr_spec.arguments.variant` of it) and serve's settings are
generated from its fields."""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from ..arguments import option
from .compute import COMPUTE_TYPES

if TYPE_CHECKING:
    from .loader import ModelOptions

SPECULATION = ("auto", "on")
DEFAULT_DRAFT = "auto"  # the draft shipped for the target (asr_spec/drafts/), else none
COMPUTE_HELP = ("precision of the whole model, CTranslate2's names: " + ", ".join(COMPUTE_TYPES) + "; int8 = int8 "
                "weights with the best float the device computes natively; auto = the native type measured fastest "
                "here (once, then kept in the cache directory). Each type gives slightly different text; "
                "speculation is exact at every type")
SPECULATION_HELP = ("auto: draft only at the batch widths where drafting was measured to pay on this machine (once, "
                    "kept in the cache directory; the load line says where); on: draft at every width. Never changes "
                    "the text")


@dataclass(frozen=True, kw_only=True)
class ModelSettings:
    model: str = option("whisper-base", "target: whisper-base (embedded), a local directory or a Hugging Face id")
    draft: str = option(DEFAULT_DRAFT, "draft: 'auto' (the one shipped for the target), a directory or id "
                        "(asr_spec distill output, decoder-only or full Whisper) or layers:I,J (untrained copy)")
    no_draft: bool = option(False, "target-only decoding (the baseline)")
    torch_device: str = option("cpu", "torch device (cpu, cuda, ...)", flag="--device")
    compute_type: Literal[COMPUTE_TYPES] = option("float32", COMPUTE_HELP + " (default %(default)s)", metavar="TYPE")
    threads: int = option(0, "torch CPU threads (default: torch's choice; transcribe --ray: per worker, default 1)")
    speculation: Literal[SPECULATION] = option("auto", SPECULATION_HELP + " (default %(default)s)")

    def options(self, threads: int | None = None) -> ModelOptions:
        """What to load (``threads``: instead of the option's); what this machine has not measured yet is guessed
        now and measured in the background."""
        from .loader import ModelOptions

        return ModelOptions(self.model, None if self.no_draft else self.draft, self.torch_device, self.compute_type,
                            self.threads if threads is None else threads, self.speculation, measure_now=False)
