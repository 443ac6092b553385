"""Experiment trackers (config `tracking`, tacl.runtime.tracking): one MLflow and one W&B run per pretraining run
across its chunks, read back with the trackers' own readers after a kill -9, with no step twice and the
values of metrics.jsonl; a tracker that raises mid-chunk changes nothing of training; the config's checks;
`tacl track sync` with a stand-in for `wandb sync`; no API key or token written anywhere."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import run_tacl
from tacl.runtime import tracking
from tacl.runtime.tracking import RunInfo, TrackedRun, job_spec

SECRET = "sk-tacl-test-sentinel-4f2a"  # an "API key" in the environment: found in no file afterwards


def read_mlflow(uri: str) -> tuple[list, dict[str, list[tuple[int, float]]]]:
    """Every run of the store at `uri` and, for its only run, each metric's (step, value) history."""
    os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    runs = [r for e in client.search_experiments() for r in client.search_runs([e.experiment_id])]
    history = {key: [(m.step, m.value) for m in client.get_metric_history(runs[0].info.run_id, key)]
               for key in runs[0].data.metrics} if runs else {}
    return runs, history


def read_wandb(run_file: Path) -> tuple[str | None, list[dict]]:
    """(run id, history rows) of one offline W&B run file, read with W&B's own reader (`wandb leet inspect`);
    (None, []) for a file W&B wrote nothing to (a process killed before W&B wrote its first block)."""
    records = tracking.wandb_records(run_file)
    runs = [r["run"]["run_id"] for r in records if r["type"] == "run"]
    return (runs[0] if runs else None), tracking.wandb_history(run_file)


# unit tests: milliseconds

def test_config_checks_name_the_missing_package_and_refuse_credentials_in_the_uri(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "mlflow" else real(name, *a))
    assert tracking.config_errors({"trackers": ["tensorboard", "wandb"]}) == []
    assert tracking.config_errors({"trackers": ["mlflow"]}) == [
        "tracking.trackers: mlflow is asked for, but its package is not installed: pip install mlflow-skinny (or "
        "take mlflow out of tracking.trackers)"]
    (line,) = tracking.config_errors({"trackers": [], "mlflow": {"uri": "https://me:pw@mlflow.example.org"}})
    assert line.startswith("tracking.mlflow.uri: it holds a user name or password") and "pw" not in line


def test_the_workflow_gives_jobs_tracking_only_beyond_tensorboard(tmp_path):
    """`tracking: [tensorboard, mlflow]` is short for `tracking: {trackers: [...]}`; the demo's config with it
    passes the checks (the packages are installed here); a job is given `--tracking` (with its labels and the
    plan's cost, asked only then) where a tracker beyond TensorBoard is asked for, and a chunk
    `--no-tensorboard` where TensorBoard is not."""
    from snakemake.utils import validate

    from conftest import REPO, demo_config
    from tacl.experiment.config import checked_config, load_schema
    from tacl.experiment.design import chunk_operational, tracking_option
    from tacl.runtime.layout import Layout

    schema = REPO / "workflow" / "schemas" / "config.schema.yaml"
    cfg = demo_config(tmp_path, tracking=["tensorboard", "mlflow"])
    assert checked_config(cfg, load_schema(schema), lambda c: validate(c, str(schema), set_default=True)) == []
    assert cfg["tracking"] == {"trackers": ["tensorboard", "mlflow"], "mlflow": {"uri": None, "experiment": None},
                               "wandb": {"project": None, "entity": None, "mode": "auto"}}
    layout, asked = Layout.of(cfg), []
    cost = lambda: asked.append(1) or {"gpus": 0}  # noqa: E731
    assert "--no-tensorboard" not in chunk_operational(cfg, layout)
    option = tracking_option(cfg, layout, cost, task="qnli")
    spec = json.loads(option.removeprefix("--tracking ").strip("'"))
    assert spec == {"trackers": ["mlflow"], "mlflow": {"uri": None, "experiment": None}, "task": "qnli",
                    "results_dir": layout.results, "cost": {"gpus": 0}}
    assert tracking.mlflow_uri(spec) == (tmp_path / "results" / "tracking" / "mlruns").as_uri()
    assert tracking.experiment_name(spec) == "results"
    cfg["tracking"]["trackers"] = ["mlflow"]
    assert "--no-tensorboard" in chunk_operational(cfg, layout)
    cfg["tracking"]["trackers"], asked[:] = ["tensorboard"], []
    assert tracking_option(cfg, layout, cost) == "" and not asked


