"""Process-group set-up from the launcher's environment: torchrun (RANK, WORLD_SIZE, LOCAL_RANK,
MASTER_ADDR, MASTER_PORT), a SLURM step (srun: SLURM_PROCID, SLURM_NTASKS, ...), or a single process."""

from __future__ import annotations

import os
import socket
import sys
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from tacl.runtime.device import resolve_device
from tacl.runtime.io import InputError


# imported by DeepSpeed at its own import for a feature no chunk uses (its autotuner's MLflow runs): 2.5 s of
# every rank's start
_UNUSED_BY_DEEPSPEED = ("mlflow",)


def import_deepspeed() -> Any:
    """DeepSpeed, imported without the packages of _UNUSED_BY_DEEPSPEED (hidden while it imports, so its optional
    imports fail and it goes without them). A package already imported stays as it is, and one hidden here
    imports as usual afterwards (a run tracked with MLflow: tacl.runtime.tracking). Once DeepSpeed is imported,
    nothing is hidden again (another thread may be importing MLflow then)."""
    if "deepspeed" in sys.modules:
        return sys.modules["deepspeed"]
    hidden = [name for name in _UNUSED_BY_DEEPSPEED if name not in sys.modules]
    sys.modules.update(dict.fromkeys(hidden))  # a None entry: `import name` raises ImportError
    try:
        import deepspeed
    finally:
        for name in hidden:
            if sys.modules.get(name, False) is None:
                del sys.modules[name]
    return deepspeed


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


def _address(host: str) -> str | None:
    try:
        return socket.gethostbyname(host)
    except OSError:
        return None


def _loopback(address: str | None) -> bool:
    import ipaddress

    try:
        return address is not None and ipaddress.ip_address(address).is_loopback
    except ValueError:
        return False


def interface_addresses() -> dict[str, str]:
    """The IPv4 address of each network interface of this (Linux) host that has one."""
    import fcntl
    import struct

    out = {}
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for _, name in socket.if_nameindex():
            try:  # SIOCGIFADDR
                packed = fcntl.ioctl(s.fileno(), 0x8915, struct.pack("256s", name.encode()[:15]))
            except OSError:
                continue
            out[name] = socket.inet_ntoa(packed[20:24])
    return out


def route_address(master: str) -> str | None:
    """This host's address on the route to `master` (connecting a UDP socket sends nothing)."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((master, 9))
            return s.getsockname()[0]
    except OSError:
        return None


def gloo_interface(host: str, host_address: str | None, master_address: str | None, route: str | None,
                   interfaces: dict[str, str]) -> str:
    """The interface gloo must bind to on a run across nodes whose host name resolves to a loopback address
    (gloo binds to that address, which the other nodes cannot reach): the one on the route to the master,
    or, where that cannot be told (this is the master's node), an InputError asking for GLOO_SOCKET_IFNAME."""
    chosen = next((name for name, a in interfaces.items() if a == route), None)
    if master_address is not None and not _loopback(master_address) and chosen is not None:
        return chosen
    listed = ", ".join(f"{n} {a}" for n, a in interfaces.items() if not _loopback(a)) or "none"
    raise InputError(f"this host's name ({host}) resolves to {host_address or 'no address'}, where gloo would "
                     "listen and the other nodes could not reach it: set GLOO_SOCKET_IFNAME to the network "
                     f"interface the nodes reach each other on (this host has: {listed})")


def configure_gloo(environ: dict[str, str] | None = None) -> str | None:
    """Set GLOO_SOCKET_IFNAME for a run across nodes (WORLD_SIZE > LOCAL_WORLD_SIZE) when it is unset and
    this host's name resolves to a loopback address; returns the interface chosen, if any."""
    env = os.environ if environ is None else environ
    world, local = int(env.get("WORLD_SIZE", "1")), int(env.get("LOCAL_WORLD_SIZE", env.get("WORLD_SIZE", "1")))
    if env.get("GLOO_SOCKET_IFNAME") or world <= local:
        return None
    host = socket.gethostname()
    host_address = _address(host)
    if host_address is not None and not _loopback(host_address):
        return None
    master = _address(env.get("MASTER_ADDR", "127.0.0.1"))
    name = gloo_interface(host, host_address, master, route_address(master) if master else None,
                          interface_addresses())
    env["GLOO_SOCKET_IFNAME"] = name
    return name


def init_distributed(device: str = "auto") -> DistEnv:
    """Join the process group on this rank's device: `device` is the config's (auto | cuda | cpu); a rank
    that was asked for a GPU and has none stops here (tacl.runtime.device.DeviceError), before any other work."""
    _slurm_env()
    os.environ.setdefault("RANK", "0")
    os.environ.setdefault("WORLD_SIZE", "1")
    os.environ.setdefault("LOCAL_RANK", "0")
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    if "MASTER_PORT" not in os.environ:
        os.environ["MASTER_PORT"] = str(free_port())
    rank, world, local = (int(os.environ[k]) for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK"))
    where = resolve_device(device, local)
    configure_gloo()  # (the trainer's control group, and every group on CPUs, use gloo)
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


def shutdown(failed: bool = False) -> None:
    """barrier + destroy, or an occasional SIGABRT at exit (docs/development.md). A rank that `failed` (an
    error that the others may not share) skips the barrier: it would wait for ranks that sit in another
    collective, and the job would hang until its time limit instead of ending (torchrun and srun end the other
    ranks once one exits with an error)."""
    if dist.is_initialized():
        if not failed:
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
