"""Checks that stop a run before the first submission, with one message per problem naming the rule and
the config key or profile entry to change, on plain data (tacl.cluster.hooks gathers it from Snakemake).

SLURM (`scontrol show partition`, `sinfo`): a partition that does not exist, a runtime over the partition's
limit, an account placeholder that was never filled in, an account the partition does not allow, more
nodes asked for than the partition has that answer (down, drained or not responding nodes: the job would
wait in the queue until they come back).
PBS Pro (`qstat -Qf`): a queue that does not exist or is disabled, a runtime over the queue's walltime
limit, GPUs outside the queue's limits, GPUs per node other than pretrain.ranks_per_node, a queue
placeholder never filled in. Either: a launcher of the other scheduler.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from typing import Any

from tacl.runtime.scheduler import format_walltime, parse_walltime, qstat_queues, slurm_minutes


@dataclass(frozen=True)
class Partition:
    name: str
    max_minutes: int | None  # None = UNLIMITED
    allow_accounts: frozenset[str] | None  # None = ALL
    default: bool


@dataclass(frozen=True)
class JobRequest:
    rule: str
    partition: str | None
    runtime: int | None
    account: str | None
    runtime_key: str  # config key that sets the runtime, for the message
    nodes: int = 1  # 0: no job of the rule is to run, its nodes are not checked
    nodes_key: str = "nodes"  # config key or profile entry that sets the nodes, for the message


def parse_partitions(scontrol_output: str) -> dict[str, Partition]:
    """`scontrol show partition -o`: one partition per line, KEY=VALUE fields."""
    parts = {}
    for line in scontrol_output.splitlines():
        fields = dict(f.split("=", 1) for f in line.split() if "=" in f)
        if "PartitionName" not in fields:
            continue
        accounts = fields.get("AllowAccounts", "ALL")
        parts[fields["PartitionName"]] = Partition(
            name=fields["PartitionName"],
            max_minutes=slurm_minutes(fields.get("MaxTime", "UNLIMITED")),
            allow_accounts=None if accounts == "ALL" else frozenset(accounts.split(",")),
            default=fields.get("Default") == "YES",
        )
    return parts


def cluster_partitions() -> dict[str, Partition] | None:
    try:
        out = subprocess.run(["scontrol", "show", "partition", "-o"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return parse_partitions(out.stdout) if out.returncode == 0 else None


# sinfo's node states (%T) in which a node takes no job until someone acts: down, drained, failed, in
# maintenance, not yet in service; the suffix `*` marks a node whose slurmd does not answer
NOT_TAKING_JOBS = ("down", "drain", "fail", "maint", "future", "inval", "unknown")


def parse_node_states(sinfo_output: str) -> dict[str, dict[str, str]]:
    """`sinfo -h -N -o %R|%N|%T`: {partition: {node: state}}."""
    states: dict[str, dict[str, str]] = {}
    for line in sinfo_output.splitlines():
        fields = line.strip().split("|")
        if len(fields) == 3:
            partition, node, state = fields
            states.setdefault(partition, {})[node] = state
    return states


def takes_jobs(state: str) -> bool:
    return not state.endswith("*") and not state.startswith(NOT_TAKING_JOBS)


def cluster_node_states() -> dict[str, dict[str, str]] | None:
    try:
        out = subprocess.run(["sinfo", "-h", "-N", "-o", "%R|%N|%T"], capture_output=True, text=True,
                             timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return parse_node_states(out.stdout) if out.returncode == 0 else None


def node_problem(r: JobRequest, partition: str, states: dict[str, str]) -> str | None:
    """More nodes asked for than the partition has, or than it has that take jobs now."""
    if r.nodes == 0:
        return None
    if r.nodes > len(states):
        return (f"rule {r.rule}: asks for {r.nodes} nodes, partition {partition!r} has {len(states)}; "
                f"lower {r.nodes_key}")
    up = [n for n, state in states.items() if takes_jobs(state)]
    if r.nodes <= len(up):
        return None
    out = [f"{n} ({state})" for n, state in states.items() if not takes_jobs(state)]
    shown = ", ".join(out[:5]) + (f" and {len(out) - 5} more" if len(out) > 5 else "")
    return (f"rule {r.rule}: asks for {r.nodes} nodes, partition {partition!r} has {len(up)} that take "
            f"jobs; not answering or out of service: {shown}. The job would wait in the queue until enough "
            f"come back (`sinfo -p {partition}`); lower {r.nodes_key} or wait for the nodes")


def variable_problems(r: JobRequest) -> list[str]:
    """A profile variable left unset (its `$NAME` still in the value): known without asking the cluster."""
    found = []
    if r.account and "$" in r.account:
        found.append(f"rule {r.rule}: slurm_account is {r.account!r}: export the variable or write the "
                     "account into the profile (profiles/slurm/config.yaml, default-resources)")
    if r.partition and "$" in r.partition:
        found.append(f"rule {r.rule}: slurm_partition is {r.partition!r}: export the variable or write the "
                     "partition into the profile (profiles/slurm/config.yaml)")
    return found


def by_rule(found: list[str]) -> list[str]:
    """The problems of several rules that say the same (a profile variable left unset, a partition that does
    not exist), once, naming the rules: `rules clean, shard: ...`; the others as they are, in order."""
    rules: dict[str, list[str]] = {}
    for line in found:
        rule, sep, what = line.partition(": ")
        key = what if rule.startswith("rule ") and sep else line
        rules.setdefault(key, []).append(rule[len("rule "):] if key == what else "")
    out = []
    for what, names in rules.items():
        if not any(names):
            out.append(what)
        else:
            out.append(f"{'rule' if len(names) == 1 else 'rules'} {', '.join(names)}: {what}")
    return out


def problems(requests: list[JobRequest], partitions: dict[str, Partition] | None,
             node_states: dict[str, dict[str, str]] | None = None) -> list[str]:
    """`partitions` None (scontrol did not answer): only the profile's variables are checked; `node_states`
    (cluster_node_states) None: the nodes are not checked. What several rules share is said once (by_rule)."""
    return by_rule(_problems(requests, partitions, node_states))


def _problems(requests: list[JobRequest], partitions: dict[str, Partition] | None,
              node_states: dict[str, dict[str, str]] | None) -> list[str]:
    found = [p for r in requests for p in variable_problems(r)]
    if partitions is None:
        return found
    default = next((p.name for p in partitions.values() if p.default), None)
    for r in requests:
        name = r.partition or default
        if r.partition and "$" in r.partition:
            continue
        if name is None:
            found.append(f"rule {r.rule}: no slurm_partition and the cluster has no default partition")
            continue
        part = partitions.get(name)
        if part is None:
            found.append(f"rule {r.rule}: partition {name!r} does not exist on this cluster "
                         f"(partitions: {', '.join(sorted(partitions))})")
            continue
        if r.runtime and part.max_minutes is not None and r.runtime > part.max_minutes:
            found.append(f"rule {r.rule}: runtime {r.runtime} min is over the {part.max_minutes} min limit of "
                         f"partition {name!r}; lower {r.runtime_key}")
        if part.allow_accounts is not None and (r.account or "") not in part.allow_accounts:
            found.append(f"rule {r.rule}: partition {name!r} accepts only accounts "
                         f"{', '.join(sorted(part.allow_accounts))}, not {r.account or '(none)'}; set "
                         "slurm_account in the profile")
        problem = node_problem(r, name, node_states.get(name, {})) if node_states is not None else None
        if problem:
            found.append(problem)
    return found


# -- which launcher runs under which scheduler -------------------------------------------------------------

SLURM_LAUNCHERS = ("torchrun", "srun")
PBS_LAUNCHERS = ("torchrun", "mpiexec", "pbsdsh")


def launcher_problem(scheduler: str, launcher: str, configured: str) -> str | None:
    """pretrain.launcher (as configured; `launcher` as resolved from auto) against the scheduler in use."""
    allowed = SLURM_LAUNCHERS if scheduler == "slurm" else PBS_LAUNCHERS
    if launcher in allowed:
        return None
    how = f"{configured} (srun for pretrain.nodes > 1)" if configured == "auto" else configured
    if scheduler == "slurm":
        return (f"rule pretrain_chunk: pretrain.launcher is {how}, which starts torchrun agents on the nodes of "
                "a PBS job; under SLURM use srun (several nodes) or torchrun (one node)")
    return (f"rule pretrain_chunk: pretrain.launcher is {how}, which needs a SLURM job step; under PBS set "
            "pretrain.launcher to mpiexec (Cray PALS, as on Supek) or pbsdsh: one torchrun agent per node")


# -- PBS Pro ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Queue:
    name: str
    enabled: bool
    max_walltime: int | None  # seconds; None = no limit
    max_ngpus: int | None
    min_ngpus: int | None


@dataclass(frozen=True)
class PbsRequest:
    rule: str
    queue: str | None
    runtime: int | None  # minutes
    runtime_key: str  # config key or profile entry that sets the runtime, for the message
    ngpus: int  # per node
    nodes: int


def _int(value: Any) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def parse_queues(records: dict[str, dict[str, Any]]) -> dict[str, Queue]:
    """Queues from `qstat -Qf -F json`'s "Queue" object or its text form (tacl.runtime.scheduler)."""
    queues = {}
    for name, q in records.items():
        most, least = q.get("resources_max") or {}, q.get("resources_min") or {}
        walltime = most.get("walltime")
        queues[name] = Queue(name=name, enabled=str(q.get("enabled", "True")).lower() == "true",
                             max_walltime=None if walltime is None else parse_walltime(walltime),
                             max_ngpus=_int(most.get("ngpus")), min_ngpus=_int(least.get("ngpus")))
    return queues


