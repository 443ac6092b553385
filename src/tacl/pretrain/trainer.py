"""`tacl pretrain train`: one chunk of continual pretraining on a DeepSpeed engine.

A chunk resumes from the run directory's latest checkpoint (if any), trains until the target step, the
deadline (minus a margin) or a SIGUSR1/SIGUSR2/SIGTERM, saves, writes a JSON marker and exits 0. Which run
the run directory's checkpoints belong to, and taking the directory over from another run: tacl.pretrain.identity.

Determinism: the samples of step s are data positions [s*G, (s+1)*G); micro batch j of the step (rank r
takes j = a*world + r at accumulation step a) is fixed by those positions (tacl.data.pretraining). The step's
loss is defined over the whole step: each micro-batch's sums are divided by the step's counts, and in-batch
negatives and their random draws come from fixed groups of the step's order seeded by (seed, s, group)
(tacl.objectives). Dropout is seeded by (seed, s, j). So a resumed run, or 2 ranks instead of 1, sees exactly
the same batches, and on CPU a resume reproduces the uninterrupted run bit for bit; another micro-batch size,
number of ranks or accumulation computes the same loss and gradient up to float reordering, with other
dropout draws.

Speed: batches are built in DataLoader worker processes and copied from pinned memory without blocking;
the step (`optimizer_step`) never waits for the device: losses and metrics stay device tensors in a
`Meter`, read once per `log_every` steps, and the per-step stop decision travels on a CPU (gloo) group.
DeepSpeed's throughput timer (a device synchronisation in every forward and step) is off, AdamW is PyTorch's
fused kernel, and fp32 matmuls (the contrastive similarities) use TF32 on a GPU.

Precision (`bf16`), the same at every ZeRO stage: the forward runs under torch.autocast (bf16 matmuls) over
fp32 weights, which are the masters, and DeepSpeed sees an fp32 model (its own bf16 engine would compute in
pure bf16 at ZeRO 1-3, residual stream and LayerNorm included, other numerics than ZeRO 0's; and at ZeRO 0 it
would wrap the optimizer in FP16_UnfusedOptimizer, a host sync per parameter per step). The losses always run
in fp32 (tacl.objectives.in_fp32). A step whose gradient is not finite stops the run, naming the step, before
anything is saved (DeepSpeed would skip the update silently and the schedule would drift).
"""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import os
import socket
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, NoReturn

import torch

from tacl.data.packing import is_packed
from tacl.data.pretraining import Batching, MicroBatches, PretrainingData, micro_batch_loader, on_device
from tacl.data.shards import ShardSet
from tacl.runtime.compile import (compile_failure, compile_in_own_thread, compiled_or_eager, compiles,
                                  give_up_compiling, out_of_memory)
from tacl.runtime.device import computes_bf16, device_info, fast_fp32_matmul, gpu_memory_gib
from tacl.runtime.hub import load_tokenizer, tokenizer_hash
from tacl.runtime.io import InputError, read_json, stable_hash, write_json_atomic
from tacl.objectives import NO_PADDING, GroupDraws, build_objective, objective_draws
from tacl.objectives.registry import family_error, group_error, packing_error
from tacl.pretrain import checkpoint
from tacl.pretrain.deadline import Deadline, describe, end_times
from tacl.pretrain.form import form_error, masking_spec
from tacl.pretrain.distributed import (DistEnv, all_max, all_sum, barrier, broadcast_object, import_deepspeed,
                                      init_distributed, shutdown)
from tacl.pretrain.identity import adopt_run_dir, check_not_removed, check_zero_stage, manifests_after, run_identity
from tacl.runtime.lock import RunLock
from tacl.runtime.signals import StopSignals, catching
from tacl.pretrain.metrics import MetricsLog
from tacl.pretrain.rundir import clear_leftovers
from tacl.pretrain.model import load_student, load_teacher, start_family
from tacl.pretrain.settings import ZERO3_COMPILE, TrainSettings

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
    tracking: dict[str, Any] | None = None  # W&B, MLflow (tacl.runtime.tracking.job_spec; rank 0 tracks)


def derive_seed(*parts: int) -> int:
    return int(stable_hash(list(parts), 15), 16)


