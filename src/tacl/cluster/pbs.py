"""PBS Pro (Supek's scheduler) for snakemake-executor-plugin-cluster-generic: submit, status, deadline.

- `tacl cluster pbs-submit ... JOBSCRIPT` (the profile's submit command): `qsub -q QUEUE -l select=1:ngpus=
  ..:ncpus=..:mem=..mb -l walltime=HH:MM:SS -N NAME -j oe -o LOGDIR/ -V JOBSCRIPT`, prints the job id.
- `tacl cluster pbs-status JOBID` (the status command): `qstat -x -f -F json JOBID` -> running | success |
  failed (finished with Exit_status 0 or not; a job PBS no longer knows counts as failed, so that a rerun
  goes on from the newest checkpoint).
- `pbs_time_left()`: a pretraining chunk inside a PBS job reads its own walltime and start time
  (Resource_List.walltime, stime of $PBS_JOBID) and stops before the limit: PBS sends SIGTERM at the limit
  and SIGKILL after its kill delay, with no advance signal like SLURM's --signal.

No PBS server installs from Debian or PyPI: tests/test_pbs.py checks these on qstat/qsub outputs in PBS
Pro's documented formats. Ranks of a chunk start with torchrun on the one node of the job.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from tacl.io import InputError

RUNNING_STATES = set("QRHWTEBSMU")  # queued, running, held, waiting, transit, exiting, array begun, suspended, ...
_WALLTIME = re.compile(r"^(?:(\d+):)?(?:(\d+):)?(\d+)$")
_JOB_NAME = re.compile(r"[^A-Za-z0-9_.-]")


def parse_walltime(text: str | int) -> int:
    """PBS durations ("23:30:00", "90:00", "3600") in seconds."""
    if isinstance(text, int):
        return text
    m = _WALLTIME.match(str(text).strip())
    if not m:
        raise ValueError(f"not a PBS walltime: {text!r}")
    hours, minutes, seconds = (int(x) if x else 0 for x in m.groups())
    if m.group(2) is None and m.group(1) is not None:  # "MM:SS"
        hours, minutes = 0, hours
    return hours * 3600 + minutes * 60 + seconds


def format_walltime(minutes: float) -> str:
    total = int(round(minutes * 60))
    return f"{total // 3600:02d}:{total % 3600 // 60:02d}:{total % 60:02d}"


def qsub_command(jobscript: str, queue: str, ngpus: int, ncpus: int, mem_mb: int, runtime_minutes: float,
                 name: str, log_dir: str, project: str | None = None, nodes: int = 1) -> list[str]:
    """The qsub command line of one Snakemake job (one chunk of PBS's `select`, on one node)."""
    if not queue or "$" in queue:
        raise InputError(f"PBS queue {queue!r}: set pbs_queue in profiles/pbs/config.yaml or export the variable "
                         "it names (TACL_PBS_CPU_QUEUE / TACL_PBS_GPU_QUEUE)")
    if nodes != 1:
        raise InputError(f"rule {name}: {nodes} nodes asked for, but under PBS a job runs on one node (its ranks "
                         "start with torchrun there): set pretrain.nodes to 1")
    if min(ngpus, ncpus - 1, mem_mb - 1, runtime_minutes) < 0:
        raise InputError(f"rule {name}: ngpus {ngpus}, ncpus {ncpus}, mem_mb {mem_mb}, runtime {runtime_minutes} "
                         "(need ncpus, mem_mb >= 1, ngpus, runtime >= 0)")
    select = f"1:ncpus={ncpus}:mem={mem_mb}mb" + (f":ngpus={ngpus}" if ngpus else "")
    cmd = ["qsub", "-q", queue, "-l", f"select={select}", "-l", f"walltime={format_walltime(runtime_minutes)}",
           "-N", _JOB_NAME.sub("_", f"tacl.{name}")[:230], "-j", "oe", "-o", str(Path(log_dir)) + "/", "-V"]
    if project:
        cmd += ["-P", project]
    return cmd + [jobscript]


def submit(args: list[str]) -> str:
    """Run qsub; its job id ("1234.pbs01")."""
    Path(args[args.index("-o") + 1]).mkdir(parents=True, exist_ok=True)
    out = subprocess.run(args, capture_output=True, text=True, timeout=120)
    if out.returncode != 0:
        raise InputError(f"qsub failed ({out.returncode}): {out.stderr.strip() or out.stdout.strip()}")
    job_id = out.stdout.strip().splitlines()[-1].strip() if out.stdout.strip() else ""
    if not job_id:
        raise InputError("qsub printed no job id")
    return job_id


def qstat_job(job_id: str, history: bool = True) -> dict[str, Any] | None:
    """`qstat [-x] -f -F json JOBID`'s record of the job; None when PBS does not know it."""
    cmd = ["qstat", *(["-x"] if history else []), "-f", "-F", "json", job_id]
    for attempt in range(3):
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
        if out.returncode == 0:
            return job_record(out.stdout, job_id)
        if "Unknown Job Id" in out.stderr or "Job has finished" in out.stderr:
            return None
        time.sleep(2 * (attempt + 1))  # the server may be busy: ask again
    raise RuntimeError(f"qstat failed for {job_id}: {out.stderr.strip()}")


def job_record(qstat_json: str, job_id: str) -> dict[str, Any] | None:
    jobs = json.loads(qstat_json).get("Jobs", {})
    if job_id in jobs:
        return jobs[job_id]
    short = job_id.split(".")[0]
    return next((v for k, v in jobs.items() if k.split(".")[0] == short), None)


def status_of(record: dict[str, Any] | None) -> str:
    """running | success | failed, for cluster-generic."""
    if record is None:
        return "failed"  # PBS forgot the job: it is not running; a rerun goes on from the newest checkpoint
    state = record.get("job_state", "")
    if state == "F":
        return "success" if int(record.get("Exit_status", 1)) == 0 else "failed"
    return "running" if state in RUNNING_STATES else "failed"


def _ctime(text: str | int) -> float:
    """PBS times in qstat's JSON: ctime strings ("Tue Nov 24 10:00:00 2026", server local time) or epochs."""
    if isinstance(text, (int, float)):
        return float(text)
    return time.mktime(time.strptime(text.strip(), "%a %b %d %H:%M:%S %Y"))


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


def status_main(job_id: str) -> int:
    try:
        print(status_of(qstat_job(job_id)))
    except (OSError, RuntimeError, subprocess.TimeoutExpired) as e:
        # cluster-generic stops the whole workflow on a failing status command: say "running" and let the
        # next poll ask again
        print(f"tacl cluster pbs-status: {e}", file=sys.stderr)
        print("running")
    return 0
