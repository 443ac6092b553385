"""`tacl status [RESULTS_DIR]`: where a results directory stands, from its files only (a login node needs
no scheduler and no Snakemake for it).

- Pretraining, per objective: the last step logged of the total (run/metrics.jsonl, chunk markers), the
  speed of the latest chunk that logged twice or more (tokens and seconds between its first and last metric
  lines), the time left at that speed, the chunks done and why each ended (chunk-K.json), the latest
  checkpoint (run/checkpoints/latest), and its state: done, running (the run's LOCK names a live process
  on this host), killed (the LOCK's process on this host is gone), locked (the LOCK names a process on
  another host, which only its scheduler can tell about), waiting (not done, no LOCK: the next chunk is
  queued, or no Snakemake runs).
- Fine-tunes, per model and task, against the runs (seeds) the config asks for (RESULTS_DIR/expected.json):
  done (the seed's metrics.json, read back), failed (its job's log, one per setting, holds an error), started
  (begun, no result and no error: running, or killed), missing (not begun); the failed jobs' logs, and the
  metrics.json files that do not parse (damaged: not done; the next run of the job trains that seed again).
- Fine-tuning jobs with a seed begun and not finished (its settings' job, one per setting): running,
  waiting (queued again) or stopped (its time limit, killed, ended otherwise), each naming how it was
  told (`finetune_job`): from the scheduler when the job's job.json names a SLURM or PBS job and the
  scheduler answers (squeue, then sacct's state: TIMEOUT is the time limit; qstat -x: a finished job whose
  walltime used reached its limit), from the process when it ran on this host without a scheduler,
  otherwise from its log: its own line when it stopped at a signal, else, not written for
  STALE_LOG_MINUTES, it is taken as stopped (a running fine-tune writes a line every 200 steps and at
  every checkpoint, finetune.checkpoint_minutes, 30 by default). A stopped job's seed goes on from its
  checkpoint when the job runs again.
- Disk: each pretraining run's folder in all (`pretrain/<objective>/`), and in it what killed processes left
  unfinished (a save in `.incoming/`, a universal conversion's `<tag>.incoming`, a file written under a
  temporary name: tacl.pretrain.rundir.leftovers), which the run's next chunk removes when it starts, and
  what was set aside and is kept until deleted (damaged checkpoints, `superseded/` runs); the results
  directory's folders, and every file or folder written under a temporary name elsewhere in it
  (tacl.runtime.io.atomic_path: a fine-tune's checkpoint.pt being saved, an export, a report file), which a job still
  writes or a killed one left (the next job on the same host that writes the same file, or the next holder of
  the seed's lock, removes it; one written on another host is left to the lock holder, or to you).
- Hours of the finished jobs, from the Snakemake benchmark files (wall seconds `s`): all jobs, and GPU-hours,
  each job's seconds times the GPUs it had (a chunk: its ranks when it ran on GPUs, as its marker says; a
  fine-tuning job: one when its seeds' metrics.json say they ran on a GPU; a similarity job: one when the
  fine-tunes or chunks ran on GPUs, since its result does not say).
"""

from __future__ import annotations

import json
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

import yaml

from tacl.finetune import JOB
from tacl.runtime.io import InputError, alive_here, disk_bytes, read_json, size_text, temporaries_under
from tacl.runtime.lock import lock_owner
from tacl.pretrain.rundir import DAMAGED, checkpoint_dir, leftovers
from tacl.pretrain.metrics import read_lines
from tacl.report.expected import read_expected
from tacl.runtime.scheduler import (PBS_ALIVE, SLURM_ALIVE, parse_walltime, qstat_job, slurm_accounting_state,
                            slurm_job_state)

ERROR_MARKS = ("Traceback (most recent call last)", "tacl: error:")
STOPPED_MARK = "tacl: stopped:"  # a fine-tuning job's line: it saved its seed's checkpoint at a signal
# What makes a folder a results directory: the workflow's expected.json (written whenever Snakemake starts
# jobs there), or a stage's folder (a results directory made before expected.json, commit 8add9f4, 2026-11-25)
RESULTS_MARKS = ("expected.json", "pretrain", "finetune", "logs")
STALE_LOG_MINUTES = 45  # a fine-tuning job whose log is older than this, with no other word on it, is stopped


