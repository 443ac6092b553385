"""Process-group set-up from the launcher's environment: torchrun (RANK, WORLD_SIZE, LOCAL_RANK,
MASTER_ADDR, MASTER_PORT), a SLURM step (srun: SLURM_PROCID, SLURM_NTASKS, ...), or a single process."""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from tacl.device import resolve_device


@dataclass(frozen=True)
class DistEnv:
    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    control: Any = None  # a gloo group for the trainer's small CPU collectives (None: the default group)

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _slurm_env() -> None:
    """Fill torchrun's variables from a SLURM step with several tasks (srun), without ssh or pdsh."""
    if "RANK" in os.environ or int(os.environ.get("SLURM_NTASKS", "1")) <= 1 or "SLURM_PROCID" not in os.environ:
        return
    from submitit.helpers import TorchDistributedEnvironment

    os.environ.setdefault("SUBMITIT_EXECUTOR", "slurm")  # how submitit knows it runs inside SLURM
    env = TorchDistributedEnvironment()
    env.export(set_cuda_visible_devices=False)


def init_distributed(device: str = "auto") -> DistEnv:
    """Join the process group on this rank's device: `device` is the config's (auto | cuda | cpu); a rank
    that was asked for a GPU and has none stops here (tacl.device.DeviceError), before any other work."""
    _slurm_env()
    os.environ.setdefault("RANK", "0")
    os.environ.setdefault("WORLD_SIZE", "1")
    os.environ.setdefault("LOCAL_RANK", "0")
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    if "MASTER_PORT" not in os.environ:
        os.environ["MASTER_PORT"] = str(free_port())
    rank, world, local = (int(os.environ[k]) for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK"))
    where = resolve_device(device, local)
    backend = "nccl" if where.type == "cuda" else "gloo"
    if where.type == "cuda":
        torch.cuda.set_device(where)
    if not dist.is_initialized():
        dist.init_process_group(backend, rank=rank, world_size=world)
    # Stop flags and logged numbers travel on the CPU: an NCCL collective read back on the host would
    # be a host-device synchronisation every step.
    control = dist.new_group(backend="gloo") if backend == "nccl" else None
    return DistEnv(rank, world, local, where, control)


def barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


def shutdown() -> None:
    """barrier + destroy, or an occasional SIGABRT at exit (DESIGN.md section 7)."""
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def _all_reduce(values: list[float], op: Any, group: Any) -> list[float]:
    t = torch.tensor(values, dtype=torch.float64)
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(t, op=op, group=group)
    return t.tolist()


def all_max(values: list[float], env: DistEnv) -> list[float]:
    return _all_reduce(values, dist.ReduceOp.MAX, env.control)


def all_sum(values: list[float], env: DistEnv) -> list[float]:
    return _all_reduce(values, dist.ReduceOp.SUM, env.control)


def broadcast_object(obj, src: int = 0):
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=src)
    return box[0]
