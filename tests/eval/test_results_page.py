"""eval/results_page.py: the same JSON gives the same page and plots, the page opens with a summary whose figures come
from the JSON (the current code with the shipped draft, each row with its commit), every table says where, when, at
which commit and how it was measured, sections are named by topic, the page stays short and eval/results small, a
listed JSON that is missing is a clear error, and no doc nor results file carries the absolute paths of the machine
that ran a command."""
from __future__ import annotations

import importlib.util
import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
INDEX = ROOT / "eval" / "results" / "index.json"
SCRIPT = ROOT / "eval" / "results_page.py"
PAGE = ROOT / "docs" / "results.md"
# absolute paths of a machine (temporary, checkout, home folders), not of a URL or a relative path
MACHINE_PATH = re.compile(r"(?<![\w.~-])/(?:tmp|work|root|home|private/var|Users|var/folders)/")
# what a command on the page must not hold: a folder or draft named by a placeholder, not by a path one can run
PLACEHOLDER = re.compile(r"(?<![\w./=-])(?:OUT|WORK|GPU_DATA|GPU_OUT|SHIPPED|DRAFT(?:-[\w.]+)?)(?![\w.-]*=)\b")
MAX_PAGE_LINES = 400
MAX_RESULTS_FILES = 200

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
        for field in ("- Machine: ", "- Date: ", "- Commit: ", "- Command: `", "- JSON: "):
            assert field in head, (field, block[:80])
    # outside the per-run blocks the only table is the summary's, whose rows give their commits and dates and, below
    # it, each machine's commands and JSON
    before = re.split(r"^#### ", text, flags=re.M)[0]
    summary = summary_part(text)
    assert before.count("\n| --- |") == summary.count("\n| --- |") == 1
    table = [line for line in summary.splitlines() if line.startswith("| ") and "---" not in line][1:]
    bullets = [line for line in summary.splitlines() if line.startswith("- **")]
    assert len(table) == len(bullets) == len(summary_rows())
    for row, bullet, listed in zip(table, bullets, summary_rows()):
        machine, date = row.split(" | ")[0].removeprefix("| "), row.split(" | ")[-1].removesuffix(" |")
        commit = row.split(" | ")[-2]
        assert re.fullmatch(r"\d{4}-\d\d-\d\d", date), row
        assert re.fullmatch(r"[0-9a-f]{7}", commit), row
        assert bullet.startswith(f"- **{machine}, {listed['workload']}**: files, {date} ({commit}): `") \
            and "(../eval/results/" in bullet, bullet


@pytest.mark.slow  # the whole page and its plots, or the script as a subprocess
def test_only_listed_runs_are_on_the_page_and_the_rest_is_named_by_a_readme(pages):
    """The page links the runs the index lists and no other; it keeps no lab notebook of older runs. A JSON kept in
    eval/results that the page does not show is named by the README of its folder or of a folder above it."""
    text = pages[0][0].read_text()
    listed = {r["file"] for r in index_runs()} | {f for r in summary_rows() for f in (r["file"], r.get("live")) if f}
    assert "notebook" not in text.lower()
    linked = set(re.findall(r"\]\(\.\./eval/results/([^)]+\.json)\)", text))
    assert linked - {"index.json"} == listed, sorted((linked - {"index.json"}) ^ listed)
    for p in INDEX.parent.rglob("*.json"):
        rel = str(p.relative_to(INDEX.parent))
        if p == INDEX or rel in listed:
            continue
        readmes = [d / "README.md" for d in (p.parent, *p.parent.parents) if d.is_relative_to(INDEX.parent)]
        names = {r: {str(p.relative_to(r.parent))} | ({f"{p.parent.relative_to(r.parent)}/"} if p.parent != r.parent
                                                       else set()) for r in readmes if r.is_file()}
        assert any(name in r.read_text() for r in names for name in names[r]), rel


@pytest.mark.slow  # the whole page and its plots, or the script as a subprocess
def test_the_page_opens_with_the_summary(pages):
    """Its first section is the summary, starting within the page's first 40 lines: on a fresh page and on the one
    committed in docs/."""
    for text in (pages[0][0].read_text(), PAGE.read_text()):
        lines = text.splitlines()
        first = next(i for i, line in enumerate(lines) if line.startswith("## "))
        assert lines[first] == "## Summary" and first < 40, (first, lines[first])


