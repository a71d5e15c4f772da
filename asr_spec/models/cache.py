"""The cache directory (``ASR_SPEC_CACHE``, default ``~/.cache/asr_spec``), safe for any number of processes.

What is built there (a converted model folder) is built by one process at a time under a lock beside it, in a
temporary folder renamed into place once whole; stale temporary folders of dead builders are removed by the next
builder. A folder's manifest (``asr_spec_manifest.json``, written last) holds each file's size and SHA-256; every load
checks it. A file whose inode, size, modification and change times are still those its digest was checked at is
taken as checked (git's index does the same); any other is read whole against its digest (0.26 s for the 290 MB
whisper-base on an AMX Xeon), so a file written into, truncated or replaced is never used. A damaged folder is built
again once, saying what was wrong; a disk without room is one clear error, with nothing left behind.
"""
from __future__ import annotations

import errno
import fcntl
import glob
import hashlib
import json
import os
import re
import shutil
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

MANIFEST = "asr_spec_manifest.json"
FORMAT = "asr_spec-cache/1"
_NO_ROOM = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)


class ModelError(ValueError):
    """A model or draft that cannot be loaded or does not fit its target."""


def cache_dir() -> Path:
    return Path(os.environ.get("ASR_SPEC_CACHE", Path.home() / ".cache" / "asr_spec"))


@contextmanager
def locked(path: Path, timeout: float | None = None) -> Iterator[bool]:
    """Hold an exclusive lock on ``path`` (created if missing; the kernel releases it when the process dies, so a
    killed holder leaves no stale lock; the file names its holder). Yields True once held, or False after ``timeout``
    seconds without it, or as soon as its holder is a stopped process (None: wait as long as it takes)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as f:
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | (fcntl.LOCK_NB if deadline is not None else 0))
                break
            except BlockingIOError:
                if time.monotonic() >= deadline or _stopped(path):
                    yield False
                    return
                time.sleep(0.05)
        try:
            f.truncate(0)
            f.write(str(os.getpid()))
            f.flush()
            yield True
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _stopped(lock: Path) -> bool:
    """Whether the process a lock file names is stopped (it holds the lock, and waiting for it may take forever)."""
    try:
        pid = int(lock.read_text())
        return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] in ("T", "t")
    except (OSError, ValueError, IndexError):
        return False


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 24):
            h.update(block)
    return h.hexdigest()


def _stamp(st: os.stat_result) -> list[int]:
    """What changes whenever a file's bytes may have: its inode, size, modification and change times."""
    return [st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]


def write_manifest(folder: Path) -> None:
    """Record every file of ``folder`` (size, digest, stamp) in its manifest, written last and atomically."""
    files = {}
    for p in sorted(folder.iterdir()):
        if p.is_file() and p.name != MANIFEST and not p.name.startswith("."):
            files[p.name] = {"size": p.stat().st_size, "sha256": sha256(p), "stamp": _stamp(p.stat())}
    _write_json(folder / MANIFEST, {"format": FORMAT, "files": files})


def _write_json(path: Path, doc: dict) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.part")
    tmp.write_text(json.dumps(doc, indent=1))
    tmp.replace(path)


def problem(folder: Path) -> str | None:
    """What is wrong with a built folder (missing, no or an unreadable manifest, a file missing, of another size or
    with other bytes than its digest), or None: it is whole."""
    if not folder.is_dir():
        return "not built yet"
    try:
        doc = json.loads((folder / MANIFEST).read_text())
        files = doc["files"]
        if doc.get("format") != FORMAT or not isinstance(files, dict) or not files:
            raise ValueError("not a manifest")
        entries = {str(name): (int(e["size"]), str(e["sha256"]), list(e.get("stamp", []))) for name, e in files.items()}
    except FileNotFoundError:
        return f"no {MANIFEST} (an unfinished or older build)"
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return f"its {MANIFEST} is unreadable"
    restamped = False
    for name, (size, digest, stamp) in entries.items():
        try:
            st = (folder / name).stat()
        except OSError:
            return f"{name} is missing"
        if st.st_size != size:
            return f"{name} holds {st.st_size} bytes, not {size} (truncated or replaced)"
        if _stamp(st) == stamp:
            continue
        if sha256(folder / name) != digest:
            return f"{name} has other bytes than when it was written (damaged)"
        files[name]["stamp"], restamped = _stamp(st), True
    if restamped:  # checked whole once (a copied or restored folder): stat alone from now on
        try:
            _write_json(folder / MANIFEST, doc)
        except OSError:
            pass  # a read-only cache: checked whole each time
    return None


def built(out: Path, build: Callable[[Path], None], what: str) -> Path:
    """``out``, verified; built first by ``build(folder)`` (which fills an empty folder) when it is missing or
    damaged. One process builds at a time (the others wait, then find it built); a build is renamed into place only
    once whole, with its manifest."""
    if problem(out) is None:
        return out
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        with locked(out.with_name(out.name + ".lock")):
            if (wrong := problem(out)) is None:  # another process built it while this one waited
                return out
            remove_stale(out)
            if out.exists():
                print(f"{out}: {wrong}; building it again", file=sys.stderr)
            tmp = out.with_name(f"{out.name}.tmp{os.getpid()}")
            try:
                tmp.mkdir()
                build(tmp)
                write_manifest(tmp)
                _swap(tmp, out)
            except BaseException:
                shutil.rmtree(tmp, ignore_errors=True)
                raise
    except Exception as e:  # noqa: BLE001 - writers other than Python's own (safetensors) say errno in words
        number = e.errno if isinstance(e, OSError) else int(m.group(1)) if (
            m := re.search(r"os error (\d+)", str(e))) else None
        if number in _NO_ROOM:
            raise ModelError(f"no room to write {what} into {out.parent} ({os.strerror(number)}): free some space, "
                             "or set ASR_SPEC_CACHE to a folder on a disk with room") from None
        if isinstance(e, OSError):
            raise ModelError(f"cannot write {what} into {out.parent}: {e.strerror or e}") from None
        raise
    if (wrong := problem(out)) is not None:
        raise ModelError(f"{out}: {wrong} right after it was built; delete that folder and run again")
    return out


def remove_stale(out: Path) -> None:
    """Temporary folders left beside ``out`` by builders that died (the caller holds ``out``'s lock, so no live
    process is building one)."""
    for p in (*out.parent.glob(glob.escape(out.name) + ".tmp*"), *out.parent.glob(glob.escape(out.name) + ".old*")):
        _remove(p)


def _swap(new: Path, out: Path) -> None:
    """Put folder ``new`` in the place of ``out`` (which may exist: a damaged build)."""
    if out.exists():
        old = out.with_name(f"{out.name}.old{os.getpid()}")
        os.replace(out, old)
        os.replace(new, out)
        _remove(old)
    else:
        os.replace(new, out)


def _remove(p: Path) -> None:
    if p.is_dir() and not p.is_symlink():
        shutil.rmtree(p, ignore_errors=True)
    else:
        p.unlink(missing_ok=True)