def test_wandb_is_offline_in_a_scheduler_job_and_without_a_key(monkeypatch):
    for name in ("SLURM_JOB_ID", "PBS_JOBID", "WANDB_API_KEY"):
        monkeypatch.delenv(name, raising=False)
    spec = {"wandb": {"mode": "auto"}}
    assert tracking.wandb_mode(spec) == "offline"
    monkeypatch.setenv("WANDB_API_KEY", SECRET)
    assert tracking.wandb_mode(spec) == "online"
    monkeypatch.setenv("SLURM_JOB_ID", "42")
    assert tracking.wandb_mode(spec) == "offline"
    assert tracking.wandb_mode({"wandb": {"mode": "online"}}) == "online"


class Recorder(tracking.Tracker):
    """A stand-in tracker: what it was sent; RAISE_AT makes its log raise at that step (a full disk)."""

    name = "mlflow"
    RAISE_AT: int | None = None
    sent: list[tuple[str, object]] = []

    def start(self) -> None:
        self.high = self.state.get("high", -1)
        Recorder.sent.append(("start", self.high))

    def log(self, step, values) -> None:
        if step == self.RAISE_AT:
            raise OSError(28, "No space left on device")
        self.state["high"] = step
        Recorder.sent.append(("log", step))

    def summary(self, values) -> None:
        Recorder.sent.append(("summary", sorted(values)))

    def finish(self, status) -> None:
        Recorder.sent.append(("finish", status))


def test_a_tracked_run_sends_each_step_once_and_a_failing_tracker_is_dropped_with_one_warning(
        tmp_path, monkeypatch, caplog):
    monkeypatch.setitem(tracking.TRACKER_CLASSES, "mlflow", Recorder)
    monkeypatch.setattr(Recorder, "sent", [])
    spec = job_spec({"trackers": ["mlflow"]}, str(tmp_path / "results"))
    info = RunInfo("pretrain", "pretrain tacl", "pretrain", "id1")
    state = tmp_path / "run" / tracking.STATE
    run = TrackedRun(spec, state, info, backfill=[{"step": 1, "loss": 1.0}])
    for step in (2, 3):
        run.metrics({"step": step, "loss": 0.5, "text": "x"})
    run.close(tracking.SCHEDULED)
    assert Recorder.sent == [("start", -1), ("log", 1), ("log", 2), ("log", 3), ("finish", "SCHEDULED")]
    json.loads(state.read_text())  # (the ids kept for the next chunk)

    # the next chunk: metrics.jsonl's lines up to its checkpoint (step 2) sent first, the repeated step 3 not,
    # and a tracker that raises at step 5 dropped with one warning while the caller goes on
    Recorder.sent, Recorder.RAISE_AT = [], 5
    state.write_text(json.dumps({"identity": "id1", "mlflow": {"high": 3}}))
    with caplog.at_level(logging.WARNING, "tacl.tracking"):
        run = TrackedRun(spec, state, info, backfill=[{"step": 1}, {"step": 2}])
        for step in (3, 4, 5, 6):
            run.metrics({"step": step, "loss": 0.5})
        run.close(tracking.FINISHED)
    assert Recorder.sent == [("start", 3), ("log", 4), ("finish", "FAILED")]
    (warning,) = [r.getMessage() for r in caplog.records]
    assert "mlflow failed (metrics: OSError: [Errno 28] No space left on device)" in warning
    assert "training goes on without it" in warning and run.failed == ["mlflow"]
    # another run's ids (another identity) are not taken up
    Recorder.sent, Recorder.RAISE_AT = [], None
    TrackedRun(spec, state, RunInfo("pretrain", "p", "p", "id2")).close(tracking.FINISHED)
    assert Recorder.sent[0] == ("start", -1)


