"""One trainer per run directory (and per fine-tuning seed, tacl.finetune.seeds): a lock file created
atomically and whole (written under a name of its own, then linked to LOCK: the link fails where LOCK
exists), holding who owns it.

A lock whose holder is gone is taken over: a SLURM or PBS job that its scheduler no longer runs (finished,
failed, requeued, or forgotten), a process on this host that no longer exists, or an earlier run of this very
job (a requeued job keeps its id). Two processes of one scheduler job (two `srun` steps, Snakemake's local
profile or a command typed inside `salloc`, several hosts of one allocation) share that id: a holder of this
same job counts as gone only when its process is (asked on its host), or when it belongs to an earlier run of
the job (SLURM's SLURM_RESTART_COUNT, PBS's run_count: a requeue counts up; a sibling's count is this
process's). A lock held by a live process stops the second trainer with one message naming it and the command
that shows it. A lock taken over is logged (a warning): the lock file, its holder as recorded and why it counts
as gone.

Taking over is atomic, one winner whatever the timing: the taker first links the lock file to a name made of
the record it judged (`.LOCK.taking-<hash>`, which only one process can create), checks through that link
that the lock still holds that record, and only then removes it and creates its own (the link); a second
taker of the same record cannot link, and one that judged an older record finds another one there. `release`
removes the lock the same way, and only while it still holds this process's record (its `token`).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import socket
import time
import uuid
from pathlib import Path

from tacl.runtime.scheduler import job_state, pbs_run_count, show_job_command, state_runs
from tacl.runtime.io import InputError, pid_alive

LOCK = "LOCK"
log = logging.getLogger("tacl.pretrain")
# (scheduler, the job id's variable, its key in the record, the key of the job's run: requeues count it up)
SCHEDULERS = (("slurm", "SLURM_JOB_ID", "slurm_job", "slurm_restarts"),
              ("pbs", "PBS_JOBID", "pbs_job", "pbs_run_count"))
# a takeover's link left by a taker that died between link and unlink (the two are instants apart) is
# removed once it is this old
TAKING_STALE_S = 60.0


def process_start(pid: int) -> int | None:
    """When process `pid` of this host started (clock ticks since boot, /proc/PID/stat), or None where /proc
    cannot tell: tells a process from a later one that was given the same pid."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return int(stat.rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


def this_run(scheduler: str) -> int | None:
    """Which run of its scheduler job this process belongs to (counts up when the job is requeued), or None
    where the scheduler does not say. SLURM: SLURM_RESTART_COUNT (absent on the first run: 0); PBS: the job's
    run_count, asked of qstat."""
    if scheduler == "slurm":
        try:
            return int(os.environ.get("SLURM_RESTART_COUNT") or 0)
        except ValueError:
            return None
    return pbs_run_count(os.environ["PBS_JOBID"]) if os.environ.get("PBS_JOBID") else None


def owner_record() -> dict:
    """Who this process is: host, pid (and when it started), since when, its SLURM or PBS job (None outside
    one) and which run of it, and a token of its own (a lock holds this process's record only where the token
    is this one)."""
    owner = {"host": socket.gethostname(), "pid": os.getpid(), "pid_start": process_start(os.getpid()),
             "since": time.strftime("%Y-%m-%dT%H:%M:%S"), "token": uuid.uuid4().hex}
    for scheduler, variable, key, run in SCHEDULERS:
        owner[key] = os.environ.get(variable)
        owner[run] = this_run(scheduler) if owner[key] else None
    return owner


def _process_alive(owner: dict) -> bool:
    """Whether the record's process (on this host) still runs: its pid, started when the record says."""
    pid = int(owner["pid"])
    if not pid_alive(pid):
        return False
    started, now = owner.get("pid_start"), process_start(pid)
    return started is None or now is None or int(started) == now


def _same_job(a: str | None, b: str) -> bool:
    return bool(a) and (a == b or a.split(".")[0] == b.split(".")[0])


