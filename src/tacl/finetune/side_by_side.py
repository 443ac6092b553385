"""Several seeds of one fine-tuning setting at once on one GPU, each in a process of its own.

A fine-tune of BERT-base leaves its GPU idle most of each step: the step is short, and the host's Python
and kernel launches set its pace (docs/finetuning.md). A job of several seeds then trains
`finetune.seeds_per_gpu` of them at once, so that the GPU works while each process is on the host. Each
seed runs as the job of one seed would (`tacl finetune FAMILY ... --seed N --out SETTING/seedN`): its own
process, with its own share of the job's CPU cores (CPU affinity, and as many threads), its own lock,
given.json, checkpoint and metrics (tacl.finetune.seeds). A seed's results are what they are alone on the
same number of threads: nothing passes between the processes. The others wait for a free place; the job
writes its marker once every seed is done.

The job's signals (SIGTERM, SIGUSR1, SIGUSR2: the scheduler's warning before the time limit) go to every
seed that runs: each saves its checkpoint at its next step and stops; no seed starts after them, and the job
stops (exit status EXIT_STOPPED). Run again, every seed goes on from its checkpoint. A seed refused for bad
input (the seed is being trained by another process, say) stops the others the same way and the job fails
naming it; a seed that fails otherwise does not stop the others, and the job fails at the end naming it,
as one after the other (tacl.finetune.seeds.run_seeds).

Each seed reads the job's end time itself (the scheduler's job id is in its environment) and saves and stops
before it with time for every seed that saves at the same moment (tacl.finetune.resume.TimeLimit: its
command's `--seeds-per-gpu` says how many share the GPU); the job then says which seed stopped, and why.

Each seed's output lines go to the job's log, each line led by `[seed N]`.

`auto` (`seeds_per_gpu`): one on a CPU (a seed already uses every core it is given). On a GPU, as many as
fit: the job's CPU cores at CORES_PER_SEED each, the GPU's memory at the estimate of one seed's
(`seed_memory_gib`), at most MAX_AUTO, and spread evenly over the seeds (5 seeds at most 4 at a time: 3
and 2, not 4 and 1).
"""

from __future__ import annotations

import json
import logging
import math
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from tacl.finetune import EXIT_STOPPED, FAMILY_HPARAMS, Stopped
from tacl.finetune.seeds import METRICS, seeds_record
from tacl.io import InputError
from tacl.plan import Shape

log = logging.getLogger("tacl.finetune")

CORES_PER_SEED = 2  # one for the step's Python and kernel launches, one for batches, logging, the loader
MAX_AUTO = 4  # auto's ceiling until a GPU measurement of seeds side by side says more pay
CUDA_CONTEXT_GIB = 1.0  # a process's CUDA context and the allocator's slack, beside what `seed_memory_gib` counts
MEMORY_MARGIN = 1.5  # the memory estimate is a rough one: a seed counts 1.5x it
STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2)
POLL_S = 0.2


def seed_memory_gib(model_config: dict[str, Any], batch: int, max_len: int) -> float:
    """A rough estimate of one fine-tuning seed's GPU memory: fp32 weights, gradients and AdamW's two moments
    (16 bytes a parameter), the activations kept for the backward pass (per layer about 34 + 5 heads x
    length / hidden bytes per token and hidden unit, in 16 bits), and the CUDA context."""
    h = model_config.get("hidden_size", 768)
    layers = model_config.get("num_hidden_layers", 12)
    heads = model_config.get("num_attention_heads", 12)
    params = Shape(layers, h, model_config.get("intermediate_size", 4 * h),
                   model_config.get("vocab_size", 30522)).total
    activations = layers * batch * max_len * h * (34 + 5 * heads * max_len / h)
    return (16 * params + activations) / 2**30 + CUDA_CONTEXT_GIB


def job_cores() -> list[int]:
    """The CPU cores this job may run on (its affinity: what the scheduler gave it)."""
    return sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))


