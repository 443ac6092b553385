"""What the Snakefile's onstart and onsuccess handlers run (workflow/rules/common.smk only wires them).

`preflight()`, before the first submission: under SLURM (executor slurm) the plugin's own checks and
sbatch line for one job of every rule (tacl.cluster.sbatch; TACL_SBATCH_PREVIEW=FILE writes them to FILE
and submits nothing) and the partition checks; under PBS Pro (cluster-generic with `tacl pbs submit`)
the queue checks; under either, the launcher. Each problem is one line naming the rule and the key; any
problem stops the run with all of them. `data_summary()`: the line printed after a successful run.
`directory_chosen()`: whether Snakemake's --directory chose the working directory (an attribute that Snakemake
keeps for itself, read in this one place).
"""

from __future__ import annotations

import json
import os
from typing import Any

from snakemake.exceptions import WorkflowError

from tacl.cluster.preflight import (JobRequest, PbsRequest, cluster_node_states, cluster_partitions,
                                    cluster_queues, launcher_problem, pbs_problems, problems)
from tacl.data.build import unknown_line, unknown_text
from tacl.data.shards import EXAMPLES, NSP_PAIRS, manifest_form
from tacl.experiment.design import LOCAL_RULES
from tacl.planning.plan import announce


def directory_chosen(workflow: Any) -> bool:
    """Whether this run's working directory was chosen with Snakemake's --directory (workflow/Snakefile then
    lets a run start outside the repository root). Snakemake has no public way to say it: its workflow object
    keeps the option as `overwrite_workdir` (in 9.27, the version envs/ pins), read here alone. A Snakemake without that
    attribute stops the run here, naming it and the version, rather than each run being judged as if no
    --directory had been given."""
    try:
        directory = workflow.overwrite_workdir
    except AttributeError:
        from snakemake import __version__

        raise WorkflowError(
            f"Snakemake {__version__} keeps no `overwrite_workdir` on its workflow object, which workflow/Snakefile "
            "reads (tacl.cluster.hooks.directory_chosen) to know whether --directory chose the working directory; "
            "install the Snakemake that envs/requirements-cpu.txt pins, or read the option where this version "
            "keeps it") from None
    return directory is not None


def scheduler(workflow: Any) -> str | None:
    """slurm | pbs | None (local, or another executor): what this run submits to (a SLURM job's own Snakemake,
    which runs the job inside it with the slurm-jobstep executor, says slurm too)."""
    plugin = getattr(workflow, "executor_plugin", None)
    if plugin is None:
        return None
    if plugin.name in ("slurm", "slurm-jobstep"):
        return "slurm"
    submit_cmd = getattr(getattr(workflow, "executor_settings", None), "submit_cmd", None) or ""
    if plugin.name == "cluster-generic" and "tacl pbs submit" in " ".join(submit_cmd.split()):
        return "pbs"
    return None


def scheduler_of_profile(workflow: Any) -> str | None:
    """slurm | pbs | None, from the resources the profile sets (slurm_partition, slurm_account, ... or
    pbs_queue): what a dry run would submit to, whose workflow knows only its dry-run executor."""
    settings = workflow.resource_settings
    names = set(settings.default_resources.keys()) if settings.default_resources is not None else set()
    for resources in (settings.overwrite_resources or {}).values():
        names |= set(resources)
    if any(name.startswith("slurm_") for name in names):
        return "slurm"
    return "pbs" if "pbs_queue" in names else None


def resource_text(resource: Any) -> str | None:
    """A rule's resource as text: a fixed value, or a profile expression with $VARIABLES expanded (None for
    a function of the wildcards)."""
    if resource is None:
        return None
    if not resource.is_evaluable():
        return None if resource.value is None else str(resource.value)
    if isinstance(resource.raw, str):
        return os.path.expandvars(resource.raw).strip("'\"")
    return None


def _int_resource(spec: Any, name: str, default: int) -> int:
    text = resource_text(spec.resources.get(name))
    return int(text) if text and text.isdigit() else default


