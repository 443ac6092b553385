"""The CI gate for the SLURM group (tests/slurm_gate.py), checked without a cluster."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from slurm_gate import must_run

pytest_plugins = ["pytester"]

SKIPPING_SLURM_TEST = """
import shutil
import pytest

pytestmark = [pytest.mark.slurm, pytest.mark.skipif(shutil.which("no-such-sinfo") is None, reason="no SLURM here")]

def test_through_sbatch():
    pass
"""


def test_must_run_only_under_ci():
    assert must_run({"CI": "true"}) and must_run({"CI": "1"}) and must_run({"CI": "True"})
    assert not must_run({}) and not must_run({"CI": "false"}) and not must_run({"CI": ""})


@pytest.mark.parametrize("ci", ["true", None])
def test_a_skipped_slurm_test_fails_under_ci(pytester, monkeypatch, ci):
    if ci is None:
        monkeypatch.delenv("CI", raising=False)
    else:
        monkeypatch.setenv("CI", ci)
    monkeypatch.setenv("PYTHONPATH", str(Path(__file__).parent))  # where slurm_gate lives
    pytester.makeini("[pytest]\nmarkers =\n    slurm: needs a cluster\n")
    pytester.makepyfile(test_cluster=SKIPPING_SLURM_TEST, test_other="def test_plain():\n    pass\n")
    result = pytester.runpytest_subprocess("-p", "slurm_gate", "-rs")
    if ci:
        result.assert_outcomes(passed=1, errors=1)
        result.stdout.fnmatch_lines(["*CI=true: the SLURM end-to-end test test_through_sbatch may not skip, but it "
                                     "was skipped: no SLURM here*",
                                     "slurm group: 0 passed, 1 failed, 0 skipped (CI=true: none may skip)"])
        assert result.ret != 0
    else:
        result.assert_outcomes(passed=1, skipped=1)
        result.stdout.fnmatch_lines(["slurm group: 0 passed, 0 failed, 1 skipped", "SKIPPED*no SLURM here*"])
        assert result.ret == 0


def test_tests_outside_the_slurm_group_see_no_scheduler_command(tmp_path):
    """conftest hides SLURM's and PBS's commands from every test outside the `slurm` group (a user's machine has
    none; CI's has real ones): none is found on PATH here, and `without_schedulers` keeps everything else a
    folder of PATH holds, under its own name."""
    from conftest import SCHEDULER_COMMANDS, without_schedulers

    assert [c for c in sorted(SCHEDULER_COMMANDS) if shutil.which(c)] == []
    folder = tmp_path / "bin"
    folder.mkdir()
    for name in ("sinfo", "squeue", "qstat", "tool"):
        (folder / name).write_text("#!/bin/sh\nexit 0\n")
        (folder / name).chmod(0o755)
    path = without_schedulers(f"{folder}{os.pathsep}{os.environ['PATH']}")
    assert [shutil.which(c, path=path) for c in ("sinfo", "squeue", "qstat")] == [None, None, None]
    tool = shutil.which("tool", path=path)
    assert tool is not None and Path(tool).name == "tool" and Path(tool).resolve() == folder / "tool"
    assert shutil.which("python3", path=path) is not None


def test_the_groups_ordered_first_are_test_files():
    """conftest's order of the pytest-xdist groups names test files that are there and wall-clock chains that
    are tests of theirs: a file renamed would otherwise fall back among the short ones, unnoticed."""
    import re

    from conftest import LONG_GROUPS, TESTS, WALL_CLOCK_CHAINS

    assert all((TESTS / f"{name}.py").is_file() for name in (*LONG_GROUPS, "test_pretrain", "test_slurm"))
    for chain in WALL_CLOCK_CHAINS:
        name, test = chain.split("::")
        assert re.search(rf"^def {test}\(", (TESTS / name).read_text(), re.M), chain
