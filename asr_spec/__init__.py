from pathlib import Path

# server/ and clients/ sit beside this folder and install as asr_spec.server and asr_spec.clients (pyproject.toml's
# package-dir). Run from a checkout (on PYTHONPATH, or an editable install), the folder above is searched too, so that
# those names import that checkout's server/ and clients/; an installed package holds them inside and skips this.
if not (Path(__file__).parent / "server").is_dir() and (Path(__file__).resolve().parents[1] / "server").is_dir():
    __path__.append(str(Path(__file__).resolve().parents[1]))
