"""A checkpoint inside one fine-tuning seed, so that a long fine-tune killed at its time limit goes on where
it stopped instead of starting the seed again.

`train` (tacl.finetune.common) saves the seed's whole state into its folder (CHECKPOINT, one file, written
atomically, one kept) every `finetune.checkpoint_minutes`, and at once when SIGUSR1, SIGUSR2 or SIGTERM
arrives (SLURM's and PBS's warning before the time limit; saved at the next step boundary, then the job stops
with `Stopped`, exit status EXIT_STOPPED, 3). The state is everything the rest of the seed depends on: model,
optimizer and LR schedule, the step, the epoch and the position in its batch order (the order generator's
state at the epoch's start: the resumed job draws the same order and skips the batches done), every RNG
(Python, NumPy, torch, CUDA: dropout goes on as it would have), and what the training record sums (the recent
losses, the padding counted). A seed resumed from it ends with the uninterrupted seed's weights and metrics,
bit for bit on the CPU. The checkpoint names the fine-tune it belongs to (seed, steps, rows, hyperparameters):
one of another fine-tune is not resumed. The seed's folder loses it once its metrics are written
(tacl.finetune.seeds).

A stop signal that comes before the seed trains stops it there (nothing new to save); one that comes after
its last step, while it predicts, saves the trained state and stops it (`Checkpointing.stop_point`): run
again, it trains no step and predicts; one that comes while it writes its results lets it finish
(tacl.runtime.signals says why each phase does what it does).

A seed also saves and stops on its own before its job's time limit, as a pretraining chunk does (its
Deadline, tacl.pretrain.deadline): the job's end time comes from its scheduler (squeue under SLURM, qstat's
walltime and start time under PBS Pro, which sends no warning signal before the limit), and the seed stops
when one more step and a half, plus the time to save the checkpoints of every seed of the job that trains at
once (tacl.finetune.save_margin_s: side by side they save at the same moment), would run past it (`TimeLimit`).
"""

from __future__ import annotations

import logging
import random
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from tacl.finetune import (  # noqa: F401 (Stopped: raised by train, named here)
    CHECKPOINT,
    SAVE_BYTES_PER_S,
    STOP_SLACK_S,
    Stopped,
    finetune_checkpoint_bytes,
    save_margin_s,
)
from tacl.pretrain.deadline import Deadline
from tacl.runtime import signals
from tacl.runtime.io import atomic_path, size_text

log = logging.getLogger("tacl.finetune")


@dataclass
class Checkpointing:
    """How `train` checkpoints inside a seed: every `minutes` (None: only when stopped), before the job's `end`
    (`TimeLimit`), and, for tests, a stop after `stop_after` steps of this process, as a signal would. `path`
    is the seed's checkpoint."""

    minutes: float | None = 30.0
    stop_after: int | None = None
    path: Path | None = None
    end: float | None = None  # Unix time at which the job's scheduler ends it (None: no limit known)
    at_once: int = 1  # the job's seeds that train at once, this one included: they save at the same moment
    # once the seed has trained (tacl.finetune.common.train): saves the trained state, for `stop_point`
    save_trained: Callable[[], Any] | None = field(default=None, repr=False)

    def at(self, seed_dir: str | Path) -> "Checkpointing":
        return replace(self, path=Path(seed_dir) / CHECKPOINT, save_trained=None)

    def stop_point(self) -> None:
        """A point after training where the seed may stop (each batch of its predictions): where a stop signal
        came (tacl.runtime.signals), the trained state is saved in its checkpoint and the seed stops
        (`Stopped`); run again, it resumes at its last step, trains no step and predicts."""
        if not signals.stop_requested() or self.save_trained is None:
            return
        self.save_trained()
        raise Stopped(f"stopped by {signals.first()} after training, while predicting; the trained state is saved "
                      f"in {self.path}: running the job again predicts from it without training again")


@dataclass
class TimeLimit:
    """When a seed saves and stops before its job's end: a Deadline whose margin holds the checkpoints of
    the `at_once` seeds that save at the same moment (tacl.finetune.save_margin_s: each at SAVE_BYTES_PER_S, or
    as slowly as this seed's saves went, if slower), and one step and a half."""

    deadline: Deadline
    checkpoint_bytes: float
    at_once: int
    longest_save: float = 0.0

    @classmethod
    def of(cls, checkpointing: Checkpointing, model: torch.nn.Module) -> "TimeLimit":
        nbytes = finetune_checkpoint_bytes(sum(p.numel() for p in model.parameters()))
        margin = save_margin_s(nbytes, checkpointing.at_once)
        return cls(Deadline(checkpointing.end, margin), nbytes, checkpointing.at_once)

    def near(self) -> bool:
        return self.deadline.near()

    def saved(self, seconds: float) -> None:
        """A save took `seconds`: the margin holds `at_once` saves as long as the longest one."""
        self.longest_save = max(self.longest_save, seconds)
        self.deadline.margin_s = save_margin_s(self.checkpoint_bytes, self.at_once, self.longest_save)

    def describe(self) -> str:
        """'saves and stops once a step and a half and 83 s are left before 2026-11-24T10:00:00 (4 seeds'
        checkpoints of 1.3 GB at 100 MB/s, and 30 s)'."""
        end = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(self.deadline.end)) if self.deadline.end else "?"
        seeds = f"{self.at_once} seeds' checkpoints" if self.at_once > 1 else "its checkpoint"
        return (f"saves and stops once a step and a half and {self.deadline.margin_s:.0f} s are left before {end} "
                f"({seeds} of {size_text(self.checkpoint_bytes)} at {SAVE_BYTES_PER_S / 1e6:.0f} MB/s, and "
                f"{STOP_SLACK_S:.0f} s)")


def rng_states() -> dict[str, Any]:
    """Every RNG's state, in types torch.load(weights_only=True) reads back."""
    name, keys, pos, has_gauss, gauss = np.random.get_state()
    return {"python": random.getstate(), "numpy": [name, keys.tolist(), pos, has_gauss, gauss],
            "torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else []}


def restore_rng_states(states: dict[str, Any]) -> None:
    random.setstate(states["python"])
    name, keys, *rest = states["numpy"]
    np.random.set_state((name, np.array(keys, dtype=np.uint32), *rest))
    torch.set_rng_state(states["torch"])
    if states["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(states["cuda"])


def save(path: Path, state: dict[str, Any]) -> float:
    """Write the checkpoint atomically (the one before stays whole until the new one is complete); returns
    the seconds it took."""
    started = time.time()
    with atomic_path(path) as tmp:
        torch.save(state, tmp)
    return time.time() - started


def load(path: Path | None, identity: str) -> dict[str, Any] | None:
    """The seed's checkpoint, if there is one of this fine-tune (`identity`); None otherwise, saying why when
    there is a file that is not resumed. Read onto the CPU (the RNG states must be there; model and
    optimizer state go to the device as they load)."""
    if path is None or not path.is_file():
        return None
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 (one that does not load is not resumed, whatever the cause)
        log.warning("%s: does not load (%s); this seed trains from the start", path, e)
        return None
    if not isinstance(state, dict) or state.get("identity") != identity:
        log.warning("%s: a checkpoint of another fine-tune (other settings, data or seed); not resumed, this "
                    "seed trains from the start", path)
        return None
    return state
