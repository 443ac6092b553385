"""One machine with several GPUs and no scheduler (profiles/workstation): which GPUs the workflow's jobs
share, and for each GPU job GPUs that no other running job has.

The workflow finds the GPUs once (`machine_gpus`: the config's `gpus`, `auto` = CUDA_VISIBLE_DEVICES if set,
else every GPU `nvidia-smi -L` lists), tells Snakemake how many there are (its `gpu` resource, so that it
starts no more GPU jobs than fit) and exports them to every job as TACL_GPUS. A job that needs GPUs (a
pretraining chunk: its ranks; a fine-tune or analysis job: one) takes them with `claim_gpus` before it
touches CUDA: an exclusive lock (flock) on one file per GPU in TACL_GPU_LOCKS (default /tmp/tacl-gpu-locks,
shared by every workflow on the machine), held until the job's process exits (across torchrun's exec too),
and sets CUDA_VISIBLE_DEVICES to them. When fewer are free than it needs (another workflow on the machine
uses them) it waits, saying so in its log, and holds none meanwhile.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import logging
import os
import shutil
import subprocess
import time
from pathlib import Path

from tacl.runtime.device import visible_gpus
from tacl.runtime.io import InputError

log = logging.getLogger("tacl.cluster.workstation")
DEFAULT_LOCKS = "/tmp/tacl-gpu-locks"
_held: list[int] = []  # the lock files' descriptors: held for the life of the process


def listed_gpus() -> list[str]:
    """The GPU indices `nvidia-smi -L` lists ("GPU 0: NVIDIA ... (UUID: ...)" lines)."""
    if shutil.which("nvidia-smi") is None:
        raise InputError("gpus: auto, but nvidia-smi is not installed here to list the GPUs; set gpus to their "
                         "number (or a list of their indices)")
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired:
        raise InputError("gpus: auto, but `nvidia-smi -L` did not answer within 60 s; set gpus to their number") \
            from None
    gpus = [line.split(":")[0].split()[1] for line in out.stdout.splitlines() if line.startswith("GPU ")]
    if out.returncode != 0 or not gpus:
        raise InputError(f"gpus: auto, but `nvidia-smi -L` lists no GPU (exit {out.returncode}: "
                         f"{(out.stderr or out.stdout).strip()[:200]}); set gpus, or use profiles/local")
    return gpus


def machine_gpus(setting: str | int | list | None) -> list[str] | None:
    """The GPUs the jobs share, from the config's `gpus`: None (no workstation), `auto`, a number N (GPUs
    0..N-1) or a list of indices or UUIDs. `auto` takes CUDA_VISIBLE_DEVICES when it is set."""
    if setting is None:
        return None
    if setting == "auto":
        return visible_gpus(os.environ.get("CUDA_VISIBLE_DEVICES")) or listed_gpus()
    if isinstance(setting, int):
        return [str(i) for i in range(setting)]
    return [str(g) for g in setting]


def claim_gpus(n: int, gpus: list[str], lock_dir: str | os.PathLike = DEFAULT_LOCKS, poll_s: float = 1.0,
               inheritable: bool = False) -> list[str]:
    """Take `n` of `gpus` that no other job holds (waiting while fewer are free), set CUDA_VISIBLE_DEVICES to
    them and return them. `inheritable`: the locks survive an exec (torchrun started in this process's place)."""
    if n > len(gpus):
        raise InputError(f"this job needs {n} GPUs, but the workflow shares {len(gpus)} ({','.join(gpus)}): "
                         "set pretrain.ranks_per_node to at most that")
    folder = Path(lock_dir)
    folder.mkdir(parents=True, exist_ok=True)
    try:
        folder.chmod(0o1777)  # (other users' workflows on the machine share the GPUs and these locks)
    except PermissionError:
        pass
    waited = None
    while True:
        taken: list[tuple[str, int]] = []
        for gpu in gpus:
            fd = os.open(folder / f"gpu-{gpu}.lock", os.O_RDONLY | os.O_CREAT, 0o666)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            taken.append((gpu, fd))
            if len(taken) == n:
                break
        if len(taken) == n:
            break
        for _, fd in taken:  # hold none while waiting: two jobs never keep each other waiting
            os.close(fd)
        if waited is None:
            waited = time.time()
            log.info("waiting for %d free GPU(s) of %s (held by other jobs; locks in %s)", n, ",".join(gpus), folder)
        time.sleep(poll_s)
    for _, fd in taken:
        os.set_inheritable(fd, inheritable)
        _held.append(fd)
    mine = [gpu for gpu, _ in taken]
    os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(mine)
    log.info("GPU(s) %s for this job (CUDA_VISIBLE_DEVICES=%s, of %s%s)", ",".join(mine), ",".join(mine),
             ",".join(gpus), f"; waited {time.time() - waited:.0f} s" if waited else "")
    return mine


def gpus_needed(stage: str, command: str | None, nproc: int = 1, device: str | None = "auto") -> int:
    """GPUs a job of `tacl STAGE COMMAND` takes: a pretraining chunk one per rank on the node, a fine-tune or
    an analysis of a model one, none with `device: cpu` or for every other command."""
    if device == "cpu":
        return 0
    if (stage, command) == ("pretrain", "train"):
        return nproc
    if (stage, command) in (("finetune", "glue"), ("finetune", "squad"), ("finetune", "ner"),
                            ("analysis", "similarity"), ("analysis", "embeddings")):
        return 1
    return 0


def job_device(args: argparse.Namespace) -> str | None:
    """The `device` a command was given (`--device`, or a pretraining chunk's settings), None if none."""
    if getattr(args, "device", None):
        return args.device
    for given in (getattr(args, "operational", None), getattr(args, "settings", None)):
        try:
            device = json.loads(given).get("device") if given else None
        except (ValueError, AttributeError):
            device = None  # (the command itself names what is wrong with it)
        if device:
            return device
    return None


def claim_for_job(args: argparse.Namespace) -> list[str] | None:
    """In a job of the workstation profile (TACL_GPUS set by the workflow): `claim_gpus` for this command,
    once (TACL_GPUS is dropped, so that the processes it starts do not claim again). None elsewhere."""
    if not os.environ.get("TACL_GPUS"):
        return None
    nproc = getattr(args, "nproc", 1)
    n = gpus_needed(args.stage, getattr(args, "command", None), nproc, job_device(args))
    if n < 1:
        return None
    shared = os.environ.pop("TACL_GPUS").split(",")
    # a chunk of several ranks execs torchrun in its place: the locks must survive the exec
    return claim_gpus(n, shared, os.environ.get("TACL_GPU_LOCKS") or DEFAULT_LOCKS, inheritable=nproc > 1)
