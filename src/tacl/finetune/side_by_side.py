"""Several seeds of one fine-tuning setting at once on one GPU, each in a process of its own.

A fine-tune of BERT-base leaves its GPU idle most of each step: the step is short, and the host's Python
and kernel launches set its pace (docs/finetuning.md). A job of several seeds then trains
`finetune.seeds_per_gpu` of them at once, so that the GPU works while each process is on the host. Each
seed runs as the job of one seed would (`tacl finetune FAMILY ... --seed N --out SETTING/seedN`): its own
process, with its own share of the job's CPU cores (as many threads; pinned to them where it can, below),
its own lock, given.json, checkpoint and metrics (tacl.finetune.seeds). A seed's results are what they are
alone on the same number of threads: nothing passes between the processes. The others wait for a free place; the job
writes its marker once every seed is done.

The job's signals (SIGTERM, SIGUSR1, SIGUSR2: the scheduler's warning before the time limit), caught from
its first instruction (tacl.runtime.signals), go to every seed that runs, and under SLURM reach each seed
directly too: each saves its checkpoint at its next step and stops (or, still loading, stops with nothing to
save; or, trained and predicting, saves its trained state and stops; or, writing its results, finishes); no
seed starts after them, and the job stops (exit status EXIT_STOPPED) unless every seed had finished. Run
again, every seed goes on from its checkpoint. A seed's process holds the signals blocked from before its
first instruction until it catches them itself: one sent while it starts waits, and none kills it. A seed
refused for bad input (the seed is being trained by another process, say) stops the others the same way and
the job fails naming it; a seed that fails otherwise does not stop the others, and the job fails at the end
naming it, as one after the other (tacl.finetune.seeds.run_seeds).

Each seed reads the job's end time itself (the scheduler's job id is in its environment) and saves and stops
before it with time for every seed that saves at the same moment (tacl.finetune.resume.TimeLimit: its
command's `--seeds-per-gpu` says how many share the GPU). A seed's process ends with the job's: it gets
SIGTERM when the job's process dies (Linux's parent-death signal, `_seed_preexec`), saves at its next step
and stops, so that a job killed outright (kill -9 of its process alone) leaves no seed training on as an
orphan, holding its lock and its place on the GPU; run again, the job resumes every seed.

Each seed's output lines go to the job's log, each line led by `[seed N]`. A seed that ends by a signal the
job did not send (another process's, the kernel's out-of-memory killer's SIGKILL) is named with the signal.

`auto` (`seeds_per_gpu`): one on a CPU (a seed already uses every core it is given). On a GPU, one where its
compute mode admits one process at a time (Exclusive_Process; or none, Prohibited; NVML or nvidia-smi say
which, tacl.runtime.device.gpu_compute_mode): a second process could not open it. Otherwise as many as fit: the
job's CPU cores at CORES_PER_SEED each, the GPU's memory at the estimate of one seed's (`seed_memory_gib`), at
most MAX_AUTO, and spread evenly over the seeds (5 seeds at most 4 at a time: 3 and 2, not 4 and 1). A seed
whose process cannot open the GPU all the same (a number set by hand) fails the job with its one line,
naming the compute mode and `finetune.seeds_per_gpu: 1`, not as a seed refused for bad input.

The CPU cores: where the job's CPU affinity mask is its own cpuset (SLURM's cgroups or task affinity, PBS's
cgroup hook), each seed is pinned to its share of it; where it is not (its size is not what the scheduler
gave the job: SLURM_CPUS_ON_NODE or SLURM_CPUS_PER_TASK, PBS's NCPUS; or, with no scheduler, it is the whole
machine), every job on the node would pin its seeds to the same first cores, so nothing is pinned and each
seed only gets its share as threads (`job_cpus`).
"""

from __future__ import annotations

import ctypes
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
from typing import Any, Callable, Mapping

from tacl.finetune import EXIT_STOPPED, FAMILY_HPARAMS, Stopped
from tacl.finetune.seeds import METRICS, seeds_record
from tacl.runtime import signals
from tacl.runtime.device import EXIT_GPU_UNAVAILABLE, ONE_PROCESS_MODES, GpuUnavailable
from tacl.runtime.io import InputError
from tacl.runtime.shape import Shape

log = logging.getLogger("tacl.finetune")

