"""eval/results_page.py: the same JSON gives the same page and plots, every table says where, when and how it was
measured, and a listed JSON that is missing is a clear error."""
from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
INDEX = ROOT / "eval" / "results" / "index.json"
SCRIPT = ROOT / "eval" / "results_page.py"

pytest.importorskip("matplotlib")


def load_script():
    spec = importlib.util.spec_from_file_location("results_page", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def pages(tmp_path_factory) -> list[tuple[Path, list[Path]]]:
    page = load_script()
    runs = []
    for name in ("a", "b"):
        out = tmp_path_factory.mktemp(name) / "docs" / "results.md"
        runs.append((out, page.build(INDEX, out)))
    return runs


@pytest.mark.slow  # the whole page and its plots, or the script as a subprocess
def test_a_second_run_gives_byte_identical_page_and_plots(pages):
    (out_a, files_a), (out_b, files_b) = pages
    names = [p.relative_to(out_a.parent) for p in files_a]
    assert names == [p.relative_to(out_b.parent) for p in files_b]
    assert any(n.suffix == ".png" for n in names)
    for name in names:
        assert (out_a.parent / name).read_bytes() == (out_b.parent / name).read_bytes(), name


@pytest.mark.slow  # the whole page and its plots, or the script as a subprocess
def test_every_table_states_machine_date_and_command(pages):
    text = pages[0][0].read_text()
    runs = [r for s in json.loads(INDEX.read_text())["sections"] for r in s["runs"]]
    blocks = re.split(r"^### ", text, flags=re.M)[1:]
    assert len(blocks) == len(runs)
    for block in blocks:
        assert "\n| --- |" in block, block[:80]
        head = block.split("\n| ")[0]
        for field in ("- Machine: ", "- Date: ", "- Command: `", "- JSON: "):
            assert field in head, (field, block[:80])
    # outside the per-run blocks there is no table
    assert "| --- |" not in re.split(r"^### ", text, flags=re.M)[0]


@pytest.mark.slow  # the whole page and its plots, or the script as a subprocess
def test_only_listed_runs_are_on_the_page_and_the_rest_is_named(pages):
    text = pages[0][0].read_text()
    listed = {r["file"] for s in json.loads(INDEX.read_text())["sections"] for r in s["runs"]}
    on_page, older = text.split("## Older runs")
    for f in listed:
        assert f"eval/results/{f}`" in on_page and f"eval/results/{f}`" not in older
    for p in INDEX.parent.rglob("*.json"):
        if p != INDEX and str(p.relative_to(INDEX.parent)) not in listed:
            assert f"eval/results/{p.relative_to(INDEX.parent)}`" in older


@pytest.mark.slow  # the whole page and its plots, or the script as a subprocess
def test_a_missing_json_is_a_clear_error(tmp_path):
    index = tmp_path / "index.json"
    index.write_text(json.dumps({"sections": [{"id": "x", "title": "X", "kind": "ray", "note": "",
                                               "runs": [{"file": "gone/results.json", "label": "X"}]}]}))
    page = load_script()
    with pytest.raises(page.ResultsError, match="gone/results.json"):
        page.build(index, tmp_path / "out.md")
    r = subprocess.run([sys.executable, str(SCRIPT), "--index", str(index), "--out", str(tmp_path / "out.md")],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "lists results that do not exist" in r.stderr and "gone/results.json" in r.stderr
    assert not (tmp_path / "out.md").exists()


def test_a_run_without_provenance_is_an_error(tmp_path):
    (tmp_path / "ray").mkdir()
    (tmp_path / "ray" / "results.json").write_text((INDEX.parent / "ray" / "results.json").read_text())
    index = tmp_path / "index.json"
    index.write_text(json.dumps({"sections": [{"id": "x", "title": "X", "kind": "ray", "note": "",
                                               "runs": [{"file": "ray/results.json", "label": "X", "threads": 2}]}]}))
    page = load_script()
    with pytest.raises(page.ResultsError, match="no machine recorded"):
        page.build(index, tmp_path / "out.md")


def test_values_recorded_in_the_json_win_over_the_index(tmp_path):
    doc = json.loads((INDEX.parent / "compute-types" / "dev" / "results.json").read_text())
    doc["environment"].update(machine="Some CPU", cores=4, threads=3, date="2030-01-02T03:04:05+00:00",
                              command="asr_spec eval --recorded")
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "results.json").write_text(json.dumps(doc))
    index = tmp_path / "index.json"
    index.write_text(json.dumps({"sections": [{"id": "x", "title": "X", "kind": "eval", "note": "", "runs": [
        {"file": "run/results.json", "label": "X", "machine": "other", "date": "other", "command": "other"}]}]}))
    load_script().build(index, tmp_path / "out.md")
    text = (tmp_path / "out.md").read_text()
    assert "- Machine: Some CPU (4 cores); threads: 3\n- Date: 2030-01-02T03:04:05+00:00\n" in text
    assert "- Command: `asr_spec eval --recorded`" in text and ": other" not in text


def test_provenance_names_machine_date_and_command(monkeypatch):
    from asr_spec.evaluation.provenance import command_line, provenance

    monkeypatch.setattr(sys, "argv", [str(ROOT / ".venv" / "bin" / "asr_spec"), "eval", "--systems", "a b"])
    p = provenance(2)
    assert p["command"] == "asr_spec eval --systems 'a b'" and p["threads"] == 2 and p["machine"]
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\+00:00", p["date"])
    assert command_line([str(ROOT / "asr_spec" / "__main__.py"), "eval"]) == "python -m asr_spec eval"
