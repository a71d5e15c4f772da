"""eval/ scripts are thin over the package: none imports another eval script or the tests, nor puts tests/ (or any
folder) on sys.path, nor hard-codes the dev set's location (asr_spec.evaluation.data has it). What the benchmarks share
that the package does not ship lives in eval/benchkit/, which the scripts directly in eval/ import (their folder is on
sys.path) and the experiments may not (theirs is eval/experiments/). eval/ holds at most ten scripts, the ones users
run; one-off experiments live in eval/experiments/, each with its line in that folder's README, and are checked the
same way."""
from __future__ import annotations

import ast
import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EVAL = ROOT / "eval"
EXPERIMENTS = EVAL / "experiments"
KIT = EVAL / "benchkit"
SCRIPTS = sorted(EVAL.glob("*.py")) + sorted(EXPERIMENTS.glob("*.py"))
STEMS = {p.stem for p in SCRIPTS}
MAX_SCRIPTS_IN_EVAL = 10


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


def name(script: Path) -> str:
    return str(script.relative_to(EVAL))


def test_there_are_scripts():
    assert "bench_streaming" in STEMS and len(SCRIPTS) > 5
    assert list(EXPERIMENTS.glob("*.py")), "eval/experiments/ is empty"


def test_eval_holds_at_most_ten_scripts():
    scripts = sorted(p.name for p in EVAL.glob("*.py"))
    assert len(scripts) <= MAX_SCRIPTS_IN_EVAL, f"{len(scripts)} scripts directly in eval/ (at most " \
        f"{MAX_SCRIPTS_IN_EVAL}; one-off experiments go to eval/experiments/): {', '.join(scripts)}"


def test_every_experiment_has_its_line_in_the_readme():
    readme = (EXPERIMENTS / "README.md").read_text()
    missing = [p.name for p in sorted(EXPERIMENTS.glob("*.py")) if f"`{p.name}`" not in readme]
    assert not missing, f"eval/experiments/README.md has no line for {missing}"


@pytest.mark.parametrize("script", SCRIPTS, ids=name)
def test_script_finds_the_checkout_root(script: Path):
    """A script that finds the checkout from its own path (``Path(__file__).resolve().parents[N]``) lands on the root,
    wherever in eval/ it lives."""
    for node in ast.walk(ast.parse(script.read_text(), str(script))):
        if (isinstance(node, ast.Subscript) and isinstance(node.value, ast.Attribute) and node.value.attr == "parents"
                and isinstance(node.slice, ast.Constant) and "__file__" in ast.unparse(node.value)):
            assert script.resolve().parents[node.slice.value] == ROOT, f"{name(script)}: {ast.unparse(node)}"


@pytest.mark.parametrize("script", SCRIPTS, ids=name)
def test_script_imports_only_the_package_and_libraries(script: Path):
    tree = ast.parse(script.read_text(), str(script))
    names = imported(tree)
    assert not names & STEMS, f"{name(script)} imports eval scripts {sorted(names & STEMS)}"
    assert not names & {"tests", "conftest", "."}, f"{name(script)} imports the tests or relatively"
    assert not any(n.startswith("test_") for n in names), f"{name(script)} imports a test module"
    assert not edits_sys_path(tree), f"{name(script)} changes sys.path"
    if script.parent == EXPERIMENTS:
        assert "benchkit" not in names, f"{name(script)} imports eval/benchkit, which is not on its sys.path"


@pytest.mark.parametrize("module", sorted(KIT.glob("*.py")), ids=name)
def test_the_benchkit_imports_only_the_package_libraries_and_itself(module: Path):
    names = imported(ast.parse(module.read_text(), str(module)))
    assert not names & (STEMS | {"tests", "conftest", "."}), f"{name(module)} imports {sorted(names & (STEMS | {'tests', 'conftest', '.'}))}"


def test_the_package_ships_no_benchmark_helper():
    """The package a user installs holds no test model or eval-only helper: nothing under asr_spec/ imports benchkit."""
    users = [str(p.relative_to(ROOT)) for p in (ROOT / "asr_spec").rglob("*.py") if "benchkit" in imported(ast.parse(p.read_text()))]
    assert not users, users


@pytest.mark.parametrize("script", SCRIPTS, ids=name)
def test_script_does_not_hard_code_the_dev_set(script: Path):
    text = script.read_text()
    assert "shared/data/dev" not in text and '"shared" / "data"' not in text, name(script)


@pytest.mark.slow  # imports torch and the package for each experiment
@pytest.mark.parametrize("script", sorted(EXPERIMENTS.glob("*.py")), ids=name)
def test_experiment_imports_and_shows_its_help(script: Path, monkeypatch, capsys):
    """An experiment is not maintained past its question, but it still loads against today's package and answers
    ``--help`` (run as ``python eval/experiments/NAME.py --help`` would, in this process)."""
    spec = importlib.util.spec_from_file_location(f"eval_experiment_{script.stem}", script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.setattr(sys, "argv", [str(script), "--help"])
    with pytest.raises(SystemExit) as stop:
        module.main()
    assert stop.value.code == 0 and "usage:" in capsys.readouterr().out, name(script)
