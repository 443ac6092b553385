"""BERT's masked language model + next sentence prediction losses."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F


def mlm_loss(logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean cross-entropy over the selected positions; logits [N, V] for those positions, labels [N].

    Returns (loss, accuracy). No selected position: loss 0 (still attached to the graph), accuracy nan.
    """
    if labels.numel() == 0:
        return logits.sum() * 0.0, torch.tensor(float("nan"))
    loss = F.cross_entropy(logits.float(), labels)
    acc = (logits.argmax(-1) == labels).float().mean()
    return loss, acc


def nsp_loss(logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Cross-entropy of the [CLS] classifier; label 1 = B is a random segment (BERT's convention)."""
    return F.cross_entropy(logits.float(), labels), (logits.argmax(-1) == labels).float().mean()


def mlm_nsp_terms(model: Any, batch: dict[str, torch.Tensor], sequence_output: torch.Tensor,
                  pooled_output: torch.Tensor, with_nsp: bool = True) -> tuple[dict, dict]:
    """MLM (+ NSP) loss terms and metrics from a BertForPreTraining's heads.

    The vocabulary projection runs only on the selected positions (about 15%), not on every token.
    """
    selected = batch["mlm_labels"] != -100
    logits = model.cls.predictions(sequence_output[selected])
    losses, metrics = {}, {}
    losses["mlm"], metrics["mlm_acc"] = mlm_loss(logits, batch["mlm_labels"][selected])
    if with_nsp:
        losses["nsp"], metrics["nsp_acc"] = nsp_loss(model.cls.seq_relationship(pooled_output),
                                                     batch["nsp_labels"])
    return losses, metrics


@dataclass
class MlmNsp:
    name: str = "mlm_nsp"
    needs_teacher: bool = False

    def __call__(self, model: Any, teacher: Any, batch: dict[str, torch.Tensor],
                 generator: torch.Generator) -> tuple[dict, dict]:
        out = model.bert(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                         token_type_ids=batch["token_type_ids"])
        return mlm_nsp_terms(model, batch, out.last_hidden_state, out.pooler_output)
