"""The seeds of one fine-tuning setting in one job.

One cluster job per (model, task, setting) instead of one per seed: one queue wait, one start-up, and a
runtime request that is the sum of the seeds' work. Each seed still has its own run directory
(`SETTING/seedN/`, as with one job per seed) and its own record of what it was given (given.json, written
first; metrics.json, written last). A seed whose metrics.json exists and whose given.json equals what it
would be given now (the same settings and the same start model's weights) is kept, not trained again: a job
killed after its first seeds and run again trains only the missing ones, and the seed it was killed in goes
on from its checkpoint (tacl.finetune.resume). At the end the job writes its marker, the rule's output,
listing every seed's metrics.json and its hash.

A seed is kept only if its files read back: after a seed has trained, its result files (metrics.json, the
submission files, SQuAD's predictions, a kept model) are checked to parse where they are JSON and recorded
with their sha256 in RESULT_FILES; a later job keeps the seed only if every recorded file is there with
that hash (a seed finished before the record existed, commit f1ba1fb, 2026-11-26: if its JSON files
parse, and the record is written then). Anything else trains the seed again, after one log line saying
why; the marker never names a file that does not parse.

A seed is trained by one process at a time: the process holds the seed's lock (LOCK in its folder, the
pretraining run lock's machinery, tacl.runtime.lock) from before it looks at the seed until the seed is done
or stopped. A second process on a seed whose holder still runs (a job started again while the first one
runs, on this host or another) stops with one line naming the seed's folder and the holder, and touches
nothing of the seed; a lock whose holder is gone (a killed job) is taken over, with one warning saying whose
it was.

A job killed while it writes leaves the file or folder unfinished under a temporary name (tacl.runtime.io.atomic_path:
a seed's checkpoint.pt being saved, its model/ being written, its metrics.json). The seed's next holder
removes them once it holds the seed's lock, before it looks at the seed (`train_seed`), whichever host wrote
them: whoever wrote there held the lock, and is gone. Nothing is removed before the lock is held: a
temporary in a seed's folder may be the save of a live job on another host.
"""

from __future__ import annotations

import hashlib
import json
import logging
import traceback
from pathlib import Path
from typing import Any, Callable

from tacl.finetune import CHECKPOINT, GIVEN, JOB, Stopped
from tacl.runtime.io import (InputError, changed_files, read_file_record, read_json, remove_leftovers, sha256_file,
                     temporaries_under, write_file_record, write_json_atomic)
from tacl.runtime import signals
from tacl.runtime.lock import HISTORY, LOCK, RunLock, holder, owner_record

log = logging.getLogger("tacl.finetune")
WEIGHTS = ("*.safetensors", "*.bin")
METRICS = "metrics.json"
# how long a job waits at a seed's lock for a holder on its own host to end (the seed of a job whose process
# died saves and stops: seconds, a step and a checkpoint) before it refuses the seed
SEED_LOCK_WAIT_S = 120.0
# Beside a finished seed's metrics.json: its result files and their sha256, written once they read back.
RESULT_FILES = "results.json"


def weights_fingerprint(model_dir: str | Path) -> str:
    """A hash of a model directory's weight files (name and content): which start model a seed was trained
    from."""
    h = hashlib.sha256()
    if not Path(model_dir).is_dir():
        return str(model_dir)  # (a Hub name: the name is all there is to compare)
    files = sorted({p for pattern in WEIGHTS for p in Path(model_dir).glob(pattern)})
    if not files:
        raise InputError(f"{model_dir}: no model weights (*.safetensors, *.bin)")
    for path in files:
        h.update(path.name.encode())
        with open(path, "rb") as f:
            while block := f.read(1 << 22):
                h.update(block)
    return h.hexdigest()[:32]


def result_files(out: Path) -> list[Path]:
    """A seed's result files: everything in its folder but its records (given.json, RESULT_FILES, the job's
    JOB with --seed), its checkpoint, its lock and the lock's history, and what is hidden (a file being written,
    tacl.runtime.io.atomic_path)."""
    keep = []
    for path in sorted(out.rglob("*")):
        parts = path.relative_to(out).parts
        hidden = any(p.startswith(".") for p in parts)
        records = ((GIVEN,), (RESULT_FILES,), (JOB,), (CHECKPOINT,), (LOCK,), (HISTORY,))
        if path.is_file() and not hidden and parts not in records:
            keep.append(path)
    return keep