def default_results_dir(config: str | Path = "config.yaml") -> str:
    """results_dir of ./config.yaml (where the workflow runs)."""
    path = Path(config)
    if not path.is_file():
        raise InputError(f"no RESULTS_DIR given, and no {path} here to name one: tacl status RESULTS_DIR")
    results = (yaml.safe_load(path.read_text()) or {}).get("results_dir")
    if not results:
        raise InputError(f"{path}: no results_dir; give RESULTS_DIR")
    return str(results)


def _chunk_markers(run: Path) -> list[dict[str, Any]]:
    markers = sorted(run.glob("chunk-*.json"), key=lambda p: int(p.stem.split("-")[1]))
    return [read_json(p) for p in markers]


def speed(lines: list[dict[str, Any]]) -> dict[str, Any] | None:
    """tokens/s and seconds per step of the latest chunk with two metric lines or more: between its first and
    last line (tokens and elapsed_s as the trainer logged them)."""
    chunks: list[list[dict[str, Any]]] = [[]]
    for line in lines:
        if line.get("event") == "chunk_start":
            chunks.append([])
        elif "event" not in line:
            chunks[-1].append(line)
    for chunk in reversed(chunks):
        if len(chunk) >= 2:
            first, last = chunk[0], chunk[-1]
            seconds = last["elapsed_s"] - first["elapsed_s"]
            if seconds > 0:
                return {"tokens_per_s": (last["tokens"] - first["tokens"]) / seconds,
                        "s_per_step": seconds / (last["step"] - first["step"]),
                        "from_steps": [first["step"], last["step"]]}
    return None


def _sized(paths: list[Path], folder: Path) -> list[dict[str, Any]]:
    return [{"path": str(p.relative_to(folder)), "bytes": disk_bytes(p)} for p in paths]


def run_disk(folder: Path) -> dict[str, Any]:
    """The disk a pretraining run holds (its folder, `pretrain/<objective>/`): bytes in all; what killed
    processes left unfinished in it (`unfinished`: tacl.pretrain.rundir.leftovers, and a chunk marker written
    under a temporary name), and what is set aside (`set_aside`: damaged checkpoints, runs of earlier result
    settings), each path (relative to the folder) with its bytes."""
    run = folder / "run"
    unfinished = leftovers(run) + [p for p in temporaries_under(folder) if p.parent == folder]
    aside = sorted(checkpoint_dir(run).glob(f"step*{DAMAGED}*"))
    aside += sorted((folder / "superseded").iterdir()) if (folder / "superseded").is_dir() else []
    return {"bytes": disk_bytes(folder), "unfinished": _sized(unfinished, folder), "set_aside": _sized(aside, folder)}


def results_disk(root: Path, runs: list[Path]) -> dict[str, Any]:
    """The disk the results directory holds: bytes in all and per folder in it, and what is written under a
    temporary name outside the pretraining runs' folders `runs` (tacl.runtime.io.atomic_path: being written by a
    running job, or left by a killed one)."""
    parts = {p.name: disk_bytes(p) for p in root.iterdir()}
    loose = [p for p in temporaries_under(root) if not any(p.is_relative_to(run) for run in runs)]
    return {"bytes": sum(parts.values()), "temporaries": _sized(loose, root),
            "parts": {name: n for name, n in sorted(parts.items(), key=lambda kv: (-kv[1], kv[0]))
                      if n and (root / name).is_dir()}}


