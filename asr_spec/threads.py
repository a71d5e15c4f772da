"""torch's CPU worker threads: one OpenMP pool per process, held by the thread that decodes.

torch runs its CPU operators on OpenMP (GNU libgomp in the Linux wheels). Every thread that runs a parallel operator
gets a pool of worker threads of its own, kept until that thread ends. Once the process's pools hold more threads
than the machine has cores, libgomp's workers stop waiting for the next operator spinning and sleep at once (its
"throttled" wait), so every operator pays for waking them. A server decodes in a thread of its own after its main
thread loaded the models with a pool of its own: on a 2-core Xeon with AMX, 2 torch threads, a 0.5 s stream step
took 224-229 ms in that thread against 127-129 ms in the main thread (eval/experiments/omp_pools.py). A thread
that hands its torch work to another calls :func:`release_pool`: its workers end (it gets new ones if it runs torch
again), and the decoding thread's pool is the process's only one.
"""
from __future__ import annotations

import ctypes
import os

_OMP_PAUSE_SOFT = 1
_runtime: list[ctypes.CDLL] = []  # libgomp as torch loaded it, once found


def _libgomp() -> ctypes.CDLL | None:
    """The libgomp torch runs (read from /proc/self/maps: Linux), when it has OpenMP 5.0's pause. Other wheels bundle
    a libgomp of their own (CTranslate2's, pywhispercpp's), loaded beside torch's: pausing one of those would leave
    torch's workers running, so torch's own folder comes first."""
    if not _runtime:
        try:
            with open("/proc/self/maps") as maps:
                paths = {line.split(maxsplit=5)[-1].strip() for line in maps if "libgomp" in line}
        except OSError:
            return None
        import torch

        torch_dir = os.path.dirname(torch.__file__) + os.sep
        for path in sorted(paths, key=lambda p: (not p.startswith(torch_dir), p)):
            try:
                lib = ctypes.CDLL(path)  # loaded already: the same library torch runs
                lib.omp_pause_resource_all.argtypes = [ctypes.c_int]
            except (OSError, AttributeError):
                continue
            _runtime.append(lib)
            break
    return _runtime[0] if _runtime else None


def release_pool() -> bool:
    """End the calling thread's OpenMP worker threads (``omp_pause_resource_all``); False where torch does not run
    on a libgomp this can reach (another OpenMP runtime, another OS): nothing is done there."""
    lib = _libgomp()
    return lib is not None and lib.omp_pause_resource_all(_OMP_PAUSE_SOFT) == 0