CORES_PER_SEED = 2  # one for the step's Python and kernel launches, one for batches, logging, the loader
MAX_AUTO = 4  # auto's ceiling until a GPU measurement of seeds side by side says more pay
CUDA_CONTEXT_GIB = 1.0  # a process's CUDA context and the allocator's slack, beside what `seed_memory_gib` counts
MEMORY_MARGIN = 1.5  # the memory estimate is a rough one: a seed counts 1.5x it
POLL_S = 0.2
PR_SET_PDEATHSIG = 1  # prctl(2): the signal a process gets when the thread that started it ends
# What the scheduler gave the job on this node, in CPUs: SLURM's (the job's or step's CPUs on the node, else
# its CPUs per task) and PBS Pro's (the ncpus of the job's chunk on the node)
SCHEDULER_CPUS = (("SLURM_JOB_ID", "SLURM_CPUS_ON_NODE"), ("SLURM_JOB_ID", "SLURM_CPUS_PER_TASK"),
                  ("PBS_JOBID", "NCPUS"))


def seed_memory_gib(model_config: dict[str, Any], batch: int, max_len: int) -> float:
    """A rough estimate of one fine-tuning seed's GPU memory: fp32 weights, gradients and AdamW's two moments
    (16 bytes a parameter), the activations kept for the backward pass (per layer about 34 + 5 heads x
    length / hidden bytes per token and hidden unit, in 16 bits), and the CUDA context."""
    h = model_config.get("hidden_size", 768)
    layers = model_config.get("num_hidden_layers", 12)
    heads = model_config.get("num_attention_heads", 12)
    params = Shape.of_config({"intermediate_size": 4 * h, **model_config, "num_hidden_layers": layers,
                              "hidden_size": h}).total
    activations = layers * batch * max_len * h * (34 + 5 * heads * max_len / h)
    return (16 * params + activations) / 2**30 + CUDA_CONTEXT_GIB


@dataclass(frozen=True)
class JobCpus:
    """The CPUs a job may use: `count` of them; `cores`, which ones, where the job's affinity mask is its own
    (its seeds are pinned to shares of them), else None (each seed gets its share as threads, nothing
    pinned); `why`, how that was decided (for the log)."""

    count: int
    cores: list[int] | None
    why: str


def job_cpus(environ: Mapping[str, str] | None = None, mask: list[int] | None = None,
             machine: int | None = None) -> JobCpus:
    """This job's CPUs. The affinity mask (`mask`, os.sched_getaffinity) is the job's own where its size is
    what the scheduler gave the job on this node (SCHEDULER_CPUS), or, with no scheduler's count, where it is
    less than the whole machine (`machine` CPUs: taskset, a container's cpuset). Otherwise (a scheduler
    without cgroups or task affinity, PBS without its cgroup hook; no scheduler and the whole machine) it is
    the node's, shared with every other job there: nothing is pinned, and the job counts what the scheduler
    gave it, or the mask."""
    env = os.environ if environ is None else environ
    if mask is None:
        mask = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else \
            list(range(os.cpu_count() or 1))
    machine = machine or os.cpu_count() or len(mask)
    given = next(((int(env[var]), f"{var}={env[var]}") for job, var in SCHEDULER_CPUS
                  if env.get(job) and env.get(var, "").isdigit() and int(env[var]) > 0), None)
    if given is not None:
        n, var = given
        if len(mask) == n:
            return JobCpus(n, mask, f"{n} CPUs, the job's own cpuset ({var}): each seed pinned to its share")
        return JobCpus(min(n, len(mask)), None, f"{var}, and the CPU affinity mask holds {len(mask)} of the node's "
                                                f"{machine} CPUs, not the job's own: threads only, nothing pinned")
    if len(mask) < machine:
        return JobCpus(len(mask), mask, f"the CPU affinity mask's {len(mask)} of the machine's {machine} CPUs (no "
                                        "scheduler's count; the mask taken as the job's own): each seed pinned to "
                                        "its share")
    return JobCpus(len(mask), None, f"the machine's {machine} CPUs, and no scheduler says which are the job's: "
                                    "threads only, nothing pinned")


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
    """How many of a job's `seeds` train at once (`finetune.seeds_per_gpu`: a number, or auto), and why. Auto
    opens no CUDA context here (the seeds' processes will)."""
    if requested != "auto":
        return most_at_once(requested, seeds, cpu=False), f"finetune.seeds_per_gpu: {requested}"
    from tacl.runtime.device import gpu_compute_mode, gpu_memory_gib

    gpu_gib = gpu_memory_gib(device)
    if gpu_gib is None:
        return auto_count(seeds, None, 0, 0.0)
    mode = gpu_compute_mode(device)
    if mode in ONE_PROCESS_MODES:
        return 1, (f"auto: the GPU's compute mode is {mode}, where a second process cannot open it: one seed at "
                   "a time (where MPS shares such a GPU, set finetune.seeds_per_gpu to a number)")
    config = Path(model_dir) / "config.json"
    model_config = json.loads(config.read_text()) if config.is_file() else {}
    hp = {**FAMILY_HPARAMS[family], **hparams}
    return auto_count(seeds, gpu_gib, job_cpus().count, seed_memory_gib(model_config, hp["batch"], hp["max_len"]))


