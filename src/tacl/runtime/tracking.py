"""Experiment trackers beside TensorBoard (config `tracking`): Weights & Biases and MLflow, and `tacl track sync`.

A tracked run is one run in each tracker the config names: one per pretraining run across all its chunks, one
per fine-tuning seed, one for the report. Its ids are kept in a state file beside the work it tracks (STATE in a
pretraining run directory, SEED_STATE in a seed's folder); the next chunk, or the job that goes on with a
stopped seed, reads them and resumes the same run. The step axis is the trainer's global step, and a tracker
is sent only steps above the highest it already holds (`Tracker.high`): after a kill, the steps a resumed
chunk repeats (those after its checkpoint, which metrics.jsonl drops on resume) are not logged twice, and the
curve keeps one point per step. Each tracker says how far it got at the start: MLflow's store, W&B's server
(online) or the run's offline files (read with W&B's own reader). Steps that metrics.jsonl holds and a tracker
does not (a tracker added halfway through a run, one that failed in an earlier chunk, what W&B had not yet
written when a chunk was killed) are sent at the start (`backfill`).

Trackers never stop training: every call to them runs in a thread of its own (`TrackedRun`), the training loop
only puts records in a queue, and a tracker that raises (a full disk, no network, an API error) is dropped with
one warning, the metrics staying in metrics.jsonl; closing waits at most CLOSE_S for the trackers. The packages
are optional: a config that names a tracker whose package is missing is refused before any job
(`config_errors`). Nothing here reads or writes an API key or a token: W&B and MLflow take theirs from their own
environment variables or login files, and an MLflow URI with a user name or password in it is refused.

Where runs go: MLflow's file store `RESULTS_DIR/tracking/mlruns` by default (`tracking.mlflow.uri` for a
server), W&B's offline runs `RESULTS_DIR/tracking/wandb/offline-run-*` (mode `auto`: offline inside a SLURM or
PBS job, whose compute nodes often have no internet, and wherever no WANDB_API_KEY is set), which `tacl track
sync RESULTS_DIR` uploads from a login node with `wandb sync`, skipping those synced before.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import importlib.util
import json
import logging
import math
import os
import queue
import secrets
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable
from urllib.parse import urlsplit

from tacl.runtime.io import InputError, read_json, write_json_atomic
from tacl.runtime.layout import Layout

log = logging.getLogger("tacl.tracking")

TRACKERS = ("tensorboard", "wandb", "mlflow")
# the trackers beside TensorBoard, each (the module imported, the package that installs it)
PACKAGES = {"wandb": ("wandb", "wandb"), "mlflow": ("mlflow", "mlflow-skinny")}
STATE = "tracking.json"  # a pretraining run directory's tracked runs (their ids)
SEED_STATE = ".tracking.json"  # a fine-tuning seed's (hidden: not one of the seed's result files)
CLOSE_S = 60.0  # the longest a job waits for its trackers at its end (an unreachable server)
SCHEDULER_JOB = ("SLURM_JOB_ID", "PBS_JOBID")  # set inside a job of SLURM or PBS
# MLflow statuses of a tracked run: trained to the end / waiting for its next chunk or job / failed
FINISHED, SCHEDULED, FAILED = "FINISHED", "SCHEDULED", "FAILED"


def config_errors(tracking: dict[str, Any]) -> list[str]:
    """The config's `tracking` (defaults filled in), one line per problem: a tracker whose package is not
    installed in this environment (naming the package to install), an MLflow URI that holds a user name or a
    password (credentials go in MLflow's environment variables, never in the config, the jobs' command lines
    and logs)."""
    problems = []
    for name in tracking.get("trackers", []):
        if name in PACKAGES and importlib.util.find_spec(PACKAGES[name][0]) is None:
            problems.append(f"tracking.trackers: {name} is asked for, but its package is not installed: pip install "
                            f"{PACKAGES[name][1]} (or take {name} out of tracking.trackers)")
    uri = (tracking.get("mlflow") or {}).get("uri")
    if uri and (urlsplit(uri).username or urlsplit(uri).password):
        problems.append("tracking.mlflow.uri: it holds a user name or password; give them in MLflow's environment "
                        "variables (MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD, or MLFLOW_TRACKING_TOKEN), "
                        "which no job writes anywhere")
    return problems


def job_spec(tracking: dict[str, Any], results_dir: str, **labels: Any) -> dict[str, Any] | None:
    """What a job is given of the config's `tracking`: the trackers beside TensorBoard with their settings,
    the results folder, and the job's own `labels` (e.g. the plan's cost of the run, as `cost`); None where
    the config asks for none of them."""
    names = [name for name in tracking.get("trackers", []) if name in PACKAGES]
    if not names:
        return None
    return {"trackers": names, **{name: tracking.get(name) or {} for name in names}, "results_dir": results_dir,
            **labels}


def experiment_name(spec: dict[str, Any]) -> str:
    """The default W&B project and MLflow experiment: the results folder's name (paper, demo, ...)."""
    return Path(spec["results_dir"]).resolve().name


