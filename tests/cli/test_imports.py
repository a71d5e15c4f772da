"""The package's shape: its modules import one another as a tree (no cycle), and no source file is long.

Every module of ``asr_spec`` as installed is parsed: ``asr_spec/``, and ``server/`` and ``clients/`` beside it, which
install as ``asr_spec.server`` and ``asr_spec.clients`` (pyproject.toml's package-dir). Every import counts: at the
top, inside functions, under ``if TYPE_CHECKING:``."""
from __future__ import annotations

import ast
import graphlib
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FOLDERS = {"asr_spec": ROOT / "asr_spec", "asr_spec.server": ROOT / "server", "asr_spec.clients": ROOT / "clients"}
MAX_LINES = 400
SOURCES = (".py", ".js", ".html", ".css")
CLI_MAX_LINES = 350  # the command line: a parser over one module per command (asr_spec/commands/)


def modules() -> dict[str, Path]:
    """Module name -> file, for every module of the installed package."""
    found = {}
    for package, folder in FOLDERS.items():
        for path in sorted(folder.rglob("*.py")):
            parts = [package, *path.relative_to(folder).with_suffix("").parts]
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def imported(name: str, path: Path, known: set[str]) -> set[str]:
    """The package's modules that module ``name`` (at ``path``) imports, wherever in the file the import is."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([node.module] if node.module else []))
            # ``from pkg import mod`` imports the module pkg.mod; ``from mod import name`` imports mod
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base for alias in node.names]
        else:
            continue
        for target in targets:
            while target and target not in known:  # ``import asr_spec.x.y`` where y is a name: its module
                target = target.rpartition(".")[0]
            if target and target != name:
                out.add(target)
    return out


def test_modules_are_found():
    found = modules()
    assert {"asr_spec.cli", "asr_spec.server.app", "asr_spec.clients.stream"} <= set(found)


def test_imports_form_no_cycle():
    found = modules()
    graph = {name: imported(name, path, set(found)) for name, path in found.items()}
    try:
        graphlib.TopologicalSorter(graph).prepare()
    except graphlib.CycleError as e:
        cycle = e.args[1]
        raise AssertionError("import cycle: " + " -> ".join(cycle)) from None


def test_import_resolution(tmp_path):
    """The resolver: relative imports from a module and from a package's __init__, names and submodules, imports
    in functions and under TYPE_CHECKING."""
    known = {"asr_spec.audio", "asr_spec.models", "asr_spec.models.loader", "asr_spec.streaming",
             "asr_spec.streaming.engine", "asr_spec.server", "asr_spec.server.app", "asr_spec.server.config",
             "asr_spec.server.session"}
    module = tmp_path / "session.py"
    module.write_text("from __future__ import annotations\nfrom typing import TYPE_CHECKING\n"
                      "from ..audio import SAMPLE_RATE\nfrom ..models import loader\nimport asr_spec.streaming.engine\n"
                      "if TYPE_CHECKING:\n    from .app import Server\n"
                      "def f():\n    from asr_spec.server.config import match_key\n")
    assert imported("asr_spec.server.session", module, known) == {
        "asr_spec.audio", "asr_spec.models.loader", "asr_spec.streaming.engine", "asr_spec.server.app",
        "asr_spec.server.config"}
    package = tmp_path / "__init__.py"
    package.write_text("from .config import match_key\nfrom . import session\nfrom .. import streaming\n")
    assert imported("asr_spec.server", package, known) == {
        "asr_spec.server.config", "asr_spec.server.session", "asr_spec.streaming"}


def test_no_long_files():
    long = []
    for folder in FOLDERS.values():
        for path in sorted(folder.rglob("*")):
            if path.suffix in SOURCES:
                if (n := len(path.read_text().splitlines())) > MAX_LINES:
                    long.append(f"{path.relative_to(ROOT)}: {n} lines")
    assert not long, f"files over {MAX_LINES} lines: {long}"
    assert len((ROOT / "asr_spec" / "cli.py").read_text().splitlines()) <= CLI_MAX_LINES


def test_no_dated_history_in_product_code():
    """Comments say why, commit messages say when: no ``20YY-MM-DD`` in the package's sources."""
    dated = re.compile(r"\b20\d\d-\d\d-\d\d\b")
    found = [f"{path.relative_to(ROOT)}:{n}" for folder in FOLDERS.values() for path in sorted(folder.rglob("*"))
             if path.suffix in SOURCES for n, line in enumerate(path.read_text().splitlines(), 1) if dated.search(line)]
    assert not found, f"dated lines: {found}"
