"""One trainer per run directory (and per fine-tuning seed, tacl.finetune.seeds): a lock file created
atomically (O_EXCL), holding who owns it.

A lock whose holder is gone is taken over: a SLURM or PBS job that its scheduler no longer runs (finished,
failed, requeued, or forgotten), a process on this host that no longer exists, or a lock left by an
earlier run of this very job (a requeued job keeps its id). A lock held by a live job stops the second
trainer with one message naming the job and the command that shows it. A lock taken over is logged (a
warning): the lock file, its holder as recorded and why it counts as gone.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import time
from pathlib import Path

from tacl.io import InputError, pid_alive
from tacl.scheduler import job_state, show_job_command, state_runs

LOCK = "LOCK"
log = logging.getLogger("tacl.pretrain")
SCHEDULERS = (("slurm", "SLURM_JOB_ID", "slurm_job"), ("pbs", "PBS_JOBID", "pbs_job"))


def owner_record() -> dict:
    """Who this process is: host, pid, since when, and its SLURM or PBS job (None outside one)."""
    owner = {"host": socket.gethostname(), "pid": os.getpid(), "since": time.strftime("%Y-%m-%dT%H:%M:%S")}
    for _, variable, key in SCHEDULERS:
        owner[key] = os.environ.get(variable)
    return owner


def holder(owner: dict) -> tuple[bool, str]:
    """Is the lock's holder alive, and who is it: in words, with the command that shows a live one, or why a
    gone one counts as gone?"""
    host, pid = owner.get("host"), owner.get("pid")
    for scheduler, variable, key in SCHEDULERS:
        job = owner.get(key)
        if not job:
            continue
        who = f"{scheduler.upper()} job {job} (host {host}, pid {pid}, since {owner.get('since')})"
        if os.environ.get(variable) == job:  # only one trainer runs per job
            return False, f"{who}: this job's own earlier run (the job was requeued)"
        if host == socket.gethostname() and pid and not pid_alive(int(pid)):
            return False, f"{who}: its process no longer runs on this host"
        try:
            state = job_state(scheduler, job)
        except RuntimeError as e:
            return True, f"{who}; {scheduler} could not say whether it still runs ({e})"
        if not state_runs(scheduler, state):
            tool = "squeue" if scheduler == "slurm" else "qstat"
            return False, f"{who}: {tool} shows it in state {state}" if state else f"{who}: {tool} no longer lists it"
        return True, f"{who}, still running: `{show_job_command(scheduler, job)}` shows it"
    who = f"process {pid} on host {host} (since {owner.get('since')})"
    if host == socket.gethostname() and pid:
        if not pid_alive(int(pid)):
            return False, f"{who}: it no longer runs"
        return True, f"{who}, still running: `ps -p {pid}` shows it"
    return True, f"{who}, which no scheduler job names and this host ({socket.gethostname()}) cannot see"


def lock_owner(run_dir: str | os.PathLike) -> dict | None:
    """Who holds the run directory's lock, as written there; None when it is not locked ({} when unreadable)."""
    path = Path(run_dir) / LOCK
    try:
        return json.loads(path.read_text() or "{}")
    except FileNotFoundError:
        return None
    except (OSError, json.JSONDecodeError):
        return {}


class RunLock:
    """The lock of `run_dir` (its LOCK file). `busy` says in the refusal what the folder is held for, `logger`
    takes the line of a lock taken over."""

    def __init__(self, run_dir: str | os.PathLike, busy: str = "run directory is locked by another trainer",
                 logger: logging.Logger = log):
        self.path = Path(run_dir) / LOCK
        self.busy, self.log = busy, logger
        self.held = False

    def acquire(self) -> "RunLock":
        self.path.parent.mkdir(parents=True, exist_ok=True)
        for _ in range(2):
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                try:
                    owner = json.loads(self.path.read_text() or "{}")
                except (OSError, json.JSONDecodeError):
                    owner = {}
                alive, who = holder(owner) if owner else (True, "an unreadable lock")
                if owner and not alive:
                    self.path.unlink(missing_ok=True)  # stale: its trainer is gone
                    self.log.warning("%s: took over the stale lock of %s", self.path, who)
                    continue
                raise InputError(f"{self.path}: {self.busy}, {who}; if that one is really gone, delete the file"
                                 ) from None
            with os.fdopen(fd, "w") as f:
                json.dump(owner_record(), f)
            self.held = True
            return self
        raise InputError(f"{self.path}: could not take the lock")

    def release(self) -> None:
        if self.held:
            self.path.unlink(missing_ok=True)
            self.held = False

    def __enter__(self) -> "RunLock":
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()
