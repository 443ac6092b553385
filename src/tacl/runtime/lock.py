"""One trainer per run directory (and per fine-tuning seed, tacl.finetune.seeds): a lock file created
atomically and whole (written under a name of its own, then linked to LOCK: the link fails where LOCK
exists; on a file system without hard links, created exclusively and written at once), holding who owns it.

Who owns it (`owner_record`): the host, the machine's boot (its boot id) and the PID namespace the process
lives in (a container started with its own, such as Apptainer's --containall, numbers its processes from 1:
host and pid alone name no process), the pid and when that process started, the user, and the scheduler job
it runs in: its id, its cluster (SLURM_CLUSTER_NAME; a PBS job id names its server), which run of the job
(SLURM's SLURM_RESTART_COUNT: a requeue counts up) and the job's hosts (its allocation). Nothing is asked of
a scheduler to write the record: acquiring a lock never waits on squeue or qstat.

A lock whose holder is gone is taken over (`holder` judges):
- a process of this host (same boot, same PID namespace) that no longer runs; one of a boot of this host
  that is over (the host restarted);
- a SLURM or PBS job that its scheduler no longer runs (finished, failed, requeued, or forgotten), asked of
  the job's own cluster (`squeue -M CLUSTER`; `qstat JOBID.SERVER`). A job the scheduler no longer lists
  counts as gone only where it is the user's own: squeue hides other users' jobs where the cluster sets
  PrivateData, and a cluster that does not answer (another cluster's, out of reach) is no answer either;
- an earlier run of this very job (a requeued job keeps its id): a lower SLURM_RESTART_COUNT, or another
  allocation (the requeue runs on other hosts: no qstat needed, which compute nodes may not be allowed to run).

Two processes of one scheduler job (two `srun` steps, Snakemake's local profile or a command typed inside
`salloc`, several hosts of one allocation) share its id: a holder of this same job counts as gone only when
its process is (asked on its host), or when it belongs to an earlier run of the job. A lock held by a live
process, or by one this process cannot judge, stops the second trainer with one message naming it, the
command that shows it, and what to do if it is really gone. A lock taken over is logged (a warning): the
lock file, its holder as recorded and why it counts as gone. Each acquisition and release is one line of
HISTORY beside the lock (kept after it), so that who held a folder, and when, can be read afterwards.

Taking over is atomic, one winner whatever the timing and whatever the clocks say: the taker first claims the
record it judged by creating `.LOCK.taking-<hash>` exclusively (only one process can), checks that the lock
still holds that record, and only then removes it; a second taker of the same record cannot claim it, and one
that judged an older record finds another one there. A claim whose claimer died before removing it (between
two instants) is passed by, never removed while its claimer may live: the next claim of that record is
`.LOCK.taking-<hash>.1`, and so on, a sequence every taker walks alike (a claimer's death is permanent: no
two takers can disagree on which claim is the live one). `release` removes the lock the same way, and only
while it still holds this process's record (its `token`). The claims of a record are removed once the lock no
longer holds it.
"""

from __future__ import annotations

import errno
import hashlib
import json
import logging
import os
import re
import socket
import time
import uuid
from pathlib import Path

from tacl.runtime.io import InputError, pid_alive
from tacl.runtime.scheduler import job_state, show_job_command, state_runs

LOCK = "LOCK"
# Beside LOCK: one JSON line per holder's acquisition and release (who, when, whose stale lock it took over), kept
# after the lock goes: which processes held the folder, and when (tacl status; the fault-injection run checks from
# it that no two held it at once)
HISTORY = "LOCK.log"
log = logging.getLogger("tacl.pretrain")
# (scheduler, the job id's variable, its key in the record, the key of the job's run: requeues count it up)
SCHEDULERS = (("slurm", "SLURM_JOB_ID", "slurm_job", "slurm_restarts"),
              ("pbs", "PBS_JOBID", "pbs_job", "pbs_run_count"))
# os.link's errors on a file system without hard links (FUSE mounts of object stores, some SMB and NFS exports)
NO_HARD_LINKS = (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.ENOSYS, errno.EXDEV, errno.EMLINK)
CLAIMS = 50  # the claims of one record a taker walks (each left by a claimer that died in between) before it gives up