@pytest.mark.slow  # the whole page and its plots, or the script as a subprocess
def test_the_page_is_short_with_one_table_a_topic(pages):
    """A page a user reads: at most MAX_PAGE_LINES lines, one current table per topic (its newest run), notes of a few
    sentences, no issue numbers in the text."""
    for text in (pages[0][0].read_text(), PAGE.read_text()):
        assert len(text.splitlines()) <= MAX_PAGE_LINES, len(text.splitlines())
        for topic in re.split(r"^## ", text, flags=re.M)[2:]:  # after the summary
            assert topic.count("\n| --- |") == 1 and topic.count("\n#### ") == 1, topic[:80]
        prose = [line for line in text.splitlines() if line and line[0].isalpha()]
        assert max(len(line) for line in prose) < 700, max(prose, key=len)[:120]
        assert not re.search(r"\bissues? \d|#\d\d\b", text, flags=re.I)


def test_the_summary_is_the_current_code_with_the_shipped_draft():
    """Each summary row's runs record their commit, and its files run used the shipped draft (``--draft auto``)."""
    for row in summary_rows():
        doc = json.loads((INDEX.parent / row["file"]).read_text())
        assert doc["options"]["draft"] == "auto", row["file"]
        for f in (row["file"], row.get("live")):
            if f:
                d = json.loads((INDEX.parent / f).read_text())
                assert re.fullmatch(r"[0-9a-f]{40}", (d.get("environment") or d.get("provenance"))["git_commit"]), f


@pytest.mark.slow  # the whole page and its plots, or the script as a subprocess
def test_commands_on_the_page_can_be_run(pages):
    """Every command the page shows names real paths, not placeholders; `asr_spec eval` commands parse with today's
    options (no removed option), and a script they run exists."""
    from asr_spec.cli import build_parser

    text = pages[0][0].read_text()
    commands = re.findall(r"^- Command: `(.+)`$", text, flags=re.M) + re.findall(r": `([^`]+)` \(\[", text)
    assert len(commands) >= len(index_runs())
    parser = build_parser("eval")
    for command in commands:
        assert not PLACEHOLDER.search(command), command
        assert not MACHINE_PATH.search(command), command
        words = shlex.split(command)
        while words and "=" in words[0]:  # environment variables
            words.pop(0)
        if words[:3] == ["python", "-m", "asr_spec"]:
            words = ["asr_spec", *words[3:]]
        if words[:2] == ["asr_spec", "eval"]:
            parser.parse_args(words[1:])  # exits on an option that no longer exists
        elif words[0] == "python":
            assert (ROOT / words[1]).is_file(), command


def test_the_results_folder_is_small():
    """eval/results holds the page's runs and the few others their READMEs name: at most MAX_RESULTS_FILES files, no
    plot (the page draws its own) and no per-run report.md copy."""
    files = [p for p in INDEX.parent.rglob("*") if p.is_file()]
    assert len(files) <= MAX_RESULTS_FILES, len(files)
    assert not [p for p in files if p.suffix == ".png" or p.name == "report.md"]


@pytest.mark.slow  # the whole page and its plots, or the script as a subprocess
def test_the_summary_quotes_its_runs(pages):
    """Each row's figures are the JSON's: its workload's size, speed-ups against target-only (decode, end to end) and
    faster-whisper int8, WER, identical texts, tokens a pass and a pass's cost in target passes, the live speakers at
    real time with their final latency, the date."""
    summary = summary_part(pages[0][0].read_text())
    table = [line for line in summary.splitlines() if line.startswith("| ") and "---" not in line][1:]
    for row, line in zip(summary_rows(), table):
        cells = line.strip("| ").split(" | ")
        doc = json.loads((INDEX.parent / row["file"]).read_text())
        spec, s = row["spec"], doc["systems"][row["spec"]]
        assert cells[1] == f"{row['workload']} ({doc['utterances']}, {doc['audio_s']:.0f} s)", (row["file"], cells)
        assert cells[3] == f"{doc['speedup_vs_target']['decode'][spec]:.2f}x", (row["file"], cells)
        assert cells[4] == f"{doc['speedup_vs_target']['wall'][spec]:.2f}x", (row["file"], cells)
        peer = doc["speedup_vs_peer"].get("faster-whisper-int8", {}).get(spec)
        assert cells[5] == ("—" if peer is None else f"{peer:.2f}x"), (row["file"], cells)
        assert cells[6].startswith(f"{s['wer']:.2f}"), (row["file"], cells)
        assert cells[7] == f"{s['identical_to_target']}/{s['utterances']}", (row["file"], cells)
        assert cells[8] == f"{s['tokens_per_pass']:.2f}", (row["file"], cells)
        cost = doc.get("pass_cost_vs_target", {}).get(spec)  # older runs did not record it
        assert cells[9] == ("—" if cost is None else f"{cost:.2f}"), (row["file"], cells)
        if row.get("live"):
            live = json.loads((INDEX.parent / row["live"]).read_text())
            n = live["largest_real_time_sessions"]
            if n is None:  # no count the run tried was at real time within the latency bar
                assert cells[10] == "none", (row["live"], cells)
            else:
                latency = next(r["final_latency_median_s"] for r in live["capacity"] if r["sessions"] == n)
                assert re.fullmatch(rf"(at least )?{n} \({latency:.2f} s\)", cells[10]), (row["live"], cells)
        else:
            assert cells[10] == "—"
        recorded = doc.get("environment") or doc.get("provenance")
        assert cells[11] == recorded["git_commit"][:7], (row["file"], cells)
        assert cells[12] == recorded["date"][:10], (row["file"], cells)


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
    """Commands in the docs, the README, the results page and every file under eval/results (the JSON's environment
    and command fields, the READMEs) read the same on any machine: no temporary, checkout or home folder of the
    machine that ran them."""
    docs = sorted({*ROOT.glob("docs/*.md"), *ROOT.glob("docs/**/*.md")}) + [ROOT / "README.md"]
    results = sorted(p for p in INDEX.parent.rglob("*") if p.is_file())
    assert results and INDEX in results
    found = [f"{p.relative_to(ROOT)}:{n}: {line.strip()[:120]}" for p in docs + results
             for n, line in enumerate(p.read_text(errors="replace").splitlines(), 1) if MACHINE_PATH.search(line)]
    assert not found, "absolute machine paths:\n" + "\n".join(found)


