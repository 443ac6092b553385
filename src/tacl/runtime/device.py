"""Which device a job runs on, and the contract that a job which asked for a GPU never runs on the CPU.

A GPU was asked for when the config says `device: cuda` (the paper config does), or when the scheduler gave the
job GPUs (SLURM's SLURM_GPUS_ON_NODE / SLURM_JOB_GPUS / SLURM_STEP_GPUS, or TACL_REQUIRE_GPU=1, which a
profile can set for its GPU rules). Such a job that sees no usable GPU stops at once with one message naming
what it saw (CUDA_VISIBLE_DEVICES, the torch build's CUDA version, the CUDA error) instead of training on the
CPU for a whole day. `tacl doctor` prints the same facts on a login or compute node and says what is wrong,
including, with `--compile`, what torch.compile needs on the node (Triton for a GPU, a C compiler, the Python
headers), and a transformers older than the code needs.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tacl.runtime.io import InputError

if TYPE_CHECKING:
    import torch

DEVICES = ("auto", "cuda", "cpu")
TRANSFORMERS_MAJOR = 5  # every padded forward passes a 4-D boolean attention mask, which transformers 4.x refuses
_SCHEDULER_GPU_VARS = ("SLURM_GPUS_ON_NODE", "SLURM_JOB_GPUS", "SLURM_STEP_GPUS", "SLURM_GPUS")


class DeviceError(InputError):
    """A GPU was asked for and none is usable (exit status 2, like every bad input)."""


# GPU compute modes, NVML's numbers (nvmlDeviceGetComputeMode) and nvidia-smi's names: Default lets any number
# of processes use the GPU; Exclusive_Process one at a time (a second cannot create a CUDA context: "CUDA-capable
# device(s) is/are busy or unavailable"; MPS lets several share it there); Prohibited none; Exclusive_Thread is
# the old name of one at a time, gone from recent drivers.
COMPUTE_MODES = {0: "Default", 1: "Exclusive_Thread", 2: "Prohibited", 3: "Exclusive_Process"}
MODE_MEANINGS = {"Default": "any number of processes", "Exclusive_Process": "one process at a time",
                 "Exclusive_Thread": "one process at a time", "Prohibited": "no process at all"}
ONE_PROCESS_MODES = ("Exclusive_Process", "Exclusive_Thread", "Prohibited")  # (seeds side by side: never)
EXIT_GPU_UNAVAILABLE = 4  # the exit status of a job whose GPU is there but will not take this process
_BUSY = "busy or unavailable"  # CUDA's words when a compute mode turns a process away (cudaErrorDevicesUnavailable)


class GpuUnavailable(DeviceError):
    """The GPU is there, but this process cannot open it: its compute mode admits no more processes (another
    holds it), or none. Exit status EXIT_GPU_UNAVAILABLE, not 2: a job of seeds side by side tells it from a
    seed refused for bad input. `mode`: the GPU's compute mode, None where unknown."""

    exit_status = EXIT_GPU_UNAVAILABLE

    def __init__(self, message: str, mode: str | None = None):
        super().__init__(message)
        self.mode = mode


def gpu_request(requested: str, environ: dict[str, str] | None = None) -> str | None:
    """Why this job must run on a GPU (a short phrase), or None when the CPU is allowed."""
    env = os.environ if environ is None else environ
    if requested not in DEVICES:
        raise InputError(f"device: {requested!r} is not one of {', '.join(DEVICES)}")
    if requested == "cuda":
        return "device: cuda in the config"
    if requested == "cpu":
        return None
    if env.get("TACL_REQUIRE_GPU") == "1":
        return "TACL_REQUIRE_GPU=1"
    for var in _SCHEDULER_GPU_VARS:
        value = env.get(var, "").strip()
        if value and value not in ("0", "(null)", "N/A"):
            return f"the scheduler gave this job GPUs ({var}={value})"
    return None


def cuda_problem() -> str | None:
    """None when CUDA works; else what torch says is wrong (CPU build, no driver, driver too old, ...)."""
    import torch

    if torch.version.cuda is None:
        return f"this torch ({torch.__version__}) is a CPU-only build"
    try:
        torch.cuda.init()
    except Exception as e:  # torch raises RuntimeError/AssertionError with the driver's own words
        return f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else e!r}"
    if torch.cuda.device_count() == 0:
        return "torch.cuda.device_count() is 0"
    return None


def rank_gpu(local_rank: int, visible: int) -> int | str:
    """The index of this rank's GPU among the `visible` ones, or why there is none: GPU <local_rank> when the
    node's GPUs are all visible, GPU 0 when exactly one is (a site that binds one GPU per task, e.g.
    `--gpus-per-task=1` or `--gpu-bind=single`, shows each rank only its own)."""
    if visible == 1:
        return 0
    if local_rank < visible:
        return local_rank
    return f"rank {local_rank} on this node needs GPU {local_rank}, {visible} visible"


