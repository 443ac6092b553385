"""`tacl submit pretrain`: one pretraining run from Python or a notebook, without Snakemake, via submitit.

The job runs the trainer as a child process and supervises it. submitit has SLURM send SIGUSR2 shortly
before the time limit (to every process of the step, the trainer included, which saves at the next step
boundary) and calls `checkpoint()`: the supervisor waits for the trainer to exit, and submitit requeues
the job; the next run resumes from that checkpoint. Should the trainer stop at its own deadline first
(SLURM may not signal a requeued job again), the supervisor raises the same signal itself, so the cycle
is the same.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from tacl.runtime.layout import Layout
from tacl.runtime.io import InputError, read_json, require_file


class PretrainRun:
    """A checkpointable callable: the run's arguments only (the trainer's state lives in run_dir)."""

    def __init__(self, run_dir: str, start_model: str, manifest: str, settings: dict[str, Any], nproc: int = 1,
                 src: str | None = None, margin_minutes: float = 0.25):
        self.run_dir = str(Path(run_dir).resolve())
        self.start_model = str(Path(start_model).resolve())
        self.manifest = str(Path(manifest).resolve())
        self.settings = settings
        self.nproc = nproc
        self.src = src or str(Path(__file__).resolve().parents[2])
        self.margin_minutes = margin_minutes
        self._child: subprocess.Popen | None = None

    def _command(self, marker: str) -> list[str]:
        cmd = [sys.executable, "-m", "tacl", "pretrain", "train", "--run-dir", self.run_dir, "--start-model",
               self.start_model, "--manifest", self.manifest, "--settings", json.dumps(self.settings),
               "--marker", marker, "--margin-minutes", str(self.margin_minutes)]
        return cmd + (["--nproc", str(self.nproc)] if self.nproc > 1 else [])

    def __call__(self) -> dict[str, Any]:
        marker = str(Path(self.run_dir) / "submitit-marker.json")
        Path(marker).unlink(missing_ok=True)
        env = dict(os.environ, PYTHONPATH=self.src + os.pathsep + os.environ.get("PYTHONPATH", ""))
        self._child = subprocess.Popen(self._command(marker), env=env)
        while self._child.poll() is None:  # (not wait(): checkpoint() polls the same child from a signal)
            time.sleep(1.0)
        if self._child.returncode != 0:
            raise RuntimeError(f"trainer exited with status {self._child.returncode} (see the job's log)")
        result = read_json(marker)
        if not result["done"]:
            # stopped at its own deadline: ask submitit to checkpoint and requeue, as its timeout signal would
            os.kill(os.getpid(), signal.SIGUSR2)
            time.sleep(60)  # (the handler requeues the job and exits)
            raise RuntimeError(f"trainer stopped at step {result['step']} ({result['reason']}); requeue failed")
        return result

    def checkpoint(self, *args: Any, **kwargs: Any):
        """Called by submitit before the time limit: let the trainer save, then requeue this callable."""
        import submitit

        child = self._child
        if child is not None and child.poll() is None:
            child.send_signal(signal.SIGUSR1)
            deadline = time.time() + 600
            while child.poll() is None and time.time() < deadline:
                time.sleep(0.5)
        return submitit.helpers.DelayedSubmission(PretrainRun(self.run_dir, self.start_model, self.manifest,
                                                              self.settings, self.nproc, self.src,
                                                              self.margin_minutes))

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k != "_child"}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state, _child=None)


def submit_pretraining(folder: str, run: PretrainRun, timeout_min: int, slurm: dict[str, Any] | None = None,
                       signal_delay_s: int = 120, max_requeues: int = 20):
    """Submit `run` to SLURM; returns the submitit Job (`.result()` waits for the final marker)."""
    import submitit

    executor = submitit.AutoExecutor(folder=folder, cluster="slurm", slurm_max_num_timeout=max_requeues)
    executor.update_parameters(timeout_min=timeout_min, slurm_signal_delay_s=signal_delay_s, name="tacl-pretrain",
                               **(slurm or {}))
    return executor.submit(run)


def run_from_config(config_path: str, objective: str) -> PretrainRun:
    """The same run the workflow would make for `objective` (its start model and shards must exist)."""
    import yaml

    from tacl.experiment.config import SCHEMA, config_errors, load_schema
    from tacl.pretrain.settings import TrainSettings

    config = yaml.safe_load(require_file(config_path, "workflow config").read_text()) or {}
    schema = load_schema(SCHEMA)
    problems = config_errors(config, schema)
    if problems:
        raise InputError(f"{config_path}: " + "; ".join(problems))
    pretrain = {**_defaults(schema["properties"]["pretrain"]), **config.get("pretrain", {})}
    data = {**_defaults(schema["properties"]["data"]), **config.get("data", {})}
    layout = Layout(config.get("results_dir", _defaults(schema)["results_dir"]))
    start, manifest = Path(layout.start), Path(layout.manifest)
    for path in (start / "config.json", manifest):
        if not path.is_file():
            raise InputError(f"{path}: not found; run the workflow up to it first "
                             f"(snakemake --profile profiles/slurm {start} {manifest})")
    settings = TrainSettings.from_config(pretrain, objective, data["max_len"]).to_dict()
    return PretrainRun(layout.pretrain_run(objective), str(start), str(manifest), settings,
                       nproc=pretrain.get("ranks_per_node", 1))


def _defaults(schema: dict[str, Any]) -> dict[str, Any]:
    """The schema's default of each key of one section (the workflow fills in the same)."""
    return {k: v.get("default") for k, v in schema.get("properties", {}).items() if "default" in v}
