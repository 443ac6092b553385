"""What a run's checkpoints belong to, and which run a run directory holds.

A run's identity (`run_identity`: its result settings, data and start model) is written to run.json by the
chunk that takes the run directory. A chunk whose identity differs adopts the directory (`adopt_run_dir`):
the earlier run's checkpoints are set aside whole under `superseded/`, and a run set aside before comes back.
Beside it, the checks a run directory must pass before a chunk resumes it: the ZeRO stage its checkpoints
were written with (`check_zero_stage`), checkpoints removed after the export (`check_not_removed`), and the
step up to which its checkpoints predate manifests (`manifests_after`). The lock (tacl.runtime.lock) is held
throughout.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import Any

from tacl.pretrain import checkpoint
from tacl.pretrain.export import removed_message, removed_note
from tacl.pretrain.model import start_identity
from tacl.pretrain.settings import TrainSettings
from tacl.runtime.io import InputError, changed_keys, read_json, stable_hash
from tacl.runtime.lock import RunLock

log = logging.getLogger("tacl.pretrain")


def run_identity(settings: TrainSettings, start_model: str, manifest: dict[str, Any], bf16: bool) -> dict[str, Any]:
    """What a run's checkpoints belong to: the result settings (precision as it resolved on this device),
    the data and the start model's weights. Operational settings (micro batch, ranks, logging, ...) are not
    part of it: a run goes on whatever they are."""
    return {
        "objective": settings.objective,
        "result": {**settings.result(bf16), "precision": "bf16" if bf16 else "fp32"},
        "data": {"config_hash": manifest["config_hash"], "tokenizer": manifest["tokenizer"]["hash"],
                 "examples": manifest["totals"]["examples"]},
        "start_model": start_identity(start_model)["weights_sha256"],
    }


def _recorded_identity(record: dict[str, Any], identity: dict[str, Any]) -> dict[str, Any]:
    """run.json's identity in today's form. A run.json written before RESULT_VERSIONS and the result keys
    (commit a513d30, 2026-11-25; its identity has `trajectory`, no `result`) kept a hash of the result
    settings without the precision (`trajectory`) beside the full settings: those compare on the settings,
    the precision left out, and their batch version read off the hash."""
    previous = dict(record["identity"])
    if "result" not in previous and "trajectory" in previous:
        settings = TrainSettings.from_dict(record["settings"])
        result = settings.result(bf16=False)  # (made before BF16_VERSION, commit 4e829f5, 2026-11-26)
        result["precision"] = identity["result"]["precision"]
        if settings.legacy_trajectory_hash() != previous.pop("trajectory"):
            result["data_version"] = "older"
        previous["result"] = result
    return previous


def identity_changes(record: dict[str, Any], identity: dict[str, Any]) -> list[str]:
    """What differs between a run directory's run.json and the run about to train, in words."""
    previous = _recorded_identity(record, identity)
    rest = ({k: v for k, v in d.items() if k != "result"} for d in (previous, identity))
    return changed_keys(previous["result"], identity["result"]) + changed_keys(*rest)


def adopt_run_dir(run_dir: Path, identity: dict[str, Any], lock: RunLock, chunk: int, objective: str) -> None:
    """Make the run directory hold this run (the lock held). Checkpoints of other result settings (data,
    start model) are moved aside whole, to `superseded/<identity hash>` beside the run directory, and this
    run starts from the start model; if an earlier run of exactly these settings lies there, it comes back
    and goes on (a setting changed and changed back costs nothing). Only the first chunk of a chain may do
    this: a later chunk whose run directory holds another run means the earlier chunks of the chain trained
    that run, and it stops (`chunk`: this chunk's number in the chain)."""
    path = run_dir / "run.json"
    if not path.is_file():
        return
    record = read_json(path)
    changes = identity_changes(record, identity)
    if not changes:
        return
    what = "; ".join(changes)
    if chunk != 0:
        raise InputError(f"{path}: the checkpoints here belong to another run ({what}), and this is chunk "
                         f"{chunk} of the chain: the chain's earlier chunks trained that run. Rerun with "
                         "the profile's rerun triggers (params among them) so that the chain starts again at "
                         "chunk 0, or `--forcerun pretrain_chunk`")
    superseded = run_dir.parent / "superseded"
    aside = superseded / stable_hash(_recorded_identity(record, identity), 12)
    back = superseded / stable_hash(identity, 12)
    superseded.mkdir(parents=True, exist_ok=True)
    if aside.exists():  # (a copy of the same run was set aside before: both are kept)
        aside = aside.with_name(f"{aside.name}-{time.strftime('%Y%m%dT%H%M%S')}")
    os.rename(run_dir, aside)  # (with the lock file in it, so that no other trainer starts in between)
    (aside / lock.path.name).unlink(missing_ok=True)
    lock.held = False
    if back.is_dir():
        os.rename(back, run_dir)
        log.warning("pretraining %s: the result settings changed (%s); the checkpoints of the earlier run are "
                    "now in %s, and the run of these settings that was set aside before is back in %s and goes "
                    "on from its latest checkpoint", objective, what, aside, run_dir)
    else:
        log.warning("pretraining %s: the result settings changed (%s); the checkpoints of the earlier run are "
                    "now in %s, and this run starts from the start model", objective, what, aside)
    lock.acquire()


def check_not_removed(run_dir: Path) -> None:
    """A run whose checkpoints went after its export (pretrain.remove_checkpoints) cannot go on: say so now,
    rather than train it again from step 0 unasked."""
    note = removed_note(run_dir)
    if note is not None and checkpoint.latest_tag(run_dir) is None:
        raise InputError(removed_message(run_dir, note))


def check_zero_stage(run_dir: Path, stage: int) -> None:
    """The ZeRO stage is operational (it changes no result), but DeepSpeed's checkpoints of one stage do not
    load into an engine of another: a run keeps the stage its checkpoints were written with."""
    path = run_dir / "run.json"
    if checkpoint.latest_tag(run_dir) is None or not path.is_file():
        return
    saved = read_json(path)["settings"].get("zero_stage", stage)
    if saved != stage:
        raise InputError(f"{run_dir}: its checkpoints were written at ZeRO stage {saved} and pretrain.zero_stage "
                         f"is now {stage}; DeepSpeed cannot load one stage's checkpoint into another's engine. Set "
                         f"pretrain.zero_stage back to {saved} until this run is done (the stage changes no "
                         "result, so finished runs are not trained again)")


def manifests_after(run_dir: Path) -> int:
    """The step after which every checkpoint of the run has a manifest (tacl.pretrain.checkpoint.resume_tag), as
    run.json keeps it. A run.json without it was written before checkpoints had manifests (commit f4f50ea,
    2026-11-26), or none is there: its checkpoints, up to the latest, are trusted unverified, as they were
    then, and every later one is verified. (So a manifest lost from a checkpoint written since counts as
    damage, while a checkpoint from before f4f50ea, which never had one, resumes.)"""
    path = run_dir / "run.json"
    recorded = read_json(path).get("checkpoint_manifests_after") if path.is_file() else None
    if isinstance(recorded, int):
        return recorded
    tag = checkpoint.latest_tag(run_dir)
    return checkpoint.step_of(tag) if tag is not None else 0