def auto_count(seeds: int, gpu_gib: float | None, cores: int, per_seed_gib: float) -> tuple[int, str]:
    """`seeds_per_gpu: auto`: how many of `seeds` train at once, and why (for the log)."""
    if gpu_gib is None:
        return 1, "auto: on a CPU, one seed at a time (each uses every core the job has)"
    by_cores = max(1, cores // CORES_PER_SEED)
    by_memory = max(1, int(gpu_gib // (MEMORY_MARGIN * per_seed_gib)))
    cap = min(seeds, by_cores, by_memory, MAX_AUTO)
    return evenly(seeds, cap), (f"auto: {cores} CPU cores at {CORES_PER_SEED} a seed, {gpu_gib:.0f} GiB of GPU "
                                f"memory at {MEMORY_MARGIN} x {per_seed_gib:.1f} GiB a seed, at most {MAX_AUTO}")


def most_at_once(requested: str, seeds: int, cpu: bool) -> int:
    """The most of a job's `seeds` that train at once (`finetune.seeds_per_gpu`): a number as given, at most
    the seeds; auto: one on a CPU, else MAX_AUTO spread evenly (the job's cores and its GPU's memory may allow
    fewer: `auto_count`). What the plan asks host memory for."""
    if requested != "auto":
        return min(int(requested), seeds)
    return 1 if cpu else evenly(seeds, MAX_AUTO)


def seeds_at_once(requested: str, seeds: int, device: Any, model_dir: str | Path, family: str,
                  hparams: dict[str, Any]) -> tuple[int, str]:
    """How many of a job's `seeds` train at once (`finetune.seeds_per_gpu`: a number, or auto), and why."""
    if requested != "auto":
        return most_at_once(requested, seeds, cpu=False), f"finetune.seeds_per_gpu: {requested}"
    from tacl.device import gpu_memory_gib

    gpu_gib = gpu_memory_gib(device)
    if gpu_gib is None:
        return auto_count(seeds, None, 0, 0.0)
    config = Path(model_dir) / "config.json"
    model_config = json.loads(config.read_text()) if config.is_file() else {}
    hp = {**FAMILY_HPARAMS[family], **hparams}
    return auto_count(seeds, gpu_gib, len(job_cores()), seed_memory_gib(model_config, hp["batch"], hp["max_len"]))


def evenly(seeds: int, cap: int) -> int:
    """At most `cap` at a time, in as few rounds as `cap` allows, with the rounds as even as can be."""
    rounds = math.ceil(seeds / max(1, cap))
    return math.ceil(seeds / rounds) if seeds else 1


def core_shares(cores: list[int], count: int) -> list[list[int]]:
    """`cores` cut into `count` contiguous shares as even as can be (fewer cores than shares: one each, in
    turn)."""
    if len(cores) < count:
        return [[cores[k % len(cores)]] for k in range(count)]
    base, extra = divmod(len(cores), count)
    shares, start = [], 0
    for k in range(count):
        size = base + (k < extra)
        shares.append(cores[start:start + size])
        start += size
    return shares


@dataclass
class SeedProcess:
    seed: int
    proc: subprocess.Popen
    share: list[int]
    pump: threading.Thread
    error: list[str]  # the seed's `tacl: error:` lines, for the job's own message
    stopped: list[str]  # its `tacl: stopped:` lines


def _pump(seed: int, stream, error: list[str], stopped: list[str]) -> None:
    """The seed's output, line by line, into the job's log, each line led by `[seed N]`."""
    for line in iter(stream.readline, ""):
        for lead, lines in (("tacl: error: ", error), ("tacl: stopped: ", stopped)):
            if line.startswith(lead):
                lines.append(line[len(lead):].strip())
        sys.stderr.write(f"[seed {seed}] {line}")
        sys.stderr.flush()
    stream.close()


def start_seed(seed: int, command: list[str], share: list[int]) -> SeedProcess:
    """The seed's process, on its share of the cores, with as many threads."""
    env = {**os.environ, "OMP_NUM_THREADS": str(len(share)), "MKL_NUM_THREADS": str(len(share))}
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                            bufsize=1)
    try:
        os.sched_setaffinity(proc.pid, share)  # (before it starts any thread: they inherit it)
    except (OSError, AttributeError):  # (gone already, or no affinity on this system: threads alone)
        pass
    error: list[str] = []
    stopped: list[str] = []
    pump = threading.Thread(target=_pump, args=(seed, proc.stdout, error, stopped), daemon=True)
    pump.start()
    log.info("seed %d: started, process %d on CPU %s", seed, proc.pid, _cores_text(share))
    return SeedProcess(seed, proc, share, pump, error, stopped)


def _cores_text(share: list[int]) -> str:
    if len(share) == 1:
        return f"core {share[0]}"
    return f"cores {share[0]}-{share[-1]}" if share == list(range(share[0], share[-1] + 1)) else \
        "cores " + ",".join(map(str, share))


def run_side_by_side(seeds: list[int], count: int, command: Callable[[int], list[str]],
                     run_dir: Callable[[int], Path], marker: str | None = None) -> dict[str, Any]:
    """Train `seeds`, `count` at a time, each in its own process (`command(seed)`: the seed's job), then write
    the marker (tacl.finetune.seeds.seeds_record). Raises `Stopped` after a signal (every running seed saved
    and stopped), InputError when a seed was refused for bad input, RuntimeError naming the seeds that
    failed."""
    free = core_shares(job_cores(), count)
    waiting, running, failed = list(seeds), [], []
    received: list[int] = []  # the job's signals
    stopped: list[int] = []  # seeds that stopped at a signal (theirs or the job's): no seed starts after them
    refused: tuple[int, str] | None = None
    reasons: dict[int, str] = {}  # each stopped seed's own words
    before = {sig: signal.signal(sig, lambda signum, frame: received.append(signum)) for sig in STOP_SIGNALS}
    forwarded = 0
    log.info("%d seeds, %d at a time, each in its own process", len(seeds), count)
    try:
        while running or (waiting and not (received or stopped or refused)):
            while waiting and free and not (received or stopped or refused):
                running.append(start_seed(waiting[0], command(waiting.pop(0)), free.pop(0)))
            for sig in received[forwarded:]:  # (each signal the job gets, to every seed that runs)
                for p in running:
                    _signal(p, sig)
            forwarded = len(received)
            time.sleep(POLL_S)
            for p in [p for p in running if p.proc.poll() is not None]:
                running.remove(p)
                free.append(p.share)
                p.pump.join()
                code = p.proc.returncode
                if code == 0:
                    log.info("seed %d: done", p.seed)
                elif code == EXIT_STOPPED or received:
                    log.info("seed %d: stopped (exit status %d)", p.seed, code)
                    stopped.append(p.seed)
                    if p.stopped:
                        reasons[p.seed] = p.stopped[-1].split(", saved in ")[0]
                elif code == 2 and refused is None:
                    refused = (p.seed, p.error[-1] if p.error else "bad input (its lines above say which)")
                    log.error("seed %d refused: %s; the other seeds save and stop", p.seed, refused[1])
                    for other in running:
                        _signal(other, signal.SIGTERM)
                else:
                    log.error("seed %d failed (exit status %d; its lines above say why)", p.seed, code)
                    failed.append(p.seed)
    finally:
        for p in running:  # (an error of this process's own: no seed runs on without it)
            _signal(p, signal.SIGTERM)
        for p in running:
            p.proc.wait()
        for sig, handler in before.items():
            signal.signal(sig, handler)
    if refused is not None:
        raise InputError(f"seed {refused[0]}: {refused[1]}")
    if received or stopped:
        first = stopped[0] if stopped else None
        why = (f"by {signal.Signals(received[0]).name}" if received else
               f"with seed {first}" + (f" ({reasons[first]})" if first in reasons else ""))
        left = [s for s in seeds if not (run_dir(s) / METRICS).is_file()]
        raise Stopped(f"stopped {why}: seed(s) {left} not finished; running the job again goes on with them, "
                      "each from its checkpoint where it has one")
    return seeds_record(seeds, run_dir, sorted(failed), marker)


def _signal(p: SeedProcess, sig: int) -> None:
    try:
        p.proc.send_signal(sig)
    except ProcessLookupError:
        pass