def resolve_device(requested: str = "auto", local_rank: int = 0) -> torch.device:
    """The device of this process: its GPU (`rank_gpu`) where a GPU is usable, else the CPU, unless a GPU was
    asked for: then DeviceError, naming what this process saw."""
    import torch

    reason = gpu_request(requested)
    if requested == "cpu":
        return torch.device("cpu")
    problem = cuda_problem()
    if problem is None:
        index = rank_gpu(local_rank, torch.cuda.device_count())
        if isinstance(index, int):
            return torch.device("cuda", index)
        problem = index
    if _BUSY in problem:  # (a GPU that is there but taken: never the CPU instead)
        raise gpu_unavailable(torch.device("cuda", local_rank), problem)
    if reason:
        raise DeviceError(f"a GPU was asked for ({reason}) but none is usable: {problem}; "
                          f"CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', '(unset)')}, "
                          f"torch {torch.__version__} built for CUDA {torch.version.cuda}. "
                          "Run `tacl doctor` on this node for details.")
    return torch.device("cpu")


def open_gpu(device: torch.device) -> None:
    """Open `device` now (this process's CUDA context; nothing on a CPU), before any work: a GPU that will not
    take this process (its compute mode) stops the job here, GpuUnavailable naming the mode. Only a process
    that computes on the GPU calls it: a context held elsewhere (a job's parent process that only starts
    others) would keep its children off an Exclusive_Process GPU."""
    if device.type != "cuda":
        return
    try:
        _create_context(device)
    except RuntimeError as e:  # (torch's AcceleratorError is one)
        words = str(e).strip().splitlines()[0] if str(e).strip() else repr(e)
        raise gpu_unavailable(device, f"{type(e).__name__}: {words}") from e


def _create_context(device: torch.device) -> None:
    import torch

    torch.empty(1, device=device)  # (the first allocation creates the context)


def gpu_unavailable(device: torch.device, error: str) -> GpuUnavailable:
    """GpuUnavailable for `device`, whose opening failed with `error`: one line naming the GPU's compute mode."""
    mode = gpu_compute_mode(device)
    if mode is None:
        what = "not known (neither NVML nor nvidia-smi answered)"
    else:
        held = ", and another process holds it: `nvidia-smi` names it" if "Exclusive" in mode else ""
        what = f"{mode} ({MODE_MEANINGS.get(mode, 'a mode this code does not know')}{held})"
    return GpuUnavailable(f"cannot open the GPU ({device}, CUDA_VISIBLE_DEVICES="
                          f"{os.environ.get('CUDA_VISIBLE_DEVICES', '(unset)')}): {error}; its compute mode is {what}",
                          mode)


def gpu_compute_mode(device: torch.device | str) -> str | None:
    """The compute mode of `device`'s GPU as nvidia-smi names it (Default, Exclusive_Process, Prohibited):
    NVML's answer (pynvml, from the nvidia-ml-py package), else `nvidia-smi --query-gpu=uuid,compute_mode`;
    the GPU found by its UUID (torch's), or, where that is not known, the mode that every GPU of the node
    has. None where neither answers, or the node's GPUs differ and the UUID is not known. Opens no CUDA
    context (NVML and nvidia-smi do not, nor does reading the UUID)."""
    modes = _nvml_modes()
    if modes is None:
        modes = _smi_modes()
    if not modes:
        return None
    uuid = _gpu_uuid(device)
    if uuid in modes:
        return modes[uuid]
    found = set(modes.values())
    return found.pop() if len(found) == 1 else None


def _uuid_key(text: str) -> str:
    """A GPU's UUID as NVML ("GPU-8f6c...") and torch ("8f6c...") write it, in one form."""
    text = text.strip().lower()
    return text[4:] if text.startswith("gpu-") else text


def _gpu_uuid(device: torch.device | str) -> str | None:
    try:
        import torch

        index = torch.device(device).index or 0
        return _uuid_key(str(torch.cuda.get_device_properties(index).uuid))
    except Exception:  # noqa: BLE001 (no CUDA, an older torch: the UUID is not known)
        return None


