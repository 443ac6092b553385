"""Contrastive fine-tuning for classification (docs/finetuning.md): a batch-level term on the [CLS]
vectors, added to cross-entropy as loss = (1 - w) * CE + w * L, with w = `contrastive_weight` and the
temperature `contrastive_tau` among the fine-tuning hyperparameters (0.9 and 0.3 by default, Gunel et al.).

- `kl`: the similarity matrix S of the batch's normalised [CLS] vectors (cosine / tau, row-wise softmax)
  against the target matrix T = Y Y^T of the one-hot labels (row-normalised): mean over rows of KL(T || softmax(S)).
- `scl`: the supervised contrastive loss (Gunel et al. 2021): for anchor i, the other examples of its
  class are positives, every other example of the batch is in the denominator:
  -1/(N_i - 1) sum_{j != i, y_j = y_i} log( exp(s_ij / tau) / sum_{k != i} exp(s_ik / tau) ), averaged over the
  anchors that have a positive.

A row labelled below 0 (an ignored row that pads a batch to its full size, tacl.finetune.common.pad_batch)
is in neither form: not an anchor, not in any denominator.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from tacl.finetune import CONTRASTIVE_FORMS  # noqa: F401 (the forms computed here, `contrastive_loss`)
from tacl.objectives import in_fp32

# group_by_length off: the term's negatives are the other examples of the batch, which length grouping would
# make all of about the anchor's length
DEFAULTS = {"contrastive_weight": 0.9, "contrastive_tau": 0.3, "group_by_length": False}


def _similarities(cls: torch.Tensor, tau: float) -> torch.Tensor:
    z = F.normalize(cls.float(), dim=-1)
    return z @ z.T / tau


@in_fp32
def kl_contrastive_loss(cls: torch.Tensor, labels: torch.Tensor, tau: float) -> torch.Tensor:
    real = labels >= 0
    same = ((labels[:, None] == labels[None, :]) & real[:, None] & real[None, :]).float()
    target = same / same.sum(1, keepdim=True).clamp(min=1)
    ignored = ~real[None, :]
    log_p = F.log_softmax(_similarities(cls, tau).masked_fill(ignored, float("-inf")), dim=1).masked_fill(ignored, 0)
    per_row = (target * (torch.log(target.clamp(min=1e-12)) - log_p)).sum(1)
    return (per_row * real).sum() / real.sum().clamp(min=1)


@in_fp32
def supervised_contrastive_loss(cls: torch.Tensor, labels: torch.Tensor, tau: float) -> torch.Tensor:
    n = len(labels)
    real = labels >= 0
    left_out = torch.eye(n, dtype=torch.bool, device=cls.device) | ~real[None, :]
    sims = _similarities(cls, tau).masked_fill(left_out, float("-inf"))  # k != i in the denominator
    log_p = F.log_softmax(sims, dim=1).masked_fill(left_out, 0.0)
    positive = (labels[:, None] == labels[None, :]) & ~left_out & real[:, None]
    per_anchor = -(log_p * positive).sum(1) / positive.sum(1).clamp(min=1)
    has = positive.any(1)
    return (per_anchor * has).sum() / has.sum().clamp(min=1)


def contrastive_loss(form: str, cls: torch.Tensor, labels: torch.Tensor, tau: float) -> torch.Tensor:
    return (kl_contrastive_loss if form == "kl" else supervised_contrastive_loss)(cls, labels, tau)
