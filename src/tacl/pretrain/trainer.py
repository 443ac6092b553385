"""`tacl pretrain train`: one chunk of continual pretraining on a DeepSpeed engine.

A chunk resumes from the run directory's latest checkpoint (if any), trains until the target step, the
deadline (minus a margin) or a SIGUSR1/SIGUSR2/SIGTERM, saves, writes a JSON marker and exits 0.

Determinism: the samples of step s are data positions [s*G, (s+1)*G); micro batch j of the step (rank r
takes j = a*world + r at accumulation step a) is fixed by those positions, and its dropout and TACO draws
come from generators seeded by (seed, s, j). So a resumed run, or 2 ranks instead of 1, sees exactly the
same batches, and on CPU a resume reproduces the uninterrupted run bit for bit.
"""

from __future__ import annotations

import json
import logging
import math
import os
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from tacl.io import InputError, read_json, stable_hash, write_json_atomic
from tacl.pretrain import checkpoint
from tacl.pretrain.deadline import Deadline, StopSignals, end_time
from tacl.pretrain.distributed import DistEnv, all_max, all_mean, barrier, broadcast_object, init_distributed, shutdown
from tacl.pretrain.lock import RunLock
from tacl.pretrain.settings import TrainSettings

log = logging.getLogger("tacl.pretrain")


@dataclass
class ChunkArgs:
    run_dir: str
    start_model: str
    manifest: str
    settings: TrainSettings
    marker: str | None = None
    chunk: int = 0
    deadline: float | None = None  # unix time
    runtime_minutes: float | None = None
    margin_minutes: float = 10.0
    max_steps: int | None = None  # at most this many optimizer steps in this chunk
    tensorboard: bool = True


def derive_seed(*parts: int) -> int:
    return int(stable_hash(list(parts), 15), 16)


class Pretrainer(torch.nn.Module):
    """What DeepSpeed wraps: the student and its objective. The teacher is passed in, never a submodule,
    so it stays out of the optimizer and of ZeRO partitioning."""

    def __init__(self, model: torch.nn.Module, objective: Any):
        super().__init__()
        self.model = model
        self.objective = objective

    def forward(self, batch: dict[str, torch.Tensor], teacher: Any, generator: torch.Generator):
        losses, metrics = self.objective(self.model, teacher, batch, generator)
        return sum(losses.values()), losses, metrics


def linear_schedule(steps: int, warmup_ratio: float):
    warmup = max(1, int(round(steps * warmup_ratio))) if warmup_ratio > 0 else 0

    def factor(step: int) -> float:
        if warmup and step < warmup:
            return (step + 1) / warmup
        return max(0.0, (steps - step) / max(1, steps - warmup))

    return factor


def ds_config(s: TrainSettings, accumulation: int, bf16: bool, cpu: bool) -> dict[str, Any]:
    bucket = 5e6 if cpu else 5e8  # DESIGN.md section 7: the default buckets allocate GBs per step on CPU
    return {
        "train_batch_size": s.global_batch,
        "train_micro_batch_size_per_gpu": s.micro_batch,
        "gradient_accumulation_steps": accumulation,
        "gradient_clipping": s.grad_clip,
        "bf16": {"enabled": bf16},
        "zero_optimization": {"stage": s.zero_stage, "reduce_bucket_size": bucket, "allgather_bucket_size": bucket,
                              "stage3_param_persistence_threshold": 0 if cpu else 1e5},
        "zero_allow_untested_optimizer": True,
        "steps_per_print": 2**62,
        "wall_clock_breakdown": False,
    }


def _avoid_cpu_shm_op() -> None:
    """On CPU, DeepSpeed compiles a shared-memory all-reduce op at start-up (about a minute, racing between
    ranks); gloo does the same job, so skip it unless TACL_DS_SHM_OP=1."""
    if torch.cuda.is_available() or os.environ.get("TACL_DS_SHM_OP") == "1":
        return
    import importlib

    # (`import deepspeed.comm.torch as m` would bind the torch package that deepspeed.comm re-exports)
    importlib.import_module("deepspeed.comm.torch").build_shm_op = lambda: None


def run_identity(args: ChunkArgs, manifest: dict[str, Any]) -> dict[str, Any]:
    from tacl.pretrain.model import start_identity

    return {
        "objective": args.settings.objective,
        "trajectory": args.settings.trajectory_hash(),
        "data": {"config_hash": manifest["config_hash"], "tokenizer": manifest["tokenizer"]["hash"],
                 "examples": manifest["totals"]["examples"]},
        "start_model": start_identity(args.start_model)["weights_sha256"],
    }


