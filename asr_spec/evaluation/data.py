"""The data the benchmarks run on: where the dev set is, its manifest, and sessions of its speech.

The dev set is ``$ASR_SPEC_DEV`` when set, else ``../shared/data/dev`` beside the checkout (where this workplace keeps
it). A session is dev utterances back to back with short pauses, as a live speaker would give them; its pieces keep
where each utterance starts, so that a reference can be made utterance by utterance (one long offline decode of the
whole session runs Whisper's seek loop over the joins, and its last window, a fraction of a second of pause, was
seen to invent a sentence there: a reference that counts those words as missing from the stream is wrong).
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..audio import SAMPLE_RATE, load_audio

PAUSE_S = 0.6  # between the utterances of a session


def dev_dir() -> Path:
    """The dev set's folder (``$ASR_SPEC_DEV``, else ``../shared/data/dev`` beside the checkout)."""
    if env := os.environ.get("ASR_SPEC_DEV"):
        return Path(env)
    return Path(__file__).resolve().parents[3] / "shared" / "data" / "dev"


def manifest(path: Path | None = None) -> list[dict]:
    """The records of a manifest (JSON lines of id, audio relative to the manifest, text); default: the dev set's."""
    path = path or dev_dir() / "manifest.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@dataclass(frozen=True)
class DataSet:
    """A manifest's records (the first ``limit`` when given) and where their audio is."""
    path: Path
    items: list[dict]

    @classmethod
    def read(cls, path: Path, limit: int = 0) -> DataSet:
        items = manifest(path)
        return cls(path, items[:limit] if limit else items)

    @property
    def root(self) -> Path:
        """The folder the records' audio paths are relative to."""
        return self.path.parent

    def audio_path(self, item: dict) -> Path:
        return self.root / item["audio"]

    def audio(self, item: dict) -> np.ndarray:
        return load_audio(self.audio_path(item))

    def texts(self) -> list[str]:
        return [item.get("text", "") for item in self.items]

    def session(self, seconds: float, offset: int) -> Session:
        """:func:`session` over these records."""
        return session(self.items, seconds, offset, self.root)


def dev_set(dev: Path | None = None, limit: int = 0) -> DataSet:
    """The dev set's utterances (``dev``: its folder, default :func:`dev_dir`)."""
    return DataSet.read((dev or dev_dir()) / "manifest.jsonl", limit)


def longform_set(dev: Path | None = None) -> DataSet:
    """The dev set's long-form talk(s): ``longform/manifest.jsonl`` in its folder."""
    return DataSet.read((dev or dev_dir()) / "longform" / "manifest.jsonl")


@dataclass
class Session:
    """A session's audio, its utterances ((start in seconds, audio) each) and their reference texts."""
    audio: np.ndarray
    pieces: list[tuple[float, np.ndarray]]
    texts: list[str]

    @property
    def seconds(self) -> float:
        return len(self.audio) / SAMPLE_RATE


def session(items: list[dict], seconds: float, offset: int, root: Path | None = None) -> Session:
    """Utterances from ``items[offset]`` on (wrapping around), each followed by ``PAUSE_S`` of silence, until the
    session lasts at least ``seconds``."""
    root = root or dev_dir()
    parts, pieces, texts, total, i = [], [], [], 0.0, offset
    pause = np.zeros(int(PAUSE_S * SAMPLE_RATE), np.float32)
    while total < seconds:
        item = items[i % len(items)]
        a = load_audio(root / item["audio"])
        pieces.append((total, a))
        texts.append(item.get("text", ""))
        parts += [a, pause]
        total += len(a) / SAMPLE_RATE + PAUSE_S
        i += 1
    return Session(np.concatenate(parts), pieces, texts)
