"""The masked language model loss (every family) and BERT's next sentence prediction loss."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from tacl.objectives import counts, in_fp32, mean_of, step_denominator
from tacl.objectives.encoders import encoder, has_nsp, mlm_logits, nsp_logits
from tacl.objectives.packed import encode, pooled

IGNORE_INDEX = -100


@in_fp32
def mlm_loss(logits: torch.Tensor, targets: torch.Tensor,
             denominator: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean cross-entropy over the selected positions; logits [N, V] for a fixed-length list of
    positions, targets [N] (IGNORE_INDEX for the padding entries of the list). The sum is divided by
    `denominator` (tacl.objectives.step_denominator: the step's mean) where given, else by the positions.

    Returns (loss, accuracy counts). No selected position: loss 0 (still attached to the graph)."""
    valid = targets != IGNORE_INDEX
    loss = F.cross_entropy(logits.float(), targets, ignore_index=IGNORE_INDEX, reduction="sum")
    return mean_of(loss, valid.sum(), denominator), counts(logits.argmax(-1) == targets, valid)


@in_fp32
def nsp_loss(logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Cross-entropy of the [CLS] classifier; label 1 = B is a random segment (BERT's convention)."""
    return F.cross_entropy(logits.float(), labels), counts(logits.argmax(-1) == labels,
                                                           torch.ones_like(labels, dtype=torch.bool))


def mlm_nsp_terms(model: Any, batch: dict[str, torch.Tensor], out: Any, with_nsp: bool = True) -> tuple[dict, dict]:
    """MLM (+ NSP) loss terms and metrics from the student's heads (tacl.objectives.encoders), given its
    encoder's output `out`. NSP only where `with_nsp` and the model has BERT's NSP head (a family pretrained
    without NSP has none: its batches' `nsp_labels` are not read).

    The vocabulary projection runs only on the selected positions (about 15%), gathered by the batch's
    fixed-length `mlm_index`, not on every token. MLM is the step's mean over its selected positions; NSP
    the mean over the micro-batch's sequences (every micro-batch of a step holds as many)."""
    selected = out.last_hidden_state.flatten(0, 1).index_select(0, batch["mlm_index"])
    losses, metrics = {}, {}
    losses["mlm"], metrics["mlm_acc"] = mlm_loss(mlm_logits(model, selected), batch["mlm_targets"],
                                                 step_denominator(batch, "masked"))
    if with_nsp and has_nsp(model):
        losses["nsp"], metrics["nsp_acc"] = nsp_loss(nsp_logits(model, pooled(model, out, batch)),
                                                     batch["nsp_labels"])
    return losses, metrics


@dataclass
class MlmNsp:
    name: str = "mlm_nsp"
    with_nsp: bool = True  # False: the MLM control of a family pretrained without NSP (objective `mlm`)
    needs_teacher: bool = False

    def __call__(self, model: Any, teacher: Any, batch: dict[str, torch.Tensor],
                 draws: dict[str, Any]) -> tuple[dict, dict]:
        return mlm_nsp_terms(model, batch, encode(encoder(model), batch), self.with_nsp)