def _nvml_modes() -> dict[str, str] | None:
    """{UUID: compute mode} of every GPU NVML shows; None without pynvml or a driver that answers."""
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except Exception:  # noqa: BLE001 (NVMLError: no driver, no library)
        return None
    try:
        modes = {}
        for i in range(pynvml.nvmlDeviceGetCount()):
            try:
                handle = pynvml.nvmlDeviceGetHandleByIndex(i)
                uuid, mode = pynvml.nvmlDeviceGetUUID(handle), pynvml.nvmlDeviceGetComputeMode(handle)
            except Exception:  # noqa: BLE001 (a GPU this job may not see)
                continue
            modes[_uuid_key(uuid.decode() if isinstance(uuid, bytes) else uuid)] = COMPUTE_MODES.get(mode, str(mode))
        return modes
    except Exception:  # noqa: BLE001
        return None
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:  # noqa: BLE001
            pass


def _smi_modes() -> dict[str, str] | None:
    """{UUID: compute mode} from nvidia-smi; None where it is not there or fails."""
    if shutil.which("nvidia-smi") is None:
        return None
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=uuid,compute_mode", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0:
        return None
    pairs = [line.split(",", 1) for line in out.stdout.splitlines() if "," in line]
    return {_uuid_key(uuid): mode.strip() for uuid, mode in pairs if mode.strip()} or None


def gpu_memory_gib(device: torch.device) -> float | None:
    """The GPU's memory in GiB (None on a CPU)."""
    import torch

    if device.type != "cuda":
        return None
    return torch.cuda.get_device_properties(device.index or 0).total_memory / 2**30


def computes_bf16(precision: str, device: str) -> bool:
    """Whether a run computes in bf16 (pretraining, fine-tuning, the plan): precision bf16, or auto on a GPU
    (`device` cuda, or auto, which finds one on a GPU node; a job's resolved device type is cuda or cpu)."""
    return precision == "bf16" or (precision == "auto" and device != "cpu")


def fast_fp32_matmul(device: torch.device) -> None:
    """On a GPU, fp32 matmuls (the contrastive losses' similarity matrices, fine-tuning in fp32) run on the
    tensor cores in TF32 (10-bit mantissa, fp32 range and accumulation), as PyTorch did by default from 1.7
    to 1.11, the reference's time; PyTorch >= 1.12 computes them in full fp32, about 8x slower on an A100.
    The CPU is left alone."""
    import torch

    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True


# Dense (no sparsity) bf16 tensor-core peaks in TFLOP/s, by the model in the device name (NVIDIA's data sheets).
# Order matters: the specific names first. A GPU not listed has no known peak (no MFU is computed for it).
BF16_PEAKS = (("H100 NVL", 835.0), ("H100 PCIe", 756.0), ("H100 SXM", 989.0), ("H100 80GB HBM3", 989.0),
              ("GH200", 989.0), ("H200 NVL", None), ("H200", 989.0), ("A100", 312.0))


def dense_bf16_peak(gpu_name: str) -> float | None:
    """The GPU's dense bf16 peak in FLOP/s from its exact model (`torch.cuda.get_device_name()`), or None when
    the model is not known exactly (e.g. an H100 whose name says neither SXM, PCIe nor NVL)."""
    for model, peak in BF16_PEAKS:
        if model in gpu_name:
            return None if peak is None else peak * 1e12
    return None


def _driver_version() -> str | None:
    if shutil.which("nvidia-smi") is None:
        return None
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.splitlines()[0].strip() if out.returncode == 0 and out.stdout.strip() else None


def device_info(device: torch.device | None = None) -> dict[str, Any]:
    """What a job ran on: GPU model and count, torch, CUDA, NCCL, driver (for markers and metrics files)."""
    import torch

    info: dict[str, Any] = {"device": str(device) if device is not None else None, "host": platform.node(),
                            "torch": torch.__version__, "cuda": torch.version.cuda,
                            "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES")}
    if device is not None and device.type == "cpu":
        info.update(gpu=None, gpus=0, cpu_threads=torch.get_num_threads())
        return info
    if cuda_problem() is None:
        count = torch.cuda.device_count()
        props = torch.cuda.get_device_properties(device.index if device is not None and device.index is not None
                                                 else 0)
        nccl = torch.cuda.nccl.version() if hasattr(torch.cuda, "nccl") else None
        peak = dense_bf16_peak(props.name)
        info.update(gpu=props.name, gpus=count, gpu_memory_gib=round(props.total_memory / 2**30, 1),
                    bf16_peak_tflops=peak / 1e12 if peak else None,
                    capability=f"{props.major}.{props.minor}", bf16=torch.cuda.is_bf16_supported(),
                    nccl=".".join(map(str, nccl)) if isinstance(nccl, tuple) else nccl,
                    driver=_driver_version())
    else:
        info.update(gpu=None, gpus=0, cpu_threads=torch.get_num_threads())
    return info


def visible_gpus(value: str | None) -> list[str] | None:
    """CUDA_VISIBLE_DEVICES as its entries: indices ("0,1") or GPU / MIG UUIDs ("GPU-8f6c2a..,GPU-..", as PBS
    sets them on Supek; torch takes both); None when unset."""
    if value is None:
        return None
    return [entry.strip() for entry in value.split(",") if entry.strip()]