def cannot_share(error: GpuUnavailable, together: int) -> GpuUnavailable:
    """A seed's GpuUnavailable, saying what to change where `together` seeds of its job share the GPU and its
    compute mode may be why (not Default)."""
    if together <= 1 or error.mode == "Default":
        return error
    return GpuUnavailable(f"{error}; this job trains {together} seeds at once, each in its own process: set "
                          "finetune.seeds_per_gpu: 1 (--seeds-per-gpu 1) to train them one after the other", error.mode)


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


@dataclass(frozen=True)
class Share:
    """A seed's share of the job's CPUs: `threads`, and the `cores` it is pinned to (None: nothing pinned)."""

    threads: int
    cores: tuple[int, ...] | None = None

    def text(self) -> str:
        if self.cores is None:
            return f"with {self.threads} thread{'s' if self.threads > 1 else ''}, nothing pinned"
        cores = list(self.cores)
        if len(cores) == 1:
            return f"on CPU core {cores[0]}"
        return f"on CPU cores {cores[0]}-{cores[-1]}" if cores == list(range(cores[0], cores[-1] + 1)) else \
            "on CPU cores " + ",".join(map(str, cores))


def shares(cpus: JobCpus, count: int) -> list[Share]:
    """The job's CPUs cut into `count` shares: pinned ones where its cores are its own, else thread counts."""
    if cpus.cores is not None:
        return [Share(len(share), tuple(share)) for share in core_shares(cpus.cores, count)]
    return [Share(len(share)) for share in core_shares(list(range(cpus.count)), count)]


@dataclass
class SeedProcess:
    seed: int
    proc: subprocess.Popen
    share: Share
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


def _seed_preexec() -> Callable[[], None]:
    """What a seed's process runs between fork and exec (Popen's preexec_fn): the stop signals blocked, so that
    one sent before the seed's own `catch` (tacl.runtime.signals: its first instruction) waits for it instead
    of killing the seed while it imports; and, on Linux, SIGTERM when the job's process dies (PR_SET_PDEATHSIG).
    The signal comes when the THREAD that started the seed ends, not the process: seeds are started from the
    job's main thread (run_side_by_side must run there, as its signal handlers must), which lives as long as
    the job. A job that died between the fork and this call sends no signal: the seed sees that its parent
    changed and exits at once."""
    prctl = None
    if sys.platform.startswith("linux"):
        try:
            prctl = ctypes.CDLL(None, use_errno=True).prctl  # (looked up here: the child does as little as it can)
        except (OSError, AttributeError):
            prctl = None
    parent, sigterm = os.getpid(), int(signal.SIGTERM)

    def preexec() -> None:
        signals.block()
        if prctl is not None:
            prctl(PR_SET_PDEATHSIG, sigterm)
            if os.getppid() != parent:
                os._exit(1)

    return preexec


def start_seed(seed: int, command: list[str], share: Share) -> SeedProcess:
    """The seed's process, with its share of the CPUs (pinned to its cores where it has some), ending with the
    job's process."""
    env = {**os.environ, "OMP_NUM_THREADS": str(share.threads), "MKL_NUM_THREADS": str(share.threads)}
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                            bufsize=1, preexec_fn=_seed_preexec())
    if share.cores is not None:
        try:
            os.sched_setaffinity(proc.pid, share.cores)  # (before it starts any thread: they inherit it)
        except (OSError, AttributeError):  # (gone already, or no affinity on this system: threads alone)
            pass
    error: list[str] = []
    stopped: list[str] = []
    pump = threading.Thread(target=_pump, args=(seed, proc.stdout, error, stopped), daemon=True)
    pump.start()
    log.info("seed %d: started, process %d %s", seed, proc.pid, share.text())
    return SeedProcess(seed, proc, share, pump, error, stopped)


