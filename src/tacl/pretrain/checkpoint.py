"""Checkpoints in `RUN/checkpoints/`: one directory per step (`step00001200`), complete or absent.

Every rank writes its DeepSpeed files and its own RNG file into `checkpoints/.incoming/<tag>`; after a
barrier rank 0 renames the directory into place, then rewrites `latest` (temporary name + rename), then
prunes all but the newest `keep`. A process killed at any moment leaves `latest` naming a complete
checkpoint.

Each checkpoint carries a manifest (`<tag>/manifest.json`: every file's size and sha256), written by rank 0
after all ranks' files and before the rename. A resume verifies the checkpoint it is about to load
(`resume_tag`, rank 0, before DeepSpeed reads anything): a damaged one (a file missing, truncated or changed;
a full disk, a copy cut short, a scratch purge) is set aside as `<tag>.damaged-<time>`, and the run goes on
from the newest intact one, with `latest` rewritten to name it.

Another number of ranks: the batches do not depend on the world size (a micro-batch is a function of
(seed, step, index)), and neither do dropout (seeded per micro-batch) and the objectives' draws (seeded per
group of the step), so a run can go on
with M ranks from a checkpoint N ranks wrote. ZeRO 0 loads as it is (every rank holds the whole optimizer
state). ZeRO 1 and 2 partition the optimizer state by rank: the checkpoint is converted once to DeepSpeed's
universal format (`<tag>/universal/<tag>`, by rank 0, under a temporary name), which loads on any number
of ranks; on CPU the run then follows the uninterrupted M-rank run bit for bit. ZeRO 3 is refused (its
converted checkpoint resumed measurably off the trajectory).

A process killed while it writes leaves what it wrote unfinished: the next chunk removes it when it starts
(tacl.pretrain.rundir.clear_leftovers).
"""

from __future__ import annotations

import logging
import os
import random
import re
import shutil
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from tacl.pretrain.distributed import DistEnv, barrier, import_deepspeed
from tacl.pretrain.rundir import CHECKPOINTS, DAMAGED, INCOMING, UNIVERSAL, checkpoint_dir  # noqa: F401 (CHECKPOINTS)
from tacl.runtime.device import rank_gpu
from tacl.runtime.io import InputError, changed_files, read_file_record, write_file_record, write_text_atomic

MANIFEST = "manifest.json"
_TAG = re.compile(r"^step(\d{8})$")
_RNG = re.compile(r"^rng_rank(\d{5})\.pt$")
log = logging.getLogger("tacl.pretrain")


def tag_for(step: int) -> str:
    return f"step{step:08d}"


def step_of(tag: str) -> int:
    return int(tag.removeprefix("step"))


def latest_tag(run_dir: str | os.PathLike) -> str | None:
    path = checkpoint_dir(run_dir) / "latest"
    if not path.is_file():
        return None
    tag = path.read_text().strip()
    if not _TAG.match(tag) or not (checkpoint_dir(run_dir) / tag).is_dir():
        raise InputError(f"{path}: names {tag!r}, which is not a complete checkpoint in {path.parent}")
    return tag


def rng_state() -> dict[str, Any]:
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
        state["cuda_device"] = torch.cuda.current_device()  # this rank's GPU (distributed.py set it)
    return state


def set_rng_state(state: dict[str, Any], local_rank: int = 0) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        set_cuda_rng_states(state["cuda"], state.get("cuda_device"), local_rank)


def set_cuda_rng_states(states: list[torch.Tensor], saved_device: int | None, local_rank: int) -> None:
    """Restore the saved CUDA generator states of the GPUs this process sees. A rank that now sees fewer GPUs
    than were saved (torchrun with 4 visible per process, then srun with 1 per task) gets the state of the GPU
    it trained on (`saved_device`; in checkpoints that did not record it, the GPU its local rank picked) on
    the GPU it trains on now; the other saved states have no device here and are left, as the log says. (Dropout
    and the objectives' draws are seeded per micro-batch and per group, so the trajectory does not depend on
    these states; restoring them keeps any other CUDA draw where it was.)"""
    visible = torch.cuda.device_count()
    if len(states) <= visible:
        torch.cuda.set_rng_state_all(states)
        return
    current = torch.cuda.current_device()
    source = saved_device if saved_device is not None else rank_gpu(local_rank, len(states))
    if not isinstance(source, int) or source >= len(states):
        source = min(current, len(states) - 1)
    torch.cuda.set_rng_state(states[source], current)
    log.info("checkpoint holds CUDA RNG states of %d GPUs, this process sees %d: restored saved GPU %d's "
             "state on GPU %d (the GPU this rank trains on), left the others", len(states), visible, source,
             current)


