"""eval/results_page.py: the same JSON gives the same page and plots, the page opens with a summary whose figures come
from the JSON, every table says where, when and how it was measured, sections are named by topic, a listed JSON that
is missing is a clear error, and no doc carries the absolute paths of the machine that ran a command."""
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
PAGE = ROOT / "docs" / "results.md"
# absolute paths of a machine (temporary, checkout, home folders), not of a URL or a relative path
MACHINE_PATH = re.compile(r"(?<![\w.~-])/(?:tmp|work|root|home|private/var)/")

pytest.importorskip("matplotlib")


def load_script():
    spec = importlib.util.spec_from_file_location("results_page", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def pages(tmp_path_factory) -> list[tuple[Path, list[Path]]]:
    """Two fresh builds, each in a folder beside a link to eval/, so that its links read as docs/results.md's."""
    page = load_script()
    runs = []
    for name in ("a", "b"):
        folder = tmp_path_factory.mktemp(name)
        (folder / "eval").symlink_to(ROOT / "eval", target_is_directory=True)
        out = folder / "docs" / "results.md"
        runs.append((out, page.build(folder / INDEX.relative_to(ROOT), out)))
    return runs


@pytest.mark.slow  # the whole page and its plots, or the script as a subprocess
def test_a_second_run_gives_byte_identical_page_and_plots(pages):
    (out_a, files_a), (out_b, files_b) = pages
    names = [p.relative_to(out_a.parent) for p in files_a]
    assert names == [p.relative_to(out_b.parent) for p in files_b]
    assert any(n.suffix == ".png" for n in names)
    for name in names:
        assert (out_a.parent / name).read_bytes() == (out_b.parent / name).read_bytes(), name


def index_runs() -> list[dict]:
    return [r for t in json.loads(INDEX.read_text())["topics"] for s in t["sections"] for r in s["runs"]]


def summary_rows() -> list[dict]:
    return json.loads(INDEX.read_text())["summary"]["rows"]


def summary_part(text: str) -> str:
    return text.split("\n## Summary\n", 1)[1].split("\n## ", 1)[0]


@pytest.mark.slow  # the whole page and its plots, or the script as a subprocess
def test_every_table_states_machine_date_and_command(pages):
    text = pages[0][0].read_text()
    blocks = re.split(r"^#### ", text, flags=re.M)[1:]
    assert len(blocks) == len(index_runs())
    for block in blocks:
        assert "\n| --- |" in block, block[:80]
        head = block.split("\n| ")[0]
        for field in ("- Machine: ", "- Date: ", "- Command: `", "- JSON: "):
            assert field in head, (field, block[:80])
    # outside the per-run blocks the only table is the summary's, whose rows give their dates and, below it, each
    # machine's commands and JSON
    before = re.split(r"^#### ", text, flags=re.M)[0]
    summary = summary_part(text)
    assert before.count("\n| --- |") == summary.count("\n| --- |") == 1
    table = [line for line in summary.splitlines() if line.startswith("| ") and "---" not in line][1:]
    bullets = [line for line in summary.splitlines() if line.startswith("- **")]
    assert len(table) == len(bullets) == len(summary_rows())
    for row, bullet in zip(table, bullets):
        machine, date = row.split(" | ")[0].removeprefix("| "), row.split(" | ")[-1].removesuffix(" |")
        assert re.fullmatch(r"\d{4}-\d\d-\d\d", date), row
        assert bullet.startswith(f"- **{machine}**: files, {date}: `") and "(../eval/results/" in bullet, bullet


@pytest.mark.slow  # the whole page and its plots, or the script as a subprocess
def test_only_listed_runs_are_on_the_page_and_the_rest_is_in_the_notebook(pages):
    text = pages[0][0].read_text()
    listed = {r["file"] for r in index_runs()} | {f for r in summary_rows() for f in (r["file"], r.get("live")) if f}
    on_page, older = text.split("## Lab notebook")
    for f in listed:
        assert f"(../eval/results/{f})" in on_page and f"(../eval/results/{f})" not in older, f
    for p in INDEX.parent.rglob("*.json"):
        rel = str(p.relative_to(INDEX.parent))
        if p != INDEX and rel not in listed:
            assert f"(../eval/results/{rel})" in older, rel


@pytest.mark.slow  # the whole page and its plots, or the script as a subprocess
def test_the_page_opens_with_the_summary(pages):
    """Its first section is the summary, starting within the page's first 40 lines: on a fresh page and on the one
    committed in docs/."""
    for text in (pages[0][0].read_text(), PAGE.read_text()):
        lines = text.splitlines()
        first = next(i for i, line in enumerate(lines) if line.startswith("## "))
        assert lines[first] == "## Summary" and first < 40, (first, lines[first])


@pytest.mark.slow  # the whole page and its plots, or the script as a subprocess
def test_the_summary_quotes_its_runs(pages):
    """Each row's figures are the JSON's: speed-ups against target-only (decode, end to end) and faster-whisper
    int8, WER, identical texts, the live speakers at real time with their final latency, the date."""
    summary = summary_part(pages[0][0].read_text())
    table = [line for line in summary.splitlines() if line.startswith("| ") and "---" not in line][1:]
    for row, line in zip(summary_rows(), table):
        cells = line.strip("| ").split(" | ")
        doc = json.loads((INDEX.parent / row["file"]).read_text())
        spec, s = row["spec"], doc["systems"][row["spec"]]
        assert cells[2] == f"{doc['speedup_vs_target']['decode'][spec]:.2f}x", (row["file"], cells)
        assert cells[3] == f"{doc['speedup_vs_target']['wall'][spec]:.2f}x", (row["file"], cells)
        peer = doc["speedup_vs_peer"].get("faster-whisper-int8", {}).get(spec)
        assert cells[4] == ("—" if peer is None else f"{peer:.2f}x"), (row["file"], cells)
        assert cells[5].startswith(f"{s['wer']:.2f}"), (row["file"], cells)
        assert cells[6] == f"{s['identical_to_target']}/{s['utterances']}", (row["file"], cells)
        if row.get("live"):
            live = json.loads((INDEX.parent / row["live"]).read_text())
            n = live["largest_real_time_sessions"]
            if n is None:  # no count the run tried was at real time within the latency bar
                assert cells[7] == "none", (row["live"], cells)
            else:
                latency = next(r["final_latency_median_s"] for r in live["capacity"] if r["sessions"] == n)
                assert re.fullmatch(rf"(at least )?{n} \({latency:.2f} s\)", cells[7]), (row["live"], cells)
        else:
            assert cells[7] == "—"
        date = (doc.get("environment") or doc.get("provenance"))["date"][:10]
        assert cells[8] == date, (row["file"], cells)


@pytest.mark.slow  # the whole page and its plots, or the script as a subprocess
def test_sections_are_named_by_topic_and_their_anchors_unique(pages):
    text = pages[0][0].read_text()
    titles = re.findall(r"^#{2,3} (.+)$", text, flags=re.M)
    assert not [t for t in titles if re.search(r"\bissues? \d", t, flags=re.I)], titles
    anchors = re.findall(r'^<a id="([^"]+)"></a>$', text, flags=re.M)
    assert len(anchors) == len(set(anchors)), sorted(a for a in anchors if anchors.count(a) > 1)


@pytest.mark.slow  # the whole page and its plots, or the script as a subprocess
def test_the_committed_page_is_the_generated_one(pages):
    """docs/results.md is what the index gives today: rerun `python eval/results_page.py` after editing it."""
    assert PAGE.read_text() == pages[0][0].read_text()


def test_no_doc_names_an_absolute_machine_path():
    """Commands in the docs, the README and the results page read the same on any machine: no temporary, checkout or
    home folder of the machine that ran them."""
    docs = sorted({*ROOT.glob("docs/*.md"), *ROOT.glob("docs/**/*.md")}) + [ROOT / "README.md"]
    found = [f"{p.relative_to(ROOT)}:{n}: {line.strip()[:120]}" for p in docs
             for n, line in enumerate(p.read_text().splitlines(), 1) if MACHINE_PATH.search(line)]
    assert not found, "absolute machine paths:\n" + "\n".join(found)


def test_commands_are_shown_without_the_machines_paths():
    portable = load_script().portable
    renamed = {"eval/results/issue39": "eval/results/auto-and-float32",
               "eval/experiments/ray_dev.py": "eval/experiments/ray_dev.py"}
    cases = {
        "python -m asr_spec eval --manifest /work/shared/data/dev/manifest.jsonl --out /work/bar/auto":
            "python -m asr_spec eval --manifest ../shared/data/dev/manifest.jsonl --out OUT/auto",
        "python /work/main/eval/pass_budget.py --out /work/bench-join/budget-now1.json":
            "python eval/pass_budget.py --out OUT/budget-now1.json",
        "python -m asr_spec eval --manifest /tmp/gpu/dev/manifest.jsonl --out /tmp/tmp.n6ZIY7wLJi/eval-auto":
            "python -m asr_spec eval --manifest GPU_DATA/dev/manifest.jsonl --out OUT/eval-auto",
        "python eval/bench_streaming.py --out /root/out/gpu": "python eval/bench_streaming.py --out OUT/gpu",
        "x --dev /home/someone/src/asr_spec/../shared/data/dev --out /private/var/folders/ab/T/run/":
            "x --dev ../shared/data/dev --out OUT/run",
        "asr_spec eval --out eval/results/issue39/auto": "asr_spec eval --out eval/results/auto-and-float32/auto",
        "python eval/experiments/ray_dev.py --out eval/results/ray": "python eval/experiments/ray_dev.py --out eval/results/ray",
        "asr_spec eval --manifest ../shared/data/dev/manifest.jsonl --out eval/out/dev":
            "asr_spec eval --manifest ../shared/data/dev/manifest.jsonl --out eval/out/dev",
    }
    for command, shown in cases.items():
        assert portable(command, renamed) == shown, command
        assert not MACHINE_PATH.search(portable(command, renamed))


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