class Pretrainer(torch.nn.Module):
    """What DeepSpeed wraps: the student (`model.*`) and its objective (`objective.*`: parameters of its own,
    such as COCO-LM's auxiliary model, train and checkpoint with it; only `model.*` is exported). The
    teacher is passed in, never a submodule, so it stays out of the optimizer and of ZeRO partitioning."""

    def __init__(self, model: torch.nn.Module, objective: Any, autocast: str | None = None):
        super().__init__()
        self.model = model
        self.objective = objective
        self.losses = self.eager_losses  # `compile_losses` puts a compiled copy here
        self.autocast = autocast  # bf16: the device type the forward autocasts on, else None
        self.matmul_dtype: torch.dtype | None = None  # what the student's matmuls ran in (`compute_dtype`)

    def eager_losses(self, batch: dict[str, torch.Tensor], teacher: Any, draws: dict[str, Any]):
        """The student's forward and the objective's loss: the part `pretrain.compile` compiles."""
        losses, metrics = self.objective(self.model, teacher, batch, draws)
        return sum(losses.values()), losses, metrics

    def forward(self, batch: dict[str, torch.Tensor], teacher: Any, group_draws: GroupDraws):
        # the objective's random numbers are drawn here, eagerly: a compiled graph cannot take a generator
        draws = objective_draws(self.objective, batch, group_draws)
        # bf16: autocast is entered here, inside DeepSpeed's engine.forward, which switches off an
        # autocast entered around it (deepspeed.runtime.torch_autocast.autocast_if_enabled, 0.19.8, where
        # the DeepSpeed config has no torch_autocast section; on CUDA only: it asks torch.is_autocast_enabled())
        with torch.autocast(self.autocast or "cpu", dtype=torch.bfloat16, enabled=self.autocast is not None):
            if self.matmul_dtype is None:
                self.matmul_dtype = compute_dtype(self.model)
            return self.losses(batch, teacher, draws)

    def compile_losses(self, teacher: Any = None, backend: str = "inductor") -> None:
        """torch.compile the forward and loss, one graph for every micro-batch shape (`dynamic=True`: the
        widths of length groups and the number of masked positions vary from one micro-batch to the next;
        static shapes would compile once per width, up to max_len / 8 graphs), and one more for the host
        flag `no_padding` (attention with or without a mask: `compile_variants`). Parameter names, and so
        checkpoints, stay as they are. transformers installs the hooks that collect `output_hidden_states`
        (TACO's student, tacl_attn's teacher) on the first forward that asks for them, under a lock that
        breaks the graph: installed here, on the teacher too.

        Python floats are compiled in as constants (torch._dynamo.config.specialize_float): the floats the
        graph reads are the modules' attributes (dropout p, LayerNorm eps, attention scaling, an embedding's
        norm_type, the objective's tau), fixed for a run. Left symbolic, as dynamic=True has them, each graph
        was traced twice: the embeddings' norm_type cannot become a tensor input, and AOTAutograd's pass
        restarted dynamo's analysis with it specialised (half of the compile time). Dynamo's settings are per
        thread: the setting is made around every call of the compiled function, whichever thread compiles."""
        from transformers import PreTrainedModel
        from transformers.utils.output_capturing import maybe_install_capturing_hooks

        for module in [*self.modules(), *(teacher.modules() if teacher is not None else [])]:
            if isinstance(module, PreTrainedModel):
                maybe_install_capturing_hooks(module)
        compiled = torch.compile(self.eager_losses, dynamic=True, backend=backend)
        self.losses = torch._dynamo.config.patch(specialize_float=True)(compiled)

    @property
    def compiled(self) -> bool:
        return self.losses != self.eager_losses

    def go_eager(self, why: str) -> None:
        """A compilation failed (`why`: tacl.runtime.compile.compile_failure): this run goes on uncompiled, saying
        so; dynamo's caches are emptied, so nothing of the failed compilation is kept
        (tacl.runtime.compile.give_up_compiling)."""
        give_up_compiling(log, "pretrain.compile: torch.compile failed (%s); this chunk goes on uncompiled (eager, "
                          "slower); `tacl doctor --device cuda --compile` checks the tool chain, and pretrain.compile: "
                          "false turns compilation off", why, lambda: setattr(self, "losses", self.eager_losses))


def compute_dtype(model: torch.nn.Module) -> torch.dtype:
    """The dtype the model's linear layers compute in here: a 1 x 1 matmul of their weights' dtype and device
    (not the layer itself, whose weights ZeRO 3 partitions), under the autocast in force."""
    weight = next(m for m in model.modules() if isinstance(m, torch.nn.Linear)).weight
    one = torch.zeros(1, 1, dtype=weight.dtype, device=weight.device)
    with torch.no_grad():
        return (one @ one).dtype


def check_compute_dtype(chunk: "Chunk") -> str:
    """The dtype the first micro-batch's matmuls ran in (for the marker); a run that says bf16 and computed in
    anything else (or the other way round) stops here, before anything is saved."""
    seen = chunk.engine.module.matmul_dtype
    expected = torch.bfloat16 if chunk.bf16 else torch.float32
    if seen != expected:
        raise RuntimeError(f"pretraining {chunk.settings.objective}: precision {'bf16' if chunk.bf16 else 'fp32'}, "
                           f"but the student's matmuls ran in {seen} (ZeRO stage {chunk.settings.zero_stage}, "
                           f"{chunk.env.device}); nothing was saved. Please report it, with the versions of torch "
                           "and DeepSpeed")
    return str(seen).removeprefix("torch.")


def linear_schedule(steps: int, warmup_ratio: float):
    warmup = max(1, int(round(steps * warmup_ratio))) if warmup_ratio > 0 else 0

    def factor(step: int) -> float:
        if warmup and step < warmup:
            return (step + 1) / warmup
        return max(0.0, (steps - step) / max(1, steps - warmup))

    return factor


# Elements per bucket of the gradient's reduction at ZeRO 1-3. Each bucket is reduced as soon as the backward
# has filled it (overlap_comm; on a GPU, on a stream of its own beside the backward's kernels), so the bucket
# must be much smaller than the model for the reduction to overlap the backward: BERT-base (110M parameters)
# makes about 10 reductions (buckets of 40 MB in fp32, twice for overlap_comm's second buffer; the 23M-element
# word embedding, whose gradient comes last, on its own). DeepSpeed's default, 5e8, holds
# all of BERT-base (one reduction, after the backward) and allocates GBs per step on a CPU. (ZeRO 0 reduces
# after the backward whatever the config says: DeepSpeed's engine.allreduce_gradients.)
REDUCE_BUCKET = {"cpu": 5e6, "cuda": 1e7}


def ds_config(s: TrainSettings, accumulation: int, cpu: bool, universal: bool = False,
              ranks: int = 1) -> dict[str, Any]:
    """DeepSpeed's configuration: an fp32 model at every stage (bf16 runs compute under the trainer's autocast);
    at ZeRO 0 the trainer clips the gradient itself, without a host sync; at ZeRO 1-3 on several `ranks` the
    gradient's reduction overlaps the backward (REDUCE_BUCKET; on one rank there is nothing to overlap, and
    overlap_comm's second buffer and its device synchronisation at the end of the backward would buy nothing)."""
    overlap = ranks > 1
    bucket = 5e6 if cpu else 5e8  # the default buckets allocate GBs per step on CPU
    config = {
        "checkpoint": {"load_universal": universal},
        "train_batch_size": s.global_batch,
        "train_micro_batch_size_per_gpu": s.micro_batch,
        "gradient_accumulation_steps": accumulation,
        # ZeRO 0: clipped in optimizer_step (DeepSpeed's fp32 clipping builds two tensors from Python numbers
        # on the device every step, each a blocking copy)
        "gradient_clipping": s.grad_clip if s.zero_stage else 0.0,
        "bf16": {"enabled": False},
        "zero_optimization": {"stage": s.zero_stage, "allgather_bucket_size": bucket,
                              # ZeRO 1 reduces only in the last micro-batch's backward, ZeRO 2 in every one
                              "overlap_comm": overlap, "contiguous_gradients": True,
                              "reduce_bucket_size": REDUCE_BUCKET["cpu" if cpu else "cuda"] if overlap else bucket,
                              "stage3_param_persistence_threshold": 0 if cpu else 1e5},
        "zero_allow_untested_optimizer": True,
        "steps_per_print": 2**62,
        "wall_clock_breakdown": False,
        # on by default with synchronized: true, i.e. a device synchronisation in every forward and step
        "timers": {"throughput": {"enabled": False, "synchronized": False}},
    }
    return config