def process_start(pid: int) -> int | None:
    """When process `pid` of this host started (clock ticks since boot, /proc/PID/stat), or None where /proc
    cannot tell: tells a process from a later one that was given the same pid."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return int(stat.rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


def process_state(pid: int) -> str | None:
    """Process `pid`'s state letter on this host (R, S, D, Z for a zombie, ...), or None where /proc cannot
    tell."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


def boot_id() -> str | None:
    """This machine's boot (Linux's random boot id, new at every boot), or None where it cannot be read."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip() or None
    except OSError:
        return None


def pid_namespace() -> str | None:
    """The PID namespace this process lives in ('pid:[4026531836]'), or None where /proc cannot tell."""
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return None


def hostlist(text: str) -> list[str]:
    """SLURM's compact host list, expanded: 'gpu[01-03,07],login1' -> gpu01, gpu02, gpu03, gpu07, login1
    (several bracketed parts in one name too)."""
    names, depth, start = [], 0, 0
    for i, c in enumerate(text + ","):
        depth += (c == "[") - (c == "]")
        if c == "," and depth == 0:
            if text[start:i]:
                names.extend(_expand(text[start:i]))
            start = i + 1
    return names


def _expand(name: str) -> list[str]:
    m = re.search(r"\[([^\]]*)\]", name)
    if not m:
        return [name]
    head, tail, out = name[: m.start()], name[m.end():], []
    for part in m.group(1).split(","):
        low, _, high = part.partition("-")
        numbers = range(int(low), int(high or low) + 1) if low.isdigit() and (high or low).isdigit() else None
        values = [str(n).zfill(len(low)) for n in numbers] if numbers is not None else [part]
        out.extend(f"{head}{v}{rest}" for v in values for rest in _expand(tail))
    return out


def allocation(environ: dict | None = None) -> list[str] | None:
    """The hosts of this process's scheduler job, sorted (SLURM_JOB_NODELIST; PBS's $PBS_NODEFILE, once each),
    or None outside a job or where the scheduler does not say. Every process of one run of a job shares it;
    a requeued job's next run has its own."""
    env = os.environ if environ is None else environ
    if env.get("SLURM_JOB_ID") and env.get("SLURM_JOB_NODELIST"):
        return sorted(set(hostlist(env["SLURM_JOB_NODELIST"])))
    if env.get("PBS_JOBID") and env.get("PBS_NODEFILE"):
        try:
            return sorted({line.strip() for line in Path(env["PBS_NODEFILE"]).read_text().splitlines()
                           if line.strip()})
        except OSError:
            return None
    return None


def cluster_of(scheduler: str, job: str | None, environ: dict | None = None) -> str | None:
    """The cluster a job belongs to: SLURM's cluster name (SLURM_CLUSTER_NAME, in this job's environment), a
    PBS job id's server part ('4242.pbs01' -> 'pbs01'); None where unknown."""
    env = os.environ if environ is None else environ
    if scheduler == "slurm":
        return env.get("SLURM_CLUSTER_NAME") or None
    return job.split(".", 1)[1] if job and "." in job else None


def owner_record() -> dict:
    """Who this process is: host, boot, PID namespace, pid (and when it started), user, since when, its SLURM or
    PBS job (None outside one) with its cluster, run and hosts, and a token of its own (a lock holds this
    process's record only where the token is this one). Asks no scheduler."""
    owner = {"host": socket.gethostname(), "boot": boot_id(), "pid_ns": pid_namespace(), "pid": os.getpid(),
             "pid_start": process_start(os.getpid()), "uid": os.getuid(), "since": time.strftime("%Y-%m-%dT%H:%M:%S"),
             "token": uuid.uuid4().hex}
    for scheduler, variable, key, run in SCHEDULERS:
        job = os.environ.get(variable)
        owner[key] = job
        owner[run] = this_run(scheduler) if job else None
        owner[f"{scheduler}_cluster"] = cluster_of(scheduler, job) if job else None
    owner["allocation"] = allocation()
    return owner


def this_run(scheduler: str) -> int | None:
    """Which run of its SLURM job this process belongs to (SLURM_RESTART_COUNT, absent on the first run: 0);
    None under PBS, whose run count only qstat knows (the allocation tells its runs apart instead)."""
    if scheduler != "slurm":
        return None
    try:
        return int(os.environ.get("SLURM_RESTART_COUNT") or 0)
    except ValueError:
        return None