def check_identity(run_dir: Path, identity: dict[str, Any]) -> None:
    path = run_dir / "run.json"
    if path.is_file():
        previous = read_json(path)["identity"]
        if previous != identity:
            differs = sorted(k for k in identity if previous.get(k) != identity[k])
            raise InputError(f"{path}: the checkpoints here belong to another run (differs in: {', '.join(differs)});"
                             " use another run directory or delete this one")


def train_chunk(args: ChunkArgs) -> dict[str, Any]:
    started = time.time()
    signals = StopSignals().install()
    env = init_distributed()
    lock = RunLock(args.run_dir)
    try:
        return _train(args, env, lock, signals, started)
    finally:
        lock.release()
        shutdown()
        # The chunk is saved and over: a late SIGUSR1 (SLURM's --signal) must not kill the process while the
        # interpreter shuts down (Python restores the default action, termination, during finalisation).
        signal.signal(signal.SIGUSR1, signal.SIG_IGN)
        signal.signal(signal.SIGUSR2, signal.SIG_IGN)


def _train(args: ChunkArgs, env: DistEnv, lock: RunLock, signals: StopSignals, started: float) -> dict[str, Any]:
    import deepspeed

    from tacl.data.masking import MaskingSpec
    from tacl.data.pretraining import PretrainingData
    from tacl.data.shards import ShardSet
    from tacl.hub import load_tokenizer, tokenizer_hash
    from tacl.objectives import build_objective
    from tacl.pretrain.metrics import MetricsLog
    from tacl.pretrain.model import load_student, load_teacher

    s = args.settings
    run_dir = Path(args.run_dir)
    # -- everything that can be wrong is checked before the model is built ---------------------------
    accumulation = s.accumulation(env.world_size)
    objective = build_objective(s.objective, s.objective_params)
    if s.objective == "taco" and s.micro_batch < 2:
        raise InputError("pretrain.micro_batch must be >= 2 for taco (negatives come from other sequences)")
    tokenizer = load_tokenizer(args.start_model)
    error = None
    if env.is_main:
        try:
            shards = ShardSet(args.manifest, tokenizer_hash=tokenizer_hash(tokenizer), verify=True)
            identity = run_identity(args, shards.manifest)
            check_identity(run_dir, identity)
            lock.acquire()
            write_json_atomic(run_dir / "run.json", {"identity": identity, "settings": s.to_dict(),
                                                     "world_size": env.world_size})
        except InputError as e:
            error = str(e)
    error = broadcast_object(error)
    if error:
        raise InputError(error)
    if not env.is_main:
        shards = ShardSet(args.manifest, tokenizer_hash=tokenizer_hash(tokenizer), verify=False)
    data = PretrainingData(shards, MaskingSpec.from_tokenizer(tokenizer, s.max_len), s.seed,
                           pad_multiple=s.max_len if s.pad_to_max_len else 8)

    # -- model, optimizer, engine --------------------------------------------------------------------
    cpu = env.device.type == "cpu"
    bf16 = s.precision == "bf16" or (s.precision == "auto" and not cpu)
    torch.manual_seed(s.seed)
    student = load_student(args.start_model)
    teacher = load_teacher(args.start_model).to(env.device) if objective.needs_teacher else None
    if teacher is not None and bf16:
        teacher = teacher.to(torch.bfloat16)
    decay = [p for n, p in student.named_parameters() if not any(k in n for k in ("bias", "LayerNorm"))]
    no_decay = [p for n, p in student.named_parameters() if any(k in n for k in ("bias", "LayerNorm"))]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": s.weight_decay},
                                   {"params": no_decay, "weight_decay": 0.0}],
                                  lr=s.lr, betas=tuple(s.adam_betas), eps=s.adam_eps)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, linear_schedule(s.steps, s.warmup_ratio))
    _avoid_cpu_shm_op()
    deepspeed.init_distributed(dist_backend="gloo" if cpu else "nccl")
    engine, _, _, _ = deepspeed.initialize(model=Pretrainer(student, objective), optimizer=optimizer,
                                           lr_scheduler=scheduler, config=ds_config(s, accumulation, bf16, cpu))

    step = tokens_seen = 0
    tag = checkpoint.latest_tag(run_dir)
    if tag is not None:
        state = checkpoint.load(engine, run_dir, tag, env)
        if state.get("world_size") != env.world_size and s.zero_stage > 0:
            raise InputError(f"{run_dir}: checkpoint {tag} was written by {state.get('world_size')} ranks with "
                             f"ZeRO stage {s.zero_stage}; resume it with the same number of ranks")
        step, tokens_seen = int(state["step"]), int(state.get("tokens", 0))
        log.info("resumed from %s at step %d", tag, step)
    metrics_log = MetricsLog(run_dir, step, args.tensorboard) if env.is_main else None

    deadline = Deadline(end_time(started, args.deadline, args.runtime_minutes), 60.0 * args.margin_minutes)
    last_save = time.time()
    reason = "target" if step >= s.steps else None
    interval: dict[str, float] = {}
    interval_steps = interval_tokens = pending_tokens = 0
    interval_start = time.time()
    progress = _progress(env, step, s.steps)
    start_step = step
    global_batch, micro = s.global_batch, s.micro_batch

    while step < s.steps:
        t0 = time.time()
        for a in range(accumulation):
            j = a * env.world_size + env.rank
            first = step * global_batch + j * micro
            batch = {k: v.to(env.device, non_blocking=True) for k, v in data.batch(range(first, first + micro)).items()}
            torch.manual_seed(derive_seed(s.seed, step, j, 0))
            generator = torch.Generator().manual_seed(derive_seed(s.seed, step, j, 1))
            loss, losses, metrics = engine(batch, teacher, generator)
            engine.backward(loss)
            engine.step()
            for k, v in {"loss": loss, **losses, **metrics}.items():
                v = float(v.detach())
                if not math.isnan(v):
                    interval[k] = interval.get(k, 0.0) + v / accumulation
            n_tokens = int(batch["attention_mask"].sum())
            interval_tokens += n_tokens
            pending_tokens += n_tokens
        step += 1
        interval_steps += 1
        deadline.observe_step(time.time() - t0)
        if progress is not None:
            progress.update(1)

        if step % s.log_every == 0 or step == s.steps:
            keys = sorted(interval)
            values = all_mean([interval[k] / interval_steps for k in keys] + [interval_tokens, pending_tokens],
                              env.device)
            elapsed = time.time() - interval_start
            tokens_seen += round(values[-1] * env.world_size)
            if metrics_log is not None:
                record = {"step": step, "samples": step * global_batch, "tokens": tokens_seen,
                          "lr": scheduler.get_last_lr()[0], **dict(zip(keys, values[:-2])),
                          "tokens_per_s": values[-2] * env.world_size / max(elapsed, 1e-9),
                          "elapsed_s": time.time() - started}
                metrics_log.write(record)
            interval, interval_steps, interval_tokens, pending_tokens = {}, 0, 0, 0
            interval_start = time.time()

        due = (time.time() - last_save) / 60.0 >= s.checkpoint_minutes
        stop_signal, near, due = all_max([float(signals.stop), float(deadline.near()), float(due)], env.device)
        if step >= s.steps:
            reason = "target"
        elif stop_signal:
            reason = "signal"
        elif near:
            reason = "deadline"
        elif args.max_steps and step - start_step >= args.max_steps:
            reason = "max_steps"
        if reason or due:
            t_save = time.time()
            tokens_seen += round(all_mean([pending_tokens], env.device)[0] * env.world_size)
            pending_tokens = 0
            tag = checkpoint.save(engine, run_dir, step, {"step": step, "samples": step * global_batch,
                                                          "tokens": tokens_seen, "world_size": env.world_size},
                                  env, s.keep_checkpoints)
            deadline.save_s = max(deadline.save_s, time.time() - t_save)
            last_save = time.time()
        if reason:
            break
    if progress is not None:
        progress.close()
    if metrics_log is not None:
        metrics_log.close()

    marker = {"objective": s.objective, "chunk": args.chunk, "step": step, "steps": s.steps,
              "done": step >= s.steps, "reason": reason, "samples": step * global_batch, "tokens": tokens_seen,
              "steps_this_chunk": step - start_step, "checkpoint": checkpoint.latest_tag(run_dir),
              "wall_s": round(time.time() - started, 1), "world_size": env.world_size,
              "threads": torch.get_num_threads()}
    barrier()
    if env.is_main and args.marker:
        write_json_atomic(args.marker, marker)
    log.info("chunk %d: %s", args.chunk, json.dumps(marker))
    return marker


def _progress(env: DistEnv, step: int, steps: int):
    if not env.is_main or not sys.stderr.isatty():
        return None
    from tqdm import tqdm

    return tqdm(total=steps, initial=step, desc="pretrain", unit=" steps")