class NonFiniteGradient(InputError):
    """A step's gradient was inf or nan: the run stops (nothing after the last checkpoint is saved)."""

    def __init__(self, chunk: "Chunk", step: int, how: str):
        super().__init__(
            f"pretraining {chunk.settings.objective}, optimizer step {step}: the gradient is not finite (inf or "
            f"nan); {how}. The run stopped without saving; its latest checkpoint "
            f"({checkpoint.latest_tag(chunk.args.run_dir) or 'none'}) is intact. Look at the losses in "
            f"{Path(chunk.args.run_dir) / 'metrics.jsonl'}; a lower pretrain.lr or precision fp32 may help")


def _avoid_cpu_shm_op() -> None:
    """On CPU, DeepSpeed compiles a shared-memory all-reduce op at start-up (about a minute, racing between
    ranks); gloo does the same job, so skip it unless TACL_DS_SHM_OP=1."""
    if torch.cuda.is_available() or os.environ.get("TACL_DS_SHM_OP") == "1":
        return
    # (`import deepspeed.comm.torch as m` would bind the torch package that deepspeed.comm re-exports)
    importlib.import_module("deepspeed.comm.torch").build_shm_op = lambda: None


def train_chunk(args: ChunkArgs) -> dict[str, Any]:
    """One chunk, with the stop signals caught (tacl.runtime.signals: `tacl pretrain train` catches them
    first thing, and at its exit ignores them)."""
    started = time.time()
    with catching():
        env = init_distributed(args.settings.device)  # a job that asked for a GPU and has none stops here
        lock = RunLock(args.run_dir)
        failed = True
        try:
            result = _run_chunk(_setup(args, env, lock), StopSignals(), started)
            failed = False
            return result
        finally:
            lock.release()
            shutdown(failed)


@dataclass
class Chunk:
    """Everything one chunk trains with, and where it stands."""

    args: ChunkArgs
    env: DistEnv
    engine: Any
    scheduler: Any
    teacher: Any
    data: Any  # tacl.data.pretraining.PretrainingData
    accumulation: int
    generator: torch.Generator  # the objective's random draws (TACO pairs), on the device, reseeded per group
    bf16: bool = False  # the run computes in bf16 (under autocast: Pretrainer.autocast)
    clip: float | None = None  # ZeRO 0: the trainer clips to this (0: no clipping), not DeepSpeed
    step: int = 0
    tokens: int = 0  # tokens trained on by all ranks, up to the last time they were summed
    skipped: int = 0  # DeepSpeed's count of skipped (non-finite) steps, as last seen
    nonfinite: torch.Tensor | None = None  # ZeRO 0: the first step whose gradient norm was not finite (-1: none)
    compile_agreed: bool = False  # every rank has agreed whether the chunk runs compiled (`_agree_to_compile`)

    @property
    def settings(self) -> TrainSettings:
        return self.args.settings

    def check_finite(self) -> None:
        """ZeRO 0: stop if a step since the start had a non-finite gradient (a host read: call it where the
        trainer reads anyway, at a log line or before a save)."""
        if self.nonfinite is not None and (bad := int(self.nonfinite)) >= 0:
            raise NonFiniteGradient(self, bad, "its update was applied, so the weights are no longer finite")


def _setup(args: ChunkArgs, env: DistEnv, lock: RunLock) -> Chunk:
    """Check the inputs (before the model is built), take the run directory, build data, model and engine,
    resume."""
    s = args.settings
    objective, accumulation = _check_inputs(args, env)
    # (here, not at the top: DeepSpeed's import takes seconds, and a job that asked for a GPU and has none stops
    # in init_distributed, before this, as do settings that cannot train, in _check_inputs)
    import_deepspeed()  # (`_engine` builds with it)
    tokenizer = load_tokenizer(args.start_model)
    bf16 = computes_bf16(s.precision, env.device.type)
    shards, tag = _take_run_dir(args, env, lock, tokenizer, bf16, objective)
    saved_world = _saved_world_size(args, env, tag)
    batching = Batching(s.global_batch, s.micro_batch, s.group_by_length, s.max_len if s.pad_to_max_len else 8,
                        packing=s.packing, max_len=s.max_len)
    data = PretrainingData(shards, masking_spec(tokenizer, s.max_len, s.mlm_probability, args.start_model), s.seed,
                           batching)
    trainable, teacher = _build_model(args, env, objective, bf16)
    engine, scheduler, universal = _engine(args, env, trainable, accumulation, tag, saved_world)
    chunk = Chunk(args, env, engine, scheduler, teacher, data, accumulation, torch.Generator(device=env.device),
                  bf16=bf16, clip=s.grad_clip if s.zero_stage == 0 else None,
                  nonfinite=torch.full((), -1, dtype=torch.long, device=env.device) if s.zero_stage == 0 else None)
    if tag is not None:
        _resume(chunk, tag, universal, saved_world)
    chunk.skipped = engine.skipped_steps
    return chunk


