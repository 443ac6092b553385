"""A pytest plugin (loaded by conftest.py): under CI the SLURM end-to-end tests must run.

Outside CI a test of the `slurm` group skips, saying why, when no cluster is up. Under CI (`CI=true`,
which .ci/run sets) a skipped `slurm` test is reported as failed with the skip's own reason, whatever the
skip condition says, so a machine where the cluster did not start, or a later change to the condition,
cannot turn "tested against a real SLURM cluster" into a silent no-op. The end of the run prints how
many tests of the group passed, failed and skipped.
"""

from __future__ import annotations

import os
from collections import Counter
from typing import Mapping

import pytest

MARK = "slurm"


def must_run(environ: Mapping[str, str] | None = None) -> bool:
    """Whether the slurm group may not skip: under CI (CI=true or CI=1, as CI services set it)."""
    env = os.environ if environ is None else environ
    return env.get("CI", "").strip().lower() in ("true", "1", "yes")


def skip_reason(longrepr) -> str:
    """The reason pytest recorded for a skip ((file, line, reason) tuple, or text)."""
    reason = longrepr[2] if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr)
    return reason.removeprefix("Skipped: ")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.skipped and item.get_closest_marker(MARK) is not None and must_run():
        report.outcome = "failed"
        report.longrepr = (f"CI=true: the SLURM end-to-end test {item.name} may not skip, but it was skipped: "
                           f"{skip_reason(report.longrepr)} (see the [slurm-ci] and [slurm-nodes] lines of "
                           ".ci/run)")


def pytest_terminal_summary(terminalreporter):
    counts: Counter[str] = Counter()
    for outcome in ("passed", "failed", "skipped", "error"):
        for report in terminalreporter.stats.get(outcome, []):
            if getattr(report, "when", "call") in ("call", "setup") and MARK in getattr(report, "keywords", {}):
                if outcome != "passed" or report.when == "call":
                    counts[outcome] += 1
    if counts:
        terminalreporter.write_line(
            f"slurm group: {counts['passed']} passed, {counts['failed'] + counts['error']} failed, "
            f"{counts['skipped']} skipped" + (" (CI=true: none may skip)" if must_run() else ""))