def _known_equal(a, b) -> bool:
    """Two values of a record that may be missing (records written before they were recorded): unequal only
    where both are known."""
    return a is None or b is None or a == b


def place(owner: dict) -> str:
    """Where the record's process is, as this process sees it: 'here' (this host, this boot, this PID
    namespace: its pid means the same process), 'rebooted' (this host, a boot that is over), 'namespace' (this
    host and boot, another PID namespace: its pid means nothing here), or 'elsewhere'."""
    if owner.get("host") != socket.gethostname() or not owner.get("pid"):
        return "elsewhere"
    if not _known_equal(owner.get("boot"), boot_id()):
        return "rebooted"
    if not _known_equal(owner.get("pid_ns"), pid_namespace()):
        return "namespace"
    return "here"


def _process_alive(owner: dict) -> bool:
    """Whether the record's process (on this host, `place` 'here') still runs: its pid, started when the record
    says."""
    pid = int(owner["pid"])
    if not pid_alive(pid) or process_state(pid) == "Z":  # (a zombie has ended; its parent has yet to reap it)
        return False
    started, now = owner.get("pid_start"), process_start(pid)
    return started is None or now is None or int(started) == now


def same_job(scheduler: str, a: str | None, b: str | None, a_cluster: str | None, b_cluster: str | None) -> bool:
    """Whether two job ids of one scheduler name the same job: the same sequence number, on the same cluster
    where both clusters are known (a PBS id's server part may be short or full: '4242.pbs01',
    '4242.pbs01.example.org')."""
    if not a or not b or a.split(".")[0] != b.split(".")[0]:
        return False
    if scheduler == "pbs":
        x, y = (a.split(".", 1) + [""])[1], (b.split(".", 1) + [""])[1]
        return not x or not y or x == y or x.startswith(y + ".") or y.startswith(x + ".")
    return _known_equal(a_cluster, b_cluster)


def holder(owner: dict) -> tuple[bool, str]:
    """Is the lock's holder alive (or out of this process's sight: taken as alive), and who is it: in words,
    with the command that shows a live one, or why a gone one counts as gone?"""
    host, pid, where = owner.get("host"), owner.get("pid"), place(owner)
    for scheduler, variable, key, run in SCHEDULERS:
        job = owner.get(key)
        if not job:
            continue
        cluster = owner.get(f"{scheduler}_cluster") or cluster_of(scheduler, job)
        on = f" on cluster {cluster}" if cluster and scheduler == "slurm" else ""  # (a PBS id names its server)
        who = f"{scheduler.upper()} job {job}{on} (host {host}, pid {pid}, since {owner.get('since')})"
        mine = os.environ.get(variable)
        if same_job(scheduler, mine, job, cluster_of(scheduler, mine), cluster):
            return _same_job_holder(owner, scheduler, run, who, where)
        if where == "here" and not _process_alive(owner):
            return False, f"{who}: its process no longer runs on this host"
        if where == "rebooted":
            return False, f"{who}: its process ran on this host before it restarted"
        return _scheduler_says(owner, scheduler, job, cluster, who)
    who = f"process {pid} on host {host} (since {owner.get('since')})"
    if where == "here":
        if not _process_alive(owner):
            return False, f"{who}: it no longer runs"
        return True, f"{who}, still running: `ps -p {pid}` shows it"
    if where == "rebooted":
        return False, f"{who}: it ran on this host before it restarted"
    if where == "namespace":
        return True, f"{who}, in another PID namespace of this host (a container), which this process cannot see into"
    return True, f"{who}, which no scheduler job names and this host ({socket.gethostname()}) cannot see"