def test_commands_are_shown_without_the_machines_paths():
    portable = load_script().portable
    renamed = {"eval/results/issue39": "eval/results/auto-and-float32",
               "eval/experiments/ray_dev.py": "eval/experiments/ray_dev.py"}
    cases = {
        "python -m asr_spec eval --manifest /work/shared/data/dev/manifest.jsonl --out /work/bar/auto":
            "python -m asr_spec eval --manifest ../shared/data/dev/manifest.jsonl --out eval/out/auto",
        "python /work/main/eval/pass_budget.py --out /work/bench-join/budget-now1.json":
            "python eval/pass_budget.py --out eval/out/budget-now1.json",
        "python -m asr_spec eval --manifest /tmp/gpu/dev/manifest.jsonl --out /tmp/tmp.n6ZIY7wLJi/eval-auto":
            "python -m asr_spec eval --manifest ../shared/data/dev/manifest.jsonl --out eval/out/eval-auto",
        "python eval/bench_streaming.py --out /root/out/gpu": "python eval/bench_streaming.py --out eval/out/gpu",
        "x --dev /home/someone/src/asr_spec/../shared/data/dev --out /private/var/folders/ab/T/run/":
            "x --dev ../shared/data/dev --out eval/out/run",
        "asr_spec eval --out eval/results/issue39/auto": "asr_spec eval --out eval/results/auto-and-float32/auto",
        "python eval/experiments/ray_dev.py --out eval/results/ray": "python eval/experiments/ray_dev.py --out eval/results/ray",
        "asr_spec eval --manifest ../shared/data/dev/manifest.jsonl --out eval/out/dev":
            "asr_spec eval --manifest ../shared/data/dev/manifest.jsonl --out eval/out/dev",
    }
    for command, shown in cases.items():
        assert portable(command, renamed) == shown, command
        assert not MACHINE_PATH.search(portable(command, renamed))
        assert not PLACEHOLDER.search(portable(command, renamed))


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
    doc = json.loads((INDEX.parent / "avx2-current" / "bar-auto" / "results.json").read_text())
    doc["environment"].update(machine="Some CPU", cores=4, threads=3, date="2030-01-02T03:04:05+00:00",
                              command="asr_spec eval --recorded", git_commit="0123456789abcdef")
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "results.json").write_text(json.dumps(doc))
    index = tmp_path / "index.json"
    index.write_text(json.dumps({"sections": [{"id": "x", "title": "X", "kind": "eval", "note": "", "runs": [
        {"file": "run/results.json", "label": "X", "machine": "other", "date": "other", "command": "other",
         "commit": "other"}]}]}))
    load_script().build(index, tmp_path / "out.md")
    text = (tmp_path / "out.md").read_text()
    assert "- Machine: Some CPU (4 cores); threads: 3\n- Date: 2030-01-02T03:04:05+00:00\n" in text
    assert "- Command: `asr_spec eval --recorded`" in text and ": other" not in text
    assert "- Commit: 0123456\n" in text


def test_provenance_names_machine_date_and_command(monkeypatch):
    from asr_spec.evaluation.provenance import command_line, provenance

    monkeypatch.setattr(sys, "argv", [str(ROOT / ".venv" / "bin" / "asr_spec"), "eval", "--systems", "a b"])
    p = provenance(2)
    assert p["command"] == "asr_spec eval --systems 'a b'" and p["threads"] == 2 and p["machine"]
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\+00:00", p["date"])
    assert command_line([str(ROOT / "asr_spec" / "__main__.py"), "eval"]) == "python -m asr_spec eval"