def test_a_fine_tuning_seed_is_a_run_of_its_model_and_task_that_ends_as_the_seed_does(tmp_path, monkeypatch):
    from tacl.finetune import Stopped
    from tacl.finetune.tracked import seed_info, tracked_seed

    monkeypatch.setitem(tracking.TRACKER_CLASSES, "mlflow", Recorder)
    monkeypatch.setattr(Recorder, "sent", [])
    spec = job_spec({"trackers": ["mlflow"]}, str(tmp_path / "results"), model="tacl+scl", setting="lr2e-5",
                    cost={"gpus": 1})
    out = tmp_path / "results" / "finetune" / "tacl+scl" / "rte" / "lr2e-5" / "seed3"
    info = seed_info(spec, "rte", 3, out, {"hparams": {"lr": 2e-5}})
    assert (info.name, info.group) == ("tacl+scl/rte/lr2e-5/seed3", "tacl+scl/rte")
    assert {k: info.tags[k] for k in ("objective", "contrastive", "family", "seed", "plan.gpus")} == {
        "objective": "tacl", "contrastive": "scl", "family": "glue", "seed": "3", "plan.gpus": "1"}
    assert info.params["hparams.lr"] == 2e-5 and info.identity != seed_info(spec, "mrpc", 3, out, {}).identity
    result = {"dev": {"dev": {"accuracy": 0.7}}, "train": {"steps": 5}, "wall_s": 1.0, "bf16": False}
    assert tracked_seed(spec, "rte", 3, out, {}, lambda: result) is result
    assert Recorder.sent[-2:] == [("summary", ["dev.accuracy", "train.steps", "wall_s"]), ("finish", "FINISHED")]

    def stopped():
        raise Stopped("stopped by SIGUSR1 at step 3/5")

    with pytest.raises(Stopped):
        tracked_seed(spec, "rte", 3, out, {}, stopped)
    assert Recorder.sent[-1] == ("finish", "SCHEDULED")  # (the next job goes on in this run)
    with pytest.raises(ZeroDivisionError):
        tracked_seed(spec, "rte", 3, out, {}, lambda: 1 / 0)
    assert Recorder.sent[-1] == ("finish", "FAILED")
    assert tracked_seed(None, "rte", 3, out, {}, lambda: result) is result  # (no tracker: no thread either)


STAND_IN_WANDB = """#!/bin/sh
# a stand-in for `wandb sync DIR...`: records its arguments and marks each run file synced, as wandb does
echo "$@" >> "{log}"
shift
for dir in "$@"; do for f in "$dir"/run-*.wandb; do touch "$f.synced"; done; done
"""


def test_track_sync_uploads_the_offline_runs_once(tmp_path, monkeypatch, capsys):
    from tacl.cli import main

    results = tmp_path / "results" / "demo"
    root = results / "tracking" / "wandb"
    fragments = [root / f"offline-run-2026112{k}_000000-{rid}" / f"run-{rid}.wandb"
                 for k, rid in enumerate(["aaaa1111", "aaaa1111", "bbbb2222"])]
    for f in fragments:
        f.parent.mkdir(parents=True)
        f.write_bytes(b"W&B")
    bin_dir, calls = tmp_path / "bin", tmp_path / "calls.txt"
    bin_dir.mkdir()
    (bin_dir / "wandb").write_text(STAND_IN_WANDB.format(log=calls))
    (bin_dir / "wandb").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")

    assert main(["track", "sync", str(results)]) == 0
    out = capsys.readouterr().out
    assert "uploading 3 offline W&B run file(s) of 2 run(s) (0 synced before, skipped): aaaa1111, bbbb2222" in out
    assert all(str(f.parent) in out for f in fragments)
    assert calls.read_text().split() == ["sync", *(str(f.parent) for f in fragments)]  # (oldest first)
    assert main(["track", "sync", str(results)]) == 0
    assert "all 3 offline W&B run files were synced before; nothing to upload" in capsys.readouterr().out
    new = root / "offline-run-20261130_000000-aaaa1111" / "run-aaaa1111.wandb"
    new.parent.mkdir()
    new.write_bytes(b"W&B")
    assert main(["track", "sync", str(results)]) == 0
    assert "uploading 1 offline W&B run file(s) of 1 run(s) (3 synced before, skipped): aaaa1111" in \
        capsys.readouterr().out
    assert calls.read_text().splitlines()[-1].split() == ["sync", str(new.parent)]