def holder(owner: dict) -> tuple[bool, str]:
    """Is the lock's holder alive, and who is it: in words, with the command that shows a live one, or why a
    gone one counts as gone?"""
    host, pid = owner.get("host"), owner.get("pid")
    here = host == socket.gethostname() and bool(pid)
    for scheduler, variable, key, run in SCHEDULERS:
        job = owner.get(key)
        if not job:
            continue
        who = f"{scheduler.upper()} job {job} (host {host}, pid {pid}, since {owner.get('since')})"
        if _same_job(os.environ.get(variable), job):  # this job's: an earlier run of it, or a sibling
            theirs, mine = owner.get(run), this_run(scheduler)
            if theirs is not None and mine is not None and int(theirs) < mine:
                return False, f"{who}: this job's earlier run (run {int(theirs) + 1}; the job was requeued)"
            if here:
                if not _process_alive(owner):
                    return False, f"{who}: its process no longer runs on this host"
                return True, f"{who}: another process of this same job, still running: `ps -p {pid}` shows it"
            return True, (f"{who}: another process of this same job, on host {host}, which this host cannot see "
                          "into")
        if here and not _process_alive(owner):
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
    if here:
        if not _process_alive(owner):
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


def remove_if_still(path: Path, record: bytes) -> bool | None:
    """Remove the lock file `path` if it still holds `record` (its bytes as read): True when removed, False
    when it holds another record or is gone, None when another process is removing that same record now.
    Atomic against every other caller (`RunLock`: takeover and release): the lock is linked first to
    `.LOCK.taking-<hash of record>`, a name only one process can create, and read back through that link."""
    taking = path.with_name(f".{path.name}.taking-{hashlib.sha256(record).hexdigest()[:16]}")
    try:
        os.link(path, taking)
    except FileNotFoundError:
        return False
    except FileExistsError:
        try:
            if time.time() - taking.stat().st_ctime > TAKING_STALE_S:  # (its taker died in between)
                taking.unlink(missing_ok=True)
        except FileNotFoundError:
            pass
        return None
    try:
        if taking.read_bytes() != record:  # (the lock changed hands since `record` was read)
            return False
        path.unlink()  # (still that record: every other remover of it is kept out by `taking`)
        return True
    finally:
        taking.unlink(missing_ok=True)


class RunLock:
    """The lock of `run_dir` (its LOCK file). `busy` says in the refusal what the folder is held for, `logger`
    takes the line of a lock taken over."""

    def __init__(self, run_dir: str | os.PathLike, busy: str = "run directory is locked by another trainer",
                 logger: logging.Logger = log):
        self.path = Path(run_dir) / LOCK
        self.busy, self.log = busy, logger
        self.held = False
        self.record: bytes | None = None  # what this process wrote into the lock

    def acquire(self) -> "RunLock":
        self.path.parent.mkdir(parents=True, exist_ok=True)
        for attempt in range(20):
            record = json.dumps(owner_record()).encode()
            if self._create(record):
                self.record, self.held = record, True
                return self
            try:
                record = self._read()
            except FileNotFoundError:
                continue  # (released or taken over just now: try again)
            try:
                owner = json.loads(record or b"{}")
            except (UnicodeDecodeError, json.JSONDecodeError):
                owner = {}
            alive, who = holder(owner) if isinstance(owner, dict) and owner else (True, "an unreadable lock")
            if alive:
                raise InputError(f"{self.path}: {self.busy}, {who}; if that one is really gone, delete the "
                                 "file") from None
            removed = remove_if_still(self.path, record)
            if removed:
                self.log.warning("%s: took over the stale lock of %s", self.path, who)
            elif removed is None:
                time.sleep(0.05 * (attempt + 1))  # (another process takes it over now: see who wins)
        raise InputError(f"{self.path}: could not take the lock (it kept changing hands)")

    def _create(self, record: bytes) -> bool:
        """Create the lock holding `record`, whole (written under a name of this process's, then linked to LOCK,
        which fails where LOCK exists: no reader sees it half written); False where it exists."""
        new = self.path.with_name(f".{self.path.name}.new-{socket.gethostname()}-{os.getpid()}")
        new.write_bytes(record)
        try:
            os.link(new, self.path)
        except FileExistsError:
            return False
        finally:
            new.unlink(missing_ok=True)
        return True

    def _read(self) -> bytes:
        """The lock's record; one that does not parse yet (written by a version that filled it after creating
        it) is read again for up to a second before it counts as unreadable."""
        for _ in range(10):
            record = self.path.read_bytes()
            try:
                json.loads(record)
                return record
            except (UnicodeDecodeError, json.JSONDecodeError):
                time.sleep(0.1)
        return record

    def release(self) -> None:
        """Remove the lock if it still holds this process's record (one taken over meanwhile, by a process
        that judged this one gone, is left to its new holder)."""
        if self.held and self.record is not None:
            for attempt in range(20):
                if remove_if_still(self.path, self.record) is not None:
                    break
                time.sleep(0.05 * (attempt + 1))
        self.held = False

    def __enter__(self) -> "RunLock":
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()
