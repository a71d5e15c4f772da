"""The README and docs/*.md against the code: every default a doc states for an option (`--k K` (default 3), a table
row whose "default" column holds it) is the default the command line builds (asr_spec.cli's parser, serve's
ServeSettings, and the hardware-dependent defaults their methods resolve); the README is a manual of at most 300 lines
with a contents list; every relative link and every eval/results/ path a doc names exists; no doc narrates dated runs.
docs/results.md is generated (eval/results_page.py) and checked by tests/eval/test_results_page.py, so it is left out.
Fast: the parsers and settings only, no model."""
from __future__ import annotations

import argparse
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
GENERATED = {ROOT / "docs" / "results.md"}
DOCS = [README] + [p for p in sorted((ROOT / "docs").glob("*.md")) if p not in GENERATED]
COMMANDS = ("transcribe", "serve", "mic", "stream", "eval", "distill")
# pages about one command: an option they name without saying whose is that command's
PAGE_COMMANDS = {"protocol.md": {"serve"}, "realtime.md": {"serve"}, "openai-api.md": {"serve"}, "deploy.md": {"serve"}}
MAX_README_LINES = 300


# --- what the code says ----------------------------------------------------------------------------------------------

def _options(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    return {flag: a for a in parser._actions for flag in a.option_strings if flag.startswith("--") and flag != "--help"}


def code_defaults(cores_amx: tuple[tuple[int, bool], ...] = ((1, False), (1, True))) -> dict[str, dict[str, set]]:
    """Each command's options and the defaults they may be documented with: argparse's default (serve's: its
    ServeSettings field's), and where that is a placeholder (None, 0: "the hardware's"), what the code resolves it to
    on a CPU and on CUDA (``cores_amx``: the CPUs serve's session limit is worked out for)."""
    from asr_spec.server import settings as serve

    from asr_spec.cli import build_parser
    from asr_spec.commands.transcribe import TranscribeSettings
    from asr_spec.models.settings import ModelSettings

    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    out: dict[str, dict[str, set]] = {}
    for name, parser in sub.choices.items():
        out[name] = {flag: {a.default} for flag, a in _options(parser).items()}
    out["serve"] = {"--" + n.replace("_", "-"): {f.default} for n, f in serve.ServeSettings.model_fields.items()}
    out["serve"]["--api-key"] = {None}
    assert set(out) == set(COMMANDS), f"asr_spec --help lists {sorted(out)}: update COMMANDS and the README"

    t = out["transcribe"]
    cpu, cuda = TranscribeSettings(models=ModelSettings()), TranscribeSettings(models=ModelSettings(torch_device="cuda"))
    resolved = cpu.options()
    t["--k"].add(resolved.k)
    t["--draft-stop"].add(resolved.draft_stop)
    t["--batch-size"] |= {cpu.batch(), cuda.batch()}
    t["--format"] |= set(TranscribeSettings(models=ModelSettings(), output_dir="out").formats())

    s = out["serve"]
    on_cpu, on_cuda = serve.ServeSettings.model_construct(device="cpu"), serve.ServeSettings.model_construct(device="cuda")
    s["--max-batch"] |= {on_cpu.batch(), on_cuda.batch()}
    s["--encoder-window"] |= {on_cpu.window(), on_cuda.window()}
    s["--max-sessions"].add(on_cuda.sessions())
    s["--threads"].add(on_cuda.torch_threads())
    saved = serve._cores, serve.amx
    try:
        for cores, amx in cores_amx:
            serve._cores, serve.amx = (lambda c=cores: c), (lambda a=amx: a)
            s["--max-sessions"].add(on_cpu.sessions())
    finally:
        serve._cores, serve.amx = saved
    return out


# --- what the docs say -----------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Claim:
    """A doc's statement that ``option`` defaults to ``value``, with the commands its context names (empty: any)."""
    where: str
    option: str
    value: str
    commands: frozenset[str]


SPAN = re.compile(r"`([^`\n]+)`")
OPTION = re.compile(r"(?<![\w-])(--[a-z][a-z0-9-]*)(?:[ =]([^\s`]+))?")
COMMAND_WORD = re.compile(r"`(?:asr_spec )?(" + "|".join(COMMANDS) + r")(?:`| [^`]*`)")
NUMBER = re.compile(r"-?\d+(?:\.\d+)?(?:e-?\d+)?(?![\w.])")
LITERAL = re.compile(r"[a-z0-9_.,:/+-]+")  # a value as the code spells it (placeholders such as OUT/work are capitals)
DEFAULT = re.compile(r"\bdefaults?\b\s*(?:is\s+|of\s+)?[:=]?\s*")


def literal(text: str) -> str | None:
    """The value ``text`` starts with, when it is one the code could hold: a number or a `code` literal."""
    if m := re.match(r"`([^`]+)`", text):
        return m[1] if LITERAL.fullmatch(m[1]) else None
    if m := NUMBER.match(text):
        return m[0]
    return None


def option_mentions(item: str) -> list[tuple[int, int, str, str | None, str | None]]:
    """The options an item names in `code`: (start, end, option, inline value, command). A span that starts with
    another program (python, docker, ray, a script) names that program's options and is left out; one that starts with
    asr_spec or a command's name says whose option it is."""
    found = []
    for span in SPAN.finditer(item):
        words = span[1].split()
        command = None
        if words and words[0] == "asr_spec":
            words = words[1:]
        if words and words[0] in COMMANDS:
            command, words = words[0], words[1:]
        if not words or not words[0].startswith("--"):
            continue
        for m in OPTION.finditer(" ".join(words)):
            found.append((span.start(), span.end(), m[1], m[2], command))
    return found


def row_cells(row: str) -> list[str]:
    return [c.strip() for c in re.split(r"(?<!\\)\|", row.strip().strip("|"))]


def items(text: str) -> list[tuple[int, str, frozenset[str], list[str] | None]]:
    """A doc's items outside code blocks, each (first line, text, the commands its heading names, its table's header
    cells): a table row, a list item with its continuation lines, or a paragraph."""
    out: list[tuple[int, str, frozenset[str], list[str] | None]] = []
    context: frozenset[str] = frozenset()
    header: list[str] | None = None
    current: list[str] = []
    start = 0
    fenced = False

    def flush() -> None:
        if current:
            out.append((start, " ".join(current), context, None))
            current.clear()

    for n, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if stripped.startswith("```"):
            flush()
            fenced = not fenced
            continue
        if fenced:
            continue
        if stripped.startswith("#"):
            flush()
            context = frozenset(m[1] for m in COMMAND_WORD.finditer(stripped))
            header = None
            continue
        if stripped.startswith("|"):
            flush()
            cells = row_cells(stripped)
            if header is None:
                header = [c.lower() for c in cells]
            elif not all(set(c) <= set("-: ") for c in cells):
                out.append((n, stripped, context, header))
            continue
        header = None
        if not stripped or re.match(r"[-*] |\d+\. ", stripped):
            flush()
        if stripped:
            if not current:
                start = n
            current.append(stripped)
    flush()
    return out


def claims(text: str, name: str) -> list[Claim]:
    """Every default ``text`` states for an option: "`--opt X` (default Y)" and its kin (the first value after the
    word default, up to the next option named), "`--opt Y`, the default", and table rows under a "default" column."""
    page = frozenset(PAGE_COMMANDS.get(Path(name).name, ()))
    found = []
    for line, item, heading, header in items(text):
        item = item.replace("**", "")
        context = heading or page
        mentions = option_mentions(item)
        for i, (_, end, option, inline, command) in enumerate(mentions):
            upto = mentions[i + 1][0] if i + 1 < len(mentions) else len(item)
            segment = item[end:upto]
            where = f"{name}:{line}"
            commands = frozenset({command}) if command else context
            if m := DEFAULT.search(segment):
                value = literal(segment[m.end():])
                if value is not None:
                    found.append(Claim(where, option, value, commands))
                    continue
            if inline and LITERAL.fullmatch(inline) and "|" not in inline and re.match(
                    r"\s*[(,]?\s*(?:the |by )?default\b", segment):
                found.append(Claim(where, option, inline, commands))
        if header and "default" in header:
            cells = row_cells(item)
            column = header.index("default")
            before = " | ".join(cells[:column])
            first = option_mentions(before)
            value = literal(cells[column]) if column < len(cells) else None
            if first and value is not None:
                named = frozenset(m[1] for m in COMMAND_WORD.finditer(cells[0]))
                found.append(Claim(f"{name}:{line}", first[0][2], value, first[0][4] and frozenset({first[0][4]})
                                   or named or context))
    return found


def same(doc: str, code) -> bool:
    if isinstance(code, bool) or code is None:
        return doc == str(code).lower()
    if isinstance(code, (int, float)):
        try:
            return float(doc) == float(code)
        except ValueError:
            return False
    if isinstance(code, (tuple, list)):
        return doc == ",".join(map(str, code))
    if NUMBER.fullmatch(doc) and NUMBER.fullmatch(str(code)):
        return float(doc) == float(code)
    return doc == str(code)


def mismatches(found: list[Claim], defaults: dict[str, dict[str, set]]) -> list[str]:
    """The claims no command their context names (or, where it names none of the option's, any command) bears out.
    Options no command has (docker's, pip's, a script's) are not asr_spec's and are left out."""
    bad = []
    for c in found:
        having = [cmd for cmd in COMMANDS if c.option in defaults[cmd]]
        candidates = [cmd for cmd in having if cmd in c.commands] or having
        if candidates and not any(same(c.value, d) for cmd in candidates for d in defaults[cmd][c.option]):
            truth = "; ".join(f"{cmd}: {sorted(map(repr, defaults[cmd][c.option]))}" for cmd in candidates)
            bad.append(f"{c.where}: {c.option} documented as default {c.value!r}, the code has {truth}")
    return bad


def doc_claims() -> list[Claim]:
    return [c for p in DOCS for c in claims(p.read_text(), str(p.relative_to(ROOT)))]


@pytest.fixture(scope="module")
def defaults() -> dict[str, dict[str, set]]:
    return code_defaults()


def test_every_documented_default_is_the_codes(defaults):
    found = doc_claims()
    assert len(found) >= 40, f"only {len(found)} documented defaults found: has the docs' style or the parser changed?"
    bad = mismatches(found, defaults)
    assert not bad, "docs quote defaults the code does not have:\n" + "\n".join(bad)


def test_the_readme_states_the_key_defaults():
    """The manual gives each command's main defaults where a reader looks for them."""
    stated = {(cmd, c.option) for c in claims(README.read_text(), "README.md") for cmd in c.commands}
    wanted = {("transcribe", "--k"), ("transcribe", "--draft-stop"), ("transcribe", "--compute-type"),
              ("transcribe", "--batch-size"), ("transcribe", "--beam-size"), ("transcribe", "--encoder-window"),
              ("serve", "--compute-type"), ("serve", "--step"), ("serve", "--max-step"), ("serve", "--commit-policy"),
              ("serve", "--port"), ("serve", "--max-batch"), ("serve", "--encoder-window"), ("mic", "--compute-type"),
              ("stream", "--url"), ("eval", "--compute-type"), ("eval", "--systems"), ("distill", "--head-size")}
    assert not wanted - stated, f"the README states no default for {sorted(wanted - stated)}"


def test_the_checker_catches_a_wrong_default(defaults):
    """The parser reads each way the docs state a default, and a changed value is a mismatch."""
    doc = """## `asr_spec transcribe`: files

- `--k K` (default {k}): most drafted tokens; `--draft-stop P` (**default {stop}**).
- `--compute-type T` (default `{ctype}`), `--batch-size N` (default {batch} on a CPU, 16 on CUDA).

| option | default |
|---|---|
| `--beam-size N` | {beam} |

## Serving

Streams are re-decoded every `serve --step S` (default {step}); `asr_spec eval --k` (default `{ek}`).
`--speculation auto`, the default. Not ours: `docker run --gpus all` (default 7), `python x.py --k 9` (default 9).
"""
    right = dict(k=3, stop=0.3, ctype="float32", batch=8, beam=1, step=0.5, ek=3)
    good = claims(doc.format(**right), "x.md")
    assert {(c.option, c.value) for c in good} == {
        ("--k", "3"), ("--draft-stop", "0.3"), ("--compute-type", "float32"), ("--batch-size", "8"),
        ("--beam-size", "1"), ("--step", "0.5"), ("--speculation", "auto")}, good
    assert not mismatches(good, defaults)
    for key, wrong in dict(k=4, stop=0.5, ctype="auto", batch=4, beam=5, step=1.0, ek=2).items():
        bad = mismatches(claims(doc.format(**{**right, key: wrong}), "x.md"), defaults)
        assert len(bad) == 1, (key, bad)


# --- the README is the manual ----------------------------------------------------------------------------------------

def slug(heading: str) -> str:
    """GitHub's anchor for a heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(text: str) -> set[str]:
    seen: dict[str, int] = {}
    out = set(re.findall(r'<a id="([^"]+)"', text))
    fenced = False
    for line in text.splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and (m := re.match(r"#{1,6} (.+)", line)):
            s = slug(m[1])
            out.add(s if s not in seen else f"{s}-{seen[s]}")
            seen[s] = seen.get(s, 0) + 1
    return out


def test_the_readme_is_a_manual_with_contents():
    text = README.read_text()
    lines = text.splitlines()
    assert len(lines) <= MAX_README_LINES, f"README.md has {len(lines)} lines (at most {MAX_README_LINES})"
    top = "\n".join(lines[:30])
    assert "\n## Contents\n" in top, "the README's contents list is not near its top"
    contents = text.split("\n## Contents\n", 1)[1].split("\n## ", 1)[0]
    linked = set(re.findall(r"\]\(#([^)]+)\)", contents))
    sections = {slug(h) for h in re.findall(r"^## (.+)$", text, re.M)} - {"contents"}
    assert sections <= linked, f"the contents list lacks {sorted(sections - linked)}"
    assert linked <= anchors(text), f"the contents list links to no heading: {sorted(linked - anchors(text))}"
    block = re.findall(r"<!-- test-command -->\n```bash\n(.+)\n```\n<!-- /test-command -->", text)
    assert len(block) == 1 and "python -m pytest" in block[0], "the README's test-command block (.ci/run runs it)"
    assert "docs/results.md" in text, "the README links the results page"


def test_no_doc_narrates_dated_runs():
    """Docs say what is; the measurements, with their machines and dates, are on the generated results page."""
    dated = [f"{p.relative_to(ROOT)}:{n}: {line.strip()[:100]}" for p in DOCS
             for n, line in enumerate(p.read_text().splitlines(), 1) if re.search(r"\b20\d\d-\d\d-\d\d\b", line)]
    assert not dated, "dated lines (link docs/results.md or the results file instead):\n" + "\n".join(dated)


# --- links -----------------------------------------------------------------------------------------------------------

def links(text: str) -> list[tuple[int, str]]:
    out, fenced = [], False
    for n, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
        elif not fenced:
            out += [(n, m) for m in re.findall(r"\]\(([^)\s]+)\)", re.sub(r"`[^`]*`", "", line))]
    return out


def test_every_relative_link_and_results_path_exists():
    broken = []
    for page in DOCS:
        text = page.read_text()
        for n, target in links(text):
            if re.match(r"[a-z]+:", target):
                continue
            path, _, anchor = target.partition("#")
            file = (page.parent / path).resolve() if path else page
            where = f"{page.relative_to(ROOT)}:{n}: {target}"
            if not file.exists():
                broken.append(f"{where} (no such file)")
            elif anchor and file.suffix == ".md" and anchor not in anchors(file.read_text()):
                broken.append(f"{where} (no such heading)")
        for n, line in enumerate(text.splitlines(), 1):
            for path in re.findall(r"(?<![\w/.-])(eval/results/[\w./-]*)", line):
                path = path.rstrip(".,")
                if not (ROOT / path).exists():
                    broken.append(f"{page.relative_to(ROOT)}:{n}: {path} (no such results path)")
    assert not broken, "broken links:\n" + "\n".join(broken)
