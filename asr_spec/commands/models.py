"""Loading the models a command's options name (asr_spec.models.settings), with a line on stderr."""
from __future__ import annotations

import sys
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..models.loader import Draft, ModelOptions, Whisper


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
