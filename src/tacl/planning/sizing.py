"""What each job of one experiment asks the scheduler for and is expected to take (the estimates of
tacl.planning.estimates, applied to the config and to what the results folder holds so far): the rules'
runtimes and memory, and the plan's figures, from the same functions.

The start model's size is looked up once, when a Sizing is made; what the data stage, prepare_task and
finished chunks have measured is read each time, so that the estimates follow the run."""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from typing import Any

from tacl.experiment.config import start_model_shape
from tacl.experiment.design import gpus_per_node, model_tasks, setting_hparams, settings_of, task_seeds
from tacl.runtime.layout import Layout
from tacl.finetune import finetune_checkpoint_bytes, save_margin_s
from tacl.planning import estimates
from tacl.runtime.shape import Shape


@dataclass(frozen=True, eq=False)
class Sizing:
    """The estimates of one experiment: its config, its results folder, the start model's size and the GPU
    the runtimes are sized for (plan.gpu)."""

    config: dict[str, Any]
    layout: Layout
    shape: Shape
    gpu: estimates.Gpu

    @classmethod
    def of(cls, config: dict[str, Any], layout: Layout) -> Sizing:
        shape = estimates.shape_of(config, start_model_shape(config))
        return cls(config, layout, shape, estimates.gpus_of(config["plan"])[config["plan"]["gpu"]])

    @property
    def plan(self) -> dict[str, Any]:
        return self.config["plan"]

    def model_shape(self, model: str) -> Shape:
        """The size of a fine-tuned model: the start model's, or an extra model's own."""
        base = model.split("+")[0]
        extra = self.config["finetune"]["extra_models"]
        if base in extra:
            return estimates.shape_of(
                {"model": extra[base]}, start_model_shape({"model": extra[base], "model_init": {}})
            )
        return self.shape

    def data_summary(self) -> dict[str, Any] | None:
        """The data stage's summary, once it has run."""
        path = self.layout.data_summary
        if not os.path.exists(path):
            return None
        with open(path) as f:
            return json.load(f)

    def pretrain_seq(self) -> float:
        """The mean padded length of a pretraining sequence (the data stage's own, once it has run)."""
        max_len = self.config["data"]["max_len"]
        mean, _ = estimates.mean_length(max_len, self.data_summary())
        return estimates.padded_length(mean, max_len, self.config["pretrain"])

    def pretrain_minutes(self, objective: str) -> float:
        """Expected minutes of a whole pretraining run, estimated."""
        return estimates.pretrain_minutes(objective, self.config["pretrain"], self.shape, self.pretrain_seq(), self.gpu)

    def chunk_expected(self, objective: str, chunk: int) -> float:
        """Expected minutes of the rest of a pretraining run from chunk `chunk` on: measured by the previous
        chunk where there is one, else estimated (tacl.planning.estimates)."""
        previous = self.layout.chunk_marker(objective, chunk - 1)
        if chunk > 0 and os.path.exists(previous):
            with open(previous) as f:
                rest = estimates.measured_rest_minutes(json.load(f))
            if rest is not None:
                return rest
        return self.pretrain_minutes(objective)

    def chunk_runtime(self, objective: str, chunk: int) -> int:
        """Minutes a chunk asks for: the rest of its run's work with the plan's safety factor and the chunk's
        margin, at most pretrain.chunk.runtime_minutes (the configured runtime itself with `device: cpu`)."""
        limits = self.config["pretrain"]["chunk"]
        if self.config["device"] == "cpu":
            return math.ceil(limits["runtime_minutes"])
        rest = self.chunk_expected(objective, chunk)
        return estimates.request(rest, self.plan, cap=limits["runtime_minutes"], extra=limits["margin_minutes"])

    def task_sizes(self, task: str) -> dict[str, int] | None:
        """A task's split sizes as prepare_task counted them, once it has run."""
        path = self.layout.task_data(task)
        if not os.path.exists(path):
            return None
        with open(path) as f:
            return json.load(f)["splits"]

    def finetune_expected(self, model: str, task: str, setting: str) -> float:
        """Expected minutes of one fine-tuning job (every seed of a setting), without start-up."""
        hp = setting_hparams(self.config, task, setting)
        seeds = len(task_seeds(self.config, task))
        return estimates.finetune_minutes(task, hp, seeds, self.model_shape(model), self.gpu, self.task_sizes(task))

    def finetune_runtime(self, model: str, task: str, setting: str) -> int:
        """Minutes a fine-tuning job asks for: finetune.runtime_minutes where it names the task (or has a
        default), else its seeds' expected work with the plan's safety factor (tacl.planning.estimates), and
        the time it keeps to save its seeds before the limit (tacl.finetune.save_margin_s), as a chunk asks
        for its margin."""
        explicit = self.config["finetune"]["runtime_minutes"]
        if task in explicit or "default" in explicit or self.config["device"] == "cpu":
            return explicit.get(task, explicit.get("default", 240))
        save = save_margin_s(finetune_checkpoint_bytes(self.model_shape(model).total), self.seeds_at_once(task)) / 60
        return estimates.request(self.finetune_expected(model, task, setting), self.plan, extra=save)

    def finetune_mem(self, task: str, setting: str) -> int:
        """Host memory of a fine-tuning job: one process's for each seed that may train at once."""
        max_len = setting_hparams(self.config, task, setting).get("max_len", 128)
        return self.seeds_at_once(task) * estimates.finetune_mem_mb(task, max_len, self.task_sizes(task))

    def seeds_at_once(self, task: str) -> int:
        """The most seeds of one of the task's jobs that train at once (finetune.seeds_per_gpu)."""
        from tacl.finetune.side_by_side import most_at_once

        return most_at_once(str(self.config["finetune"]["seeds_per_gpu"]), len(task_seeds(self.config, task)),
                            self.config["device"] == "cpu")

    def run_cost(self, objective: str | None = None, model: str = "", task: str = "", setting: str = ""
                 ) -> dict[str, Any]:
        """The plan's cost of one tracked run (tacl.runtime.tracking): a pretraining run's, all its chunks
        (`objective`), or one fine-tuning seed's (a share of its job's): expected minutes of work, the GPUs it
        uses and their GPU-hours, on the plan's GPU."""
        if objective is not None:
            minutes = self.pretrain_minutes(objective)
            gpus = gpus_per_node(self.config, "pretrain_chunk") * self.config["pretrain"]["nodes"]
        else:
            minutes = self.finetune_expected(model, task, setting) / max(1, len(task_seeds(self.config, task)))
            gpus = gpus_per_node(self.config, "finetune")
        return {"gpu": self.gpu.name, "gpus": gpus, "expected_minutes": float(f"{minutes:.3g}"),
                "expected_gpu_hours": float(f"{gpus * minutes / 60:.3g}")}

    def similarity_expected(self) -> float:
        return estimates.similarity_minutes(self.config["analysis"], self.shape, self.gpu)

    def similarity_runtime(self) -> int:
        return estimates.request(self.similarity_expected(), self.plan)

    def config_runtimes(self) -> dict[str, tuple[int, str]]:
        """The rules whose runtime the config sets: (the longest minutes, key), for the preflight's messages."""
        runtimes = {
            "pretrain_chunk": (
                math.ceil(self.config["pretrain"]["chunk"]["runtime_minutes"]),
                "pretrain.chunk.runtime_minutes",
            )
        }
        jobs = [(m, t, s) for m, t in model_tasks(self.config) for s in settings_of(self.config, t)]
        if jobs:
            longest = max(self.finetune_runtime(m, t, s) for m, t, s in jobs)
            runtimes["finetune"] = (longest, "finetune.runtime_minutes (or plan.safety)")
        return runtimes
