"""Pretraining objectives, one module each, each a pure loss function plus a small class that turns a
batch and the model outputs into named loss terms (exact definitions in docs/pretraining.md, Objectives).
The list of objectives, and what each name builds, is tacl.objectives.registry:

    mlm_nsp   BERT masked LM + next sentence prediction (the "more pretraining" control)
    tacl      MLM + NSP + TaCL token contrastive loss against a frozen teacher (Su et al. 2021)
    tacl_batch  tacl with cross-sequence negatives (tacl.negatives: batch), its own model in the tables
    tacl_attn   tacl with each masked token's term weighted by the attention it receives in the teacher
    taco      MLM + TACO token-alignment contrastive loss (Fu et al. 2022), continual variant
    coco_lm   COCO-LM: auxiliary MLM corrupts, corrective LM + sequence contrast (Meng et al. 2021)

The hot path has no host-device synchronisation: every loss and metric stays a tensor on the device, and
shapes never depend on tensor values (fixed-shape gathers and ignore_index instead of boolean indexing or
`nonzero`). An objective returns (losses, metrics): losses are 0-d tensors, metrics are counts
`[correct, total]` that the trainer sums over a logging interval and divides once when it logs.

The package imports no torch itself (the Snakefile reads the registry while it parses); the objective
modules do.

An objective is called as `objective(model, teacher, batch, draws)`; one that draws random numbers (TACO's
pairs, COCO-LM's samples and crops) has a method `draws(batch, generator)` that makes them ahead, as a
dict of tensors (`objective_draws`): a compiled step (`pretrain.compile`) cannot take a generator.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any, Callable, TypeVar

from tacl.objectives.registry import OBJECTIVES, build_objective, objective_params  # noqa: F401 (the API)

if TYPE_CHECKING:
    import torch

F = TypeVar("F", bound=Callable[..., Any])


def in_fp32(loss: F) -> F:
    """Run a loss function in fp32 even inside torch.autocast: its floating-point tensor arguments are cast to
    fp32 and autocast is off while it runs (under autocast, a `.float()` before a matmul does not stop the
    matmul from running in bf16: the similarity logits of a contrastive loss would come out bf16)."""
    import torch

    def fp32(x: Any) -> Any:  # (float64 stays as it is)
        return x.float() if isinstance(x, torch.Tensor) and x.dtype in (torch.bfloat16, torch.float16) else x

    @functools.wraps(loss)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        device = next((x.device.type for x in (*args, *kwargs.values()) if isinstance(x, torch.Tensor)), "cpu")
        with torch.autocast(device, enabled=False):
            return loss(*map(fp32, args), **{k: fp32(v) for k, v in kwargs.items()})

    return wrapper  # type: ignore[return-value]


def counts(correct: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """[correct among valid, valid] as an int64 pair (an accuracy, summable over micro-batches)."""
    import torch

    return torch.stack([(correct & valid).sum(), valid.sum()])


def accuracy(pair: torch.Tensor) -> float:
    """correct / total of a `counts` pair (nan when there was nothing to count)."""
    correct, total = pair.tolist()
    return correct / total if total else float("nan")


def sdpa_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """A [B, L] padding mask as SDPA's 4-D boolean mask (True = attend): given a 2-D mask, transformers asks
    `mask.all()` on every forward to decide whether it may drop it, a host-device sync."""
    return attention_mask[:, None, None, :].bool()


def encoder_inputs(batch: dict[str, torch.Tensor], ids: str = "input_ids") -> dict[str, torch.Tensor]:
    """A BERT encoder's keyword arguments for this batch (the padding mask as `sdpa_mask`)."""
    return {"input_ids": batch[ids], "token_type_ids": batch["token_type_ids"],
            "attention_mask": sdpa_mask(batch["attention_mask"])}


def objective_draws(objective: Any, batch: dict[str, torch.Tensor], generator: torch.Generator) -> dict[str, Any]:
    """The random numbers an objective draws for this micro-batch (none for most)."""
    return objective.draws(batch, generator) if hasattr(objective, "draws") else {}
