"""One machine with several GPUs and no scheduler (profiles/workstation, tacl.cluster.workstation), on stand-in GPUs:
each job's own GPUs, a job that waits for a free one, a chunk's GPUs held across torchrun's exec, the
profile's dry run and its errors. (The profile running real fine-tunes: tests/test_workflow.py.)"""

from __future__ import annotations

import argparse
import fcntl
import os
import re
import shutil
import subprocess
import sys
import time

import pytest

from conftest import REPO, demo_config, run_snakemake
from tacl.cluster.workstation import gpus_needed, job_device

CLAIM = ("import argparse, logging, os, sys, time\n"
         "from tacl.cluster.workstation import claim_for_job\n"
         "logging.basicConfig(level=logging.INFO)\n"
         "claim_for_job(argparse.Namespace(stage=sys.argv[1], command=sys.argv[2], nproc=int(sys.argv[3]),\n"
         "                                 device='auto'))\n"
         "print(os.environ['CUDA_VISIBLE_DEVICES'], time.time(), 'TACL_GPUS' in os.environ, flush=True)\n"
         "{after}\n")


def start(tmp_path, *args: str, after: str = "time.sleep(float(sys.argv[4]))") -> subprocess.Popen:
    env = dict(os.environ, TACL_GPUS="0,1", TACL_GPU_LOCKS=str(tmp_path / "locks"),
               PYTHONPATH=str(REPO / "src"))
    env.pop("CUDA_VISIBLE_DEVICES", None)
    return subprocess.Popen([sys.executable, "-c", CLAIM.format(after=after), *args], env=env,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_two_jobs_get_gpus_of_their_own_and_a_third_waits(tmp_path):
    """(Each job holds its GPUs until the test lets it go: what the third gets, and when, does not depend on
    how fast a busy machine starts the processes.)"""
    hold = "sys.stdin.readline()"
    a = start(tmp_path, "finetune", "glue", "1", after=hold)
    first = a.stdout.readline().split()
    b = start(tmp_path, "analysis", "similarity", "1", after=hold)
    second = b.stdout.readline().split()
    assert sorted([first[0], second[0]]) == ["0", "1"], "each its own GPU"
    assert [first[2], second[2]] == ["False", "False"], "the processes a job starts do not claim again"
    c = start(tmp_path, "finetune", "squad", "1", "0")
    while "waiting for 1 free GPU(s) of 0,1" not in (line := c.stderr.readline()):
        assert line, "the third job did not wait"
    released = time.time()
    a.communicate("go\n")
    third = c.stdout.readline().split()
    assert third[0] == first[0], "the third got the GPU the first job freed"
    assert float(third[1]) >= released, "... after that job ended, not before"
    c.communicate()
    b.communicate("go\n")


def test_a_chunk_takes_one_gpu_per_rank_and_holds_them_across_exec(tmp_path):
    """`tacl pretrain train --nproc 2` claims two GPUs and execs torchrun in its place: the locks stay held."""
    after = ("os.execv(sys.executable, [sys.executable, '-c', "
             "'import time; print(\"exec\", flush=True); time.sleep(3)'])")
    chunk = start(tmp_path, "pretrain", "train", "2", after=after)
    assert chunk.stdout.readline().split()[0] == "0,1"
    assert chunk.stdout.readline().strip() == "exec"
    for gpu in ("0", "1"):
        fd = os.open(tmp_path / "locks" / f"gpu-{gpu}.lock", os.O_RDONLY)
        with pytest.raises(BlockingIOError):
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.close(fd)
    chunk.wait()
    assert gpus_needed("pretrain", "export") == gpus_needed("report", None) == 0  # (CPU commands claim nothing)
    assert gpus_needed("finetune", "glue", device="cpu") == gpus_needed("pretrain", "train", 2, "cpu") == 0
    assert job_device(argparse.Namespace(settings='{"steps": 4}', operational='{"device": "cpu"}')) == "cpu"


def fake_nvidia_smi(tmp_path, monkeypatch, gpus: int = 2) -> None:
    fake = tmp_path / "bin"
    fake.mkdir()
    lines = "".join(f"echo 'GPU {i}: Stand-in (UUID: GPU-{i})'\n" for i in range(gpus))
    (fake / "nvidia-smi").write_text(f"#!/bin/sh\n[ \"$1\" = -L ] || exit 9\n{lines}")
    (fake / "nvidia-smi").chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake}:{os.environ['PATH']}")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)


def test_workstation_profile_dry_run_and_its_errors(tmp_path, monkeypatch):
    """The profile finds the stand-in GPUs with nvidia-smi -L: a chunk asks for one GPU per rank, a fine-tune and
    a similarity job for one; a chunk with more ranks than GPUs, `gpus` with a scheduler's profile, or no
    nvidia-smi, stops with one line."""
    fake_nvidia_smi(tmp_path, monkeypatch)
    profile = str(REPO / "profiles" / "workstation")
    cfg = demo_config(tmp_path, device="auto", **{"finetune.tasks": ["qnli"]})  # (device cpu: no GPU jobs)
    proc = run_snakemake(tmp_path, cfg, "--profile", profile, "-n")
    assert re.search(r"From the schema's defaults, unlike config.yaml .*finetune.preset", proc.stderr)
    jobs = proc.stdout.split("\n\n")
    for rule in ("pretrain_chunk", "finetune", "similarity"):
        resources = [j for j in jobs if f"rule {rule}:" in j or f"checkpoint {rule}:" in j]
        assert resources and all("gpu=1" in j for j in resources), rule
    assert not [j for j in jobs if "rule clean:" in j and "gpu=" in j]

    cfg = demo_config(tmp_path, device="auto", **{"pretrain.ranks_per_node": 4, "pretrain.micro_batch": 2,
                                                  "pretrain.negatives_group": 2})
    proc = run_snakemake(tmp_path, cfg, "--profile", profile, "-n", check=False)
    assert proc.returncode != 0
    assert ("pretrain.ranks_per_node: 4 ranks, one GPU each, but this machine's jobs share 2 GPU(s) (0,1; config "
            "`gpus: auto`)") in proc.stdout + proc.stderr
    proc = run_snakemake(tmp_path, cfg, "--profile", str(REPO / "profiles" / "slurm"), "-n", "--config", "gpus=2",
                         check=False)
    assert proc.returncode != 0 and "gpus: 2 is for one machine without a scheduler (profiles/workstation); " \
        "under SLURM or PBS the scheduler gives each job its GPUs: set gpus: null" in proc.stdout + proc.stderr
    monkeypatch.setenv("PATH", os.environ["PATH"].split(":", 1)[1])  # (the fake's folder gone)
    if shutil.which("nvidia-smi") is None:
        proc = run_snakemake(tmp_path, demo_config(tmp_path), "--profile", profile, "-n", check=False)
        assert proc.returncode != 0 and "gpus: auto, but nvidia-smi is not installed here" in proc.stdout + proc.stderr
