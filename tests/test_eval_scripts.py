"""eval/ scripts are thin over the package: none imports another eval script or the tests, nor puts tests/ (or any
folder) on sys.path, nor hard-codes the dev set's location (asr_spec.evaluation.data has it)."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

EVAL = Path(__file__).resolve().parents[1] / "eval"
SCRIPTS = sorted(EVAL.glob("*.py"))
STEMS = {p.stem for p in SCRIPTS}


def imported(tree: ast.AST) -> set[str]:
    """The top-level module names a module imports (relative imports as ``.``)."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            out.add("." if node.level else (node.module or "").split(".")[0])
    return out


def edits_sys_path(tree: ast.AST) -> bool:
    """Whether the module touches ``sys.path`` (insert, append, assignment, ...)."""
    return any(isinstance(node, ast.Attribute) and node.attr == "path" and isinstance(node.value, ast.Name)
               and node.value.id == "sys" for node in ast.walk(tree))


def test_there_are_scripts():
    assert "bench_streaming" in STEMS and len(SCRIPTS) > 5


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_script_imports_only_the_package_and_libraries(script: Path):
    tree = ast.parse(script.read_text(), str(script))
    names = imported(tree)
    assert not names & STEMS, f"{script.name} imports eval scripts {sorted(names & STEMS)}"
    assert not names & {"tests", "conftest", "."}, f"{script.name} imports the tests or relatively"
    assert not any(n.startswith("test_") for n in names), f"{script.name} imports a test module"
    assert not edits_sys_path(tree), f"{script.name} changes sys.path"


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_script_does_not_hard_code_the_dev_set(script: Path):
    text = script.read_text()
    assert "shared/data/dev" not in text and '"shared" / "data"' not in text, script.name
