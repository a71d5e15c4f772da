"""Transcript files: txt, srt, vtt, json, each written atomically (temp file + rename)."""
from __future__ import annotations

import json
import os
import secrets
from pathlib import Path

from .transcript import Segment, Transcript

FORMATS = ("txt", "srt", "vtt", "json")


def _clock(seconds: float, sep: str) -> str:
    ms = int(round(seconds * 1000))
    h, ms = divmod(ms, 3_600_000)
    m, ms = divmod(ms, 60_000)
    s, ms = divmod(ms, 1000)
    return f"{h:02d}:{m:02d}:{s:02d}{sep}{ms:03d}"


def to_txt(t: Transcript) -> str:
    return t.text + "\n"


def cues(t: Transcript, words: bool = False) -> list[tuple[float, float, str]]:
    """(start, end, text) of each subtitle cue: a segment, or with ``words`` a word (segments without word times
    stay whole)."""
    out = []
    for s in t.segments:
        if words and s.words:
            out += [(w.start, w.end, w.word.strip()) for w in s.words]
        else:
            out.append((s.start, s.end, s.text.strip()))
    return out


def to_srt(t: Transcript, words: bool = False) -> str:
    blocks = [f"{i}\n{_clock(a, ',')} --> {_clock(b, ',')}\n{text}\n" for i, (a, b, text) in enumerate(cues(t, words), 1)]
    return "\n".join(blocks)


def to_vtt(t: Transcript, words: bool = False) -> str:
    blocks = [f"{_clock(a, '.')} --> {_clock(b, '.')}\n{text}\n" for a, b, text in cues(t, words)]
    return "WEBVTT\n\n" + "\n".join(blocks)


def word_dicts(segment: Segment) -> list[dict]:
    return [w.as_dict() for w in segment.words or ()]


def to_json(t: Transcript, extra: dict | None = None) -> str:
    doc = {
        "text": t.text,
        "language": t.language,
        "segments": [{"start": s.start, "end": s.end, "text": s.text.strip(), "avg_logprob": round(s.avg_logprob, 4),
                      "no_speech_prob": round(s.no_speech_prob, 4), "temperature": s.temperature,
                      **({"words": word_dicts(s)} if s.words is not None else {})} for s in t.segments],
        "statistics": t.stats.as_dict(),
        **(extra or {}),
    }
    return json.dumps(doc, ensure_ascii=False, indent=2) + "\n"


def render(t: Transcript, fmt: str, extra: dict | None = None, word_cues: bool = False) -> str:
    if fmt == "json":
        return to_json(t, extra)
    return to_txt(t) if fmt == "txt" else {"srt": to_srt, "vtt": to_vtt}[fmt](t, word_cues)


def write_atomic(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` so that readers see the old file or the whole new one, never a part.
    The file gets the mode of any newly created file (0o666 less the umask)."""
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(6)}.part")
    f = open(tmp, "x", encoding="utf-8")  # exclusive create, permissions from the umask (unlike mkstemp's 0600)
    try:
        with f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_outputs(t: Transcript, stem: str, out_dir: Path, formats: list[str], extra: dict | None = None,
                  word_cues: bool = False) -> list[Path]:
    paths = []
    for fmt in formats:
        path = out_dir / f"{stem}.{fmt}"
        write_atomic(path, render(t, fmt, extra, word_cues))
        paths.append(path)
    return paths
