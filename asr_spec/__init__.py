import os
from pathlib import Path

# A row's bits must not depend on its batch company (tests/test_compute.py): oneDNN's AMX kernels for bfloat16 matrix
# products broke that on a Xeon with AMX (2026-11-28), its AVX512-BF16 ones keep it, so AMX stays off unless the user
# sets ONEDNN_MAX_CPU_ISA (read by oneDNN at its first kernel, after this import).
os.environ.setdefault("ONEDNN_MAX_CPU_ISA", "AVX512_CORE_BF16")

# server/ and clients/ sit beside this folder and install as asr_spec.server and asr_spec.clients (pyproject.toml's
# package-dir). Run from a checkout (on PYTHONPATH, or an editable install), the folder above is searched too, so that
# those names import that checkout's server/ and clients/; an installed package holds them inside and skips this.
if not (Path(__file__).parent / "server").is_dir() and (Path(__file__).resolve().parents[1] / "server").is_dir():
    __path__.append(str(Path(__file__).resolve().parents[1]))
