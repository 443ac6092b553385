"""Small file helpers shared by every stage: atomic writes, hashing, JSON."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Any, Iterable, Iterator


class InputError(RuntimeError):
    """Bad input (config, file, checkpoint): one clear message naming the key or file."""


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path next to `path` (write a file or a directory there); it is renamed onto
    `path` only if the block succeeds.

    A killed or failing writer leaves at most a hidden `.NAME.tmp-PID` behind, never a half-written
    `path`; an existing `path` stays as it was until the rename.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    _remove(tmp)
    try:
        yield tmp
        if tmp.is_file():
            with open(tmp, "rb+") as f:
                os.fsync(f.fileno())
        if tmp.is_dir() and path.is_dir():  # a directory cannot be replaced in one step
            old = path.with_name(f".{path.name}.old-{os.getpid()}")
            os.replace(path, old)
            os.replace(tmp, path)
            _remove(old)
        else:
            os.replace(tmp, path)
    finally:
        _remove(tmp)


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()


def write_text_atomic(path: str | os.PathLike, text: str) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


def write_json_atomic(path: str | os.PathLike, obj: Any) -> None:
    write_text_atomic(path, json.dumps(obj, indent=2, sort_keys=True) + "\n")


def read_json(path: str | os.PathLike) -> Any:
    path = Path(path)
    if not path.is_file():
        raise InputError(f"{path}: file not found")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise InputError(f"{path}: not valid JSON ({e})") from None


def sha256_file(path: str | os.PathLike, chunk: int = 1 << 22) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def write_file_record(path: str | os.PathLike, folder: str | os.PathLike, files: Iterable[Path]) -> None:
    """Record `files` (under `folder`, by their relative paths) with their sizes and sha256 in the JSON file
    `path`, atomically: what `changed_files` checks the folder against later (a checkpoint's manifest, a
    fine-tuning seed's results)."""
    folder = Path(folder)
    write_json_atomic(path, {"files": {p.relative_to(folder).as_posix(): {"bytes": p.stat().st_size,
                                                                          "sha256": sha256_file(p)}
                                       for p in files}})


def read_file_record(path: str | os.PathLike) -> dict[str, dict[str, Any]]:
    """The files a `write_file_record` record lists; ValueError (or OSError) when it is not such a record."""
    files = json.loads(Path(path).read_text(encoding="utf-8"))["files"] if Path(path).is_file() else None
    if not isinstance(files, dict) or not all(
            isinstance(e, dict) and isinstance(e.get("bytes"), int) and isinstance(e.get("sha256"), str)
            for e in files.values()):
        raise ValueError("not a record of files with their bytes and sha256")
    return files


def changed_files(folder: str | os.PathLike, files: dict[str, dict[str, Any]]) -> list[tuple[str, str, int]]:
    """(name, what, bytes now) for each recorded file (`read_file_record`) that is not in `folder` as it was
    recorded, in name order: what is "missing", "bytes" (another size; its sha256 is not read) or "sha256";
    [] when every one is."""
    changed = []
    for name, entry in sorted(files.items()):
        file = Path(folder) / name
        if not file.is_file():
            changed.append((name, "missing", 0))
        elif (size := file.stat().st_size) != entry["bytes"]:
            changed.append((name, "bytes", size))
        elif sha256_file(file) != entry["sha256"]:
            changed.append((name, "sha256", size))
    return changed


def stable_hash(obj: Any, length: int = 16) -> str:
    """A short, stable hash of JSON-serialisable data (key order does not matter)."""
    blob = json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(blob).hexdigest()[:length]


def require_file(path: str | os.PathLike, what: str = "input file") -> Path:
    path = Path(path)
    if not path.is_file():
        raise InputError(f"{path}: {what} not found")
    return path


def with_cache(source: dict[str, Any], cache_dir: str | None) -> dict[str, Any]:
    """A data source with the datasets cache folder the workflow passes apart (the cache decides where, not
    what: it is not among the parameters that decide a rerun); a source's own cache_dir wins."""
    return {"cache_dir": cache_dir, **source} if cache_dir else source