def _ended(code: int) -> str:
    """'exit status 3', or 'ended by SIGTERM' (Popen's negative return code: the signal that ended it)."""
    if code >= 0:
        return f"exit status {code}"
    try:
        return f"ended by {signal.Signals(-code).name}"
    except ValueError:
        return f"ended by signal {-code}"


def run_side_by_side(seeds: list[int], count: int, command: Callable[[int], list[str]],
                     run_dir: Callable[[int], Path], marker: str | None = None) -> dict[str, Any]:
    """Train `seeds`, `count` at a time, each in its own process (`command(seed)`: the seed's job), then write
    the marker (tacl.finetune.seeds.seeds_record). Raises `Stopped` after a signal (every running seed saved
    and stopped), InputError when a seed was refused for bad input, GpuUnavailable when a seed's process
    could not open the GPU, RuntimeError naming the seeds that failed. Runs in the job's main thread (its
    signal handlers, and the seeds' parent-death signal, need it)."""
    cpus = job_cpus()
    free = shares(cpus, count)
    waiting, running, failed = list(seeds), [], []
    stopped: list[int] = []  # seeds that stopped at a signal (theirs or the job's): no seed starts after them
    sent: set[int] = set()  # seeds this job stopped itself (after a refusal)
    refused: tuple[int, str, int] | None = None  # (seed, its message, its exit status)
    reasons: dict[int, str] = {}  # each stopped seed's own words
    forwarded = 0
    log.info("%d seeds, %d at a time, each in its own process; CPUs: %s", len(seeds), count, cpus.why)
    with signals.catching():  # (the job's signals, recorded from its first instruction: tacl.runtime.signals)
        try:
            while running or (waiting and not (signals.stop_requested() or stopped or refused)):
                while waiting and free and not (signals.stop_requested() or stopped or refused):
                    running.append(start_seed(waiting[0], command(waiting.pop(0)), free.pop(0)))
                received = signals.received()
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
                    elif code == EXIT_STOPPED or signals.stop_requested() or p.seed in sent:
                        log.info("seed %d: stopped (%s)", p.seed, _ended(code))
                        stopped.append(p.seed)
                        if p.stopped:
                            reasons[p.seed] = p.stopped[-1].split(", saved in ")[0]
                    elif code in (2, EXIT_GPU_UNAVAILABLE) and refused is None:
                        words = "cannot open the GPU" if code == EXIT_GPU_UNAVAILABLE else "refused"
                        refused = (p.seed, p.error[-1] if p.error else f"{words} (its lines above say why)", code)
                        log.error("seed %d %s: %s; the other seeds save and stop", p.seed, words, refused[1])
                        for other in running:
                            _signal(other, signal.SIGTERM)
                            sent.add(other.seed)
                    elif code < 0:
                        log.error("seed %d failed: %s, a signal this job did not send (from another process, or "
                                  "the system's: its out-of-memory killer sends SIGKILL)", p.seed, _ended(code))
                        failed.append(p.seed)
                    else:
                        log.error("seed %d failed (exit status %d; its lines above say why)", p.seed, code)
                        failed.append(p.seed)
        finally:
            for p in running:  # (an error of this process's own: no seed runs on without it)
                _signal(p, signal.SIGTERM)
            for p in running:
                p.proc.wait()
        received = signals.received()
    if refused is not None:
        seed, message, code = refused
        error = GpuUnavailable if code == EXIT_GPU_UNAVAILABLE else InputError
        raise error(f"seed {seed}: {message}")
    left = [s for s in seeds if not (run_dir(s) / METRICS).is_file()]
    if (received or stopped) and left:  # (a signal after every seed had finished stops nothing)
        first = stopped[0] if stopped else None
        why = (f"by {signal.Signals(received[0]).name}" if received else
               f"with seed {first}" + (f" ({reasons[first]})" if first in reasons else ""))
        raise Stopped(f"stopped {why}: seed(s) {left} not finished; running the job again goes on with them, "
                      "each from its checkpoint where it has one")
    return seeds_record(seeds, run_dir, sorted(failed), marker)


def _signal(p: SeedProcess, sig: int) -> None:
    try:
        p.proc.send_signal(sig)
    except ProcessLookupError:
        pass