def pretrain_status(results_dir: Path, objective: str) -> dict[str, Any]:
    folder = results_dir / "pretrain" / objective
    run = folder / "run"
    markers = _chunk_markers(folder)
    lines = read_lines(run)
    logged = [m["step"] for m in lines if "event" not in m]
    settings = read_json(run / "run.json").get("settings", {}) if (run / "run.json").is_file() else {}
    steps = markers[-1]["steps"] if markers else settings.get("steps")
    step = max([0] + logged + [m["step"] for m in markers])
    latest = run / "checkpoints" / "latest"
    owner = lock_owner(run)
    done = bool(markers) and markers[-1]["done"]
    if done:
        state = "done"
    elif owner is not None:
        alive = alive_here(owner)
        state = {True: "running", False: "killed", None: "locked"}[alive]
        if alive is None:
            state += f" ({owner.get('slurm_job') or owner.get('pbs_job') or 'pid ' + str(owner.get('pid'))}" \
                     f" on {owner.get('host')})"
    else:
        state = "waiting" if markers or lines else "not started"
    pace = speed(lines)
    left = None
    if pace and steps is not None and not done:
        left = (steps - step) * pace["s_per_step"]
    return {"objective": objective, "state": state, "step": step, "steps": steps,
            "tokens_per_s": pace["tokens_per_s"] if pace else None, "seconds_left": left,
            "speed_from_steps": pace["from_steps"] if pace else None,
            "chunks": [{"chunk": m["chunk"], "reason": m["reason"], "step": m["step"],
                        "steps_this_chunk": m["steps_this_chunk"], "wall_s": m["wall_s"]} for m in markers],
            "checkpoint": latest.read_text().strip() if latest.is_file() else None, "disk": run_disk(folder)}


def _tail(log: Path) -> str:
    with open(log, "rb") as f:
        f.seek(max(0, log.stat().st_size - 200000))
        return f.read().decode("utf-8", "replace")


def _failed(log: Path) -> bool:
    tail = _tail(log)
    return any(mark in tail for mark in ERROR_MARKS)


def _metrics(path: Path) -> dict[str, Any] | None:
    """A seed's metrics.json, or None when it is not there or does not parse (a damaged one)."""
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    return value if isinstance(value, dict) else None


def _ago(seconds: float) -> str:
    return f"{seconds / 60:.0f} min ago" if seconds < 5400 else f"{seconds / 3600:.1f} h ago"


def _slurm_job(job: str) -> tuple[str, str]:
    state = slurm_job_state(job)
    if state in SLURM_ALIVE:
        return "running", f"SLURM job {job}, squeue: {state}"
    if state is not None:
        return "waiting", f"SLURM job {job}, squeue: {state}"
    ended = slurm_accounting_state(job)
    if ended is None:
        return "stopped", f"SLURM job {job}: neither squeue nor sacct knows it"
    what = {"TIMEOUT": "its time limit", "CANCELLED": "killed (scancel)", "PREEMPTED": "preempted",
            "NODE_FAIL": "its node failed", "OUT_OF_MEMORY": "out of memory"}.get(ended, "ended")
    return ("running" if ended == "RUNNING" else "stopped"), f"SLURM job {job}, sacct: {ended}, {what}"


def _pbs_job(job: str) -> tuple[str, str]:
    try:
        record = qstat_job(job, history=True)
    except (OSError, ValueError, subprocess.TimeoutExpired) as e:
        raise RuntimeError(f"qstat: {e}") from e
    if record is None:
        return "stopped", f"PBS job {job}: qstat no longer knows it"
    state = str(record.get("job_state", "")).strip()
    if state in PBS_ALIVE:
        return "running", f"PBS job {job}, qstat: job_state {state}"
    if state not in ("F", "X"):
        return "waiting", f"PBS job {job}, qstat: job_state {state}"
    used = record.get("resources_used", {}).get("walltime")
    limit = record.get("Resource_List", {}).get("walltime")
    try:
        at_limit = used is not None and limit is not None and \
            parse_walltime(used) >= parse_walltime(limit) - 60
    except ValueError:
        at_limit = False
    what = f"walltime {used} of {limit}, its time limit" if at_limit else \
        f"Exit_status {record.get('Exit_status')}"
    return "stopped", f"PBS job {job}, qstat -x: finished, {what}"


