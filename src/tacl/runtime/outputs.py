"""What each job wrote, and a later run's check that it is still there as written.

Snakemake decides what to run from files' existence and times alone: an output cut short or emptied after its
job wrote it (by a file system that filled, a tool run by hand, a copy that stopped halfway) is taken as
finished, and every job that reads it fails, run after run. So each rule's command ends by recording its
outputs (`record`, the rule's shell command's last step, tacl.experiment wiring: workflow/rules/common.smk):
every file of each output with its size, in RECORDS under the results folder, one record per job. When the
workflow starts (the Snakefile, before it plans), `remove_damaged` compares each record with the files: an
output of which a file is missing or of another size is removed, with one line naming it and what is wrong,
and Snakemake makes it again (and then what reads it, whose input is newer). A record whose job's outputs are
not all there is passed by: Snakemake runs that job again anyway (a failed job's outputs are removed), and it
records them anew. Sizes, not hashes: the check runs at every start, a stat per file.

A job may name folders beside its outputs that hold its results too (a fine-tuning job's seeds: `--also`):
damage there removes the job's outputs alone, and the job run again redoes what is damaged in the folder (a
fine-tuning job keeps its intact seeds). Their bookkeeping (locks and their history, a job's record,
checkpoints, hidden files) is not recorded: it changes whenever a later job of the folder starts.

`python -m tacl.runtime.outputs RESULTS OUTPUT... --inputs INPUT... [--also FOLDER...]` records; standard
library only (it runs after every job). The inputs are recorded so that what was made from a damaged output is
made again too (`damaged`).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

RECORDS = ".outputs"
BOOKKEEPING = {"LOCK", "LOCK.log", "job.json", "checkpoint.pt"}  # in an `--also` folder: not results


def _files(path: Path, bookkeeping: bool) -> dict[str, int]:
    """Every file of an output (itself, or each file under the folder), by its path relative to the output, with
    its size; hidden ones (a file being written) and, for an `--also` folder, its bookkeeping left out."""
    if path.is_file():
        return {".": path.stat().st_size}
    found = {}
    for root, dirs, names in os.walk(path):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for name in names:
            if name.startswith(".") or (bookkeeping and name in BOOKKEEPING):
                continue
            file = Path(root, name)
            found[file.relative_to(path).as_posix()] = file.stat().st_size
    return found


def record_file(results: str | os.PathLike, output: str) -> Path:
    """Where a job's record is: RESULTS/.outputs/<its first output, relative to RESULTS>.json."""
    return Path(results) / RECORDS / (os.path.relpath(output, results).replace("..", "_") + ".json")


def record(results: str | os.PathLike, outputs: list[str], also: list[str] = (), inputs: list[str] = ()
           ) -> Path | None:
    """Record a finished job's `outputs` (and the `also` folders that hold its results) under RESULTS (outputs
    outside it are not recorded), with the `inputs` it read; the record's path, or None where nothing was
    recorded."""
    results = Path(results)
    inside = [o for o in outputs if not os.path.relpath(o, results).startswith("..")]
    if not inside:
        return None
    entry = {"outputs": {o: _files(Path(o), False) for o in inside},
             "also": {a: _files(Path(a), True) for a in also if Path(a).is_dir()}, "inputs": list(inputs)}
    path = record_file(results, inside[0])
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:  # (a record that cannot be written, on a full disk, leaves nothing; the job fails, and runs again)
        tmp.write_text(json.dumps(entry, sort_keys=True))
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def _changed(path: Path, files: dict[str, int], bookkeeping: bool) -> str | None:
    """What differs between an output and its record: its first missing file or file of another size."""
    if not path.exists():
        return f"{path} is missing"
    now = _files(path, bookkeeping)
    for name, size in sorted(files.items()):
        shown = path if name == "." else path / name
        if name not in now:
            return f"{shown} is missing"
        if now[name] != size:
            return f"{shown} has {now[name]} bytes, {size} when its job wrote it"
    return None


def _records(results: str | os.PathLike) -> list[dict]:
    root = Path(results) / RECORDS
    found = []
    for rec in sorted(root.rglob("*.json")) if root.is_dir() else []:
        try:
            entry = json.loads(rec.read_text())
            found.append({"outputs": dict(entry["outputs"]), "also": dict(entry.get("also", {})),
                          "inputs": list(entry.get("inputs", []))})
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            continue
    return found


def _reads(inputs: list[str], outputs: list[str]) -> bool:
    """Whether a job that read `inputs` read one of `outputs` (or a file inside one)."""
    return any(i == o or i.startswith(o.rstrip("/") + "/") for i in inputs for o in outputs)


def damaged(results: str | os.PathLike) -> list[tuple[list[Path], str]]:
    """Each recorded job whose outputs, or `also` folders, are not as written, where some of its outputs are
    still there: (its outputs, to remove; what is wrong); then each job made from a removed output, directly or
    not, with the output it was made from (Snakemake runs no job again for an input gone missing while its own
    outputs stand: it takes the input for a temporary one). A job whose outputs are all gone is left to
    Snakemake: a failed job's are removed, and it runs again. An `also` folder stays: the job run again checks
    its own results there and redoes only what is damaged (a fine-tuning job keeps its intact seeds,
    tacl.finetune.seeds)."""
    records, found, removed = _records(results), [], []
    for entry in records:
        outputs, also = entry["outputs"], entry["also"]
        if not any(Path(o).exists() for o in outputs):
            continue
        why = next((w for o, files in outputs.items() if (w := _changed(Path(o), files, False))), None) or next(
            (w for a, files in also.items() if Path(a).is_dir() and (w := _changed(Path(a), files, True))), None)
        if why:
            found.append(([Path(o) for o in outputs], why))
            removed += list(outputs)
    todo = list(removed)
    while todo:  # (what was made from a removed output, and so on down)
        gone, todo = todo, []
        for entry in records:
            outputs = list(entry["outputs"])
            if any(o in removed for o in outputs) or not any(Path(o).exists() for o in outputs):
                continue
            source = next((i for i in entry["inputs"] if _reads([i], gone)), None)
            if source is not None:
                found.append(([Path(o) for o in outputs], f"made from {source}, which is made again"))
                removed += outputs
                todo += outputs
    return found


def remove_damaged(results: str | os.PathLike, say=print) -> list[str]:
    """Remove every damaged job's outputs, and those of the jobs made from them (`damaged`), so that Snakemake
    makes them again; one line each, said (`say`) and returned."""
    lines = []
    for paths, why in damaged(results):
        for path in paths:
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path, ignore_errors=True)
            elif path.exists():
                path.unlink()
        named = ", ".join(os.path.relpath(p, results) for p in paths)
        head = "damaged since its job wrote it" if not why.startswith("made from ") else "to be made again"
        lines.append(f"{head} ({why}): removed {named}, which this run makes again")
        say(lines[-1])
    return lines


def main(argv: list[str]) -> int:
    """RESULTS OUTPUT... [--inputs INPUT...] [--also FOLDER...]"""
    parts: dict[str, list[str]] = {"": []}
    at = ""
    for arg in argv:
        if arg in ("--inputs", "--also"):
            at = arg
            parts.setdefault(at, [])
        else:
            parts[at].append(arg)
    if len(parts[""]) < 2:
        print("usage: python -m tacl.runtime.outputs RESULTS OUTPUT... [--inputs INPUT...] [--also FOLDER...]",
              file=sys.stderr)
        return 2
    record(parts[""][0], parts[""][1:], parts.get("--also", []), parts.get("--inputs", []))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