def test_deepspeed_imports_without_mlflow_and_a_tracked_run_still_has_it():
    """DeepSpeed's autotuner imports MLflow when it is installed (2.5 s of every rank's start, for a feature no chunk
    uses): the trainer imports DeepSpeed with MLflow hidden, and MLflow imports as usual afterwards."""
    code = ("import sys; from tacl.pretrain.distributed import import_deepspeed; import_deepspeed(); "
            "from deepspeed.autotuning import autotuner; print('mlflow' in sys.modules, autotuner.has_mlflow); "
            "import mlflow; print(mlflow.MlflowClient.__name__)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True)
    assert proc.stdout.splitlines()[-2:] == ["False False", "MlflowClient"], proc.stdout + proc.stderr[-2000:]


# the trainer: in this process (milliseconds per step), and in chunk processes killed with SIGKILL

@pytest.fixture
def env():
    """One gloo process group of one rank for the test (as tests/test_step.py's), the environment restored after
    it (a chunk process started later would otherwise take its RANK and MASTER_PORT)."""
    import torch.distributed as dist

    from tacl.pretrain.distributed import free_port, init_distributed

    saved = dict(os.environ)
    os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(free_port()))
    yield init_distributed("cpu")
    if dist.is_initialized():
        import deepspeed.comm as ds

        (ds.destroy_process_group if getattr(ds.comm, "cdb", None) is not None else dist.destroy_process_group)()
    os.environ.clear()
    os.environ.update(saved)


def chunk_in_process(demo_data, run_dir: Path, env, tracking_spec: dict | None) -> dict:
    """One chunk of 6 steps of MLM+NSP, in this process (the trainer's own _setup and _run_chunk)."""
    from conftest import run_params
    from tacl.pretrain.settings import TrainSettings
    from tacl.pretrain.trainer import ChunkArgs, _run_chunk, _setup
    from tacl.runtime.lock import RunLock
    from tacl.runtime.signals import StopSignals

    s = TrainSettings(objective="mlm_nsp", steps=6, global_batch=8, micro_batch=4, lr=2e-3, seed=3, max_len=64,
                      loader_workers=0, device="cpu", log_every=1, checkpoint_minutes=1000,
                      objective_params=run_params("mlm_nsp"))
    lock = RunLock(run_dir)
    try:
        args = ChunkArgs(str(run_dir), str(demo_data["start"]), str(demo_data["manifest"]), s, tensorboard=False,
                         tracking=tracking_spec)
        return _run_chunk(_setup(args, env, lock), StopSignals(), time.time())
    finally:
        lock.release()


def test_a_tracker_that_raises_mid_chunk_leaves_training_as_it_was(demo_data, tmp_path, env, monkeypatch, caplog):
    """A tracker whose log raises at step 3 (a full disk): one warning, the chunk trains on to its end, and
    its checkpoint and metrics.jsonl are an untracked chunk's, weight for weight."""
    import torch

    from tacl.pretrain import checkpoint
    from tacl.pretrain.metrics import read_metrics
    from tacl.pretrain.model import checkpoint_state_dict

    monkeypatch.setitem(tracking.TRACKER_CLASSES, "mlflow", Recorder)
    monkeypatch.setattr(Recorder, "sent", [])
    monkeypatch.setattr(Recorder, "RAISE_AT", 3)
    plain = chunk_in_process(demo_data, tmp_path / "plain", env, None)
    with caplog.at_level(logging.WARNING, "tacl.tracking"):
        tracked = chunk_in_process(demo_data, tmp_path / "tracked", env,
                                   job_spec({"trackers": ["mlflow"]}, str(tmp_path / "results")))
    assert tracked["done"] and tracked["step"] == plain["step"] == 6
    assert Recorder.sent == [("start", -1), ("log", 1), ("log", 2), ("finish", "FAILED")]
    assert len([r for r in caplog.records if "mlflow failed (metrics: OSError" in r.getMessage()]) == 1
    weights = [checkpoint_state_dict(run / "checkpoints", checkpoint.latest_tag(run))
               for run in (tmp_path / "plain", tmp_path / "tracked")]
    assert weights[0].keys() == weights[1].keys() and all(torch.equal(weights[0][k], weights[1][k])
                                                         for k in weights[0])
    keep = lambda rows: [{k: v for k, v in r.items() if k not in ("elapsed_s", "tokens_per_s")} for r in rows]  # noqa
    assert keep(read_metrics(tmp_path / "plain")) == keep(read_metrics(tmp_path / "tracked"))