def _check_inputs(args: ChunkArgs, env: DistEnv) -> tuple[Any, int]:
    """(the objective, the accumulation steps): what can be wrong with the settings and the start model is
    checked before any model is built. pretrain.micro_batch auto is resolved here, on the settings."""
    s = args.settings
    if s.micro_batch == "auto":
        s.resolve_micro_batch(env.world_size, gpu_memory_gib(env.device))
        log.info("pretrain.micro_batch auto: %d sequences per rank (tacl.pretrain.settings.AUTO_MICRO_BATCH)",
                 s.micro_batch)
    accumulation = s.accumulation(env.world_size)
    if why := group_error([s.objective], s.objective_params.get("negatives_group"), s.micro_batch, s.micro_batch):
        raise InputError(why)
    objective = build_objective(s.objective, s.objective_params)
    if s.packing and (why := packing_error(s.objective, s.objective_params)):
        raise InputError(why)
    if why := family_error(s.objective, s.objective_params, start_family(args.start_model), s.packing):
        raise InputError(why)  # e.g. mlm_nsp on a family without NSP
    if hasattr(objective, "check"):
        objective.check(args.start_model)  # e.g. COCO-LM's auxiliary model is no larger than the main one
    return objective, accumulation


def _take_run_dir(args: ChunkArgs, env: DistEnv, lock: RunLock, tokenizer: Any, bf16: bool, objective: Any
                  ) -> tuple[ShardSet, str | None]:
    """(the shards, the checkpoint every rank resumes from: None for none). Rank 0 verifies the shards, takes
    the run directory (its lock, the run's identity, what a killed chunk left unfinished, run.json) and verifies
    the checkpoint before DeepSpeed reads it; one collective hands every rank its error, which stops them all,
    or the checkpoint."""
    s, run_dir = args.settings, Path(args.run_dir)
    error = tag = None
    if env.is_main:
        try:
            # (the form from the manifest alone, before the shards' sha256 are read)
            if why := form_error(args.manifest, read_json(args.manifest), s.objective, objective, args.start_model):
                raise InputError(why)
            shards = ShardSet(args.manifest, tokenizer_hash=tokenizer_hash(tokenizer), verify=True,
                              tokenizer_name=f"the tokenizer of the start model {args.start_model}")
            identity = run_identity(s, args.start_model, shards.manifest, bf16)
            lock.acquire()
            adopt_run_dir(run_dir, identity, lock, args.chunk, s.objective)
            clear_leftovers(run_dir)  # (a save or a write that a killed chunk left unfinished)
            check_zero_stage(run_dir, s.zero_stage)
            check_not_removed(run_dir)
            after = manifests_after(run_dir)
            tag = checkpoint.resume_tag(run_dir, after)  # verified (or set aside) before DeepSpeed reads it
            write_json_atomic(run_dir / "run.json", {"identity": identity, "result": s.result(),
                                                     "settings": s.to_dict(), "world_size": env.world_size,
                                                     "checkpoint_manifests_after": after})
        except InputError as e:
            error = str(e)
    error, tag = broadcast_object((error, tag))  # every rank loads the checkpoint rank 0 verified
    if error:
        raise InputError(error)
    if not env.is_main:
        shards = ShardSet(args.manifest, tokenizer_hash=tokenizer_hash(tokenizer), verify=False)
    return shards, tag


def _saved_world_size(args: ChunkArgs, env: DistEnv, tag: str | None) -> int:
    """The number of ranks that wrote checkpoint `tag` (this chunk's where there is none). ZeRO 3 goes on only
    with as many."""
    run_dir, s = Path(args.run_dir), args.settings
    saved_world = checkpoint.saved_world_size(run_dir, tag) if tag is not None else env.world_size
    if saved_world != env.world_size and s.zero_stage == 3:
        raise InputError(f"{run_dir}: checkpoint {tag} was written by {saved_world} rank(s) with ZeRO stage 3, which "
                         f"cannot go on with {env.world_size}: its conversion does not reproduce the trajectory. "
                         f"Resume with {saved_world} rank(s); ZeRO stages 0, 1 and 2 go on with any number")
    return saved_world


def _build_model(args: ChunkArgs, env: DistEnv, objective: Any, bf16: bool) -> tuple[Pretrainer, Any]:
    """(what DeepSpeed wraps: the student and its objective, compiled where pretrain.compile says; the teacher,
    None where the objective has none), the student's initialisation seeded."""
    # (not at the top either: tacl.objectives.packed imports torch's varlen attention, seconds)
    from tacl.objectives.packed import use_packed_attention

    s = args.settings
    torch.manual_seed(s.seed)
    student = load_student(args.start_model)
    teacher = load_teacher(args.start_model).to(env.device) if objective.needs_teacher else None
    if teacher is not None and bf16:
        teacher = teacher.to(torch.bfloat16)
    if hasattr(objective, "attach"):
        objective.attach(args.start_model, student)  # parameters of the objective's own (COCO-LM's auxiliary model)
    if s.packing:  # attention within each sequence of a packed row (tacl.objectives.packed)
        use_packed_attention(student, teacher, objective if isinstance(objective, torch.nn.Module) else None)
    trainable = Pretrainer(student, objective, autocast=env.device.type if bf16 else None)
    if chunk_compiles(s, env.device):
        trainable.compile_losses(teacher)
    return trainable, teacher


def chunk_compiles(s: TrainSettings, device: torch.device) -> bool:
    """Whether a chunk compiles (pretrain.compile, tacl.runtime.compile.compiles), never at ZeRO stage 3: auto
    compiles nothing there, saying why, and true is refused (ZERO3_COMPILE; plan_errors refuses it before the
    run)."""
    if not compiles(s.compile, device, "pretrain"):
        return False
    if s.zero_stage != 3:
        return True
    if s.compile is True:
        raise InputError(ZERO3_COMPILE)
    log.info("pretrain.compile: auto compiles nothing at ZeRO stage 3 (its parameters are gathered inside the "
             "forward: a rank whose compilation failed there would leave the others waiting)")
    return False


def no_weight_decay(name: str, parameter: torch.Tensor) -> bool:
    """Biases and normalisation weights train without weight decay: BERT's by name (`bias`, `LayerNorm`), and
    every 1-D parameter (another family's norms, e.g. ModernBERT's `attn_norm`, which have other names)."""
    return any(k in name for k in ("bias", "LayerNorm")) or parameter.dim() < 2


