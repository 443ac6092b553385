"""The device contract: a job that asked for a GPU and sees none stops at once, naming what it saw."""

from __future__ import annotations

import json
import time

import pytest
import torch

from conftest import REPO, run_tacl
from tacl.device import DeviceError, device_info, gpu_request, resolve_device
from tacl.io import InputError

needs_no_gpu = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the behaviour on a machine without GPU")


def test_who_asked_for_a_gpu():
    assert gpu_request("cuda", {}) == "device: cuda in the config"
    assert gpu_request("cpu", {"SLURM_GPUS_ON_NODE": "4"}) is None, "cpu is an explicit choice"
    assert gpu_request("auto", {}) is None
    assert gpu_request("auto", {"SLURM_GPUS_ON_NODE": "0", "SLURM_JOB_GPUS": ""}) is None
    assert "SLURM_GPUS_ON_NODE=4" in gpu_request("auto", {"SLURM_GPUS_ON_NODE": "4"})
    assert "SLURM_JOB_GPUS=0,1" in gpu_request("auto", {"SLURM_JOB_GPUS": "0,1"})
    assert gpu_request("auto", {"TACL_REQUIRE_GPU": "1"}) == "TACL_REQUIRE_GPU=1"
    with pytest.raises(InputError, match="device: 'gpu' is not one of auto, cuda, cpu"):
        gpu_request("gpu", {})


@needs_no_gpu
def test_asking_for_cuda_on_a_cpu_machine_fails_naming_the_cause(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3")
    with pytest.raises(DeviceError) as e:
        resolve_device("cuda")
    message = str(e.value)
    assert "a GPU was asked for (device: cuda in the config) but none is usable" in message
    assert "CUDA_VISIBLE_DEVICES=3" in message and f"torch {torch.__version__}" in message
    monkeypatch.setenv("SLURM_GPUS_ON_NODE", "1")  # SLURM gave the job a GPU: auto must find it too
    with pytest.raises(DeviceError, match=r"the scheduler gave this job GPUs \(SLURM_GPUS_ON_NODE=1\)"):
        resolve_device("auto")
    monkeypatch.delenv("SLURM_GPUS_ON_NODE")
    assert resolve_device("auto") == torch.device("cpu") == resolve_device("cpu")
    info = device_info(torch.device("cpu"))
    assert info["gpus"] == 0 and info["gpu"] is None and info["torch"] == torch.__version__


@needs_no_gpu
@pytest.mark.slow
def test_gpu_jobs_stop_within_seconds_on_a_cpu_machine(demo_data, tmp_path):
    """Pretraining, a fine-tune and `tacl doctor`, each asked for cuda on this CPU-only machine."""
    settings = {"objective": "mlm_nsp", "steps": 5, "global_batch": 8, "micro_batch": 4, "max_len": 64,
                "device": "cuda"}
    t0 = time.time()
    proc = run_tacl("pretrain", "train", "--run-dir", str(tmp_path / "run"), "--start-model", str(demo_data["start"]),
                    "--manifest", str(demo_data["manifest"]), "--settings", json.dumps(settings), check=False)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert time.time() - t0 < 30
    assert proc.stderr.count("tacl: error: a GPU was asked for (device: cuda in the config)") == 1
    assert "CUDA_VISIBLE_DEVICES=" in proc.stderr and "built for CUDA" in proc.stderr
    assert not (tmp_path / "run" / "checkpoints").exists()

    proc = run_tacl("finetune", "glue", "--model", str(demo_data["start"]), "--task", "qnli", "--seed", "0",
                    "--source", json.dumps({"kind": "tsv", "data_dir": str(REPO / "examples/demo/glue")}),
                    "--device", "cuda", "--out", str(tmp_path / "ft"), check=False)
    assert proc.returncode == 2 and "tacl: error: a GPU was asked for" in proc.stderr
    assert not (tmp_path / "ft").exists()

    proc = run_tacl("doctor", "--device", "cuda", check=False)
    assert proc.returncode == 1 and "problem: a GPU was asked for" in proc.stdout
    assert json.loads(proc.stdout[: proc.stdout.rindex("}") + 1])["gpus"] == 0
