"""`tacl submit ...`: run one stage on SLURM from the command line or a notebook, without Snakemake.
`tacl pbs submit|status`: the submit and status commands of the PBS Pro profile (profiles/pbs);
`tacl pbs launch`: a chunk's torchrun agents on several PBS nodes (tacl.cluster.launch).
`tacl profiles install`: `snakemake --profile slurm` / `--profile pbs` by name (tacl.cluster.profiles)."""

from __future__ import annotations

import argparse
import json
import logging
import sys

from tacl.objectives.registry import OBJECTIVES


def register(stages: argparse._SubParsersAction) -> None:
    p = stages.add_parser("submit", help="submit one stage to SLURM with submitit (no Snakemake)")
    cmds = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    c = cmds.add_parser("pretrain", help="one pretraining run: timeout -> checkpoint -> requeue until done")
    c.add_argument("--config", default="config.yaml", help="the workflow config (paths, pretrain settings)")
    c.add_argument("--objective", required=True, choices=OBJECTIVES)
    c.add_argument("--folder", default="results/submitit", help="submitit's logs and pickles")
    c.add_argument("--timeout-min", type=int, default=1440)
    c.add_argument("--signal-delay-s", type=int, default=120)
    c.add_argument("--slurm", default="{}",
                   help='submitit SLURM parameters as JSON, e.g. {"slurm_partition": "gpu", "gpus_per_node": 4, '
                        '"cpus_per_task": 32, "slurm_account": "p123"}')
    c.add_argument("--wait", action="store_true", help="wait for the final marker and print it")
    c.set_defaults(func=_pretrain)

    p = stages.add_parser("profiles", help="the repository's Snakemake profiles, usable by name")
    cmds = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    c = cmds.add_parser("install", help="link profiles/slurm and profiles/pbs into ~/.config/snakemake")
    c.set_defaults(func=_profiles_install)

    p = stages.add_parser("pbs", help="PBS Pro submit/status commands for Snakemake's cluster-generic executor")
    cmds = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    c = cmds.add_parser("submit", help="qsub one Snakemake job script; prints the job id")
    c.add_argument("--queue", required=True)
    c.add_argument("--ngpus", type=int, default=0, help="GPUs per node")
    c.add_argument("--ncpus", type=int, default=1, help="CPUs per node")
    c.add_argument("--mem-mb", type=int, required=True, help="memory per node")
    c.add_argument("--runtime", type=float, required=True, help="minutes (walltime)")
    c.add_argument("--nodes", type=int, default=1)
    c.add_argument("--name", required=True, help="the rule (job name tacl.RULE)")
    c.add_argument("--log-dir", required=True, help="PBS writes the job's output here")
    c.add_argument("--exit-dir", required=True, help="the job leaves its exit status here (JOBID.exit)")
    c.add_argument("--project", default="", help="qsub -P (empty: none)")
    c.add_argument("jobscript")
    c.set_defaults(func=_pbs_submit)
    c = cmds.add_parser("status", help="running | success | failed, from qstat or the job's exit file")
    c.add_argument("--exit-dir", required=True, help="where jobs leave their exit status (as for submit)")
    c.add_argument("job_id")
    c.set_defaults(func=_pbs_status)
    c = cmds.add_parser("launch", help="one torchrun agent per node of this PBS job (c10d rendezvous)")
    c.add_argument("--starter", required=True, choices=["mpiexec", "pbsdsh"])
    c.add_argument("--nodes", type=int, required=True)
    c.add_argument("--ranks-per-node", type=int, required=True)
    c.add_argument("--state-dir", required=True, help="agents' description, logs and exit statuses (shared)")
    c.add_argument("--port", type=int, default=29400, help="the rendezvous port on the first node")
    c.add_argument("cmd", nargs=argparse.REMAINDER, help="-- the command every rank runs")
    c.set_defaults(func=_pbs_launch)
    c = cmds.add_parser("agent", help="(started by `tacl pbs launch` on each node)")
    c.add_argument("spec")
    c.set_defaults(func=_pbs_agent)


def _profiles_install(a: argparse.Namespace) -> int:
    from tacl.cluster.profiles import main

    return main()


def _pbs_submit(a: argparse.Namespace) -> None:
    from tacl.cluster.pbs import qsub_command, submit

    print(submit(qsub_command(a.jobscript, a.queue, a.ngpus, a.ncpus, a.mem_mb, a.runtime, a.name, a.log_dir,
                              a.project or None, a.nodes), a.exit_dir, a.ngpus > 0))


def _pbs_status(a: argparse.Namespace) -> int:
    from tacl.cluster.pbs import status_main

    return status_main(a.job_id, a.exit_dir)


def _pbs_launch(a: argparse.Namespace) -> int:
    from tacl.cluster.launch import launch

    cmd = a.cmd[1:] if a.cmd[:1] == ["--"] else a.cmd
    return launch(a.starter, a.nodes, a.ranks_per_node, cmd, a.state_dir, a.port)


def _pbs_agent(a: argparse.Namespace) -> int:
    from tacl.cluster.launch import run_agent

    return run_agent(a.spec)


def _pretrain(a: argparse.Namespace) -> None:
    import submitit  # noqa: F401  (configures its logger, which the line below then quiets on stdout)

    from tacl.cluster.submit import run_from_config, submit_pretraining

    # stdout carries only this command's JSON lines; submitit's messages stay on stderr
    log = logging.getLogger("submitit")
    for handler in [h for h in log.handlers if getattr(h, "stream", None) is sys.stdout]:
        log.removeHandler(handler)

    job = submit_pretraining(a.folder, run_from_config(a.config, a.objective), a.timeout_min, json.loads(a.slurm),
                             a.signal_delay_s)
    print(json.dumps({"job_id": job.job_id, "folder": a.folder}))
    if a.wait:
        print(json.dumps(job.result()))