def _same_job_holder(owner: dict, scheduler: str, run: str, who: str, where: str) -> tuple[bool, str]:
    """A holder of this very job: an earlier run of it (gone), or a sibling process (alive while its process
    runs, where this host can see it)."""
    theirs, mine = owner.get(run), this_run(scheduler)
    if theirs is not None and mine is not None and int(theirs) < mine:
        return False, f"{who}: this job's earlier run (run {int(theirs) + 1}; the job was requeued)"
    ours = allocation()
    if owner.get("allocation") and ours and sorted(owner["allocation"]) != ours:
        return False, (f"{who}: this job's earlier run, on hosts {','.join(owner['allocation'])} (this run has "
                       f"{','.join(ours)}: the job was requeued)")
    if where == "here":
        if not _process_alive(owner):
            return False, f"{who}: its process no longer runs on this host"
        return True, f"{who}: another process of this same job, still running: `ps -p {owner.get('pid')}` shows it"
    if where == "rebooted":
        return False, f"{who}: this job's earlier run, on this host before it restarted"
    if where == "namespace":
        return True, f"{who}: another process of this same job, in another PID namespace of this host"
    return True, (f"{who}: another process of this same job, on host {owner.get('host')}, which this host cannot "
                  "see into")


def _scheduler_says(owner: dict, scheduler: str, job: str, cluster: str | None, who: str) -> tuple[bool, str]:
    """A holder of another job, judged by its scheduler, asked of the job's own cluster."""
    tool = "squeue" if scheduler == "slurm" else "qstat"
    try:
        state = job_state(scheduler, job, cluster)
    except RuntimeError as e:
        return True, f"{who}; {tool} could not say whether it still runs ({e})"
    if state_runs(scheduler, state):
        return True, f"{who}, still running: `{show_job_command(scheduler, job, cluster)}` shows it"
    if state:
        return False, f"{who}: {tool} shows it in state {state}"
    if not _known_equal(owner.get("uid"), os.getuid()):
        return True, (f"{who}: another user's job (uid {owner.get('uid')}), which {tool} does not show to this "
                      "user (the cluster may hide other users' jobs)")
    return False, f"{who}: {tool} no longer lists it"


def lock_owner(run_dir: str | os.PathLike) -> dict | None:
    """Who holds the run directory's lock, as written there; None when it is not locked ({} when unreadable)."""
    path = Path(run_dir) / LOCK
    try:
        return json.loads(path.read_text() or "{}")
    except FileNotFoundError:
        return None
    except (OSError, json.JSONDecodeError):
        return {}


def create_exclusive(path: Path, data: bytes) -> bool:
    """Create `path` holding `data`, whole, where nothing is there: written under a name of this process's,
    then hard-linked to `path` (no reader sees it half written); on a file system without hard links
    (NO_HARD_LINKS), created exclusively (O_EXCL) and written at once. False where `path` exists."""
    new = path.with_name(f".{path.name}.new-{socket.gethostname()}-{os.getpid()}")
    try:  # (a write that fails, on a full disk say, leaves nothing behind)
        new.write_bytes(data)
        os.link(new, path)
        return True
    except FileExistsError:
        return False
    except OSError as e:
        if e.errno not in NO_HARD_LINKS:
            raise
    finally:
        new.unlink(missing_ok=True)
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
        return False
    try:
        os.write(fd, data)
        os.fsync(fd)
    except OSError:
        path.unlink(missing_ok=True)  # (not left half written: it would read as an unreadable lock)
        raise
    finally:
        os.close(fd)
    return True


def _claim_gone(claim: Path) -> bool:
    """Whether the claimer of `claim` is gone for certain: a process of this host (`place` 'here') that no
    longer runs, or one of a boot of this host that is over. A claim of another host's process, or one that
    cannot be read, may be live: never passed by."""
    try:
        owner = json.loads(claim.read_bytes() or b"{}")
    except FileNotFoundError:
        return False
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return False
    where = place(owner) if isinstance(owner, dict) else "elsewhere"
    return where == "rebooted" or (where == "here" and not _process_alive(owner))


def remove_if_still(path: Path, record: bytes) -> bool | None:
    """Remove the lock file `path` if it still holds `record` (its bytes as read): True when removed, False
    when it holds another record or is gone, None when another process is removing that same record now (or
    an unreadable claim of another host's stands in the way). Atomic against every other caller (`RunLock`:
    takeover and release): the record is claimed first (`.LOCK.taking-<hash of record>[.N]`, created
    exclusively: one process at a time), and the lock read back under the claim."""
    base = f".{path.name}.taking-{hashlib.sha256(record).hexdigest()[:16]}"
    claims = [path.with_name(base if k == 0 else f"{base}.{k}") for k in range(CLAIMS)]
    for k, claim in enumerate(claims):
        if create_exclusive(claim, json.dumps(owner_record()).encode()):
            break
        if not _claim_gone(claim):
            return None  # (a live claimer: it removes the lock, or finds another record there)
    else:
        return None
    try:
        try:
            held = path.read_bytes()
        except FileNotFoundError:
            return False
        if held != record:  # (the lock changed hands since `record` was read)
            return False
        path.unlink()  # (still that record: every other remover of it is kept out by the claim)
        for dead in claims[:k]:  # (the claims of claimers that died: this record is gone, none is needed again)
            dead.unlink(missing_ok=True)
        return True
    finally:
        claim.unlink(missing_ok=True)


