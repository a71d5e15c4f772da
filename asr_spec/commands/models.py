"""The model options of the commands that load models (--model/--draft/--no-draft/--device/--compute-type/--threads),
and loading them with a line on stderr."""
from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from ..arguments import option
from ..models.compute import COMPUTE_TYPES

if TYPE_CHECKING:
    from ..models.loader import Draft, ModelOptions, Whisper

SPECULATION = ("auto", "on")
SPECULATION_HELP = ("auto: draft only at the batch widths where drafting was measured to pay on this machine (once, "
                    "kept in the cache directory; the load line says where); on: draft at every width (default "
                    "%(default)s). Never changes the text")
DEFAULT_DRAFT = "auto"  # the draft shipped for the target (asr_spec/drafts/), else none
COMPUTE_HELP = ("precision of the whole model, CTranslate2's names: " + ", ".join(COMPUTE_TYPES) + "; int8 = int8 "
                "weights with the best float the device computes natively; auto = the native type measured fastest "
                "here (once, then kept in the cache directory). Each type gives slightly different text; "
                "speculation is exact at every type (default %(default)s)")


@dataclass(frozen=True, kw_only=True)
class ModelSettings:
    model: str = option("whisper-base", "target: whisper-base (embedded), a local directory or a Hugging Face id")
    draft: str = option(DEFAULT_DRAFT, "draft: 'auto' (the one shipped for the target), a directory or id "
                        "(asr_spec distill output, decoder-only or full Whisper) or layers:I,J (untrained copy)")
    no_draft: bool = option(False, "target-only decoding (the baseline)")
    torch_device: str = option("cpu", "torch device (cpu, cuda, ...)", flag="--device")
    compute_type: Literal[COMPUTE_TYPES] = option("float32", COMPUTE_HELP, metavar="TYPE")
    threads: int = option(0, "torch CPU threads (default: torch's choice; transcribe --ray: per worker, default 1)")
    speculation: Literal[SPECULATION] = option("auto", SPECULATION_HELP)

    def options(self) -> ModelOptions:
        """What to load; what this machine has not measured yet is guessed now and measured in the background."""
        from ..models.loader import ModelOptions

        return ModelOptions(self.model, None if self.no_draft else self.draft, self.torch_device, self.compute_type,
                            self.threads, self.speculation, measure_now=False)


def load(options: ModelOptions, background: bool = False) -> tuple[Whisper, Draft | None] | None:
    """(target, draft or None) as ``options`` say, or None after printing the error. What this machine has not
    measured yet (``auto``'s type, where the draft pays) is measured now (``options.measure_now``), or guessed and,
    with ``background`` (a server: it waits for idle moments), measured by a process of its own (asr_spec.measure)."""
    from ..measure import settle
    from ..models.linear import measuring_seconds
    from ..models.loader import load as load_models
    from ..models.sources import ModelError

    t0 = time.perf_counter()
    try:
        target, draft = load_models(options)
        draft = settle(options, target, draft, background)
    except ModelError as e:
        print(f"error: {e}", file=sys.stderr)
        return None
    probed = measuring_seconds()
    print(f"loaded {target.name}" + (f" + draft {draft.name}: {draft.widths.describe()}" if draft else " (no draft)")
          + f" in {time.perf_counter() - t0:.1f} s"
          + (f" ({probed:.1f} s of it measuring which kernels keep a row's bits here: once, kept in the cache)"
             if probed >= 0.1 else ""), file=sys.stderr)
    return target, draft
