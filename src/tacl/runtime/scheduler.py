"""What the schedulers answer, in one place: a running job's end time under SLURM or PBS Pro (the trainer's
deadline), whether a job still runs (the run lock), a PBS job's or queue's record from qstat (the PBS
status command and preflight), and the duration formats of both.

Layering: this module is a floor of its own, below the runtime, the stages and the rest of tacl.cluster. It
imports nothing from tacl, so that the run lock (tacl.runtime.lock), the stages (tacl.pretrain.deadline,
tacl.report.status) and tacl.cluster (pbs, preflight) can all ask it; the rest of tacl.cluster stands above
the stages and may import them, never the other way round (tacl/cluster/__init__.py imports nothing, so that
a stage asking this module brings none of it along).

qstat's JSON is not always JSON: PBS Pro 2022 and OpenPBS before 23.06 print Variable_List values
unescaped (OpenPBS issues #2541: `BASH_FUNC_*` functions that `module` leaves and `qsub -V` copies;
#1255: values such as `005`). When the JSON does not parse, the same question is asked again as text
(`qstat -f`), whose `name = value` lines any value can only garble for itself.
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import time
from typing import Any

_SLURM_TIME = re.compile(r"^(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?$")
_PBS_TIME = re.compile(r"^(?:(\d+):)?(?:(\d+):)?(\d+)$")
_ATTRIBUTE = re.compile(r"^ {4}([A-Za-z_][\w.]*) = ?(.*)$")
_RECORD = re.compile(r"^(Job Id|Queue|Server): (\S+)\s*$")
UNKNOWN_JOB = ("Unknown Job Id", "Job has finished")  # qstat's words (exit 153 / 35) for a job it no longer shows
_pause = time.sleep  # (between tries of a failing query; tests count the pauses)


# -- durations --------------------------------------------------------------------------------------------


def slurm_seconds(text: str) -> float | None:
    """A SLURM duration in seconds: "MM", "MM:SS", "HH:MM:SS", "D-HH", "D-HH:MM", "D-HH:MM:SS" (sbatch -t,
    scontrol's MaxTime, squeue's %L); None for UNLIMITED / INFINITE / NOT_SET / anything else."""
    m = _SLURM_TIME.match(text.strip())
    if not m:
        return None
    days, a, b, c = m.groups()
    parts = [int(x) for x in (a, b, c) if x is not None]
    if days is not None:  # D-HH[:MM[:SS]]
        hours, minutes, seconds = (parts + [0, 0])[:3]
        return int(days) * 86400 + hours * 3600 + minutes * 60 + seconds
    if len(parts) == 1:  # minutes
        return parts[0] * 60
    if len(parts) == 2:  # MM:SS
        return parts[0] * 60 + parts[1]
    return parts[0] * 3600 + parts[1] * 60 + parts[2]


def slurm_minutes(text: str) -> int | None:
    """A SLURM limit in whole minutes, rounded up (None = no limit)."""
    seconds = slurm_seconds(text)
    return None if seconds is None else math.ceil(seconds / 60)


def parse_walltime(text: str | int) -> int:
    """PBS durations ("23:30:00", "90:00", "3600") in seconds."""
    if isinstance(text, int):
        return text
    m = _PBS_TIME.match(str(text).strip())
    if not m:
        raise ValueError(f"not a PBS walltime: {text!r}")
    hours, minutes, seconds = (int(x) if x else 0 for x in m.groups())
    if m.group(2) is None and m.group(1) is not None:  # "MM:SS"
        hours, minutes = 0, hours
    return hours * 3600 + minutes * 60 + seconds


def format_walltime(minutes: float) -> str:
    total = int(round(minutes * 60))
    return f"{total // 3600:02d}:{total % 3600 // 60:02d}:{total % 60:02d}"


# -- asking a scheduler -----------------------------------------------------------------------------------


def ask(cmd: list[str], tries: int = 3, pause_s: float = 2.0, give_up_on: tuple[str, ...] = (),
        timeout_s: float = 60.0) -> subprocess.CompletedProcess:
    """Run a scheduler query, again after pause_s, 2 x pause_s, ... while it fails (the server may be
    busy), but never after the last try and never when its error says one of `give_up_on` (an answer, not
    a failure). Returns the last result; OSError / TimeoutExpired on the last try propagate."""
    for attempt in range(tries):
        try:
            out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            if attempt == tries - 1:
                raise
            out = None
        if out is not None and (out.returncode == 0 or any(s in out.stderr for s in give_up_on)):
            return out
        if attempt == tries - 1:
            return out
        _pause(pause_s * (attempt + 1))
    raise AssertionError("unreachable")


def parse_qstat_text(text: str) -> dict[str, dict[str, Any]]:
    """`qstat -f` / `qstat -Qf` text: {name: attributes}, with dotted names nested as the JSON has them
    (`Resource_List.walltime = 24:00:00` -> {"Resource_List": {"walltime": "24:00:00"}}). Lines that
    start with a tab continue the value above (qstat wraps long values); other lines that are not
    `    name = value` belong to a value with newlines in it (a bash function in Variable_List)."""
    records: dict[str, dict[str, Any]] = {}
    flat: dict[str, str] | None = None
    key = None
    for line in text.splitlines():
        m = _RECORD.match(line)
        if m:
            flat, key = {}, None
            records[m.group(2)] = flat  # (filled in, then nested below)
            continue
        if flat is None:
            continue
        a = _ATTRIBUTE.match(line)
        if a:
            key = a.group(1)
            flat[key] = a.group(2)
        elif key is not None and line.startswith("\t"):
            flat[key] += line[1:]
        elif key is not None and line.strip():
            flat[key] += "\n" + line
    return {name: _nest(attrs) for name, attrs in records.items()}


def _nest(flat: dict[str, str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, value in flat.items():
        head, _, tail = name.partition(".")
        if tail:
            section = out.setdefault(head, {})
            if isinstance(section, dict):
                section[tail] = value
        else:
            out[name] = value
    return out


def _same_job(a: str, b: str) -> bool:
    """Job ids as qsub prints them and as qstat keys them may differ in the server part
    ("4242.pbs01" / "4242.pbs01.supek.srce.hr"): the sequence number decides."""
    return a == b or a.split(".")[0] == b.split(".")[0]


def pick_job(jobs: dict[str, Any], job_id: str) -> dict[str, Any] | None:
    if job_id in jobs:
        return jobs[job_id]
    return next((v for k, v in jobs.items() if _same_job(k, job_id)), None)


def job_record(qstat_json: str, job_id: str) -> dict[str, Any] | None:
    """The job's record in `qstat -f -F json` output (json.JSONDecodeError when it is not JSON)."""
    return pick_job(json.loads(qstat_json).get("Jobs", {}), job_id)