def compile_toolchain() -> dict[str, str | None]:
    """What torch.compile builds with on this node: Triton (its GPU kernels), a C compiler (Triton's launcher
    and the CPU's kernels: $CC, else cc, gcc or clang on PATH) and the Python headers (Python.h, both
    compile against it); each its version or path, None where missing."""
    import importlib.metadata

    try:
        triton = importlib.metadata.version("triton")
    except importlib.metadata.PackageNotFoundError:
        triton = None
    compiler = next((shutil.which(c) for c in (os.environ.get("CC"), "cc", "gcc", "clang") if c and shutil.which(c)),
                    None)
    headers = Path(sysconfig.get_paths()["include"]) / "Python.h"
    return {"triton": triton, "c_compiler": compiler, "python_headers": str(headers) if headers.is_file() else None}


def transformers_version() -> str | None:
    import importlib.metadata

    try:
        return importlib.metadata.version("transformers")
    except importlib.metadata.PackageNotFoundError:
        return None


def doctor(requested: str = "auto", compile: bool = False) -> tuple[dict[str, Any], list[str]]:
    """(facts, problems) for `tacl doctor`: device facts, and what would stop a GPU job here (`compile`:
    a job with pretrain.compile on)."""
    import torch

    reason = gpu_request(requested)
    problem = cuda_problem()
    facts = device_info(None if problem is None else torch.device("cpu"))
    facts["gpu_requested"] = reason
    facts["cuda_problem"] = problem
    facts["hf_offline"] = {k: os.environ.get(k) for k in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "HF_HOME")}
    facts["python"] = sys.version.split()[0]
    problems = []
    if reason and problem:
        problems.append(f"a GPU was asked for ({reason}) but none is usable: {problem}")
    visible = visible_gpus(os.environ.get("CUDA_VISIBLE_DEVICES"))
    if problem is None and visible is not None and len(visible) != facts["gpus"]:
        problems.append(f"CUDA_VISIBLE_DEVICES names {len(visible)} GPU(s) but torch sees {facts['gpus']}: an index "
                        "or UUID there is not a GPU of this node (CUDA stops at the first it cannot find)")
    if problem is None and not facts.get("bf16"):
        problems.append(f"{facts['gpu']} has no bf16: set pretrain.precision / finetune.precision to fp32")
    if torch.version.cuda and problem and "too old" in problem:
        problems.append("the NVIDIA driver is older than this torch build needs: install a torch build for "
                        "the driver's CUDA version (envs/requirements-cuda.txt says how)")
    facts["transformers"] = transformers_version()
    if facts["transformers"] is None or int(facts["transformers"].split(".")[0]) < TRANSFORMERS_MAJOR:
        problems.append(f"transformers {facts['transformers'] or '(not installed)'}: the code needs "
                        f"transformers {TRANSFORMERS_MAJOR}.x (envs/requirements-cuda.txt pins it; 4.x refuses the "
                        "4-D attention masks every forward passes, \"Wrong shape\")")
    facts["compile"] = compile_toolchain()
    if compile:
        tools = facts["compile"]
        gpu = problem is None or reason is not None
        missing = [what for what, have in (("Triton (pip package triton, for the GPU's kernels)",
                                            tools["triton"] or not gpu),
                                           ("a C compiler ($CC, cc, gcc or clang on PATH)", tools["c_compiler"]),
                                           (f"the Python headers (Python.h under {sysconfig.get_paths()['include']};"
                                            " a python3-dev / python3-devel package or a module that has them)",
                                            tools["python_headers"])) if not have]
        if missing:
            problems.append(f"torch.compile (pretrain.compile) needs {'; '.join(missing)}: load or install "
                            "them, or set pretrain.compile: false")
    return facts, problems


def register(commands: argparse._SubParsersAction) -> None:
    c = commands.add_parser("doctor", help="what device this node offers a job, and what is wrong with it")
    c.add_argument("--device", default="auto", choices=DEVICES,
                   help="what the job would ask for (cuda: fail unless a GPU is usable)")
    c.add_argument("--compile", action="store_true",
                   help="the job compiles (pretrain.compile): check Triton, a C compiler and the Python headers")
    c.set_defaults(func=_doctor)


def _doctor(a: argparse.Namespace) -> int:
    facts, problems = doctor(a.device, a.compile)
    print(json.dumps(facts, indent=2))
    for p in problems:
        print(f"problem: {p}")
    if not problems:
        print("ok: " + (f"{facts['gpus']} x {facts['gpu']}" if facts.get("gpus") else "CPU only"))
    return 1 if problems else 0
