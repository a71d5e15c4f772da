"""Freed memory handed back to the system.

glibc's malloc keeps what a process frees in its arenas (one per thread that allocates) for its next allocations,
and returns little of it: the decoder's and encoder's buffers of a few windows in flight, freed between passes,
stayed held (a server transcribing four uploads at once held 250-340 MB more than with one; malloc_trim gave all of
it back; eval/results/shared-machine). A long-running worker calls :func:`give_back` between rounds of work."""
from __future__ import annotations

import ctypes
import ctypes.util

_libc: list[ctypes.CDLL | None] = []


def give_back() -> bool:
    """Return the memory malloc holds free to the system (glibc's ``malloc_trim``); False where there is none."""
    if not _libc:
        name = ctypes.util.find_library("c")
        try:
            lib = ctypes.CDLL(name) if name else None
            _libc.append(lib if lib is not None and hasattr(lib, "malloc_trim") else None)
        except OSError:
            _libc.append(None)
    if _libc[0] is None:
        return False
    _libc[0].malloc_trim(0)
    return True