def qstat_job(job_id: str, history: bool = True) -> dict[str, Any] | None:
    """`qstat [-x] -f -F json JOBID`'s record of the job, or the text form's when the JSON is broken;
    None when PBS does not know the job ("Unknown Job Id": history off or expired, or never there).
    RuntimeError when qstat keeps failing."""
    base = ["qstat", *(["-x"] if history else []), "-f"]
    out = ask([*base, "-F", "json", job_id], give_up_on=UNKNOWN_JOB)
    if out.returncode != 0:
        if any(s in out.stderr for s in UNKNOWN_JOB):
            return None
        raise RuntimeError(f"qstat failed for {job_id} ({out.returncode}): {out.stderr.strip()}")
    try:
        return job_record(out.stdout, job_id)
    except json.JSONDecodeError:
        pass
    out = ask([*base, job_id], give_up_on=UNKNOWN_JOB)
    if out.returncode != 0:
        if any(s in out.stderr for s in UNKNOWN_JOB):
            return None
        raise RuntimeError(f"qstat failed for {job_id} ({out.returncode}): {out.stderr.strip()}")
    return pick_job(parse_qstat_text(out.stdout), job_id)


def qstat_queues() -> dict[str, dict[str, Any]] | None:
    """Every queue's record from `qstat -Qf -F json` (or its text form when the JSON is broken);
    None when qstat does not answer."""
    try:
        out = ask(["qstat", "-Qf", "-F", "json"])
        if out.returncode == 0:
            try:
                return json.loads(out.stdout).get("Queue", {})
            except json.JSONDecodeError:
                out = ask(["qstat", "-Qf"])
        return parse_qstat_text(out.stdout) if out.returncode == 0 else None
    except (OSError, subprocess.TimeoutExpired):
        return None


# -- whether a job still runs ------------------------------------------------------------------------------

# squeue's states of a job whose processes may still run (a PENDING or REQUEUED job runs nothing yet)
SLURM_ALIVE = ("RUNNING", "COMPLETING", "CONFIGURING", "SUSPENDED", "STOPPED", "RESIZING", "SIGNALING",
               "STAGE_OUT")
# PBS job_state letters of a job whose processes may still run: running, exiting, array begun, suspended
PBS_ALIVE = ("R", "E", "B", "S", "U")
_SLURM_UNKNOWN = "Invalid job id"  # squeue's words for a job it no longer lists (exit 1)


