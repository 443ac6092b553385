"""Checkpoints in `RUN/checkpoints/`: one directory per step (`step00001200`), complete or absent.

Every rank writes its DeepSpeed files and its own RNG file into `checkpoints/.incoming/<tag>`; after a
barrier rank 0 renames the directory into place, then rewrites `latest` (temporary name + rename), then
prunes all but the newest `keep`. A process killed at any moment leaves `latest` naming a complete
checkpoint.
"""

from __future__ import annotations

import os
import random
import re
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch

from tacl.io import InputError, write_text_atomic
from tacl.pretrain.distributed import DistEnv, barrier

CHECKPOINTS = "checkpoints"
INCOMING = ".incoming"
_TAG = re.compile(r"^step(\d{8})$")


def tag_for(step: int) -> str:
    return f"step{step:08d}"


def checkpoint_dir(run_dir: str | os.PathLike) -> Path:
    return Path(run_dir) / CHECKPOINTS


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
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


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
        os.replace(incoming / tag, final)
        write_text_atomic(root / "latest", tag + "\n")
        prune(root, keep, protect=tag)
    barrier()
    return tag


def prune(root: Path, keep: int, protect: str) -> None:
    tags = sorted(p.name for p in root.iterdir() if p.is_dir() and _TAG.match(p.name))
    for old in tags[: max(0, len(tags) - keep)]:
        if old != protect:
            shutil.rmtree(root / old, ignore_errors=True)


def load(engine: Any, run_dir: str | os.PathLike, tag: str, env: DistEnv) -> dict[str, Any]:
    root = checkpoint_dir(run_dir)
    path, client_state = engine.load_checkpoint(str(root), tag=tag, load_optimizer_states=True,
                                                load_lr_scheduler_states=True)
    if path is None:
        raise InputError(f"{root / tag}: DeepSpeed could not load this checkpoint")
    rng_file = root / tag / f"rng_rank{env.rank:05d}.pt"
    if not rng_file.is_file():
        raise InputError(f"{rng_file}: missing (the checkpoint was written by fewer ranks than {env.world_size})")
    set_rng_state(torch.load(rng_file, weights_only=False))
    return client_state