def cluster_queues() -> dict[str, Queue] | None:
    records = qstat_queues()
    return None if records is None else parse_queues(records)


def pbs_problems(requests: list[PbsRequest], queues: dict[str, Queue] | None,
                 ranks_per_node: int | None) -> list[str]:
    """`queues` None: qstat did not answer, only what needs no server is checked; `ranks_per_node` None: no
    pretraining chunk is to run, its GPUs per node are not checked. What several rules share is said once."""
    return by_rule(_pbs_problems(requests, queues, ranks_per_node))


def _pbs_problems(requests: list[PbsRequest], queues: dict[str, Queue] | None,
                  ranks_per_node: int | None) -> list[str]:
    found = []
    for r in requests:
        if r.rule == "pretrain_chunk" and ranks_per_node and r.ngpus and r.ngpus != ranks_per_node:
            found.append(f"rule pretrain_chunk: the profile gives each of its {r.nodes} node(s) {r.ngpus} GPU(s) "
                         f"(gpu under set-resources), but pretrain.ranks_per_node is {ranks_per_node} (one rank "
                         "per GPU); make them agree")
        if not r.queue or "$" in r.queue:
            found.append(f"rule {r.rule}: pbs_queue is {r.queue!r}: export the variable or write the queue into "
                         "the profile (profiles/pbs/config.yaml)")
            continue
        if queues is None:
            continue
        q = queues.get(r.queue)
        if q is None:
            found.append(f"rule {r.rule}: queue {r.queue!r} does not exist on this PBS server (queues: "
                         f"{', '.join(sorted(queues))}); set pbs_queue in the profile")
            continue
        if not q.enabled:
            found.append(f"rule {r.rule}: queue {r.queue!r} does not take jobs (enabled = False); set pbs_queue "
                         "in the profile")
        if r.runtime and q.max_walltime is not None and 60 * r.runtime > q.max_walltime:
            found.append(f"rule {r.rule}: runtime {r.runtime} min is over the {format_walltime(q.max_walltime / 60)} "
                         f"walltime limit of queue {r.queue!r} (resources_max.walltime); lower {r.runtime_key}")
        total = r.ngpus * r.nodes
        if q.max_ngpus is not None and total > q.max_ngpus:
            found.append(f"rule {r.rule}: {total} GPU(s) asked for, over the {q.max_ngpus} of queue {r.queue!r} "
                         "(resources_max.ngpus); lower pretrain.ranks_per_node or pretrain.nodes")
        if q.min_ngpus is not None and total < q.min_ngpus:
            found.append(f"rule {r.rule}: queue {r.queue!r} takes jobs with at least {q.min_ngpus} GPU(s) "
                         f"(resources_min.ngpus), the rule asks for {total}; set its pbs_queue in the profile, "
                         "or the GPUs in the config (device: cpu asks for none; pretrain.ranks_per_node)")
    return found