def _engine(args: ChunkArgs, env: DistEnv, trainable: Pretrainer, accumulation: int, tag: str | None,
            saved_world: int) -> tuple[Any, Any, Path | None]:
    """(DeepSpeed's engine, the learning rate's schedule, the universal checkpoint that another number of
    ranks under ZeRO 1-2 resumes from: None where it needs none): AdamW and the schedule, DeepSpeed's process
    group, the engine."""
    deepspeed = import_deepspeed()
    s, run_dir, cpu = args.settings, Path(args.run_dir), env.device.type == "cpu"
    decay = [p for n, p in trainable.named_parameters() if not no_weight_decay(n, p)]
    no_decay = [p for n, p in trainable.named_parameters() if no_weight_decay(n, p)]
    # fused: one kernel for all parameters, and the step count stays on the device (the unfused CPU/foreach
    # variants read it on the host for every parameter)
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": s.weight_decay},
                                   {"params": no_decay, "weight_decay": 0.0}],
                                  lr=s.lr, betas=tuple(s.adam_betas), eps=s.adam_eps, fused=True)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, linear_schedule(s.steps, s.warmup_ratio))
    fast_fp32_matmul(env.device)
    _avoid_cpu_shm_op()
    deepspeed.init_distributed(dist_backend="gloo" if cpu else "nccl")
    # another number of ranks under ZeRO 1-2: the partitioned optimizer state goes through the universal format
    universal = checkpoint.make_universal(run_dir, tag, env) if saved_world != env.world_size and s.zero_stage else None
    engine, _, _, _ = deepspeed.initialize(
        # device_rank: this rank's GPU, which is cuda:0 where the site shows each task only its own GPU
        args=argparse.Namespace(device_rank=env.device.index) if env.device.type == "cuda" else None,
        model=trainable, optimizer=optimizer, lr_scheduler=scheduler,
        config=ds_config(s, accumulation, cpu, universal=universal is not None, ranks=env.world_size))
    return engine, scheduler, universal


def _resume(chunk: Chunk, tag: str, universal: Path | None, saved_world: int) -> None:
    """Load checkpoint `tag` into the engine (every rank) and go on from its step and token count."""
    env = chunk.env
    state = checkpoint.load(chunk.engine, Path(chunk.args.run_dir), tag, env, universal)
    chunk.step, chunk.tokens = int(state["step"]), int(state.get("tokens", 0))
    log.info("resumed from %s at step %d (written by %d rank(s), now %d)", tag, chunk.step, saved_world,
             env.world_size)


class Meter:
    """Losses and metric counts of one logging interval, summed on the device (no host-device sync);
    `read` fetches them once, sums them over ranks on the CPU and divides."""

    def __init__(self) -> None:
        self.sums: dict[str, torch.Tensor] = {}
        self.steps = 0
        self.tokens = 0  # this rank's tokens in the interval
        self.started = time.time()

    def add(self, losses: dict[str, torch.Tensor], metrics: dict[str, torch.Tensor], accumulation: int) -> None:
        values = {k: v.detach().double() / accumulation for k, v in losses.items()}
        values.update((k, v.detach().double()) for k, v in metrics.items())  # [correct, total] pairs
        for k, v in values.items():
            self.sums[k] = self.sums[k] + v if k in self.sums else v

    def read(self, env: DistEnv) -> dict[str, float]:
        keys = sorted(self.sums)
        local = torch.cat([self.sums[k].reshape(-1) for k in keys]).cpu().tolist() if keys else []
        *values, tokens = all_sum(local + [self.tokens], env)
        out, i = {}, 0
        for k in keys:
            if self.sums[k].numel() == 2:  # accuracy counts
                correct, total = values[i : i + 2]
                out[k] = correct / total if total else float("nan")
                i += 2
            else:
                out[k] = values[i] / (self.steps * env.world_size)
                i += 1
        out["tokens_per_s"] = tokens / max(time.time() - self.started, 1e-9)
        return out


def optimizer_step(chunk: Chunk, batches: Iterator[dict[str, Any]], meter: Meter) -> int:
    """One optimizer step of `accumulation` micro-batches; returns this rank's number of tokens. The hot
    path: nothing here waits for the device (DeepSpeed's own optimizer at ZeRO 1-3 reads its overflow check
    on the host; benchmarks/pretrain_step.py --gpu counts what remains)."""
    env, engine = chunk.env, chunk.engine
    tokens = 0
    for a in range(chunk.accumulation):
        batch = next(batches)
        tokens += batch["num_tokens"]
        batch = on_device(batch, env.device)
        loss, losses, metrics = _compiled_or_eager(chunk, batch, a * env.world_size + env.rank)
        if chunk.clip is not None and a == chunk.accumulation - 1:
            _clip(chunk)
        engine.step()
        meter.add({"loss": loss, **losses}, metrics, chunk.accumulation)
    if engine.skipped_steps != chunk.skipped:  # DeepSpeed found the gradient not finite and skipped the update
        raise NonFiniteGradient(chunk, chunk.step + 1, "DeepSpeed skipped its update")
    meter.steps += 1
    meter.tokens += tokens
    return tokens


def compile_variants(batch: dict[str, Any]) -> list[dict[str, Any]]:
    """`batch` as every graph a run of its layout can meet, its own first. The compiled step specialises on
    host values of the micro-batch (a new one compiles a graph): its layout, and whether its attention takes
    a mask (tacl.objectives.NO_PADDING). A packed micro-batch has no such flag: one graph; a padded one is
    given the flag both ways (where the flag does not say what the batch holds, what it computes is only
    compiled, never used)."""
    if is_packed(batch):
        return [batch]
    return [batch, {**batch, NO_PADDING: batch.get(NO_PADDING) is not True}]


