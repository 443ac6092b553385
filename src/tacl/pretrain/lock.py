"""One trainer per run directory: a lock file created atomically (O_EXCL), holding who owns it.

A lock left by a dead process is taken over: same host and the pid is gone, or a SLURM job that squeue no
longer knows. Otherwise a second trainer stops with a message naming the holder and the file.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
from pathlib import Path

from tacl.io import InputError

LOCK = "LOCK"


def _owner() -> dict:
    return {"host": socket.gethostname(), "pid": os.getpid(), "slurm_job": os.environ.get("SLURM_JOB_ID"),
            "since": time.strftime("%Y-%m-%dT%H:%M:%S")}


def _alive(owner: dict) -> bool:
    if owner.get("host") == socket.gethostname():
        try:
            os.kill(int(owner["pid"]), 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True
    job = owner.get("slurm_job")
    if job:
        try:
            out = subprocess.run(["squeue", "-h", "-j", str(job), "-o", "%T"], capture_output=True, text=True,
                                 timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            return True
        return out.returncode == 0 and out.stdout.strip() in ("RUNNING", "COMPLETING", "SUSPENDED")
    return True  # another host, no way to tell: assume alive


class RunLock:
    def __init__(self, run_dir: str | os.PathLike):
        self.path = Path(run_dir) / LOCK
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
                if owner and not _alive(owner):
                    self.path.unlink(missing_ok=True)  # stale: its trainer is gone
                    continue
                raise InputError(
                    f"{self.path}: run directory is locked by another trainer ({json.dumps(owner)}); "
                    "if that trainer is really gone, delete the file"
                ) from None
            with os.fdopen(fd, "w") as f:
                json.dump(_owner(), f)
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