class RunLock:
    """The lock of `run_dir` (its LOCK file). `busy` says in the refusal what the folder is held for, `logger`
    takes the line of a lock taken over."""

    def __init__(self, run_dir: str | os.PathLike, busy: str = "run directory is locked by another trainer",
                 logger: logging.Logger = log, wait_s: float = 0.0):
        self.path = Path(run_dir) / LOCK
        self.busy, self.log = busy, logger
        self.wait_s = wait_s  # how long to wait for a live holder of this host to end before refusing
        self.held = False
        self.record: bytes | None = None  # what this process wrote into the lock

    def acquire(self) -> "RunLock":
        self.path.parent.mkdir(parents=True, exist_ok=True)
        took_over = None  # (the token of the stale lock this process removed, for HISTORY)
        for attempt in range(20):
            record = json.dumps(owner_record()).encode()
            if create_exclusive(self.path, record):
                self.record, self.held = record, True
                self._note("acquired", took_over)
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
            if alive and self._waited_for(owner, record, who):
                continue  # (it ended, or let the lock go: see who holds it now)
            if alive:
                raise InputError(f"{self.path}: {self.busy}, {who}; if that one is really gone, delete the "
                                 "file") from None
            removed = remove_if_still(self.path, record)
            if removed:
                self.log.warning("%s: took over the stale lock of %s", self.path, who)
                took_over = owner.get("token") or "unknown"
            elif removed is None:
                time.sleep(0.05 * (attempt + 1))  # (another process takes it over now: see who wins)
        raise InputError(f"{self.path}: could not take the lock (it kept changing hands, or a takeover by another "
                         f"host's process stands in the way: {self.path.name}'s .taking-* files beside it name it; "
                         "delete them if that process is gone)")

    def _waited_for(self, owner: dict, record: bytes, who: str) -> bool:
        """Wait up to `wait_s` for a live holder of this host (`place` 'here') to end or let the lock go, saying
        so once: a seed whose job's process died saves and stops within a step and a save, and the job run
        again need not fail for it. True when it did in that time."""
        if self.wait_s <= 0 or place(owner) != "here":
            return False
        self.log.info("%s: %s; waiting up to %.0f s for it to end", self.path, who, self.wait_s)
        deadline = time.monotonic() + self.wait_s
        while time.monotonic() < deadline:
            try:
                held = self.path.read_bytes()
            except FileNotFoundError:
                held = b""
            if held != record or not _process_alive(owner):
                return True
            time.sleep(0.2)
        self.wait_s = 0.0
        return False

    def _read(self) -> bytes:
        """The lock's record; one that does not parse yet (being written, or written by a version that filled
        it after creating it) is read again for up to a second before it counts as unreadable."""
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
                removed = remove_if_still(self.path, self.record)
                if removed is not None:
                    if removed:
                        self._note("released")
                    break
                time.sleep(0.05 * (attempt + 1))
        self.held = False

    def _note(self, event: str, took_over: str | None = None) -> None:
        """One line of HISTORY: this holder's `event`, the time and who it is (and the token of the stale lock
        it took over). One write in append mode; a line that cannot be written is not worth failing for."""
        owner = json.loads(self.record or b"{}")
        line = {"event": event, "time": round(time.time(), 3), "token": owner.get("token"), "host": owner.get("host"),
                "pid": owner.get("pid"), "pid_start": owner.get("pid_start")}
        if took_over:
            line["took_over"] = took_over
        try:
            fd = os.open(self.path.with_name(HISTORY), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            try:
                os.write(fd, (json.dumps(line) + "\n").encode())
            finally:
                os.close(fd)
        except OSError:
            pass

    def __enter__(self) -> "RunLock":
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()