# why a compilation that fails after the chunk's start stops the run (`CompileFailedMidRun`), by where it failed
MID_RUN_WHY = {"forward": "the other ranks run compiled, and one rank going on uncompiled alone would produce "
                          "its gradients in another order than theirs (at ZeRO 1 and 2 the buckets' reductions would "
                          "not match)",
               "backward": "the backward had begun (DeepSpeed's gradient hooks may have taken part of this "
                           "micro-batch's gradient), so the micro-batch cannot be computed again"}


class CompileFailedMidRun(InputError):
    """A compilation failed after every rank had agreed to run compiled, where going on uncompiled could not
    be agreed or could not be done safely: the run stops (nothing after the last checkpoint is saved)."""

    def __init__(self, chunk: "Chunk", failure: str, where: str):
        super().__init__(
            f"pretraining {chunk.settings.objective}, optimizer step {chunk.step + 1}, rank {chunk.env.rank} of "
            f"{chunk.env.world_size}: torch.compile failed in the {where} after the chunk's start had compiled "
            f"({failure}); {MID_RUN_WHY[where]}. The run stopped without saving; its latest checkpoint "
            f"({checkpoint.latest_tag(chunk.args.run_dir) or 'none'}) is intact. pretrain.compile: false runs it "
            "uncompiled")


def _compiled_or_eager(chunk: Chunk, batch: dict[str, Any], j: int):
    """Micro-batch j's forward and backward (`_forward_backward`), compiled where the chunk compiles.

    The chunk's first micro-batch decides, for every rank alike, whether the chunk runs compiled
    (`_agree_to_compile`): each rank compiles every graph it can meet (`compile_variants`) on its own first
    micro-batch, in a trial that touches no gradient, then one collective tells every rank whether any rank's
    compilation failed; if one did, every rank goes on uncompiled (Pretrainer.go_eager) from that micro-batch
    on, so no rank runs compiled beside an uncompiled one (whose gradients would reach DeepSpeed's buckets in
    another order: at ZeRO 1 and 2, mismatched reductions). The steady step has no collective and no host read
    of its own.

    A compilation that fails later (an unexpected recompilation: every graph was compiled at the start) cannot
    be agreed without a collective in every step. Where it fails in the forward, nothing of the micro-batch is
    in the gradient: on one rank the chunk goes on uncompiled and computes the micro-batch again (the same
    seeds: tacl.runtime.compile.compiled_or_eager); on several it stops with CompileFailedMidRun, naming
    pretrain.compile: false (the others would go on compiled). Where it fails in the backward, DeepSpeed's
    backward has begun and may hold part of the micro-batch's gradient: the chunk stops, on any number of
    ranks. An out-of-memory error, as every error that is not the compiler's
    (tacl.runtime.compile.compile_failure), propagates."""
    module = chunk.engine.module
    if module.compiled and not chunk.compile_agreed:
        _agree_to_compile(chunk, batch, j)
    if not module.compiled:
        return _forward_backward(chunk, batch, j)
    out = compiled_or_eager(lambda: _forward(chunk, batch, j), chunk.env.device,
                            lambda failure, error: _forward_failed(chunk, failure, error), first=False)
    try:
        chunk.engine.backward(out[0])
    except Exception as e:
        failure = compile_failure(e)
        if failure is None:
            raise
        _stop_mid_run(chunk, failure, "backward", e)
    return out


def _forward_failed(chunk: Chunk, failure: str, error: Exception | None) -> None:
    """A compiled forward failed to compile after the chunk's start (nothing of its micro-batch is in the
    gradient): one rank goes on uncompiled (Pretrainer.go_eager); several stop (`_stop_mid_run`)."""
    if chunk.env.world_size > 1:
        _stop_mid_run(chunk, failure, "forward", error)
    chunk.engine.module.go_eager(failure)


def _stop_mid_run(chunk: Chunk, failure: str, where: str, error: Exception | None) -> NoReturn:
    """Stop the chunk with CompileFailedMidRun, a compilation having failed in the `where` after its start."""
    stop = CompileFailedMidRun(chunk, failure, where)
    log.error("%s", stop)  # (said here too: the other ranks may keep this one from reaching its exit)
    raise stop from error


def _agree_to_compile(chunk: Chunk, batch: dict[str, Any], j: int) -> None:
    """Compile every graph the chunk can meet on this rank's first micro-batch (j), in a thread of its own
    (tacl.runtime.compile.compile_in_own_thread: what a failed compilation leaves behind goes with that thread), as
    a trial: each of `compile_variants(batch)` through the compiled forward and loss, then the loss's gradient
    with respect to the trainable parameters (torch.autograd.grad: the compiled backward runs, and compiles,
    but no parameter's `.grad` is written and none of DeepSpeed's gradient hooks, which follow the gradient's
    accumulation, runs), with the micro-batch's own seeds, its results dropped. Then one collective (the
    highest rank whose compilation failed, over every rank): where any failed, every rank goes on uncompiled
    (Pretrainer.go_eager, torch.compiler.reset), and the micro-batch is then computed as if nothing had been
    tried (it reseeds, and no gradient holds anything of the trial)."""
    module = chunk.engine.module
    params = [p for p in module.parameters() if p.requires_grad]

    def trial() -> None:
        for variant in compile_variants(batch):
            loss = _forward(chunk, variant, j, module)[0]
            torch.autograd.grad(loss, params, allow_unused=True)
            del loss

    try:
        _, failure = compile_in_own_thread(trial, chunk.env.device)
    except Exception as e:  # noqa: BLE001 (an out-of-memory error alone is taken, below; every other propagates)
        if out_of_memory(e) is None:
            raise
        failure = trial_out_of_memory(e, chunk.env.device)
    (failed,) = all_max([float(chunk.env.rank + 1) if failure is not None else 0.0], chunk.env)
    chunk.compile_agreed = True
    if failure is not None:
        module.go_eager(failure)
    elif failed:
        module.go_eager(f"on rank {int(failed) - 1}, whose log names the error")