def save(engine: Any, run_dir: str | os.PathLike, step: int, client_state: dict[str, Any], env: DistEnv,
         keep: int) -> str:
    root = checkpoint_dir(run_dir)
    incoming = root / INCOMING
    tag = tag_for(step)
    if env.is_main:
        shutil.rmtree(incoming / tag, ignore_errors=True)  # leftovers of a save that was killed
        incoming.mkdir(parents=True, exist_ok=True)
    barrier()
    engine.save_checkpoint(str(incoming), tag=tag, client_state=client_state, save_latest=False)
    torch.save(rng_state(), incoming / tag / f"rng_rank{env.rank:05d}.pt")
    barrier()
    if env.is_main:
        final = root / tag
        if final.exists():
            shutil.rmtree(final)
        write_manifest(incoming / tag)
        os.replace(incoming / tag, final)
        write_text_atomic(root / "latest", tag + "\n")
        prune(root, keep, protect=tag)
    barrier()
    return tag


def write_manifest(folder: Path) -> None:
    """Record every file of the checkpoint in `folder` (its size and sha256) in `folder/manifest.json`, so that a
    resume can tell an intact checkpoint from a damaged one. Cost: one read of the checkpoint, mostly from the
    page cache just after it was written: sha256 ran at ~630 MiB/s on one core of the test machine, ~2.5 s for
    a BERT-base checkpoint with its AdamW state (~1.5 GB), once per `checkpoint_minutes` (30); the other ranks
    wait for it at the barrier after the rename."""
    write_file_record(folder / MANIFEST, folder,
                      sorted(p for p in folder.rglob("*") if p.is_file() and p != folder / MANIFEST))


def damage(folder: Path) -> list[str] | None:
    """What is wrong with the checkpoint in `folder`, one entry per file ([] when it is intact; None when it has no
    manifest). Files beside the manifest's (the `universal/` copy a resume converts) are not checked."""
    path = folder / MANIFEST
    if not path.exists():
        return None
    try:
        files = read_file_record(path)
    except (OSError, ValueError, KeyError, TypeError) as e:
        return [f"{MANIFEST}: unreadable ({e})"]
    what = {"missing": lambda name, size: "missing",
            "bytes": lambda name, size: f"{size} bytes, {files[name]['bytes']} when saved",
            "sha256": lambda name, size: "its sha256 differs from the manifest's"}
    return [f"{name}: {what[kind](name, size)}" for name, kind, size in changed_files(folder, files)]


def resume_tag(run_dir: str | os.PathLike, manifests_after: int) -> str | None:
    """The checkpoint to resume from (rank 0, before anything is loaded; None when the run has none): `latest`
    if it is intact, else the newest intact one before it. Damaged checkpoints are set aside (renamed to
    `<tag>.damaged-<time>`, kept) with one warning naming each file and what is wrong, and `latest` is rewritten
    first to name the one used. With none intact, one error says so and nothing is moved.

    Checkpoints at steps up to `manifests_after` were written before checkpoints had manifests (commit f4f50ea,
    2026-11-26; tacl.pretrain.identity.manifests_after): they are trusted as they are (as every resume did
    then), saying once that they cannot be verified; a later checkpoint without its manifest is damaged."""
    latest = latest_tag(run_dir)
    if latest is None:
        return None
    root = checkpoint_dir(run_dir)
    tags = sorted((p.name for p in root.iterdir() if p.is_dir() and _TAG.match(p.name) and p.name <= latest),
                  reverse=True)
    damaged: list[tuple[str, list[str]]] = []
    chosen = None
    for tag in tags:
        problems = damage(root / tag)
        if problems is None and step_of(tag) > manifests_after:
            problems = [f"{MANIFEST}: missing"]
        elif problems is None:
            log.info("checkpoint %s was written before checkpoints had a manifest: it cannot be verified and is "
                     "used as it is", root / tag)
        if not problems:
            chosen = tag
            break
        damaged.append((tag, problems))
    if not damaged:
        return chosen
    what = "; ".join(f"{root / tag}: {', '.join(problems)}" for tag, problems in damaged)
    if chosen is None:
        raise InputError(f"{run_dir}: no intact checkpoint to resume from ({what}). Restore these files from a "
                         f"copy, or, to train this run again from the start model, move {root} away (or delete it)")
    write_text_atomic(root / "latest", chosen + "\n")  # first: a kill before the renames leaves `latest` intact
    stamp = time.strftime("%Y%m%dT%H%M%S")
    for tag, _ in damaged:
        os.rename(root / tag, root / f"{tag}{DAMAGED}{stamp}")
    log.warning("damaged checkpoint(s) set aside as %s (%s); resuming from %s, the steps after it are trained "
                "again; the set-aside copies can be deleted", ", ".join(f"{t}{DAMAGED}{stamp}" for t, _ in damaged),
                what, root / chosen)
    return chosen