def mlflow_uri(spec: dict[str, Any]) -> str:
    """tracking.mlflow.uri, or the file store under the results folder (a path without a scheme: a file store
    there, relative to the working directory)."""
    uri = (spec.get("mlflow") or {}).get("uri")
    if not uri:
        return (Path(Layout(spec["results_dir"]).tracking) / "mlruns").resolve().as_uri()
    return uri if "://" in uri or uri.startswith("file:") else Path(uri).resolve().as_uri()


def wandb_mode(spec: dict[str, Any]) -> str:
    """tracking.wandb.mode, `auto` resolved: offline inside a job of SLURM or PBS, and wherever no WANDB_API_KEY
    is set (W&B would otherwise ask for a login); online elsewhere. Only whether the variable is set is read."""
    mode = (spec.get("wandb") or {}).get("mode", "auto")
    if mode != "auto":
        return mode
    if any(os.environ.get(name) for name in SCHEDULER_JOB) or not os.environ.get("WANDB_API_KEY"):
        return "offline"
    return "online"


@dataclass
class RunInfo:
    """What a tracked run is: its kind (pretrain, finetune, report), name and group as the trackers show them,
    its tags, the settings that decide its result (MLflow params, W&B config: fixed for the run's life) and
    their hash (`identity`: a run whose identity changes is a new tracked run), and what else it carries
    (`config`: its whole settings as its job was given them, the plan's cost; a text artifact)."""

    kind: str
    name: str
    group: str
    identity: str
    tags: dict[str, str] = field(default_factory=dict)
    params: dict[str, Any] = field(default_factory=dict)
    config: dict[str, Any] = field(default_factory=dict)


