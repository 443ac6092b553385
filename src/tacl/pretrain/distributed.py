"""Process-group set-up from the launcher's environment: torchrun (RANK, WORLD_SIZE, LOCAL_RANK,
MASTER_ADDR, MASTER_PORT), a SLURM step (srun: SLURM_PROCID, SLURM_NTASKS, ...), or a single process."""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class DistEnv:
    rank: int
    world_size: int
    local_rank: int
    device: torch.device

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


def init_distributed() -> DistEnv:
    _slurm_env()
    os.environ.setdefault("RANK", "0")
    os.environ.setdefault("WORLD_SIZE", "1")
    os.environ.setdefault("LOCAL_RANK", "0")
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    if "MASTER_PORT" not in os.environ:
        os.environ["MASTER_PORT"] = str(free_port())
    rank, world, local = (int(os.environ[k]) for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK"))
    if torch.cuda.is_available():
        device = torch.device("cuda", local)
        torch.cuda.set_device(device)
        backend = "nccl"
    else:
        device = torch.device("cpu")
        backend = "gloo"
    if not dist.is_initialized():
        dist.init_process_group(backend, rank=rank, world_size=world)
    return DistEnv(rank, world, local, device)


def barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


def shutdown() -> None:
    """barrier + destroy, or an occasional SIGABRT at exit (DESIGN.md section 7)."""
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def all_max(values: list[float], device: torch.device) -> list[float]:
    t = torch.tensor(values, dtype=torch.float64, device=device)
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.tolist()


def all_mean(values: list[float], device: torch.device) -> list[float]:
    t = torch.tensor(values, dtype=torch.float64, device=device)
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(t)
        t /= dist.get_world_size()
    return t.tolist()


def broadcast_object(obj, src: int = 0):
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=src)
    return box[0]
