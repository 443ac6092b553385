"""What a Snakemake job would hand to sbatch, built by snakemake-executor-plugin-slurm's own functions.

`sbatch_line` runs the plugin's checks (`validate_slurm_extra`, the GRES/GPU and MPI task checks) and
builds its sbatch command line for one job, without submitting anything. The preflight (tacl.cluster.hooks)
runs it for one job of every rule before the first submission, so a profile the plugin would
refuse fails at once, naming the rule and the resource; `TACL_SBATCH_PREVIEW=FILE` writes the lines to FILE
and stops there (what the tests read, and a way to see what each rule would ask the cluster for).
"""

from __future__ import annotations

import re
import shlex
from typing import Any

# which resource a message of the plugin is about (the first that matches)
_KEYS = (("GRES", "gres"), ("GPU model", "gpu_model"), ("tasks_per_node", "tasks_per_node"), ("'tasks'", "tasks"),
         ("'nodes'", "nodes"), ("cpus_per_task", "cpus_per_task"), ("cpus_per_gpu", "cpus_per_gpu"))
_GPUS_PER_NODE = re.compile(r"^gpu(?::[A-Za-z0-9_.]+)?:(\d+)$")


class SubmissionError(ValueError):
    """The plugin would refuse this job's resources."""


def sbatch_line(job: Any, account: str | None, partition: str | None, settings: Any = None) -> str:
    """The sbatch command line of `job` (a Snakemake job: .name, .threads, .resources), as the plugin
    builds it; SubmissionError naming the rule when the plugin refuses the resources."""
    from snakemake_executor_plugin_slurm.submit_string import get_submit_command
    from snakemake_executor_plugin_slurm.utils import set_gres_string
    from snakemake_executor_plugin_slurm.validation import validate_slurm_extra
    from snakemake_interface_common.exceptions import WorkflowError

    params = {"run_uuid": "RUN_UUID", "slurm_logfile": f"results/slurm-logs/rule_{job.name}/%j.log",
              "comment_str": f"rule_{job.name}", "workdir": None,
              "account": f"-A {shlex.quote(account)}" if account else "",
              "partition": f"-p {shlex.quote(partition)}" if partition else ""}
    try:
        validate_slurm_extra(job)
    except WorkflowError as e:
        raise SubmissionError(f"rule {job.name} (resource slurm_extra): {e}") from None
    try:
        line = get_submit_command(job, params, settings=settings) + set_gres_string(job)
    except WorkflowError as e:
        key = next((k for pattern, k in _KEYS if pattern in str(e)), None)
        where = f" (resource {key})" if key else ""
        raise SubmissionError(f"rule {job.name}{where}: {e}") from None
    return " ".join(line.split())


def gpus_per_node(resources: Any) -> int | None:
    """GPUs each node of a job gets: `gres: gpu[:type]:N` is per node, `gpu: N` is the job's total."""
    gres = str(resources.get("gres") or "")
    m = _GPUS_PER_NODE.match(gres)
    if m:
        return int(m.group(1))
    total = resources.get("gpu")
    if total:
        return int(total) // max(1, int(resources.get("nodes") or 1))
    return None


def geometry_problem(job: Any, nodes: int, ranks_per_node: int) -> str | None:
    """A pretraining chunk has one rank per GPU: the GPUs the profile gives each node must be
    pretrain.ranks_per_node (or none at all, on a CPU cluster)."""
    per_node = gpus_per_node(job.resources)
    if per_node is None or per_node == ranks_per_node:
        return None
    given = f"gres {job.resources.get('gres')}" if job.resources.get("gres") else f"gpu {job.resources.get('gpu')}"
    return (f"rule {job.name}: the profile gives each of its {nodes} node(s) {per_node} GPU(s) ({given}), but "
            f"pretrain.ranks_per_node is {ranks_per_node} (one rank per GPU); make them agree")
