"""The fine-tuning loop shared by GLUE, SQuAD and NER: AdamW with linear warmup and decay, dynamic
padding, bf16 autocast on GPU, gradient clipping, seeded data order; and batched prediction."""

from __future__ import annotations

import logging
import random
import sys
import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np
import torch

from tacl.device import device_info, resolve_device
from tacl.finetune import FAMILY_HPARAMS, PRESETS
from tacl.io import InputError

log = logging.getLogger("tacl.finetune")

DEFAULT_HPARAMS = FAMILY_HPARAMS["glue"]


def hyperparameters(defaults: dict[str, Any], preset: str, overrides: dict[str, Any]) -> dict[str, Any]:
    """A fine-tune's hyperparameters: the family's defaults, then the preset, then the config's values."""
    if preset not in PRESETS:
        raise InputError(f"finetune.preset: {preset!r} is not one of {', '.join(PRESETS)}")
    return {**defaults, **PRESETS[preset], **overrides}


@dataclass
class Run:
    """Where and how a fine-tune runs."""

    device: torch.device
    bf16: bool

    @classmethod
    def detect(cls, precision: str = "auto", device: str = "auto") -> "Run":
        """`device` as in the config (auto | cuda | cpu): a job that asked for a GPU and sees none stops
        here with tacl.device.DeviceError, before any data is tokenized or any model is built."""
        where = resolve_device(device)
        bf16 = precision == "bf16" or (precision == "auto" and where.type == "cuda")
        return cls(where, bf16)

    def describe(self) -> dict[str, Any]:
        """What metrics.json records about the run's device (GPU model and count, torch, CUDA, NCCL)."""
        return device_info(self.device)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def load_task_model(auto_class: Any, model_dir: str, seed: int, **kwargs: Any) -> torch.nn.Module:
    """`auto_class.from_pretrained(model_dir, **kwargs)` with every RNG seeded first: the new task head's
    random initialisation belongs to the fine-tuning seed (unseeded, it differs in every process, and a
    (model, task, seed) run could not be repeated)."""
    seed_everything(seed)
    return auto_class.from_pretrained(model_dir, **kwargs)


def pad_batch(rows: Sequence[dict[str, list[int]]], pad_id: int, label_pad: int = -100) -> dict[str, torch.Tensor]:
    """Pad a list of tokenized rows to the longest (rounded up to 8); labels are padded with -100 when
    they are sequences, stacked as they are when scalars."""
    length = -(-max(len(r["input_ids"]) for r in rows) // 8) * 8
    out: dict[str, torch.Tensor] = {}
    for key in rows[0]:
        values = [r[key] for r in rows]
        if isinstance(values[0], (list, tuple)):
            fill = pad_id if key == "input_ids" else (label_pad if key == "labels" else 0)
            arr = np.full((len(rows), length), fill, dtype=np.int64)
            for i, v in enumerate(values):
                arr[i, : len(v)] = v
            out[key] = torch.from_numpy(arr)
        else:
            out[key] = torch.tensor(values)
    return out


def optimizer_and_schedule(model: torch.nn.Module, hp: dict[str, Any], total_steps: int):
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if p.requires_grad:
            (no_decay if ("bias" in name or "LayerNorm" in name) else decay).append(p)
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": hp["weight_decay"]},
                             {"params": no_decay, "weight_decay": 0.0}], lr=hp["lr"])
    warmup = int(round(total_steps * hp["warmup_ratio"]))

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        return max(0.0, (total_steps - step) / max(1, total_steps - warmup))

    return opt, torch.optim.lr_scheduler.LambdaLR(opt, factor)


def train(model: torch.nn.Module, rows: list[dict[str, Any]], hp: dict[str, Any], seed: int, run: Run,
          pad_id: int, extra_loss: Callable[[torch.nn.Module, dict, Any], torch.Tensor] | None = None,
          task_weight: float = 1.0) -> dict:
    """Train for hp["epochs"] epochs over `rows` (tokenized, unpadded); returns a short training record.

    The loss is task_weight * the model's own loss + `extra_loss(model, batch, outputs)` (e.g. supervised
    TaCL for NER, a contrastive term on [CLS] for classification)."""
    from tqdm import tqdm

    seed_everything(seed)
    model.to(run.device).train()
    batch_size = hp["batch"]
    steps_per_epoch = -(-len(rows) // batch_size)
    total = steps_per_epoch * hp["epochs"]
    opt, sched = optimizer_and_schedule(model, hp, total)
    order_rng = np.random.default_rng(seed)
    started, losses = time.time(), []
    bar = tqdm(total=total, desc="fine-tune", unit=" steps", disable=not sys.stderr.isatty())
    for epoch in range(hp["epochs"]):
        order = order_rng.permutation(len(rows))
        for i in range(steps_per_epoch):
            batch = pad_batch([rows[j] for j in order[i * batch_size : (i + 1) * batch_size]], pad_id)
            batch = {k: v.to(run.device) for k, v in batch.items()}
            with torch.autocast(run.device.type, dtype=torch.bfloat16, enabled=run.bf16):
                outputs = model(**batch, output_hidden_states=extra_loss is not None)
                loss = outputs.loss * task_weight
                if extra_loss is not None:
                    loss = loss + extra_loss(model, batch, outputs)
            loss.backward()
            if hp.get("grad_clip"):
                torch.nn.utils.clip_grad_norm_(model.parameters(), hp["grad_clip"])
            opt.step()
            sched.step()
            opt.zero_grad(set_to_none=True)
            losses.append(float(loss.detach()))
            bar.update(1)
    bar.close()
    return {"steps": total, "epochs": hp["epochs"], "train_examples": len(rows),
            "final_loss": float(np.mean(losses[-max(1, steps_per_epoch // 10):])) if losses else None,
            "train_s": round(time.time() - started, 1)}


@torch.no_grad()
def predict(model: torch.nn.Module, rows: list[dict[str, Any]], run: Run, pad_id: int, batch_size: int,
            outputs_of: Callable[[Any], Sequence[torch.Tensor]], per_token: bool = False) -> list[list[np.ndarray]]:
    """Run the model over `rows` in order. `outputs_of(model_output)` picks tensors of shape [B, ...];
    for each, one float32 array per row comes back; `per_token` outputs ([B, L, ...]) are cut to the
    row's own length."""
    model.to(run.device).eval()
    kept: list[list[np.ndarray]] = []
    for i in range(0, len(rows), batch_size):
        chunk = rows[i : i + batch_size]
        batch = pad_batch([{k: v for k, v in r.items() if k != "labels"} for r in chunk], pad_id)
        batch = {k: v.to(run.device) for k, v in batch.items()}
        with torch.autocast(run.device.type, dtype=torch.bfloat16, enabled=run.bf16):
            out = outputs_of(model(**batch))
        for k, t in enumerate(out):
            arr = t.float().cpu().numpy()
            if len(kept) <= k:
                kept.append([])
            kept[k].extend(arr[j, : len(r["input_ids"])] if per_token else arr[j] for j, r in enumerate(chunk))
    return kept
