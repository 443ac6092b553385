"""PBS Pro (Supek's scheduler) for snakemake-executor-plugin-cluster-generic: the profile's submit and
status commands (profiles/pbs).

- `tacl pbs submit ... JOBSCRIPT`: wraps Snakemake's job script in one that leaves its exit status in
  `EXIT_DIR/<jobid>.exit` (written atomically by the job itself on exit) and exports TACL_REQUIRE_GPU=1
  when the rule asks for GPUs, then `qsub -q QUEUE -l select=N:ncpus=..:mem=..mb[:ngpus=..][:mpiprocs=1]
  [-l place=scatter:excl] -l walltime=HH:MM:SS -N tacl.RULE -j oe -o LOGDIR/ -S /bin/bash -V`, with the
  `BASH_FUNC_*` variables that `module` leaves kept out of what -V exports; prints the job id.
- `tacl pbs status JOBID`: running | success | failed, from `qstat -x -f -F json` (its text form when the
  JSON is broken), else from the job's exit file when PBS no longer knows the job (job history is off by
  default; kept job_history_duration when on): failed only when neither knows how a finished job ended.
  A changed `comment` goes to stderr; a system hold (which never ends by itself) counts as failed and
  the held job is deleted.

No PBS server installs from Debian or PyPI: tests/test_pbs.py checks these on qstat/qsub outputs in PBS
Pro's documented formats, and through a stand-in qsub/qstat that runs jobs here.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

from tacl.runtime.scheduler import format_walltime, qstat_job
from tacl.runtime.io import InputError, write_text_atomic

# Q queued, R running, H held, W waiting (execution time), T transit, E exiting, B array begun, S/U
# suspended, M moved; F finished and X finished subjob carry Exit_status
RUNNING_STATES = set("QRHWTEBSMU")
FINISHED_STATES = set("FX")
SYSTEM_HOLDS = set("sp")  # Hold_Types: s system (e.g. too many failed attempts to run), p bad password
_JOB_NAME = re.compile(r"[^A-Za-z0-9_.-]")


def qsub_command(jobscript: str, queue: str, ngpus: int, ncpus: int, mem_mb: int, runtime_minutes: float,
                 name: str, log_dir: str, project: str | None = None, nodes: int = 1) -> list[str]:
    """The qsub command line of one Snakemake job: `nodes` chunks of PBS's `select`, each with ncpus, mem
    and ngpus of one node; on several nodes one MPI process per node (one torchrun agent each, see
    tacl.cluster.launch) on nodes of its own."""
    if not queue or "$" in queue:
        raise InputError(f"PBS queue {queue!r}: set pbs_queue in profiles/pbs/config.yaml or export the variable "
                         "it names (TACL_PBS_CPU_QUEUE / TACL_PBS_GPU_QUEUE)")
    if min(ngpus, ncpus - 1, mem_mb - 1, runtime_minutes, nodes - 1) < 0:
        raise InputError(f"rule {name}: nodes {nodes}, ngpus {ngpus}, ncpus {ncpus}, mem_mb {mem_mb}, runtime "
                         f"{runtime_minutes} (need nodes, ncpus, mem_mb >= 1, ngpus, runtime >= 0)")
    select = f"{nodes}:ncpus={ncpus}:mem={mem_mb}mb" + (f":ngpus={ngpus}" if ngpus else "")
    place = []
    if nodes > 1:
        select += ":mpiprocs=1"
        place = ["-l", "place=scatter:excl"]
    cmd = ["qsub", "-q", queue, "-l", f"select={select}", *place, "-l",
           f"walltime={format_walltime(runtime_minutes)}", "-N", _JOB_NAME.sub("_", f"tacl.{name}")[:230],
           "-j", "oe", "-o", str(Path(log_dir)) + "/", "-S", "/bin/bash", "-V"]
    if project:
        cmd += ["-P", project]
    return cmd + [jobscript]


def job_script(snakemake_script: str, exit_dir: str, require_gpu: bool) -> str:
    """The script PBS runs: Snakemake's job script (which changes to the workflow's directory itself; PBS
    starts jobs in $HOME) after an EXIT trap that writes its exit status to EXIT_DIR/$PBS_JOBID.exit by
    a rename, so that a reader never sees half a file. SIGTERM (the walltime limit, qdel) ends it with
    143 once the running command has stopped; only SIGKILL leaves no file."""
    exit_dir = shlex.quote(str(Path(exit_dir).resolve()))
    lines = [
        "#!/bin/bash",
        "# tacl pbs submit: the exit status of this job goes to the exit directory below, for `tacl pbs status`",
        f"tacl_exit_dir={exit_dir}",
        "tacl_exit() {",
        '    tacl_status=$?',
        '    mkdir -p "$tacl_exit_dir"',
        '    printf \'%s\\n\' "$tacl_status" > "$tacl_exit_dir/.$PBS_JOBID.exit.$$" &&',
        '        mv -f "$tacl_exit_dir/.$PBS_JOBID.exit.$$" "$tacl_exit_dir/$PBS_JOBID.exit"',
        "}",
        "trap tacl_exit EXIT",
        "trap 'exit 143' TERM",
    ]
    if require_gpu:  # the job asked PBS for GPUs: it must not fall back to the CPU (tacl.runtime.device)
        lines.append("export TACL_REQUIRE_GPU=1")
    return "\n".join(lines) + "\n# Snakemake's job script:\n" + snakemake_script


def exported_env(environ: dict[str, str] | None = None) -> dict[str, str]:
    """qsub's environment, which -V copies into the job: without the `BASH_FUNC_*` functions of `module`,
    which PBS Pro 2022 prints as invalid JSON (OpenPBS #2541) and a job does not need."""
    env = os.environ if environ is None else environ
    return {k: v for k, v in env.items() if not k.startswith("BASH_FUNC_")}


def submit(args: list[str], exit_dir: str, require_gpu: bool) -> str:
    """Wrap the job script (the last argument), run qsub; its job id ("1234.pbs01")."""
    jobscript = Path(args[-1])
    wrapper = jobscript.with_name(jobscript.name + ".pbs")
    wrapper.write_text(job_script(jobscript.read_text(), exit_dir, require_gpu))
    Path(args[args.index("-o") + 1]).mkdir(parents=True, exist_ok=True)
    Path(exit_dir).mkdir(parents=True, exist_ok=True)
    out = subprocess.run([*args[:-1], str(wrapper)], capture_output=True, text=True, timeout=120,
                         env=exported_env())
    if out.returncode != 0:
        raise InputError(f"qsub failed ({out.returncode}): {out.stderr.strip() or out.stdout.strip()}")
    job_id = out.stdout.strip().splitlines()[-1].strip() if out.stdout.strip() else ""
    if not job_id:
        raise InputError("qsub printed no job id")
    return job_id


def exit_file(exit_dir: str, job_id: str) -> Path | None:
    """The job's exit file; named by $PBS_JOBID, which may spell the server differently than qsub did."""
    path = Path(exit_dir) / f"{job_id}.exit"
    if path.is_file():
        return path
    return next(Path(exit_dir).glob(f"{job_id.split('.')[0]}.*.exit"), None)


def read_exit(exit_dir: str, job_id: str) -> int | None:
    path = exit_file(exit_dir, job_id)
    if path is None:
        return None
    text = path.read_text().strip()
    return int(text) if text.lstrip("-").isdigit() else None


def status_of(record: dict[str, Any] | None, exit_status: int | None = None) -> str:
    """running | success | failed, for cluster-generic, from qstat's record of the job, or (None: PBS no
    longer knows it) from the exit status the job left."""
    if record is None:
        return "failed" if exit_status is None else ("success" if exit_status == 0 else "failed")
    state = str(record.get("job_state", ""))
    if state in FINISHED_STATES:
        return "success" if str(record.get("Exit_status", "1")).strip() == "0" else "failed"
    if state == "H" and SYSTEM_HOLDS & set(str(record.get("Hold_Types", ""))):
        return "failed"  # a system hold never ends by itself
    return "running" if state in RUNNING_STATES else "failed"


def job_status(job_id: str, exit_dir: str, say=None) -> str:
    """The status command: qstat first, the exit file when PBS no longer knows the job. `say` (stderr)
    gets the job's comment when it changed since the last check, and why a job counts as failed."""
    say = say or (lambda text: print(text, file=sys.stderr))
    record = qstat_job(job_id)
    if record is None:
        code = read_exit(exit_dir, job_id)
        status = status_of(None, code)
        if code is None:
            say(f"PBS job {job_id}: qstat no longer knows it (job history off, or older than "
                f"job_history_duration) and it left no exit status in {exit_dir}: counted as failed")
    else:
        status = status_of(record)
        _tell_comment(job_id, record, exit_dir, say)
        if status == "failed" and record.get("job_state") == "H":
            deleted = _qdel(job_id)
            say(f"PBS job {job_id}: held by the system (Hold_Types {record.get('Hold_Types')}), which never "
                f"releases it by itself: counted as failed{' and deleted (qdel)' if deleted else '; qdel failed'}")
    if status != "running":
        Path(exit_dir, f"{job_id}.comment").unlink(missing_ok=True)
    return status


def _qdel(job_id: str) -> bool:
    try:
        return subprocess.run(["qdel", job_id], capture_output=True, text=True, timeout=60).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def _tell_comment(job_id: str, record: dict[str, Any], exit_dir: str, say) -> None:
    """Print the job's comment ("Not Running: Insufficient amount of resource: ngpus", "job held, too many
    failed attempts to run", ...) when it differs from the one printed last for this job."""
    comment = " ".join(str(record.get("comment", "")).split())
    if not comment:
        return
    seen = Path(exit_dir, f"{job_id}.comment")
    if seen.is_file() and seen.read_text() == comment:
        return
    say(f"PBS job {job_id} ({record.get('Job_Name', '?')}, state {record.get('job_state', '?')}): {comment}")
    write_text_atomic(seen, comment)


def status_main(job_id: str, exit_dir: str) -> int:
    try:
        print(job_status(job_id, exit_dir))
    except (OSError, RuntimeError, subprocess.TimeoutExpired) as e:
        # cluster-generic stops the whole workflow on a failing status command: say "running" and let the
        # next poll ask again
        print(f"tacl pbs status: {e}", file=sys.stderr)
        print("running")
    return 0