def unreadable(out: Path) -> str | None:
    """What is wrong with a seed's result files as they are (None: nothing): metrics.json missing or not a
    JSON object, or another JSON file among them that does not parse."""
    if not (out / METRICS).is_file():
        return f"no {METRICS}"
    for path in [out / METRICS] + [p for p in result_files(out) if p.suffix == ".json" and p.name != METRICS]:
        try:
            value = json.loads(path.read_text(encoding="utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            return f"{path.relative_to(out)} is damaged (not valid JSON: {e})"
        if path.name == METRICS and not isinstance(value, dict):
            return f"{METRICS} is damaged (not a JSON object)"
    return None


def record_results(out: Path) -> None:
    """Write RESULT_FILES: each result file (relative to the seed's folder) with its size and sha256."""
    write_file_record(out / RESULT_FILES, out, result_files(out))


def given_before(out: Path) -> Any:
    """What the seed in `out` was given (its given.json), or None (not there, or it does not parse)."""
    try:
        return json.loads((out / GIVEN).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None


def why_not_done(out: Path, given: dict[str, Any]) -> str | None:
    """None when the seed in `out` is done with `given` (settings and start model) and its files read back as
    recorded; otherwise why it is trained (again), for one log line."""
    if not (out / GIVEN).is_file():
        return "not begun"
    if given_before(out) != given:
        return f"{GIVEN} differs from what it is given now (other settings or another start model)"
    problem = unreadable(out)
    if problem is not None:
        return problem
    if not (out / RESULT_FILES).is_file():
        return None  # (finished before f1ba1fb recorded files, or just before: they read back, recorded now)
    try:
        recorded = read_file_record(out / RESULT_FILES)
    except (OSError, ValueError, KeyError, TypeError):
        return f"{RESULT_FILES} is damaged"
    for name, what, _ in changed_files(out, recorded)[:1]:
        if what == "missing":
            return f"{name} is missing (recorded in {RESULT_FILES})"
        return f"{name} differs from what {RESULT_FILES} recorded (sha256)"  # (another size: another sha256 too)
    return None


def seed_done(out: Path, given: dict[str, Any]) -> bool:
    return why_not_done(out, given) is None


def note_job(folder: Path) -> None:
    """Record this job in the folder's JOB (the setting's, or the seed's with --seed), for `tacl status`, unless
    the job JOB names still runs (as the pretraining lock tells it: tacl.runtime.lock.holder): JOB then keeps
    naming it, saying so, and this job stops at the first seed that job trains (`seed_lock`). Nothing in the
    folder is removed here: each seed's leftovers go under its lock (`train_seed`)."""
    folder = Path(folder)
    try:
        before = json.loads((folder / JOB).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        before = None
    alive, who = holder(before) if isinstance(before, dict) and before else (False, "")
    if alive:
        log.warning("%s: the job that ran here before, %s, still runs; this job trains only the seeds it does "
                    "not hold", folder, who)
        return
    write_json_atomic(folder / JOB, owner_record())


def seed_lock(seed: int, out: Path) -> RunLock:
    """The lock of the seed in `out` (`RunLock`: refused while a live process holds it, after waiting up to
    SEED_LOCK_WAIT_S for one on this host to end; taken over from a dead one with a warning on the fine-tuning
    log)."""
    return RunLock(out, busy=f"seed {seed} is being trained by another process", logger=log, wait_s=SEED_LOCK_WAIT_S)


def train_seed(seed: int, out: Path, given: dict[str, Any], train_one: Callable[[int, Path], dict[str, Any]]) -> None:
    """One seed, under its lock (`seed_lock`): kept when done before (`why_not_done`), otherwise trained
    (going on from its checkpoint where it has one), its result files checked and recorded. Raises what
    `train_one` raises (InputError, `Stopped`, a failure). What killed writers left in the seed's folder goes
    first, once the lock is held (tacl.runtime.io.temporaries_under), with one warning naming each and its size.
    A stop signal received before the seed trains (tacl.runtime.signals) stops it there, raising `Stopped`."""
    with signals.catching(), seed_lock(seed, out):
        remove_leftovers(temporaries_under(out), out, "killed jobs", log)
        why = why_not_done(out, given)
        if why is None:
            log.info("seed %d: done before with these settings and this start model (%s), kept", seed, out)
        else:
            if signals.stop_requested():  # (before it trains: nothing of this seed's to save)
                raise Stopped(f"stopped by {signals.first()} before seed {seed} trained ({out}): running the job "
                              "again trains it" + (", from its checkpoint" if (out / CHECKPOINT).is_file() else ""))
            if why == f"no {METRICS}" and (out / CHECKPOINT).is_file():
                log.info("seed %d (%s): not finished; goes on from its checkpoint", seed, out)
            elif why != "not begun":
                log.warning("seed %d (%s): %s; trained again", seed, out, why)
            # (the old result and its record go first: a seed is never done by a metrics.json of other
            # settings, or by one that does not parse, should this training fail; a checkpoint only
            # serves the settings and start model it was saved with)
            for name in (RESULT_FILES, METRICS) + ((CHECKPOINT,) if given_before(out) != given else ()):
                (out / name).unlink(missing_ok=True)
            write_json_atomic(out / GIVEN, given)
            train_one(seed, out)
            problem = unreadable(out)
            if problem is not None:
                raise RuntimeError(f"{out}: {problem}, just after training")
        if not (out / RESULT_FILES).is_file():
            record_results(out)
        (out / CHECKPOINT).unlink(missing_ok=True)  # (the seed is done: its checkpoint serves nothing more)


def run_seeds(seeds: list[int], run_dir: Callable[[int], Path], given: dict[str, Any],
              train_one: Callable[[int, Path], dict[str, Any]], marker: str | None = None) -> dict[str, Any]:
    """Train every seed not done before (`train_seed`; one after the other; a seed stopped halfway resumes
    from its checkpoint, tacl.finetune.resume), then write the marker. A seed that fails does not stop the
    others; the job then fails naming them (their finished siblings stay done). Bad input (InputError: a seed
    that another process trains included) stops at once: it would fail every seed; so does a stop (`Stopped`:
    the job's time is up)."""
    failed = []
    for seed in seeds:
        try:
            train_seed(seed, run_dir(seed), given, train_one)
        except (InputError, Stopped):
            raise
        except Exception:  # noqa: BLE001 (reported, and the job fails at the end)
            log.error("seed %d failed:\n%s", seed, traceback.format_exc())
            failed.append(seed)
    return seeds_record(seeds, run_dir, failed, marker)


def seeds_record(seeds: list[int], run_dir: Callable[[int], Path], failed: list[int],
                 marker: str | None = None) -> dict[str, Any]:
    """The job's end: a failure naming the seeds that failed, else the marker (every seed's metrics.json and
    its hash), written when `marker` names it."""
    if failed:
        raise RuntimeError(f"fine-tuning seed(s) {failed} failed (see above); the {len(seeds) - len(failed)} other "
                           "seed(s) are kept, and running the job again trains only the failed ones")
    runs = [str(run_dir(seed) / METRICS) for seed in seeds]
    # (each seed's metrics hashed in: a seed trained again changes the marker, so that what reads it, the
    # selection and the report, runs again even where Snakemake compares the marker's content)
    record = {"seeds": list(seeds), "runs": runs, "metrics_sha256": [sha256_file(path)[:16] for path in runs]}
    if marker:
        write_json_atomic(marker, record)
    return record


def metrics_files(paths: list[str]) -> list[str]:
    """Every seed's metrics.json, from the seeds' markers (or metrics.json files, as they are)."""
    out = []
    for path in paths:
        record = read_json(path)
        out.extend(record["runs"] if "runs" in record and "seeds" in record else [path])
    return out
