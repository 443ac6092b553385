"""`tacl plan [SNAKEMAKE ARGS]`: what a run will cost, from a quiet dry run of the workflow (tacl.planning.plan
prints the plan into PLAN_OUT, this prints that file alone)."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from tacl.planning.plan import PLAN_OUT


def configfiles(args: list[str]) -> list[str]:
    """The files a Snakemake command line gives with --configfile / --configfiles (several may follow one)."""
    files, taking = [], False
    for a in args:
        if a.split("=")[0] in ("--configfile", "--configfiles"):
            taking = "=" not in a
            files += [a.split("=", 1)[1]] if "=" in a else []
        elif a.startswith("-"):
            taking = False
        elif taking:
            files.append(a)
    return files


# Snakemake's lines around its own messages, left out of `tacl plan`'s output when a dry run fails
NOISE = ("Using profile ", "Building DAG of jobs", "Config file config.yaml is extended by")


def register(stages: Any) -> None:
    """`tacl plan [SNAKEMAKE ARGS]`: the plan of the workflow in the working directory, from a dry run."""
    c = stages.add_parser("plan", help="what a run will cost: jobs, GPU-hours, the longest chain, disk (a dry run)")
    c.add_argument("snakemake_args", nargs="*",
                   help="Snakemake's own arguments, e.g. --profile profiles/slurm --configfile my.yaml")
    c.set_defaults(func=_plan)


def plan_command(args: list[str]) -> list[str]:
    """The quiet dry run behind `tacl plan` (Snakemake's arguments after ours: a target may come first)."""
    return [sys.executable, "-m", "snakemake", "--quiet", "rules", "progress", "host", "reason", "--dry-run", *args]


def _plan(a: Any) -> int:
    """The plan and its assumptions (with the reruns and the keys left to the schema's defaults) on stdout,
    from a dry run of the workflow in the working directory, whose job list is left out; where the dry run
    fails (a config error, a profile variable left unset, an input not found), its messages on stderr. A
    config file that is not YAML is named with its line before Snakemake starts."""
    import subprocess
    import tempfile

    from tacl.experiment.config import yaml_error

    for path in configfiles(a.snakemake_args):
        problem = yaml_error(path)
        if problem:
            print(problem, file=sys.stderr)
            return 1
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp, "plan.txt")
        proc = subprocess.run(plan_command(a.snakemake_args), capture_output=True, text=True,
                              env={**os.environ, PLAN_OUT: str(out)})
        said = out.read_text() if out.is_file() else ""
    print(said, end="", flush=True)
    if proc.returncode:
        lines = (proc.stdout + proc.stderr).splitlines()
        print("\n".join(line for line in lines if not line.startswith(NOISE)), file=sys.stderr)
    return proc.returncode
