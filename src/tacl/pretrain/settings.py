"""Training settings (config.yaml's `pretrain` section plus what the data stage fixed) as plain data.

Which settings decide a result and which only decide how it is computed is written down here, once:
RESULT_KEYS decide the weights a run reaches (a change starts the run again from the start model, and
Snakemake reruns the run and what depends on it); OPERATIONAL_KEYS decide only where, how fast and how
often it logs or saves (a change reruns nothing and takes effect from the next chunk on). Micro batch, ranks,
accumulation and ZeRO stage are operational: a step's loss is defined over the whole step (sums divided by
the step's counts, in-batch negatives from fixed groups, tacl.objectives) and computed with one precision
policy at every stage, so they change the gradient only by the order of floating-point sums, and dropout's
draws (seeded per micro-batch); tests/test_invariance.py checks it. The schema says the same per key
(`x-role`), and tests/test_reruns.py keeps the two equal.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from tacl import RESULT_VERSIONS
from tacl.objectives.registry import objective_params
from tacl.runtime.device import computes_bf16
from tacl.runtime.io import InputError, stable_hash

RESULT_KEYS = ("objective", "steps", "global_batch", "lr", "warmup_ratio", "weight_decay", "adam_eps", "adam_betas",
               "grad_clip", "precision", "seed", "pad_to_max_len", "group_by_length", "max_len", "objective_params",
               "packing", "mlm_probability")
OPERATIONAL_KEYS = ("micro_batch", "zero_stage", "log_every", "checkpoint_minutes", "keep_checkpoints",
                    "loader_workers", "compile", "device")
# The config keys of `pretrain` that reach no trainer setting and only say how a run is cut into jobs and
# laid out on the machine: operational too.
CHUNK_OPERATIONAL_KEYS = ("ranks_per_node", "cpus_per_rank", "nodes", "launcher", "chunk")
# The version of what a run computes from a data position (masking, batching, the losses), so that a run is
# never resumed with batches or losses its first chunks did not see (tacl.RESULT_VERSIONS; 2: hash-based
# vectorised masking; 3: the step's loss over the whole step, negatives from fixed groups, bf16 by autocast
# at every ZeRO stage). Kept in a run's identity under the name "data_version".
DATA_VERSION = RESULT_VERSIONS["pretrain"]
# pretrain.micro_batch: auto = the largest divisor of a rank's share of the global batch up to a cap by the GPU's
# memory. Measured 2026-11-26 on an H200 (BERT-base, max_len 256, bf16, ZeRO 0): at 64 sequences every objective
# held 8.5-12.7 GiB (COCO-LM 22.3), at 128 17.5-23.0 GiB (COCO-LM 39.2, more than an A100 40 GB gives); 32 ran
# at 5-9% of the peak, 64 at 13-19%, 128 at 18-20% (eager). So 128 on a card of 80 GB, else 64; 32 on a CPU.
# The threshold is what the cards report, in GiB: an 80 GB A100 or H100 about 79.2-79.6, an A100 40 GB 39.4,
# a 48 GB card 44.4-47.5, an H200 139.8. A larger model or max_len needs a number of its own.
# pretrain.compile: true at ZeRO stage 3, refused (tacl.experiment.config.plan_errors before a run, the trainer at a
# chunk's start): ZeRO 3 gathers each layer's parameters inside the forward, so a rank whose compilation failed
# partway would sit out gathers the other ranks wait in, until the collective's timeout
ZERO3_COMPILE = ("pretrain.compile: true cannot run at pretrain.zero_stage: 3 (its parameters are gathered "
                 "inside the forward, where a rank whose compilation failed would leave the others waiting); set "
                 "pretrain.compile: auto (uncompiled there) or zero_stage 0-2")
AUTO_MICRO_BATCH = ((70.0, 128), (0.0, 64))  # (GPU memory in GiB at least, cap)
CPU_MICRO_BATCH = 32


def auto_micro_batch(global_batch: int, world_size: int, gpu_memory_gib: float | None, group: int = 1) -> int:
    """pretrain.micro_batch: auto for this run: the largest divisor of global_batch / world_size (sequences
    per rank per optimizer step) that is a multiple of `group` (pretrain.negatives_group, for the objectives
    that take it) and at most the cap for this GPU's memory (None: a CPU), else the group itself."""
    per_rank, rest = divmod(global_batch, world_size)
    if rest:
        raise InputError(f"pretrain.global_batch={global_batch} is not a multiple of {world_size} rank(s)")
    if per_rank % group:
        raise InputError(f"pretrain.negatives_group: {group} sequences per group, but a rank gets {per_rank} per "
                         f"step (pretrain.global_batch={global_batch} over {world_size} rank(s)): a multiple is needed")
    cap = CPU_MICRO_BATCH if gpu_memory_gib is None else next(c for gib, c in AUTO_MICRO_BATCH if gpu_memory_gib >= gib)
    fits = [d for d in range(group, min(per_rank, cap) + 1, group) if per_rank % d == 0]
    return max(fits, default=group)


# How a bf16 run computes, in the result settings of every run that computes in bf16 (fp32 runs carry none):
# 2 = its matmuls run in bf16 at every ZeRO stage (since data_version 3 by autocast over fp32 weights at every
# stage). Before it (tacl 0.1.0 up to 2026-11-25) ZeRO 0's "bf16" ran in fp32 on CUDA (DeepSpeed switched the
# trainer's autocast off): those runs are not the same result, and their identity differs by this key (they
# train again, their checkpoints set aside).
BF16_VERSION = 2
# Before the split above (commit a513d30, 2026-11-25), a run's identity was a hash of these (precision left
# out); kept to read the run.json of such runs (tacl.pretrain.identity).
LEGACY_TRAJECTORY_KEYS = (tuple(k for k in RESULT_KEYS if k not in ("precision", "packing", "mlm_probability"))
                          + ("data_version",))


