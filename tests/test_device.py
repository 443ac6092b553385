"""The device contract: a job that asked for a GPU and sees none stops at once, naming what it saw."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest
import torch

from conftest import REPO, run_tacl
from tacl.runtime.device import DeviceError, device_info, gpu_request, resolve_device
from tacl.runtime.io import InputError


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
    # "within seconds", against this machine's speed now: the trainer's imports in a fresh process, timed here
    t0 = time.time()
    subprocess.run([sys.executable, "-c", "import tacl.cli, tacl.pretrain.trainer"], check=True)
    imports = time.time() - t0
    t0 = time.time()
    proc = run_tacl("pretrain", "train", "--run-dir", str(tmp_path / "run"), "--start-model", str(demo_data["start"]),
                    "--manifest", str(demo_data["manifest"]), "--settings", json.dumps(settings), check=False)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert time.time() - t0 < 2 * imports + 10, (time.time() - t0, imports)
    assert proc.stderr.count("tacl: error: a GPU was asked for (device: cuda in the config)") == 1
    assert "CUDA_VISIBLE_DEVICES=" in proc.stderr and "built for CUDA" in proc.stderr
    assert not (tmp_path / "run").exists(), "stopped before it took the run directory (and loaded anything)"

    proc = run_tacl("finetune", "glue", "--model", str(demo_data["start"]), "--task", "qnli", "--seed", "0",
                    "--source", json.dumps({"kind": "tsv", "data_dir": str(REPO / "examples/demo/glue")}),
                    "--device", "cuda", "--out", str(tmp_path / "ft"), check=False)
    assert proc.returncode == 2 and "tacl: error: a GPU was asked for" in proc.stderr
    assert not (tmp_path / "ft").exists()

    proc = run_tacl("doctor", "--device", "cuda", check=False)
    assert proc.returncode == 1 and "problem: a GPU was asked for" in proc.stdout
    assert json.loads(proc.stdout[: proc.stdout.rindex("}") + 1])["gpus"] == 0


def test_doctor_names_what_compile_and_transformers_need(monkeypatch, tmp_path):
    """With --compile: a C compiler and the Python headers (and Triton where a GPU is used) or one problem
    naming each missing piece; a transformers older than 5 is a problem whether compiling or not."""
    import sysconfig

    from tacl.runtime import device

    assert device.doctor("cpu", compile=True)[1] == []  # this machine: cc and Python.h, no GPU so no Triton
    monkeypatch.setenv("PATH", str(tmp_path))  # no compiler on PATH
    monkeypatch.delenv("CC", raising=False)
    monkeypatch.setattr(sysconfig, "get_paths", lambda: {"include": str(tmp_path / "include")})
    facts, problems = device.doctor("cpu", compile=True)
    assert facts["compile"]["c_compiler"] is None and facts["compile"]["python_headers"] is None
    assert len(problems) == 1 and "torch.compile (pretrain.compile) needs a C compiler" in problems[0]
    assert "the Python headers" in problems[0] and "Triton" not in problems[0]
    assert device.doctor("cpu", compile=False)[1] == [], "without --compile the tool chain is only reported"
    monkeypatch.setattr(device, "cuda_problem", lambda: None)  # a GPU is in use: Triton too
    monkeypatch.setattr(device, "device_info", lambda d: {"gpus": 1, "gpu": "H100", "bf16": True})
    monkeypatch.setattr(device, "compile_toolchain",
                        lambda: {"triton": None, "c_compiler": "/usr/bin/cc", "python_headers": "/p/Python.h"})
    monkeypatch.setattr(device, "transformers_version", lambda: "4.57.1")
    problems = device.doctor("cuda", compile=True)[1]
    assert any(p.startswith("transformers 4.57.1: the code needs transformers 5.x") for p in problems)
    assert any("needs Triton (pip package triton" in p and "C compiler" not in p for p in problems)


def test_a_rank_that_sees_only_its_own_gpu_uses_it(monkeypatch):
    """A site that binds one GPU per task (--gpus-per-task=1, --gpu-bind=single) shows each rank one device:
    ranks 1..3 use cuda:0 instead of stopping; with every GPU visible, rank r uses GPU r."""
    from tacl.runtime.device import rank_gpu

    assert [rank_gpu(r, 1) for r in range(4)] == [0, 0, 0, 0]
    assert [rank_gpu(r, 4) for r in range(4)] == [0, 1, 2, 3]
    assert rank_gpu(3, 2) == "rank 3 on this node needs GPU 3, 2 visible"
    monkeypatch.setattr("tacl.runtime.device.cuda_problem", lambda: None)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert resolve_device("cuda", local_rank=3) == torch.device("cuda", 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert resolve_device("cuda", local_rank=1) == torch.device("cuda", 1)
    with pytest.raises(DeviceError, match="rank 3 on this node needs GPU 3, 2 visible"):
        resolve_device("cuda", local_rank=3)


def test_dense_bf16_peak_by_exact_model():
    """Names as torch.cuda.get_device_name() gives them; a model not known exactly has no peak (and no MFU)."""
    from tacl.runtime.device import dense_bf16_peak

    peaks = {"NVIDIA A100-SXM4-40GB": 312, "NVIDIA A100 80GB PCIe": 312, "NVIDIA H100 80GB HBM3": 989,
             "NVIDIA H100 PCIe": 756, "NVIDIA H100 NVL": 835, "NVIDIA H200": 989, "NVIDIA GH200 480GB": 989,
             "NVIDIA H100": None, "NVIDIA H200 NVL": None, "NVIDIA L40S": None, "Tesla V100-SXM2-32GB": None}
    assert {name: dense_bf16_peak(name) and dense_bf16_peak(name) / 1e12 for name in peaks} == peaks


def test_gloo_interface_across_nodes(monkeypatch):
    """gloo listens on the address the host name resolves to; where that is loopback (Debian's 127.0.1.1) and
    the run spans nodes, the interface on the route to the master is chosen, or the run stops naming
    GLOO_SOCKET_IFNAME."""
    from tacl.pretrain import distributed
    from tacl.pretrain.distributed import configure_gloo, gloo_interface

    assert distributed.interface_addresses()["lo"] == "127.0.0.1"  # this machine's own, read from the kernel
    interfaces = {"lo": "127.0.0.1", "eth0": "10.0.0.5", "ib0": "192.168.1.5"}
    assert gloo_interface("n1", "127.0.1.1", "192.168.1.2", "192.168.1.5", interfaces) == "ib0"
    with pytest.raises(InputError, match=r"this host's name \(n0\) resolves to 127.0.1.1, .* set GLOO_SOCKET_IFNAME "
                                         r"to the network interface .* \(this host has: eth0 10.0.0.5, ib0 "
                                         r"192.168.1.5\)"):
        gloo_interface("n0", "127.0.1.1", "127.0.1.1", "127.0.0.1", interfaces)  # the master's own node
    monkeypatch.setattr(distributed, "_address", lambda host: {"MASTER": "192.168.1.2"}.get(host, "127.0.1.1"))
    monkeypatch.setattr(distributed, "route_address", lambda master: "192.168.1.5")
    monkeypatch.setattr(distributed, "interface_addresses", lambda: interfaces)
    env = {"WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "4", "MASTER_ADDR": "MASTER"}
    assert configure_gloo(env) == "ib0" and env["GLOO_SOCKET_IFNAME"] == "ib0"
    assert configure_gloo({**env, "GLOO_SOCKET_IFNAME": "eth0"}) is None  # the user's choice stands
    assert configure_gloo({**env, "LOCAL_WORLD_SIZE": "8"}) is None  # one node: loopback is fine
    monkeypatch.setattr(distributed, "_address", lambda host: "10.0.0.5")
    assert configure_gloo(dict(env)) is None  # the host name resolves to a reachable address
