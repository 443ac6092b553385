"""Small file helpers shared by every stage: atomic writes, hashing, JSON, and what changed between two
records of settings (`changed_keys`)."""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import shutil
import socket
from pathlib import Path
from typing import Any, Iterable, Iterator

log = logging.getLogger("tacl.runtime.io")
# What atomic_path writes beside PATH, named after the writer's host and pid: `.NAME.tmp-HOST-PID` (the new file or
# folder being written) and, while a folder replaces another, `.NAME.old-HOST-PID` (the one it replaces); before
# 2026-11-27 they were named `.NAME.tmp-PID` / `.NAME.old-PID`, without the host (matched too, host None).
TEMPORARY = re.compile(r"^\.(?P<name>.+)\.(?:tmp|old)-(?:(?P<host>.+)-)?(?P<pid>\d+)$")


class InputError(RuntimeError):
    """Bad input (config, file, checkpoint): one clear message naming the key or file."""


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path next to `path` (write a file or a directory there); it is renamed onto
    `path` only if the block succeeds.

    A failing writer leaves nothing, a killed one at most a hidden `.NAME.tmp-HOST-PID` (or, killed between the
    two renames that replace a folder, `.NAME.old-HOST-PID` with `path` missing), never a half-written `path`;
    an existing `path` stays as it was until the rename. What killed writers of `path` on this host left is
    removed here, before this one writes (`temporaries`: one written on another host is left to the holder of
    the folder's lock), with one log line naming each and its size.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    mark = f"{socket.gethostname()}-{os.getpid()}"
    tmp = path.with_name(f".{path.name}.tmp-{mark}")
    _remove(tmp)
    remove_leftovers(temporaries(path), path.parent, f"earlier writers of {path.name}")
    try:
        yield tmp
        if tmp.is_file():
            with open(tmp, "rb+") as f:
                os.fsync(f.fileno())
        if tmp.is_dir() and path.is_dir():  # a directory cannot be replaced in one step
            old = path.with_name(f".{path.name}.old-{mark}")
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


def pid_alive(pid: int) -> bool:
    """Whether process `pid` runs on this host."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def alive_here(owner: dict) -> bool | None:
    """Whether the process a record names ({"host", "pid"}: a lock's, a job's) still runs, asked of this host
    only (no scheduler): None when it ran on another host (or the record names none)."""
    if owner.get("host") != socket.gethostname() or not owner.get("pid"):
        return None
    return pid_alive(int(owner["pid"]))


def _being_written(name: str) -> bool:
    """Whether the atomic_path temporary `name` is one a process that still runs on this host writes."""
    m = TEMPORARY.match(name)
    return bool(m) and alive_here({"host": m["host"], "pid": m["pid"]}) is True


def _left_here(name: str) -> bool:
    """Whether the atomic_path temporary `name` was left by a writer on this host that no longer runs (or by one
    of the names without a host, from before 2026-11-27)."""
    m = TEMPORARY.match(name)
    return bool(m) and (m["host"] is None or alive_here({"host": m["host"], "pid": m["pid"]}) is False)


def temporaries(path: str | os.PathLike) -> list[Path]:
    """What killed writers of `path` (atomic_path) on this host left beside it: its `.NAME.tmp-*` and
    `.NAME.old-*` whose process no longer runs. One written on another host is left alone: this host cannot
    tell whether its writer still runs. It goes when the holder of the folder's lock, which knows that writer's
    job is gone, clears the folder (`temporaries_under`)."""
    path = Path(path)
    try:
        names = sorted(os.listdir(path.parent))
    except (FileNotFoundError, NotADirectoryError):
        return []
    return [path.with_name(n) for n in names if n.startswith(f".{path.name}.") and (m := TEMPORARY.match(n))
            and m["name"] == path.name and _left_here(n)]


def temporaries_under(folder: str | os.PathLike) -> list[Path]:
    """Every atomic_path temporary under `folder` (at any depth, not looking inside one) that no process still
    running on this host writes, those written on other hosts included: what killed writers left, for the
    holder of the folder's lock to remove once it holds it (its writers, whatever their host, held the lock
    before, and are gone), and for `tacl status` to show."""
    found = []
    for root, dirs, files in os.walk(folder):
        found += [Path(root, n) for n in sorted(dirs + files) if TEMPORARY.match(n) and not _being_written(n)]
        dirs[:] = sorted(d for d in dirs if not TEMPORARY.match(d))
    return found


def disk_bytes(path: str | os.PathLike) -> int:
    """The bytes of the file at `path`, or of every file under the folder (links to folders not followed); 0 when
    nothing is there."""
    path = Path(path)
    if path.is_file():
        return path.stat().st_size
    total = 0
    for root, dirs, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):  # (removed while we walk: a save finished, a pruned checkpoint)
                total += os.stat(os.path.join(root, name)).st_size
    return total


def size_text(n: float) -> str:
    """Bytes as a person reads them: 12.3 GB, 0.4 GB, 44 MB, 2.5 MB, 12 kB, 300 bytes."""
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= size or (unit == "GB" and n >= 1e8):
            return f"{n / size:.{1 if unit == 'GB' or n < 10 * size else 0}f} {unit}"
    return f"{n:.0f} bytes"


def remove_leftovers(paths: Iterable[Path], where: str | os.PathLike, what: str,
                     logger: logging.Logger = log) -> int:
    """Remove `paths` (files or folders that killed processes left unfinished) with one warning that names each,
    relative to `where`, with its size (and what could not be removed); returns the bytes freed (0, and no line,
    when there is nothing)."""
    sizes = [(Path(p), disk_bytes(p)) for p in paths]
    if not sizes:
        return 0
    for p, _ in sizes:
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p, ignore_errors=True)
        else:
            with contextlib.suppress(OSError):
                p.unlink()

    def named(entries: list[tuple[Path, int]]) -> str:
        return ", ".join(f"{os.path.relpath(p, where)} ({size_text(b)})" for p, b in entries)

    gone = [(p, b) for p, b in sizes if not os.path.lexists(p)]
    left = [(p, b) for p, b in sizes if os.path.lexists(p)]
    total = sum(b for _, b in gone)
    logger.warning("%s: removed what %s left unfinished: %s (%s in all)%s", where, what, named(gone) or "nothing",
                   size_text(total), f"; could not remove {named(left)}" if left else "")
    return total


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



# What changed between the settings a finished job ran with and the settings it would run with now, in words:
# "lr 0.0001 -> 5e-05". Used by the trainer (a run whose result settings changed starts again:
# tacl.pretrain.identity) and by the summary the workflow prints before anything runs (tacl.experiment.reruns).
MISSING = object()


def _flat(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, dict) and v:
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def _text(value: Any) -> str:
    if value is MISSING:
        return "(unset)"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_text(v) for v in value) + "]"
    return str(value)


def changed_keys(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """Every key (nested keys dotted) whose value differs, as "key old -> new", sorted by key. Lists and
    tuples compare equal when their items do (JSON turns one into the other)."""
    a, b = _flat(old), _flat(new)

    def norm(v: Any) -> Any:
        return list(v) if isinstance(v, tuple) else v

    return [f"{k} {_text(a.get(k, MISSING))} -> {_text(b.get(k, MISSING))}"
            for k in sorted(set(a) | set(b)) if norm(a.get(k, MISSING)) != norm(b.get(k, MISSING))]

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
