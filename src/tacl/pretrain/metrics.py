"""Training metrics: JSONL (one line per logging interval) and TensorBoard, rank 0 only.

Besides the metric lines, each chunk writes one event line at its start (`"event": "chunk_start"`, with the
device it runs on: GPU model and count, torch, CUDA, NCCL); `read_metrics` leaves events out.

On resume the JSONL keeps only lines up to the checkpoint's step, and TensorBoard purges later events, so a
chunk that died after logging but before saving leaves no duplicate or orphan points."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from tacl.runtime.io import write_text_atomic


class MetricsLog:
    def __init__(self, run_dir: str | os.PathLike, resume_step: int, tensorboard: bool = True):
        self.path = Path(run_dir) / "metrics.jsonl"
        if self.path.is_file():
            kept = [line for line in self.path.read_text().splitlines()
                    if line.strip() and json.loads(line)["step"] <= resume_step]
            write_text_atomic(self.path, "".join(line + "\n" for line in kept))
        self.writer = None
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self.writer = SummaryWriter(str(Path(run_dir) / "tensorboard"), purge_step=resume_step + 1)

    def write(self, record: dict[str, Any]) -> None:
        with open(self.path, "a") as f:
            f.write(json.dumps(record) + "\n")
        if self.writer is not None:
            for key, value in record.items():
                if key != "step" and isinstance(value, (int, float)):
                    self.writer.add_scalar(key, value, record["step"])

    def event(self, record: dict[str, Any]) -> None:
        """A line that is not a metric (JSONL only): `record` has "step" and "event"."""
        with open(self.path, "a") as f:
            f.write(json.dumps(record) + "\n")

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


def read_lines(run_dir: str | os.PathLike) -> list[dict[str, Any]]:
    path = Path(run_dir) / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.is_file() else []


def read_metrics(run_dir: str | os.PathLike) -> list[dict[str, Any]]:
    return [m for m in read_lines(run_dir) if "event" not in m]


def read_events(run_dir: str | os.PathLike) -> list[dict[str, Any]]:
    return [m for m in read_lines(run_dir) if "event" in m]
