"""The CI gate for the SLURM group (tests/slurm_gate.py), checked without a cluster."""

from __future__ import annotations

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
