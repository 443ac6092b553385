"""The seeds of one fine-tuning setting in one job.

One cluster job per (model, task, setting) instead of one per seed: one queue wait, one start-up, and a
runtime request that is the sum of the seeds' work. Each seed still has its own run directory
(`SETTING/seedN/`, as with one job per seed) and its own record of what it was given (given.json, written
first; metrics.json, written last). A seed whose metrics.json exists and whose given.json equals what it
would be given now (the same settings and the same start model's weights) is kept, not trained again: a job
killed after its first seeds and run again trains only the missing ones. At the end the job writes its
marker, the rule's output, listing every seed's metrics.json and its hash.
"""

from __future__ import annotations

import hashlib
import logging
import traceback
from pathlib import Path
from typing import Any, Callable

from tacl.finetune import GIVEN
from tacl.io import InputError, read_json, sha256_file, write_json_atomic

log = logging.getLogger("tacl.finetune")
WEIGHTS = ("*.safetensors", "*.bin")


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


def seed_done(out: Path, given: dict[str, Any]) -> bool:
    return (out / "metrics.json").is_file() and (out / GIVEN).is_file() and read_json(out / GIVEN) == given


def run_seeds(seeds: list[int], run_dir: Callable[[int], Path], given: dict[str, Any],
              train_one: Callable[[int, Path], dict[str, Any]], marker: str | None = None) -> dict[str, Any]:
    """Train every seed not done before (one after the other), then write the marker. A seed that fails
    does not stop the others; the job then fails naming them (their finished siblings stay done). Bad input
    (InputError) stops at once: it would fail every seed."""
    runs, failed = [], []
    for seed in seeds:
        out = run_dir(seed)
        if seed_done(out, given):
            log.info("seed %d: done before with these settings and this start model (%s), kept", seed, out)
        else:
            write_json_atomic(out / GIVEN, given)
            try:
                train_one(seed, out)
            except InputError:
                raise
            except Exception:  # noqa: BLE001 (reported, and the job fails at the end)
                log.error("seed %d failed:\n%s", seed, traceback.format_exc())
                failed.append(seed)
                continue
        runs.append(str(out / "metrics.json"))
    if failed:
        raise RuntimeError(f"fine-tuning seed(s) {failed} failed (see above); the {len(runs)} other seed(s) are "
                           "kept, and running the job again trains only the failed ones")
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
