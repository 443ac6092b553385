"""TaCL: token-aware contrastive learning against a frozen teacher (Su et al. 2021).

L_TaCL = -(1/|M|) sum_{i in M} log( exp(cos(h~_i, h_i)/tau) / sum_{j} exp(cos(h~_i, h_j)/tau) )

h~ the student's last layer on the masked sequence, h the teacher's on the clean one, M the positions
selected for MLM (of the whole step: tacl.objectives.step_denominator), j over the same sequence's
positions: real tokens by default (not padding, [CLS] or [SEP]); `negatives="all"` also counts [CLS] and
[SEP], never padding (the reference implementation, which pads every sequence to max_len, counts its padding
too: a number of negatives that would depend on a micro-batch's width here). `negatives="batch"`
(tacl_batch): j over the real tokens of every sequence of the anchor's group of `negatives_group` sequences.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from tacl.objectives import check_negatives_group, counts, group_size, in_fp32, mean_of, step_denominator
from tacl.objectives.mlm_nsp import IGNORE_INDEX, mlm_nsp_terms
from tacl.objectives.encoders import encoder
from tacl.objectives.packed import encode, padded_index, per_sequence

_EXCLUDED = -1e9  # a logit that softmax turns into exactly 0 (-inf would make NaN gradients on empty rows)


@in_fp32
def tacl_loss(student: torch.Tensor, teacher: torch.Tensor, anchors: torch.Tensor, candidates: torch.Tensor,
              tau: float, weights: torch.Tensor | None = None,
              denominator: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """student, teacher [B, L, H]; anchors [B, L] bool (the set M); candidates [B, L] bool (allowed j,
    the same for every anchor of a sequence) or [B, L, L] (row i: the j allowed for anchor i); every
    anchor must be among its own candidates. Returns (loss, accuracy counts: anchors whose own teacher
    vector is the most similar). No anchor at all: loss 0 (attached to the graph). `weights` [B, L]
    (tacl_attn): anchor i's term counts w_i times, the sum still divided by |M|; None: every w_i = 1.
    `denominator`: what the sum is divided by (tacl.objectives.step_denominator), else |M| of this batch.

    Every position is a row of one fixed-shape cross-entropy; rows that are not anchors are ignored."""
    s = F.normalize(student.float(), dim=-1)
    t = F.normalize(teacher.float(), dim=-1)
    logits = torch.bmm(s, t.transpose(1, 2)) / tau  # [B, i, j]
    allowed = candidates[:, None, :] if candidates.dim() == 2 else candidates
    logits = logits.masked_fill(~allowed, _EXCLUDED)
    length = anchors.shape[1]
    target = torch.where(anchors, torch.arange(length, device=anchors.device), IGNORE_INDEX)
    loss = _summed(logits.flatten(0, 1), target.flatten(), weights)
    return mean_of(loss, anchors.sum(), denominator), counts(logits.argmax(-1) == target, anchors)


def _summed(logits: torch.Tensor, target: torch.Tensor, weights: torch.Tensor | None) -> torch.Tensor:
    """The cross-entropy of the rows whose target is not IGNORE_INDEX, summed (each times its weight)."""
    if weights is None:
        return F.cross_entropy(logits, target, ignore_index=IGNORE_INDEX, reduction="sum")
    per_row = F.cross_entropy(logits, target, ignore_index=IGNORE_INDEX, reduction="none")  # 0 where ignored
    return (per_row * weights.flatten()).sum()


@in_fp32
def tacl_batch_loss(student: torch.Tensor, teacher: torch.Tensor, index: torch.Tensor, targets: torch.Tensor,
                    candidates: torch.Tensor, tau: float, weights: torch.Tensor | None = None,
                    group: int | None = None,
                    denominator: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """TaCL with cross-sequence negatives: the anchors are the fixed-length list of flat positions `index`
    [K] into B*L (`targets` [K] is IGNORE_INDEX for list padding); an anchor's candidates are the allowed
    tokens `candidates` [B, L] of every sequence of its group (`group` consecutive sequences; None: the
    micro-batch), its positive the teacher's vector at its own position. student, teacher [B, L, H]. Only
    the K anchor rows are computed: [K, B*L] logits, the other groups' columns excluded. `weights` [K]: as
    in `tacl_loss`, per entry of the list; `denominator` too."""
    bsz, length = candidates.shape
    s = F.normalize(student.flatten(0, 1).index_select(0, index).float(), dim=-1)
    t = F.normalize(teacher.flatten(0, 1).float(), dim=-1)
    allowed = candidates.flatten()[None, :]
    span = group_size(bsz, group) * length  # positions per group
    if span < bsz * length:
        of = torch.arange(bsz * length, device=index.device) // span  # each position's group
        allowed = allowed & (of[None, :] == (index // span)[:, None])
    logits = (s @ t.T / tau).masked_fill(~allowed, _EXCLUDED)
    valid = targets != IGNORE_INDEX
    target = torch.where(valid, index, IGNORE_INDEX)
    loss = _summed(logits, target, weights)
    return mean_of(loss, valid.sum(), denominator), counts(logits.argmax(-1) == target, valid)


def supervised_tacl_loss(student: torch.Tensor, teacher: torch.Tensor, labels: torch.Tensor,
                         tau: float, ignore_index: int = -100) -> tuple[torch.Tensor, torch.Tensor]:
    """The token-level supervised variant: every labelled token is an anchor, its positive is the
    teacher's vector at the same position, and tokens of the same class are not negatives (only tokens
    with another label are). labels [B, L], ignore_index where a token has no label."""
    labelled = labels != ignore_index
    other_class = labels[:, :, None] != labels[:, None, :]
    eye = torch.eye(labels.shape[1], dtype=torch.bool, device=labels.device)[None]
    candidates = labelled[:, None, :] & (other_class | eye)
    return tacl_loss(student, teacher, labelled, candidates, tau)


@dataclass
class TaCL:
    tau: float = 0.01
    negatives: str = "real"  # "real" | "all" ([CLS] and [SEP] count as negatives too) | "batch" (tacl_batch)
    teacher_train_mode: bool = False  # reference: teacher left in train mode (dropout on)
    negatives_group: int | None = None  # tacl_batch (and tacl_attn's weights): sequences per group; None: micro-batch
    name: str = "tacl"
    needs_teacher: bool = True

    def __post_init__(self) -> None:
        if self.negatives not in ("real", "all", "batch"):
            raise ValueError(f"pretrain.tacl.negatives: {self.negatives!r} is not 'real', 'all' or 'batch'")
        if self.negatives == "batch":
            check_negatives_group(self.negatives_group, self.name)

    def __call__(self, model: Any, teacher: Any, batch: dict[str, torch.Tensor],
                 draws: dict[str, Any]) -> tuple[dict, dict]:
        out = encode(encoder(model), batch)
        losses, metrics = mlm_nsp_terms(model, batch, out)  # (NSP where the family has it)
        teacher.train(self.teacher_train_mode)
        # no autograd record (the teacher is frozen); not inference_mode, which torch.compile's AOTAutograd
        # cannot trace ("Cannot set version_counter for inference tensor") and whose tensors the student's
        # backward could not save without a copy
        with torch.no_grad():
            h, weights = self.teacher_side(teacher, batch, metrics)
        # on the padded [B, W] layout (a packed batch's vectors gathered into it)
        student, teacher_h = per_sequence(out.last_hidden_state, batch), per_sequence(h, batch)
        denominator = step_denominator(batch, "masked")
        real = batch["attention_mask"].bool() & ~batch["special_tokens_mask"]
        if self.negatives == "batch":  # the real tokens of every sequence of the anchor's group
            index = padded_index(batch, batch["mlm_index"])
            listed = None if weights is None else weights.flatten().index_select(0, index)
            losses["tacl"], metrics["tacl_acc"] = tacl_batch_loss(student, teacher_h, index, batch["mlm_targets"],
                                                                  real, self.tau, listed, self.negatives_group,
                                                                  denominator)
            return losses, metrics
        # within each sequence
        candidates = real if self.negatives == "real" else batch["attention_mask"].bool()
        losses["tacl"], metrics["tacl_acc"] = tacl_loss(student, teacher_h, batch["mlm_mask"], candidates, self.tau,
                                                        weights, denominator)
        return losses, metrics

    def teacher_side(self, teacher: Any, batch: dict[str, torch.Tensor],
                     metrics: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(under no_grad) The teacher's last layer on the clean sequences, and the anchors' weights
        [B, L] (None: every anchor counts once, TaCL's own loss)."""
        return encode(teacher, batch, "clean_ids").last_hidden_state, None