def slurm_job_state(job_id: str, cluster: str | None = None) -> str | None:
    """squeue's state of a SLURM job (RUNNING, PENDING, COMPLETED, ...), asked of its `cluster` where named
    (`squeue -M`, which prints a `CLUSTER: NAME` line even with -h); None when squeue no longer lists it
    (finished longer than MinJobAge ago). RuntimeError when squeue does not answer."""
    where = ["-M", cluster] if cluster else []
    try:
        out = ask(["squeue", *where, "-h", "-j", str(job_id), "-o", "%T"], give_up_on=(_SLURM_UNKNOWN,),
                  timeout_s=30)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise RuntimeError(f"squeue: {e}") from e
    if out.returncode != 0:
        if _SLURM_UNKNOWN in out.stderr:
            return None
        raise RuntimeError(f"squeue {' '.join(where + ['-j', str(job_id)])} failed ({out.returncode}): "
                           f"{out.stderr.strip()}")
    lines = [line.strip() for line in out.stdout.splitlines() if line.strip() and not line.startswith("CLUSTER:")]
    return lines[0] if lines else None


def slurm_accounting_state(job_id: str) -> str | None:
    """sacct's state of a SLURM job, its first word (TIMEOUT, CANCELLED, FAILED, OUT_OF_MEMORY, NODE_FAIL,
    PREEMPTED, COMPLETED, RUNNING, ...; "CANCELLED by 1000" -> CANCELLED); None when accounting knows no
    such job. RuntimeError when sacct does not answer (no accounting on this cluster)."""
    try:
        out = ask(["sacct", "-n", "-X", "-P", "-j", str(job_id), "-o", "State"], tries=1, timeout_s=30)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise RuntimeError(f"sacct: {e}") from e
    if out.returncode != 0:
        raise RuntimeError(f"sacct -j {job_id} failed ({out.returncode}): {out.stderr.strip()}")
    lines = [line for line in out.stdout.splitlines() if line.strip()]
    return lines[-1].split()[0] if lines else None


def pbs_job_state(job_id: str) -> str | None:
    """PBS's job_state letter of a job (R, Q, F, ...); None when qstat no longer knows it. RuntimeError when
    qstat does not answer."""
    try:
        record = qstat_job(job_id, history=True)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise RuntimeError(f"qstat: {e}") from e
    return None if record is None else str(record.get("job_state", "")).strip() or None


def job_state(scheduler: str, job_id: str, cluster: str | None = None) -> str | None:
    """The job's state as its scheduler names it (squeue's RUNNING, COMPLETED, ...; qstat's R, F, ...), asked of
    its SLURM `cluster` (a PBS job id names its server: qstat asks that one); None when the scheduler no longer
    knows the job. RuntimeError when it cannot tell."""
    return slurm_job_state(job_id, cluster) if scheduler == "slurm" else pbs_job_state(job_id)


def state_runs(scheduler: str, state: str | None) -> bool:
    """Whether a job in this state (job_state) may still run processes."""
    return state in (SLURM_ALIVE if scheduler == "slurm" else PBS_ALIVE)


def show_job_command(scheduler: str, job_id: str, cluster: str | None = None) -> str:
    """The command that shows a job to its user (of its SLURM cluster, where named)."""
    if scheduler == "slurm":
        return f"squeue -M {cluster} -j {job_id}" if cluster else f"squeue -j {job_id}"
    return f"qstat -f {job_id}"


# -- a running job's end time -----------------------------------------------------------------------------


def _ctime(text: str | int | float) -> float:
    """PBS times: ctime strings ("Tue Nov 24 10:00:00 2026", server local time) or epochs."""
    if isinstance(text, (int, float)):
        return float(text)
    if text.strip().isdigit():
        return float(text)
    return time.mktime(time.strptime(" ".join(text.split()), "%a %b %d %H:%M:%S %Y"))


def end_of(record: dict[str, Any]) -> float | None:
    """Unix time at which PBS ends a running job: start time + walltime limit."""
    walltime = record.get("Resource_List", {}).get("walltime")
    start = record.get("stime")
    if walltime is None or start is None:
        return None
    return _ctime(start) + parse_walltime(walltime)


def pbs_time_left() -> float | None:
    """Seconds this PBS job has left ($PBS_JOBID), or None outside PBS or when qstat does not answer."""
    job_id = os.environ.get("PBS_JOBID")
    if not job_id:
        return None
    try:
        record = qstat_job(job_id, history=False)
    except (OSError, RuntimeError, subprocess.TimeoutExpired, ValueError):
        return None
    end = end_of(record) if record else None
    return None if end is None else end - time.time()


def slurm_time_left() -> float | None:
    """Seconds this SLURM job has left (squeue's %L of $SLURM_JOB_ID), or None outside SLURM."""
    job = os.environ.get("SLURM_JOB_ID")
    if not job:
        return None
    try:
        out = subprocess.run(["squeue", "-h", "-j", job, "-o", "%L"], capture_output=True, text=True,
                             timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    return slurm_seconds(out.splitlines()[0]) if out.strip() else None


def time_left() -> float | None:
    """Seconds until the scheduler ends this job (SLURM or PBS Pro), or None when none limits it."""
    known = [left for left in (slurm_time_left(), pbs_time_left()) if left is not None]
    return min(known) if known else None