def flat(values: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested settings as one level, keys joined by dots (lists and other values kept as they are)."""
    out: dict[str, Any] = {}
    for key, value in values.items():
        if isinstance(value, dict):
            out.update(flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def numbers(values: dict[str, Any]) -> dict[str, float]:
    """The numeric values of a record (booleans and text left out), as floats."""
    return {k: float(v) for k, v in values.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}


class Tracker:
    """One tracker's side of a tracked run. `state` is its part of the state file (ids), kept by TrackedRun;
    `high` the highest step it holds (-1: none), known once it has started."""

    name = ""

    def __init__(self, spec: dict[str, Any], info: RunInfo, state: dict[str, Any], writable: Path | None):
        self.spec, self.info, self.state, self.high = spec, info, state, -1
        self.writable = writable  # where a tracker may write files of its own (W&B's offline runs)

    def start(self) -> None: ...

    def log(self, step: int, values: dict[str, float]) -> None: ...

    def summary(self, values: dict[str, Any]) -> None: ...

    def tags(self, values: dict[str, str]) -> None: ...

    def text(self, text: str, name: str) -> None: ...

    def files(self, paths: list[Path], folder: str) -> None: ...

    def finish(self, status: str) -> None: ...


class MlflowTracker(Tracker):
    """MLflow through its client (mlflow-skinny's MlflowClient): the experiment by name (made once, under a
    file lock in a file store, which jobs side by side share), the run made with its params or taken up again
    by id, metrics with the global step, the final values as metrics of step 0, tags and artifacts."""

    name = "mlflow"

    def start(self) -> None:
        uri = mlflow_uri(self.spec)
        if uri.startswith("file:"):  # (MLflow 3.x refuses a file store unless asked; one it keeps maintained)
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        from mlflow.tracking import MlflowClient

        self.client = MlflowClient(tracking_uri=uri)
        experiment = self._experiment(uri, (self.spec.get("mlflow") or {}).get("experiment")
                                      or experiment_name(self.spec))
        run_id = self.state.get("run_id") if self.state.get("uri") == uri else None
        if run_id is not None:
            try:
                run = self.client.get_run(run_id)
                run_id = run_id if run.info.lifecycle_stage == "active" else None
            except Exception:  # noqa: BLE001 (deleted from the store: a new run)
                run_id = None
        if run_id is None:
            self.run_id = self.client.create_run(experiment, run_name=self.info.name, tags={
                **self.info.tags, "kind": self.info.kind, "group": self.info.group}).info.run_id
            self._params(self.info.params)
        else:
            self.run_id = run_id
            self.client.update_run(run_id, status="RUNNING")
        run_id = self.run_id
        self.state.update(uri=uri, run_id=run_id, experiment_id=experiment)
        self.high = self._high_water()

    def _experiment(self, uri: str, name: str) -> str:
        lock = Path(urlsplit(uri).path) / ".tacl-experiments.lock" if uri.startswith("file:") else None
        with _file_lock(lock):
            found = self.client.get_experiment_by_name(name)
            if found is None:
                return self.client.create_experiment(name)
            if found.lifecycle_stage != "active":
                self.client.restore_experiment(found.experiment_id)
            return found.experiment_id

    def _params(self, params: dict[str, Any]) -> None:
        from mlflow.entities import Param

        items = [Param(k[:250], json.dumps(v) if not isinstance(v, str) else v[:6000]) for k, v in params.items()]
        for i in range(0, len(items), 100):  # (MLflow's batch limit)
            self.client.log_batch(self.run_id, params=items[i:i + 100])

    def _high_water(self) -> int:
        metrics = self.client.get_run(self.run_id).data.metrics
        steps = [m.step for key in metrics for m in self.client.get_metric_history(self.run_id, key)]
        return max(steps, default=-1)

    def log(self, step: int, values: dict[str, float]) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        self.client.log_batch(self.run_id, metrics=[Metric(k, v, now, step) for k, v in values.items()])

    def summary(self, values: dict[str, Any]) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        metrics = [Metric(k, v, now, 0) for k, v in numbers(values).items() if math.isfinite(v)]
        self.client.log_batch(self.run_id, metrics=metrics)

    def tags(self, values: dict[str, str]) -> None:
        from mlflow.entities import RunTag

        self.client.log_batch(self.run_id, tags=[RunTag(k, str(v)[:5000]) for k, v in values.items()])

    def text(self, text: str, name: str) -> None:
        self.client.log_text(self.run_id, text, name)

    def files(self, paths: list[Path], folder: str) -> None:
        for path in paths:
            self.client.log_artifact(self.run_id, str(path), folder)

    def finish(self, status: str) -> None:
        self.client.set_terminated(self.run_id, status)


class WandbTracker(Tracker):
    """Weights & Biases: `wandb.init` with the run's id kept in the state file and resume="allow" (offline,
    each chunk or job writes a fragment of its own, `offline-run-TIME-ID`, which `wandb sync` uploads in order
    of start time as one run), the step the trainer's global step, the final values in the run's summary, CSV
    files as W&B tables and every file in an artifact.

    How far the run got (`high`): online, the server says (the resumed run's starting step); offline, the
    run's earlier fragments say, read with W&B's own reader (`wandb leet inspect`; each fragment once, its
    highest step kept in the state file). W&B's service writes a fragment in blocks: a chunk killed with
    SIGKILL leaves only what reached the file, and the steps that did not are sent again (by the next chunk,
    from metrics.jsonl or its own training)."""

    name = "wandb"

    def start(self) -> None:
        import wandb

        settings = self.spec.get("wandb") or {}
        project = settings.get("project") or experiment_name(self.spec)
        entity = settings.get("entity")
        if not (self.state.get("project") == project and self.state.get("entity") == entity and "id" in self.state):
            self.state.clear()
            self.state.update(project=project, entity=entity, id=secrets.token_hex(8), fragments={})
        self.writable.mkdir(parents=True, exist_ok=True)
        mode = wandb_mode(self.spec)
        self.run = wandb.init(
            project=project, entity=entity, id=self.state["id"], resume="allow", mode=mode,
            dir=str(self.writable), name=self.info.name, group=self.info.group, job_type=self.info.kind,
            tags=[f"{k}:{v}" for k, v in self.info.tags.items()][:64],
            config={**self.info.params, "identity": self.info.identity}, reinit="create_new",
            settings=wandb.Settings(console="off", quiet=True, silent=True, init_timeout=60))
        if mode == "offline":
            self.high = self._offline_high(Path(self.run.dir).parent)
        else:
            self.high = max(-1, int(self.run.starting_step) - 1)

    def _offline_high(self, own: Path) -> int:
        """The highest step in the run's earlier offline fragments (not `own`, this process's)."""
        seen = self.state.setdefault("fragments", {})
        for run_file in sorted(own.parent.glob(f"offline-run-*-{self.state['id']}/run-{self.state['id']}.wandb")):
            if run_file.parent != own and run_file.parent.name not in seen:
                seen[run_file.parent.name] = max((row["_step"] for row in wandb_history(run_file)), default=-1)
        return max(seen.values(), default=-1)

    def log(self, step: int, values: dict[str, float]) -> None:
        self.run.log(values, step=step, commit=True)

    def summary(self, values: dict[str, Any]) -> None:
        self.run.summary.update(values)

    def tags(self, values: dict[str, str]) -> None:
        self.run.summary.update(values)

    def text(self, text: str, name: str) -> None:
        path = Path(self.run.dir) / name  # (the run's files folder: uploaded with the run)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        self.run.save(str(path), base_path=self.run.dir, policy="end")

    def files(self, paths: list[Path], folder: str) -> None:
        import wandb

        tables = {}
        for path in paths:
            if path.suffix == ".csv" and path.stat().st_size:
                import pandas as pd

                tables[f"{folder}/{path.stem}"] = wandb.Table(dataframe=pd.read_csv(path))
        if tables:
            self.run.log(tables)
        artifact = wandb.Artifact(f"{folder}-{self.state['id']}", type=folder)
        for path in paths:
            artifact.add_file(str(path))
        self.run.log_artifact(artifact)

    def finish(self, status: str) -> None:
        self.run.finish(exit_code=1 if status == FAILED else 0)


def wandb_records(run_file: Path) -> list[dict[str, Any]]:
    """The records of an offline W&B run file, read with W&B's own reader (`wandb leet inspect --json`, the
    `wandb` command beside this Python's); [] for a file that holds none (a process killed before W&B wrote
    a block)."""
    command = Path(sys.executable).parent / "wandb"
    out = subprocess.run([str(command) if command.exists() else "wandb", "leet", "inspect", "--json",
                          str(run_file)], capture_output=True, text=True, timeout=300, check=True).stdout
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def wandb_history(run_file: Path) -> list[dict[str, Any]]:
    """The history rows (one per step: `_step` and the values) of an offline W&B run file."""
    return [r["history"]["item"] for r in wandb_records(run_file) if r.get("type") == "history"]


TRACKER_CLASSES = {"mlflow": MlflowTracker, "wandb": WandbTracker}


@contextlib.contextmanager
def _file_lock(path: Path | None):
    """An exclusive lock on `path` (made where missing), held for the block; nothing where `path` is None."""
    if path is None:
        yield
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


class TrackedRun:
    """A tracked run in every tracker of `spec` (job_spec's), driven from a thread of its own: the caller's
    calls only put work in a queue, so a slow or failing tracker never holds training up. `state_path` keeps
    the trackers' ids (and W&B's last step) between the jobs of one run; `backfill`: records (a step each)
    the trackers are sent first, those above what each holds (metrics.jsonl's, on a pretraining run's resume).
    A tracker that raises is dropped with one warning (`failed` names them); the rest go on."""

    def __init__(self, spec: dict[str, Any], state_path: str | os.PathLike, info: RunInfo,
                 backfill: Iterable[dict[str, Any]] = ()):
        self.spec, self.info, self.state_path = spec, info, Path(state_path)
        state = read_json(self.state_path) if self.state_path.is_file() else {}
        if state.get("identity") != info.identity:  # (another run's ids: this is a new tracked run)
            state = {"identity": info.identity}
        self.state = state
        writable = Path(Layout(spec["results_dir"]).tracking)
        self.live: list[Tracker] = [TRACKER_CLASSES[name](spec, info, state.setdefault(name, {}), writable)
                                    for name in spec["trackers"] if name in TRACKER_CLASSES]
        self.failed: list[str] = []
        self.cpu_s = 0.0  # CPU seconds of this run's thread in the trackers' calls, their start apart
        self.started = threading.Event()
        self.queue: queue.Queue = queue.Queue()
        self.queue.put(("start", list(backfill)))
        self.thread = threading.Thread(target=self._work, name="tacl-tracking", daemon=True)
        self.thread.start()

    # what callers do (each returns at once)
    def metrics(self, record: dict[str, Any]) -> None:
        """A metrics line (with its "step"): its numeric values, at that step."""
        self.queue.put(("metrics", record))

    def summary(self, values: dict[str, Any]) -> None:
        self.queue.put(("summary", values))

    def tags(self, values: dict[str, Any]) -> None:
        self.queue.put(("tags", {k: str(v) for k, v in values.items() if v is not None}))

    def text(self, text: str, name: str) -> None:
        self.queue.put(("text", (text, name)))

    def files(self, paths: list[Path], folder: str) -> None:
        self.queue.put(("files", (list(paths), folder)))

    def close(self, status: str, timeout: float = CLOSE_S) -> None:
        """End this job's part of the run (`status`: FINISHED, SCHEDULED where another chunk or job goes on,
        FAILED), waiting at most `timeout` seconds for the trackers."""
        self.queue.put(("finish", status))
        self.queue.put(None)
        self.thread.join(timeout)
        if self.thread.is_alive():
            log.warning("tracking: the trackers (%s) did not finish within %.0f s; this job ends without waiting "
                        "for them (every metric is in metrics.jsonl)", ", ".join(t.name for t in self.live), timeout)

    # the thread
    def _work(self) -> None:
        while (item := self.queue.get()) is not None:
            what, arg = item
            cpu = time.thread_time()
            for tracker in list(self.live):
                try:
                    getattr(self, f"_{what}")(tracker, arg)
                except Exception as e:  # noqa: BLE001 (a tracker never fails training: dropped, said once)
                    self._drop(tracker, what, e)
            if what == "start":
                self._save_state()
                self.started.set()
            else:  # (what the trackers cost after their start: benchmarks/tracking.py)
                self.cpu_s += time.thread_time() - cpu

    def _drop(self, tracker: Tracker, what: str, error: Exception) -> None:
        self.live.remove(tracker)
        self.failed.append(tracker.name)
        if what != "finish":
            with contextlib.suppress(Exception):  # (what it holds open, if anything: W&B's run in this process)
                tracker.finish(FAILED)
        first = (str(error).strip().splitlines() or [""])[0][:300]
        log.warning("tracking: %s failed (%s: %s: %s); training goes on without it (every metric stays in "
                    "metrics.jsonl, and the next chunk or job sends it what it missed)", tracker.name, what,
                    type(error).__name__, first)

    def _start(self, tracker: Tracker, backfill: list[dict[str, Any]]) -> None:
        tracker.start()
        tracker.tags({"identity": self.info.identity})
        if self.info.config:
            tracker.text(json.dumps(self.info.config, indent=1, sort_keys=True, default=str), "config.json")
        for record in backfill:
            self._metrics(tracker, record)

    def _metrics(self, tracker: Tracker, record: dict[str, Any]) -> None:
        step = int(record["step"])
        if step <= tracker.high:  # (logged before a kill: a resumed chunk repeats it)
            return
        tracker.high = step
        tracker.log(step, numbers({k: v for k, v in record.items() if k != "step"}))

    def _summary(self, tracker: Tracker, values: dict[str, Any]) -> None:
        tracker.summary(values)

    def _tags(self, tracker: Tracker, values: dict[str, str]) -> None:
        tracker.tags(values)

    def _text(self, tracker: Tracker, arg: tuple[str, str]) -> None:
        tracker.text(*arg)

    def _files(self, tracker: Tracker, arg: tuple[list[Path], str]) -> None:
        tracker.files(*arg)

    def _finish(self, tracker: Tracker, status: str) -> None:
        tracker.finish(status)

    def _save_state(self) -> None:
        try:
            write_json_atomic(self.state_path, self.state)
        except OSError as e:
            log.warning("tracking: could not write %s (%s); the next chunk or job starts new tracked runs",
                        self.state_path, e)


# `tacl track sync`: the offline W&B runs of a results folder, uploaded from a login node

def offline_runs(results_dir: str | os.PathLike) -> list[Path]:
    """Every offline W&B run file under the results folder (`tracking/wandb/offline-run-*/run-ID.wandb`: one per
    chunk or job of a tracked run), oldest first."""
    return sorted((Path(Layout(str(results_dir)).tracking) / "wandb").glob("offline-run-*/run-*.wandb"))


def synced(run_file: Path) -> bool:
    """Whether `wandb sync` uploaded this run file (it leaves RUN.wandb.synced beside it)."""
    return run_file.with_suffix(".wandb.synced").exists()


def sync_wandb(results_dir: str | os.PathLike, wandb: str | None = None, say=print) -> int:
    """Upload the offline W&B runs of `results_dir` not uploaded before, with `wandb sync` (the `wandb` command
    found on PATH, or `wandb`), saying how many and which; those synced before are skipped. The fragments of
    one tracked run (its chunks) go in one call, which uploads them in order of start time. Returns the exit
    status: 0, or 1 where some run is still not synced after the upload."""
    runs = offline_runs(results_dir)
    if not runs:
        say(f"tacl track sync: no offline W&B runs under {Path(Layout(str(results_dir)).tracking) / 'wandb'}")
        return 0
    pending = [r for r in runs if not synced(r)]
    before = len(runs) - len(pending)
    if not pending:
        say(f"tacl track sync: all {len(runs)} offline W&B run files were synced before; nothing to upload")
        return 0
    command = wandb or shutil.which("wandb")
    if command is None:
        raise InputError("tacl track sync: the wandb command is not installed here: pip install wandb")
    ids = sorted({_run_id(r) for r in pending})
    say(f"tacl track sync: uploading {len(pending)} offline W&B run file(s) of {len(ids)} run(s) "
        f"({before} synced before, skipped): " + ", ".join(ids))
    for path in pending:
        say(f"  {path.parent}")
    proc = subprocess.run([command, "sync", *(str(r.parent) for r in pending)])
    left = [r for r in pending if not synced(r)]
    if proc.returncode or left:
        say(f"tacl track sync: wandb sync exited {proc.returncode}; {len(pending) - len(left)} of {len(pending)} "
            f"uploaded, {len(left)} not yet (run the same command again to retry them): "
            + ", ".join(str(r.parent.name) for r in left))
        return 1
    say(f"tacl track sync: uploaded {len(pending)} run file(s) of {len(ids)} run(s)")
    return 0


def _run_id(run_file: Path) -> str:
    return run_file.stem.removeprefix("run-")


def register(stages: argparse._SubParsersAction) -> None:
    p = stages.add_parser("track", help="experiment trackers (W&B, MLflow): upload offline runs")
    cmds = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    c = cmds.add_parser("sync", help="upload the offline W&B runs of a results folder (`wandb sync`), from a "
                                     "login node; those synced before are skipped")
    c.add_argument("results_dir", help="the experiment's results_dir")
    c.set_defaults(func=lambda a: sync_wandb(a.results_dir), online=True)