def prune(root: Path, keep: int, protect: str) -> None:
    tags = sorted(p.name for p in root.iterdir() if p.is_dir() and _TAG.match(p.name))
    for old in tags[: max(0, len(tags) - keep)]:
        if old != protect:
            shutil.rmtree(root / old, ignore_errors=True)


def saved_world_size(run_dir: str | os.PathLike, tag: str) -> int:
    """How many ranks wrote this checkpoint (each wrote its own RNG file)."""
    return sum(1 for p in (checkpoint_dir(run_dir) / tag).iterdir() if _RNG.match(p.name))


def make_universal(run_dir: str | os.PathLike, tag: str, env: DistEnv) -> Path:
    """Convert checkpoint `tag` to DeepSpeed's universal format once (rank 0; the others wait); returns the
    directory to load it from (with `tag` as the tag)."""
    out = checkpoint_dir(run_dir) / tag / UNIVERSAL / tag
    if env.is_main and not out.is_dir():
        import argparse

        import_deepspeed()
        from deepspeed.checkpoint.ds_to_universal import main as to_universal

        incoming = out.with_name(tag + INCOMING)
        shutil.rmtree(incoming, ignore_errors=True)
        to_universal(argparse.Namespace(input_folder=str(checkpoint_dir(run_dir) / tag), output_folder=str(incoming),
                                        num_extract_workers=1, num_merge_workers=1, keep_temp_folder=False,
                                        strict=True, inject_missing_state=True))
        os.replace(incoming, out)
    barrier()
    return out.parent


def place_steps(optimizer: torch.optim.Optimizer) -> int:
    """Put each parameter's AdamW `step` where PyTorch's own load_state_dict would: for a fused (or capturable)
    optimizer a float32 tensor on the parameter's device. DeepSpeed's universal-checkpoint loader sets it
    directly, as the CPU tensor it saved, and fused AdamW on a GPU cannot step with that. Returns how many
    were moved."""
    moved = 0
    for group in optimizer.param_groups:
        if not (group.get("fused") or group.get("capturable")):
            continue
        for p in group["params"]:
            state = optimizer.state.get(p, {})
            step = state.get("step")
            if step is None or (isinstance(step, torch.Tensor) and step.device == p.device
                                and step.dtype == torch.float32):
                continue
            state["step"] = torch.as_tensor(step, dtype=torch.float32).to(p.device)
            moved += 1
    return moved


def load(engine: Any, run_dir: str | os.PathLike, tag: str, env: DistEnv, universal: Path | None = None
         ) -> dict[str, Any]:
    """Load checkpoint `tag` (from `universal`, the converted copy, when the number of ranks changed under
    ZeRO 1-2). Each rank's RNG state is restored when the same number of ranks goes on."""
    root = checkpoint_dir(run_dir)
    path, client_state = engine.load_checkpoint(str(universal or root), tag=tag, load_optimizer_states=True,
                                                load_lr_scheduler_states=True)
    if path is None:
        raise InputError(f"{root / tag}: DeepSpeed could not load this checkpoint")
    place_steps(getattr(engine, "basic_optimizer", None) or engine.optimizer)
    if saved_world_size(run_dir, tag) == env.world_size:
        rng_file = root / tag / f"rng_rank{env.rank:05d}.pt"
        if not rng_file.is_file():
            raise InputError(f"{rng_file}: missing (the checkpoint is incomplete)")
        set_rng_state(torch.load(rng_file, weights_only=False), env.local_rank)
    return client_state