def finetune_job(setting_dir: Path, log: Path, now: float | None = None) -> dict[str, str]:
    """Whether a fine-tuning job with a seed begun and not finished runs: {state: running | waiting | stopped,
    how: the evidence, named}. From the scheduler when the job's JOB record names a SLURM or PBS job and the
    scheduler answers; from the process when it ran on this host outside one; else from its log: the line of
    a job that stopped at a signal (STOPPED_MARK), or its age (older than STALE_LOG_MINUTES: stopped)."""
    try:
        owner = json.loads((setting_dir / JOB).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        owner = {}
    owner = owner if isinstance(owner, dict) else {}
    unanswered = ""
    for key, ask in (("slurm_job", _slurm_job), ("pbs_job", _pbs_job)):
        if owner.get(key):
            try:
                state, how = ask(str(owner[key]))
                return {"state": state, "how": how}
            except RuntimeError as e:
                unanswered = f"{key.split('_')[0].upper()} job {owner[key]}: no answer ({e}); "
            break
    if not unanswered and owner.get("pid"):
        alive = alive_here(owner)
        if alive is not None:
            return {"state": "running" if alive else "stopped",
                    "how": f"process {owner['pid']} on this host {'runs' if alive else 'is gone'}"}
    if not log.is_file():
        return {"state": "stopped", "how": unanswered + "no log"}
    said = [line for line in _tail(log).splitlines() if line.startswith(STOPPED_MARK)]
    if said:
        return {"state": "stopped", "how": unanswered + f"its log: {said[-1][len(STOPPED_MARK):].strip()}"}
    age = (time.time() if now is None else now) - log.stat().st_mtime
    stale = age > 60 * STALE_LOG_MINUTES
    return {"state": "stopped" if stale else "running",
            "how": unanswered + f"its log was last written {_ago(age)} ({'more' if stale else 'less'} than "
                                f"{STALE_LOG_MINUTES} min: taken as {'stopped' if stale else 'running'})"}


def finetune_status(results_dir: Path, expected: list[dict[str, Any]], damaged: list[str] | None = None,
                    jobs: list[dict[str, str]] | None = None) -> tuple[list[dict[str, Any]], list[str]]:
    """Per (model, task): done, failed, started, missing of the expected runs (seeds); and the logs of the jobs
    (one per setting, its seeds one after the other) that failed. A metrics.json that does not parse counts
    as not done and goes into `damaged`; each job with a seed started goes into `jobs` (`finetune_job`)."""
    rows: dict[tuple[str, str], dict[str, Any]] = {}
    failed_logs: list[str] = []
    started: dict[str, tuple[Path, Path]] = {}
    for e in expected:
        row = rows.setdefault((e["model"], e["task"]), {"model": e["model"], "task": e["task"], "expected": 0,
                                                         "done": 0, "failed": 0, "started": 0, "missing": 0})
        row["expected"] += 1
        setting = f"{e['model']}/{e['task']}/{e['setting']}"
        run = results_dir / "finetune" / setting / f"seed{e['seed']}"
        log = results_dir / "logs" / "finetune" / f"{setting}.log"
        if (run / "metrics.json").is_file() and _metrics(run / "metrics.json") is not None:
            row["done"] += 1
            continue
        if (run / "metrics.json").is_file() and damaged is not None:
            damaged.append(str(run / "metrics.json"))
        if log.is_file() and _failed(log):
            row["failed"] += 1
            if str(log) not in failed_logs:
                failed_logs.append(str(log))
        elif log.is_file() or run.is_dir():
            row["started"] += 1
            started.setdefault(setting, (run.parent, log))
        else:
            row["missing"] += 1
    if jobs is not None:
        jobs.extend({"job": name, **finetune_job(folder, log)} for name, (folder, log) in started.items())
    return list(rows.values()), failed_logs


def finished_runs(results_dir: Path, damaged: list[str] | None = None) -> list[dict[str, Any]]:
    """Without expected.json: the finished fine-tunes found, per (model, task) (a metrics.json that does not
    parse goes into `damaged`)."""
    rows: dict[tuple[str, str], dict[str, Any]] = {}
    for path in sorted((results_dir / "finetune").glob("*/*/*/seed*/metrics.json")):
        if _metrics(path) is None:
            if damaged is not None:
                damaged.append(str(path))
            continue
        model, task = path.parents[3].name, path.parents[2].name
        rows.setdefault((model, task), {"model": model, "task": task, "done": 0})["done"] += 1
    return list(rows.values())


def _benchmark_seconds(path: Path) -> float:
    rows = [line.split("\t") for line in path.read_text().splitlines() if line.strip()]
    column = rows[0].index("s")
    return sum(float(r[column]) for r in rows[1:])


def _ran_on_gpu(device: dict[str, Any] | None) -> bool:
    return bool(device) and str(device.get("device") or "").startswith("cuda")


def hours(results_dir: Path) -> dict[str, Any]:
    """Job-hours and GPU-hours of the jobs whose Snakemake benchmark file is there (finished jobs)."""
    files = sorted((results_dir / "benchmarks").rglob("*.tsv"))
    gpu_jobs, pending = [], []
    total = 0.0
    for path in files:
        seconds = _benchmark_seconds(path)
        total += seconds
        part = path.relative_to(results_dir / "benchmarks")
        if part.parts[0] == "pretrain" and part.name.startswith("chunk-"):
            marker = results_dir / "pretrain" / part.parent.name / part.with_suffix(".json").name
            m = read_json(marker) if marker.is_file() else {}
            gpu_jobs.append((seconds, m.get("world_size", 1) if _ran_on_gpu(m.get("device")) else 0))
        elif part.parts[0] == "finetune":  # (finetune/M/T/SETTING.tsv: the job of every seed of a setting)
            seeds = (results_dir / part.parent / part.stem).glob("seed*/metrics.json")
            on_gpu = any(_ran_on_gpu((_metrics(m) or {}).get("device")) for m in seeds)
            gpu_jobs.append((seconds, 1 if on_gpu else 0))
        elif part.parts[0] == "analysis" and part.name.startswith("similarity-"):
            pending.append(seconds)
    on_gpus = any(g for _, g in gpu_jobs)
    gpu_seconds = sum(s * g for s, g in gpu_jobs) + (sum(pending) if on_gpus else 0.0)
    return {"benchmark_files": len(files), "job_hours": total / 3600, "gpu_hours": gpu_seconds / 3600}


def status(results_dir: str | Path) -> dict[str, Any]:
    root = Path(results_dir)
    if not root.is_dir():
        raise InputError(f"{root}: no such results directory")
    if not any((root / mark).exists() for mark in RESULTS_MARKS):
        raise InputError(f"{root}: not a results directory (it holds none of {', '.join(RESULTS_MARKS)}); "
                         "give the config's results_dir")
    wanted = read_expected(root)
    if wanted is not None:
        objectives = [o for o in wanted["objectives"] if o != "none"]
    else:
        objectives = sorted(p.name for p in (root / "pretrain").glob("*") if p.is_dir())
    out: dict[str, Any] = {"results_dir": str(root), "host": socket.gethostname(), "expected_known": wanted is not None,
                           "pretrain": [pretrain_status(root, o) for o in objectives]}
    damaged: list[str] = []
    jobs: list[dict[str, str]] = []
    if wanted is not None:
        out["finetune"], out["failed_logs"] = finetune_status(root, wanted["expected"], damaged, jobs)
    else:
        out["finetune"], out["failed_logs"] = finished_runs(root, damaged), []
    out["damaged"], out["finetune_jobs"] = damaged, jobs
    out["hours"] = hours(root)
    out["disk"] = results_disk(root, [root / "pretrain" / o for o in objectives])
    return out


def duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    seconds = round(seconds)
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


def _listed(entries: list[dict[str, Any]]) -> str:
    return ", ".join(f"{e['path']} ({size_text(e['bytes'])})" for e in entries)


def _run_disk_lines(runs: list[dict[str, Any]]) -> list[str]:
    """Per pretraining run, what killed processes left unfinished and what is set aside, with sizes."""
    out = []
    for p in runs:
        unfinished, aside = p["disk"]["unfinished"], p["disk"]["set_aside"]
        if unfinished:
            if p["state"].startswith(("running", "locked")):
                why = "being written now, or left by a killed process: the run's next chunk removes what is left"
            elif p["state"] == "done":
                why = "left by a killed process; the run is done, no chunk will remove them: delete them"
            else:
                why = "left by a killed process: the run's next chunk removes them"
            out.append(f"{p['objective']}: {size_text(sum(e['bytes'] for e in unfinished))} unfinished ({why}): "
                       f"{_listed(unfinished)}")
        if aside:
            out.append(f"{p['objective']}: {size_text(sum(e['bytes'] for e in aside))} set aside (kept until you "
                       f"delete them): {_listed(aside)}")
    return out + ([""] if out else [])


def _disk_lines(disk: dict[str, Any], results_dir: str) -> list[str]:
    parts = ", ".join(f"{name} {size_text(n)}" for name, n in disk["parts"].items())
    out = [f"disk: {size_text(disk['bytes'])} in {results_dir}" + (f" ({parts})" if parts else "")]
    if disk["temporaries"]:
        out.append(f"written under a temporary name ({size_text(sum(e['bytes'] for e in disk['temporaries']))}; "
                   "a running job's, or left by a killed one: the next job on the same host that writes the same "
                   "file, or the next holder of its seed's lock, removes it; one whose job is gone on another "
                   f"host is yours to delete): {_listed(disk['temporaries'])}")
    return out


def format_status(s: dict[str, Any]) -> str:
    from tabulate import tabulate

    out = [f"{s['results_dir']} (read on {s['host']})", ""]
    if s["pretrain"]:
        rows = [[p["objective"], p["state"], f"{p['step']}/{p['steps'] if p['steps'] is not None else '?'}",
                 f"{p['tokens_per_s']:,.0f}" if p["tokens_per_s"] is not None else "-", duration(p["seconds_left"]),
                 f"{len(p['chunks'])} ({', '.join(c['reason'] or '?' for c in p['chunks'])})" if p["chunks"] else "0",
                 p["checkpoint"] or "-", size_text(p["disk"]["bytes"])] for p in s["pretrain"]]
        out += [tabulate(rows, ["pretraining", "state", "step", "tokens/s", "time left", "chunks (why each ended)",
                                "checkpoint", "disk"], tablefmt="simple", disable_numparse=True), ""]
        out += _run_disk_lines(s["pretrain"])
    if s["finetune"] and s["expected_known"]:
        rows = [[f["model"], f["task"], f"{f['done']}/{f['expected']}", f["failed"], f["started"], f["missing"]]
                for f in s["finetune"]]
        out += [tabulate(rows, ["fine-tuning", "task", "done", "failed", "started", "missing"], tablefmt="simple",
                         disable_numparse=True), ""]
        out += [f"failed: {log}" for log in s["failed_logs"]] + ([""] if s["failed_logs"] else [])
        jobs = s.get("finetune_jobs", [])
        out += [f"{j['state']}: {j['job']} ({j['how']})" for j in jobs] + ([""] if jobs else [])
    elif s["finetune"]:
        rows = [[f["model"], f["task"], f["done"]] for f in s["finetune"]]
        out += [tabulate(rows, ["fine-tuning", "task", "done"], tablefmt="simple", disable_numparse=True),
                "(no expected.json: the runs still missing are unknown until snakemake has run here)", ""]
    damaged = s.get("damaged", [])
    out += [f"damaged (does not parse; not done, trained again when its job runs again): {path}"
            for path in damaged] + ([""] if damaged else [])
    out += _disk_lines(s["disk"], s["results_dir"])
    h = s["hours"]
    out.append(f"finished jobs ({h['benchmark_files']} benchmark files): {h['gpu_hours']:.2f} GPU-hours, "
               f"{h['job_hours']:.2f} job-hours")
    out.append("time left: at the latest chunk's speed, not counting queue waits and chunk start-ups; started: "
               "begun, without a result or an error (its job running, or stopped: listed above, each saying "
               "how it was told; a stopped seed goes on from its checkpoint when its job runs again)")
    return "\n".join(out) + "\n"
