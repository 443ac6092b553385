"""Training metrics: JSONL (one line per logging interval) and TensorBoard, rank 0 only.

Besides the metric lines, each chunk writes one event line at its start (`"event": "chunk_start"`, with the
device it runs on: GPU model and count, torch, CUDA, NCCL); `read_metrics` leaves events out.

On resume the JSONL keeps only lines up to the checkpoint's step, and TensorBoard purges later events, so a
chunk that died after logging but before saving leaves no duplicate or orphan points.

With `tracking` (config `tracking`: W&B, MLflow), every line also goes to the run's tracked run
(tacl.runtime.tracking: one across all the run's chunks, its ids kept in the run directory), from a thread of
its own; each chunk's device, precision and marker go with it, and its end says whether the run is done."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from tacl.runtime.io import read_json, stable_hash, write_text_atomic
from tacl.runtime.tracking import FINISHED, SCHEDULED, STATE, RunInfo, TrackedRun, flat


class MetricsLog:
    def __init__(self, run_dir: str | os.PathLike, resume_step: int, tensorboard: bool = True,
                 tracking: dict[str, Any] | None = None):
        self.path = Path(run_dir) / "metrics.jsonl"
        if self.path.is_file():
            kept = [line for line in self.path.read_text().splitlines()
                    if line.strip() and json.loads(line)["step"] <= resume_step]
            write_text_atomic(self.path, "".join(line + "\n" for line in kept))
        self.writer = None
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self.writer = SummaryWriter(str(Path(run_dir) / "tensorboard"), purge_step=resume_step + 1)
        self.tracked = tracked_run(run_dir, tracking) if tracking else None

    def write(self, record: dict[str, Any]) -> None:
        with open(self.path, "a") as f:
            f.write(json.dumps(record) + "\n")
        if self.writer is not None:
            for key, value in record.items():
                if key != "step" and isinstance(value, (int, float)):
                    self.writer.add_scalar(key, value, record["step"])
        if self.tracked is not None:
            self.tracked.metrics(record)

    def event(self, record: dict[str, Any]) -> None:
        """A line that is not a metric (JSONL only; the tracked run's tags): `record` has "step" and "event"."""
        with open(self.path, "a") as f:
            f.write(json.dumps(record) + "\n")
        if self.tracked is not None:
            self.tracked.tags(flat({k: v for k, v in record.items() if k not in ("step", "event")}))

    def close(self, marker: dict[str, Any] | None = None) -> None:
        """The chunk's end (`marker`: what it did, tacl.pretrain.trainer): its device, precision and marker go
        to the tracked run, finished where the run is done, else waiting for its next chunk."""
        if self.writer is not None:
            self.writer.close()
        if self.tracked is None:
            return
        if marker is not None:
            self.tracked.tags(flat({k: marker.get(k) for k in ("chunk", "step", "done", "precision", "matmul_dtype",
                                                                 "compiled", "world_size", "device")}))
            self.tracked.text(json.dumps(marker, indent=1), f"chunks/chunk-{marker.get('chunk', 0)}.json")
        self.tracked.close(FINISHED if marker is not None and marker.get("done") else SCHEDULED)


def tracked_run(run_dir: str | os.PathLike, tracking: dict[str, Any]) -> TrackedRun:
    """The pretraining run's tracked run (tacl.runtime.tracking), from its run.json (written by this chunk
    before it trains: its identity, whose hash names the run, its result settings, the tracker's params, and
    all its settings) and `tracking` (the job's spec, with the plan's cost of the run as `cost`); the lines
    metrics.jsonl holds (up to the checkpoint resumed) are sent to a tracker that lacks them."""
    record = read_json(Path(run_dir) / "run.json")
    identity = record["identity"]
    objective = identity["objective"]
    info = RunInfo(kind="pretrain", name=f"pretrain {objective}", group="pretrain",
                   identity=stable_hash(identity, 12), tags={"objective": objective},
                   params=flat({**record["result"], "data": identity["data"], "start_model": identity["start_model"]}),
                   config={"settings": record["settings"], "identity": identity, "cost": tracking.get("cost")})
    if tracking.get("cost"):
        info.tags.update((k, str(v)) for k, v in flat(tracking["cost"], "plan.").items())
    return TrackedRun(tracking, Path(run_dir) / STATE, info, backfill=read_metrics(run_dir))


def read_lines(run_dir: str | os.PathLike) -> list[dict[str, Any]]:
    path = Path(run_dir) / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.is_file() else []


def read_metrics(run_dir: str | os.PathLike) -> list[dict[str, Any]]:
    return [m for m in read_lines(run_dir) if "event" not in m]


def read_events(run_dir: str | os.PathLike) -> list[dict[str, Any]]:
    return [m for m in read_lines(run_dir) if "event" in m]