@dataclass
class TrainSettings:
    objective: str
    steps: int
    global_batch: int
    micro_batch: int | str  # auto: `auto_micro_batch`, resolved where the run starts (`resolve_micro_batch`)
    lr: float = 1e-4
    warmup_ratio: float = 0.1
    weight_decay: float = 0.0
    adam_eps: float = 1e-6
    adam_betas: tuple[float, float] = (0.9, 0.999)
    grad_clip: float = 1.0
    zero_stage: int = 0
    precision: str = "auto"  # auto (bf16 on GPU, fp32 on CPU) | bf16 | fp32
    seed: int = 42
    log_every: int = 10
    checkpoint_minutes: float = 30.0
    keep_checkpoints: int = 2
    pad_to_max_len: bool = False
    group_by_length: bool = True  # micro-batches of similar length (less padding); see data/pretraining.py
    max_len: int = 256
    packing: bool = False  # sequences packed without padding (tacl.data.packing); changes the trajectory
    # the share of tokens masking selects (tacl.data.masking); None: the start model's family's (tacl.runtime.family)
    mlm_probability: float | None = None
    objective_params: dict[str, Any] = field(default_factory=dict)
    # where and how fast (OPERATIONAL_KEYS, with micro_batch and zero_stage above)
    device: str = "auto"  # auto | cuda | cpu; cuda: stop at once unless a GPU is usable (tacl.runtime.device)
    loader_workers: int = 2  # DataLoader processes that build micro-batches ahead of the step
    compile: bool | str = "auto"  # torch.compile forward and loss: true, false, auto (on a GPU: compile.compiles)

    @classmethod
    def from_config(cls, pretrain: dict[str, Any], objective: str, max_len: int) -> "TrainSettings":
        """From the validated config: `pretrain` section, one objective, the data's max_len."""
        keys = {k: pretrain[k] for k in cls.__dataclass_fields__ if k in pretrain}
        keys.pop("objective", None)
        return cls(objective=objective, max_len=max_len,
                   objective_params=objective_params(pretrain, objective),
                   **{k: v for k, v in keys.items() if k not in ("max_len", "objective_params")})

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "TrainSettings":
        unknown = set(d) - set(cls.__dataclass_fields__)
        if unknown:
            raise InputError(f"pretrain settings: unknown keys {sorted(unknown)}")
        s = cls(**d)
        s.adam_betas = tuple(s.adam_betas)
        return s

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["adam_betas"] = list(self.adam_betas)
        return d

    def resolve_micro_batch(self, world_size: int, gpu_memory_gib: float | None) -> int:
        """micro_batch as this run uses it (auto: `auto_micro_batch`, in whole groups of negatives); set on the
        settings and returned."""
        if self.micro_batch == "auto":
            self.micro_batch = auto_micro_batch(self.global_batch, world_size, gpu_memory_gib,
                                                self.objective_params.get("negatives_group", 1))
        return self.micro_batch

    def accumulation(self, world_size: int) -> int:
        """Gradient accumulation steps; the global batch must split evenly over ranks and micro batches."""
        per_step = self.micro_batch * world_size
        if self.global_batch % per_step:
            raise InputError(
                f"pretrain.global_batch={self.global_batch} is not a multiple of pretrain.micro_batch="
                f"{self.micro_batch} x {world_size} rank(s)"
            )
        return self.global_batch // per_step

    def result(self, bf16: bool | None = None) -> dict[str, Any]:
        """The settings that decide the weights (RESULT_KEYS), the batch version and, where the run computes
        in bf16 (`bf16`; None: as precision and device say, tacl.runtime.device.computes_bf16), BF16_VERSION: what a
        run's checkpoints belong to, and what Snakemake compares to decide a rerun."""
        d = self.to_dict()
        # (packing only where it is on, mlm_probability only where it is set: the runs made before they existed
        # (commit 14a0e48, 2026-11-25, and the family's masking rate) keep their identity, and no rerun)
        out = {**{k: d[k] for k in RESULT_KEYS if (k != "packing" or self.packing)
                  and (k != "mlm_probability" or self.mlm_probability is not None)}, "data_version": DATA_VERSION}
        if computes_bf16(self.precision, self.device) if bf16 is None else bf16:
            out["bf16_version"] = BF16_VERSION
        return out

    def operational(self) -> dict[str, Any]:
        d = self.to_dict()
        return {k: d[k] for k in OPERATIONAL_KEYS}

    @classmethod
    def from_parts(cls, result: dict[str, Any], operational: dict[str, Any]) -> "TrainSettings":
        """From the two halves the workflow passes apart (`--settings` and `--operational`)."""
        result = {k: v for k, v in result.items() if k not in ("data_version", "bf16_version")}
        stray = sorted((set(result) & set(OPERATIONAL_KEYS)) | (set(operational) - set(OPERATIONAL_KEYS)))
        if stray:
            raise InputError(f"pretrain settings: {stray} given on the wrong side (result / operational)")
        return cls.from_dict({**result, **operational})

    def legacy_trajectory_hash(self) -> str:
        """The run identity before commit a513d30 (2026-11-25; to read the run.json of those runs)."""
        d = {**self.to_dict(), "data_version": DATA_VERSION}
        return stable_hash({k: d[k] for k in LEGACY_TRAJECTORY_KEYS})