def trial_out_of_memory(error: BaseException, device: torch.device) -> str:
    """The compile trial ran out of memory: what the trial held (every graph's activations and the whole
    gradient at once, which no ZeRO step holds) is freed, and the chunk goes on uncompiled as after a failed
    compilation, agreed over the ranks, rather than dying at every retry: the uncompiled step is the one
    `micro_batch: auto` sized. The words for the warning."""
    import gc

    cause = out_of_memory(error) or error
    first = (str(cause).strip().splitlines() or [""])[0][:200]
    del error, cause
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return f"the compile trial ran out of memory ({first})"


def _forward_backward(chunk: Chunk, batch: dict[str, torch.Tensor], j: int):
    """Micro-batch j of the step: its seeds, forward and loss (`_forward`), and backward."""
    loss, losses, metrics = _forward(chunk, batch, j)
    chunk.engine.backward(loss)  # (the last micro-batch's backward reduces the gradient: ds_config)
    return loss, losses, metrics


def _forward(chunk: Chunk, batch: dict[str, torch.Tensor], j: int, module: Any = None):
    """Micro-batch j's seeds (dropout: per micro-batch; the objective's draws: per group of the step,
    tacl.objectives.GroupDraws), forward and loss, through the engine (or `module`, the engine's module called
    directly: nothing of DeepSpeed's backward is attached to its loss)."""
    s, step = chunk.settings, chunk.step
    torch.manual_seed(derive_seed(s.seed, step, j, 0))  # dropout
    draws = GroupDraws(chunk.generator, lambda group: derive_seed(s.seed, step, group, 1), first=j * s.micro_batch)
    call = chunk.engine if module is None else module
    return call(batch, chunk.teacher, draws)  # (bf16 autocast inside: Pretrainer)


def _clip(chunk: Chunk) -> None:
    """ZeRO 0: clip the gradient to grad_clip (PyTorch's clip_grad_norm_, all on the device; grad_clip 0: only
    its norm) and note the first step whose norm is not finite, without reading it."""
    params = [p for p in chunk.engine.module.parameters() if p.grad is not None]
    if chunk.clip:
        norm = torch.nn.utils.clip_grad_norm_(params, chunk.clip)
    else:
        norm = torch.nn.utils.get_total_norm([p.grad for p in params])
    first = chunk.nonfinite
    chunk.nonfinite = torch.where(~torch.isfinite(norm) & (first < 0), chunk.step + 1, first)


def _count_tokens(chunk: Chunk, pending: int) -> None:
    """Add the tokens every rank trained on since the last count to the run's total."""
    chunk.tokens += round(all_sum([pending], chunk.env)[0])


@dataclass
class Loop:
    """Where a chunk's loop stands after each step: what it has counted, logged and saved, and where it says so."""

    started: float  # the chunk's start (unix time)
    start_step: int
    deadline: Deadline
    metrics_log: MetricsLog | None  # (rank 0's)
    progress: Any  # a progress bar (`_progress`), or None
    last_save: float  # (unix time)
    pending: int = 0  # this rank's tokens since they were last summed over the ranks (`_count_tokens`)
    meter: Meter = field(default_factory=Meter)  # the logging interval's losses and metrics
    matmul_dtype: str | None = None  # what the student's matmuls ran in, seen in the chunk's first step


def _run_chunk(chunk: Chunk, signals: StopSignals, started: float) -> dict[str, Any]:
    """Train until the target step, the deadline, a signal or the chunk's step cap, saving every
    pretrain.checkpoint_minutes and at the end; the chunk's marker (written by rank 0 where asked)."""
    args, s, env = chunk.args, chunk.settings, chunk.env
    device = device_info(env.device)
    metrics_log = MetricsLog(Path(args.run_dir), chunk.step, args.tensorboard, args.tracking) if env.is_main else None
    if metrics_log is not None:
        metrics_log.event({"step": chunk.step, "event": "chunk_start", "chunk": args.chunk,
                           "world_size": env.world_size, "device": device})
    batches = micro_batch_loader(
        MicroBatches(chunk.data, chunk.step, s.steps, chunk.accumulation, env.rank, env.world_size),
        s.loader_workers, pin_memory=env.device.type == "cuda")
    loop = Loop(started, chunk.step, _deadline(chunk, started), metrics_log, _progress(env, chunk.step, s.steps),
                time.time())
    reason = "target" if chunk.step >= s.steps else None
    if reason is None and all_max([float(signals.stop)], env)[0]:  # (a signal while it started: not one step)
        reason = "signal"
        log.info("chunk %d: a stop signal came before the first step; nothing trained, nothing to save", args.chunk)
    while reason is None and chunk.step < s.steps:
        _train_step(chunk, batches, loop)
        if chunk.step % s.log_every == 0 or chunk.step == s.steps:
            _log_interval(chunk, loop)
        reason, due = _stop_or_save(chunk, signals, loop)
        if reason or due:
            _timed_save(chunk, loop)
        if reason:
            break
    del batches  # stops the loader's worker processes
    if loop.progress is not None:
        loop.progress.close()

    marker = _marker(chunk, loop, reason, device)
    if metrics_log is not None:
        metrics_log.close(marker)
    barrier()
    if env.is_main and args.marker:
        write_json_atomic(args.marker, marker)
    log.info("chunk %d: %s", args.chunk, json.dumps(marker))
    return marker


def _deadline(chunk: Chunk, started: float) -> Deadline:
    """The chunk's deadline: the first of its end times (`end_times`: --deadline, --runtime-minutes), less the
    margin; each rank logs them."""
    args, env = chunk.args, chunk.env
    ends = end_times(started, args.deadline, args.runtime_minutes)
    deadline = Deadline(min(ends.values(), default=None), 60.0 * args.margin_minutes)
    log.info("rank %d of %d on %s: %s", env.rank, env.world_size, socket.gethostname(), describe(ends))
    return deadline