def rule_runtime(spec: Any, config_runtimes: dict[str, tuple[int, str]]) -> tuple[int | None, str]:
    """(minutes, the key that sets them): the config's for the rules it times, else the profile's."""
    if spec.name in config_runtimes:
        return config_runtimes[spec.name]
    runtime = resource_text(spec.resources.get("runtime"))
    key = f"the runtime of rule {spec.name} (set-resources in the profile)"
    return (int(runtime) if runtime and runtime.isdigit() else None), key


def cluster_rules(workflow: Any) -> list[Any]:
    """The rules whose jobs are submitted: those with a command, not among the local rules
    (tacl.experiment.design.LOCAL_RULES, which a dry run cannot take from Snakemake)."""
    return [spec for spec in workflow.rules if not spec.norun and spec.name not in LOCAL_RULES]


def sbatch_problems(workflow: Any, pretrain: dict[str, Any]) -> list[str]:
    """One job of every rule that will run on the cluster, through the SLURM plugin's own checks and sbatch
    line; with TACL_SBATCH_PREVIEW=FILE the lines go to FILE as JSON and nothing is submitted."""
    from tacl.cluster.sbatch import SubmissionError, geometry_problem, sbatch_line

    lines, found, seen = {}, [], set()
    for job in sorted(workflow.dag.needrun_jobs(), key=lambda j: j.name):
        if job.name in seen or job.is_local or job.is_group():
            continue
        seen.add(job.name)
        try:
            lines[job.name] = sbatch_line(job, job.resources.get("slurm_account"),
                                          job.resources.get("slurm_partition"), workflow.executor_settings)
        except SubmissionError as e:
            found.append(str(e))
        if job.name == "pretrain_chunk":
            problem = geometry_problem(job, pretrain["nodes"], pretrain["ranks_per_node"])
            if problem:
                found.append(problem)
    preview = os.environ.get("TACL_SBATCH_PREVIEW")
    if preview:
        with open(preview, "w") as f:
            json.dump({"sbatch": lines, "problems": found}, f, indent=1)
        raise WorkflowError(f"TACL_SBATCH_PREVIEW: the sbatch line of every rule is in {preview}; nothing was "
                            "submitted")
    return found


def rule_geometry_problem(workflow: Any, pretrain: dict[str, Any]) -> str | None:
    """A dry run has no jobs yet: GPUs per node that the profile sets for pretrain_chunk (gres or gpu under
    set-resources), against pretrain.ranks_per_node (the workflow's own values always agree)."""
    from types import SimpleNamespace

    from tacl.cluster.sbatch import geometry_problem

    spec = next((s for s in workflow.rules if s.name == "pretrain_chunk"), None)
    if spec is None:
        return None
    given = {k: resource_text(spec.resources.get(k)) for k in ("gres", "gpu")}
    resources = {**{k: v for k, v in given.items() if v}, "nodes": pretrain["nodes"]}
    job = SimpleNamespace(name=spec.name, resources=resources)
    return geometry_problem(job, pretrain["nodes"], pretrain["ranks_per_node"])


