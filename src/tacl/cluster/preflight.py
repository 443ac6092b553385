"""Checks that stop a SLURM run before the first sbatch, with one message per problem naming the config
key or profile entry to change: a partition that does not exist, a runtime over the partition's limit,
an account placeholder that was never filled in, an account the partition does not allow."""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass

_TIME = re.compile(r"^(?:(\d+)-)?(\d+):(\d+):(\d+)$")


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


def parse_minutes(text: str) -> int | None:
    """SLURM time limits: "UNLIMITED", "1-00:00:00", "01:00:00", "60" (minutes)."""
    if text in ("UNLIMITED", "INFINITE", "NONE"):
        return None
    m = _TIME.match(text)
    if m:
        days, hours, minutes, seconds = (int(x) if x else 0 for x in m.groups())
        return days * 1440 + hours * 60 + minutes + (seconds > 0)
    return int(text) if text.isdigit() else None


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
            max_minutes=parse_minutes(fields.get("MaxTime", "UNLIMITED")),
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


def problems(requests: list[JobRequest], partitions: dict[str, Partition]) -> list[str]:
    found = []
    default = next((p.name for p in partitions.values() if p.default), None)
    for r in requests:
        if r.account and "$" in r.account:
            found.append(f"rule {r.rule}: slurm_account is {r.account!r}: export the variable or write the "
                         "account into the profile (profiles/slurm/config.yaml, default-resources)")
        name = r.partition or default
        if r.partition and "$" in r.partition:
            found.append(f"rule {r.rule}: slurm_partition is {r.partition!r}: export the variable or write the "
                         "partition into the profile (profiles/slurm/config.yaml)")
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
    return found