def _train_step(chunk: Chunk, batches: Iterator[dict[str, Any]], loop: Loop) -> None:
    """One optimizer step (`optimizer_step`), its tokens counted, its time given to the deadline; after the
    chunk's first, the dtype its matmuls ran in is checked (`check_compute_dtype`)."""
    t0 = time.time()
    loop.pending += optimizer_step(chunk, batches, loop.meter)
    chunk.step += 1
    if loop.matmul_dtype is None:
        loop.matmul_dtype = check_compute_dtype(chunk)
    loop.deadline.observe_step(time.time() - t0)
    if loop.progress is not None:
        loop.progress.update(1)


def _log_interval(chunk: Chunk, loop: Loop) -> None:
    """The end of a logging interval: the gradient checked finite, the interval's losses and metrics and the
    tokens summed over the ranks (collectives), a metrics line (rank 0, with a log line where there is no
    progress bar), and a new interval."""
    s = chunk.settings
    chunk.check_finite()
    values = loop.meter.read(chunk.env)
    _count_tokens(chunk, loop.pending)
    loop.pending = 0
    if loop.metrics_log is not None:
        loop.metrics_log.write({"step": chunk.step, "samples": chunk.step * s.global_batch,
                                "tokens": chunk.tokens, "lr": chunk.scheduler.get_last_lr()[0], **values,
                                "elapsed_s": time.time() - loop.started})
        if loop.progress is None:  # not a terminal (a job's log): a line instead of the bar
            log.info(progress_line(chunk.step, s.steps, chunk.step - loop.start_step, chunk.args.max_steps, values,
                                   loop.deadline))
    loop.meter = Meter()


def _stop_or_save(chunk: Chunk, signals: StopSignals, loop: Loop) -> tuple[str | None, float]:
    """(why the chunk stops after this step, None where it goes on; whether a checkpoint is due), decided alike
    on every rank: one collective takes a signal, the deadline's nearness and the save interval from any rank."""
    due = (time.time() - loop.last_save) / 60.0 >= chunk.settings.checkpoint_minutes
    stop_signal, near, due = all_max([float(signals.stop), float(loop.deadline.near()), float(due)], chunk.env)
    return _stop_reason(chunk, stop_signal, near, loop.start_step), due


def _timed_save(chunk: Chunk, loop: Loop) -> None:
    """Save (`_save`), the tokens summed over the ranks first; the deadline keeps the longest save's time."""
    t_save = time.time()
    _count_tokens(chunk, loop.pending)
    loop.pending = 0
    _save(chunk)
    loop.deadline.save_s = max(loop.deadline.save_s, time.time() - t_save)
    loop.last_save = time.time()


def _marker(chunk: Chunk, loop: Loop, reason: str | None, device: dict[str, Any]) -> dict[str, Any]:
    """What the chunk did (its marker file and last log line)."""
    s, env = chunk.settings, chunk.env
    return {"objective": s.objective, "chunk": chunk.args.chunk, "step": chunk.step, "steps": s.steps,
            "done": chunk.step >= s.steps, "reason": reason, "samples": chunk.step * s.global_batch,
            "tokens": chunk.tokens, "steps_this_chunk": chunk.step - loop.start_step,
            "checkpoint": checkpoint.latest_tag(Path(chunk.args.run_dir)),
            "wall_s": round(time.time() - loop.started, 1), "world_size": env.world_size,
            "threads": torch.get_num_threads(), "device": device, "precision": "bf16" if chunk.bf16 else "fp32",
            "matmul_dtype": loop.matmul_dtype,
            "compiled": chunk.engine.module.compiled}  # (false where a compilation failed and it went on eager)


def _stop_reason(chunk: Chunk, stop_signal: float, near: float, start_step: int) -> str | None:
    if chunk.step >= chunk.settings.steps:
        return "target"
    if stop_signal:
        return "signal"
    if near:
        return "deadline"
    if chunk.args.max_steps and chunk.step - start_step >= chunk.args.max_steps:
        return "max_steps"
    return None


def _save(chunk: Chunk) -> None:
    chunk.check_finite()  # never a checkpoint of non-finite weights
    s = chunk.settings
    state = {"step": chunk.step, "samples": chunk.step * s.global_batch, "tokens": chunk.tokens,
             "world_size": chunk.env.world_size}
    checkpoint.save(chunk.engine, chunk.args.run_dir, chunk.step, state, chunk.env, s.keep_checkpoints)


def _progress(env: DistEnv, step: int, steps: int):
    """A progress bar on a terminal (rank 0); None elsewhere, where each metrics line is logged as a
    `progress_line` instead (a bar's carriage returns make a job's log unreadable)."""
    if not env.is_main or not sys.stderr.isatty():
        return None
    from tqdm import tqdm

    return tqdm(total=steps, initial=step, desc="pretrain", unit=" steps")


def chunk_time_left(steps_left: int, chunk_steps: int, max_steps: int | None, deadline: Deadline,
                    now: float | None = None) -> tuple[float, str]:
    """(seconds, what ends the chunk): the first of the target step, the chunk's step cap (chunk.max_steps) and
    its deadline minus the margin, at the step time seen so far."""
    ends = [(steps_left * deadline.step_s, "target")]
    if max_steps:
        ends.append((max(0, max_steps - chunk_steps) * deadline.step_s, "max_steps"))
    if deadline.end is not None:
        now = time.time() if now is None else now
        ends.append((max(0.0, deadline.end - deadline.margin_s - now), "deadline"))
    return min(ends, key=lambda end: end[0])  # (a tie: the first, the target)


def progress_line(step: int, steps: int, chunk_steps: int, max_steps: int | None, values: dict[str, float],
                  deadline: Deadline, now: float | None = None) -> str:
    """One log line per metrics line: step / total, the loss, tokens/s and the time left in this chunk."""
    left, end = chunk_time_left(steps - step, chunk_steps, max_steps, deadline, now)
    minutes, seconds = divmod(round(left), 60)
    return (f"step {step}/{steps} ({100 * step / steps:.1f}%) loss {values.get('loss', float('nan')):.4f} "
            f"{values.get('tokens_per_s', 0.0):,.0f} tokens/s; chunk ends in {minutes // 60}:{minutes % 60:02d}:"
            f"{seconds:02d} ({end})")