def slurm_problems(workflow: Any, pretrain: dict[str, Any], config_runtimes: dict[str, tuple[int, str]],
                   dry_run: bool = False, chunks: bool = True) -> list[str]:
    if dry_run:  # (no jobs yet: the rule-level checks)
        problem = rule_geometry_problem(workflow, pretrain)
        found = [problem] if problem else []
    else:
        found = sbatch_problems(workflow, pretrain)
    requests = []
    # the nodes of the rules that are to run are checked (a dry run knows the rules, not yet the jobs)
    if dry_run:
        running = {spec.name for spec in cluster_rules(workflow) if spec.name != "pretrain_chunk" or chunks}
    else:
        running = {job.name for job in workflow.dag.needrun_jobs()}
    for spec in cluster_rules(workflow):
        runtime, key = rule_runtime(spec, config_runtimes)
        if spec.name == "pretrain_chunk":
            nodes, nodes_key = pretrain["nodes"], "pretrain.nodes"
        else:
            nodes, nodes_key = _int_resource(spec, "nodes", 1), f"the nodes of rule {spec.name} (profile)"
        requests.append(JobRequest(spec.name, resource_text(spec.resources.get("slurm_partition")), runtime,
                                   resource_text(spec.resources.get("slurm_account")), key,
                                   nodes if spec.name in running else 0, nodes_key))
    partitions = cluster_partitions()
    node_states = cluster_node_states() if partitions is not None else None
    if partitions is None:
        announce("SLURM preflight: partitions not checked, `scontrol show partition` did not answer")
    elif node_states is None:
        announce("SLURM preflight: nodes not checked, `sinfo` did not answer")
    return found + problems(requests, partitions, node_states)


def pbs_requests(workflow: Any, config_runtimes: dict[str, tuple[int, str]], gpus: dict[str, int]
                 ) -> list[PbsRequest]:
    """`gpus`: each rule's GPUs per node as the config gives them (what the rule asks for unless the profile
    sets its own)."""
    return [PbsRequest(spec.name, resource_text(spec.resources.get("pbs_queue")),
                       *rule_runtime(spec, config_runtimes), _int_resource(spec, "gpu", gpus.get(spec.name, 0)),
                       _int_resource(spec, "nodes", 1))
            for spec in cluster_rules(workflow)]


def preflight(workflow: Any, pretrain: dict[str, Any], config_runtimes: dict[str, tuple[int, str]],
              launcher: str, gpus: dict[str, int], chunks: bool, dry_run: bool = False) -> None:
    """Before the first submission, and in a dry run: WorkflowError listing every problem found (nothing
    submitted). `chunks`: a pretraining chunk is to run (its launcher and GPUs per node are checked). A dry
    run has no jobs yet: the checks that need one (the SLURM plugin's own, on each rule's sbatch line) wait
    for the real run."""
    which = scheduler_of_profile(workflow) if dry_run else scheduler(workflow)
    if which is None:
        return
    problem = launcher_problem(which, launcher, pretrain["launcher"]) if chunks else None
    found = [problem] if problem else []
    if which == "slurm":
        found += slurm_problems(workflow, pretrain, config_runtimes, dry_run, chunks)
    else:
        queues = cluster_queues()
        if queues is None:
            announce("PBS preflight: queues not checked, `qstat -Qf` did not answer")
        found += pbs_problems(pbs_requests(workflow, config_runtimes, gpus), queues,
                              pretrain["ranks_per_node"] if chunks else None)
    if found:
        done = "this dry run stops here" if dry_run else "nothing was submitted"
        raise WorkflowError(f"{which.upper()} preflight: {done}.\n  " + "\n  ".join(found))


def data_summary(path: str, manifest: str, results: str) -> str | None:
    """The data stage's summary as one line, once it exists, its examples named by the form of the shards
    `manifest` lists (tacl.data.shards: NSP pairs, or whole sentences); below it, a warning line where many of the
    shards' tokens are the tokenizer's unknown token (tacl.data.build.unknown_line)."""
    if not os.path.exists(path):
        return None
    with open(path) as f:
        s = json.load(f)
    form = NSP_PAIRS
    if os.path.exists(manifest):  # (written by the same job as the summary)
        with open(manifest) as f:
            form = manifest_form(json.load(f))
    unknown = unknown_text(s.get("unk_tokens"), s["tokens"])
    line = (f"summary ({results}): {s['documents']} documents, {s['sentences']} sentences, {s['examples']} "
            f"{EXAMPLES[form]}, {s['tokens']} tokens{unknown} in {s['shards']} shards")
    warning = unknown_line(s.get("unk_tokens"), s["tokens"], s.get("tokenizer"))
    return line + (f"\n{warning}" if warning else "")