@pytest.mark.slow
def test_one_tracked_run_across_chunks_and_a_kill_with_each_step_once(demo_data, tmp_path):
    """MLflow (a file store, read back with MlflowClient) and W&B offline (read back with W&B's own reader):
    a chunk is killed with SIGKILL once MLflow's store holds step 7 and before it saved (steps 1-7 are in
    MLflow and in no checkpoint; in W&B's file as far as W&B wrote it: 33 steps to spare, seconds on a quiet
    machine); the chunk again trains from the start to its last step. One MLflow run, one W&B run id in both
    fragments, each step once, every value metrics.jsonl's (elapsed time and tokens/s apart, which the repeated
    steps measure again). An API key and a token in the environment are in no file written. 50 to 110 s on 2
    busy cores (two chunk processes)."""
    from test_pretrain import settings

    from tacl.pretrain.metrics import read_metrics

    run, results, steps = tmp_path / "run", tmp_path / "results" / "demo", 40
    spec = json.dumps(job_spec({"trackers": ["mlflow", "wandb"], "wandb": {"mode": "offline"}}, str(results),
                               cost={"gpus": 0, "expected_minutes": 1.0}))
    env = {"WANDB_API_KEY": SECRET, "MLFLOW_TRACKING_TOKEN": SECRET}
    args = ["pretrain", "train", "--run-dir", str(run), "--start-model", str(demo_data["start"]), "--manifest",
            str(demo_data["manifest"]), "--settings", settings("mlm_nsp", steps=steps, loader_workers=0),
            "--no-tensorboard", "--tracking", spec]
    proc = subprocess.Popen([sys.executable, "-m", "tacl", *args], env={**os.environ, **env},
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    state = run / tracking.STATE

    def in_mlflow() -> int:
        if not state.is_file():
            return 0
        return max((step for h in read_mlflow(json.loads(state.read_text())["mlflow"]["uri"])[1].values()
                    for step, _ in h), default=0)

    while in_mlflow() < 7:
        assert proc.poll() is None
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert max(m["step"] for m in read_metrics(run)) < steps and not (run / "checkpoints").exists()
    run_tacl(*args, env=env)

    lines = read_metrics(run)
    assert [m["step"] for m in lines] == list(range(1, steps + 1))
    ids = json.loads(state.read_text())
    runs, history = read_mlflow(ids["mlflow"]["uri"])
    assert len(runs) == 1 and runs[0].info.status == "FINISHED" and runs[0].data.tags["objective"] == "mlm_nsp"
    assert runs[0].data.params["lr"] == "0.002" and runs[0].data.tags["plan.expected_minutes"] == "1.0"
    keys = [k for k in lines[0] if k not in ("step", "elapsed_s", "tokens_per_s")]
    assert set(history) == set(lines[0]) - {"step"}
    for key in history:
        assert [step for step, _ in history[key]] == list(range(1, steps + 1)), key  # (no step twice)
    for key in keys:
        assert [v for _, v in history[key]] == [float(m[key]) for m in lines], key

    fragments = tracking.offline_runs(results)
    assert len(fragments) == 2  # (one per chunk process: the killed one's holds what W&B wrote before the kill)
    read = [read_wandb(f) for f in fragments]
    assert {rid for rid, _ in read} - {None} == {ids["wandb"]["id"]} and read[-1][0] is not None
    rows = [row for _, h in read for row in h]
    assert [row["_step"] for row in rows] == list(range(1, steps + 1))
    for key in keys:
        assert [row[key] for row in rows] == [m[key] for m in lines], key

    written = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert written and not [p for p in written if SECRET.encode() in p.read_bytes()]
