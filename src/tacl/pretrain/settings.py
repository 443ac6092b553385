"""Training settings (config.yaml's `pretrain` section plus what the data stage fixed) as plain data."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from tacl.io import InputError, stable_hash

TRAJECTORY_KEYS = ("objective", "steps", "global_batch", "lr", "warmup_ratio", "weight_decay", "adam_eps",
                   "adam_betas", "grad_clip", "seed", "pad_to_max_len", "group_by_length", "max_len",
                   "objective_params", "data_version")
# The version of what turns a data position into a batch (bumped when masking or batching changes), so that
# a run is never resumed with batches its first chunks did not see. 2: hash-based vectorised masking.
DATA_VERSION = 2


# objectives that read another objective's config section (tacl_batch is tacl with negatives: batch)
PARAMS_SECTION = {"tacl_batch": "tacl"}


@dataclass
class TrainSettings:
    objective: str
    steps: int
    global_batch: int
    micro_batch: int
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
    objective_params: dict[str, Any] = field(default_factory=dict)
    # where and how fast (not part of the trajectory)
    device: str = "auto"  # auto | cuda | cpu; cuda: stop at once unless a GPU is usable (tacl.device)
    loader_workers: int = 2  # DataLoader processes that build micro-batches ahead of the step
    compile: bool = False  # torch.compile the student's encoder

    @classmethod
    def from_config(cls, pretrain: dict[str, Any], objective: str, max_len: int) -> "TrainSettings":
        """From the validated config: `pretrain` section, one objective, the data's max_len."""
        keys = {k: pretrain[k] for k in cls.__dataclass_fields__ if k in pretrain}
        keys.pop("objective", None)
        return cls(objective=objective, max_len=max_len,
                   objective_params=dict(pretrain.get(PARAMS_SECTION.get(objective, objective), {})),
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

    def accumulation(self, world_size: int) -> int:
        """Gradient accumulation steps; the global batch must split evenly over ranks and micro batches."""
        per_step = self.micro_batch * world_size
        if self.global_batch % per_step:
            raise InputError(
                f"pretrain.global_batch={self.global_batch} is not a multiple of pretrain.micro_batch="
                f"{self.micro_batch} x {world_size} rank(s)"
            )
        return self.global_batch // per_step

    def trajectory_hash(self) -> str:
        """What decides the weights a run reaches (not micro batch, ranks, ZeRO stage or logging)."""
        d = {**self.to_dict(), "data_version": DATA_VERSION}
        # packing only where it is on, so that the runs made before it existed keep their identity
        return stable_hash({k: d[k] for k in TRAJECTORY_KEYS + (("packing",) if self.packing else ())})
