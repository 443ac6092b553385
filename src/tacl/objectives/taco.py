"""TACO: token-alignment contrastive learning (Fu et al. 2022), continual variant.

g_t = normalize(h_t - e_t), h the last layer, e the embedding-layer output. Each anchor t (every non-pad
position) has one positive t' of the same sequence with 0 < |t - t'| <= window (a random other position
of the sequence if there is none) and K negatives drawn uniformly from the other sequences of its group
(`negatives_group` consecutive sequences of the step's order); positive and negatives are detached. Loss:
InfoNCE with temperature tau, averaged over the step's anchors, added to MLM (NSP only if `keep_nsp`).

Pairs are drawn on the device with fixed shapes (no Python loop, no `nonzero`). Only the 1 + K similarities
of each anchor are computed (`gathered_dots`), not the [B*L, B*L] matrix they are a 51-column sample of
(268 MB and 2 * 103 GFLOP per 32 x 256 micro-batch of BERT-base; benchmarks/taco_similarities.py measures
both ways).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from tacl.objectives import (GroupDraws, check_negatives_group, counts, draw_width, group_size, in_fp32, mean_of,
                             step_denominator)
from tacl.objectives.mlm_nsp import IGNORE_INDEX, mlm_nsp_terms
from tacl.objectives.encoders import encoder
from tacl.objectives.packed import encode, per_sequence


def _below(n: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Uniform integers in [0, n) from uniform numbers u in [0, 1) (n broadcast against u; 0 where n is 0)."""
    return torch.minimum((u * n).long(), (n - 1).clamp(min=0))


TacoDraws = tuple[torch.Tensor, torch.Tensor, torch.Tensor]


def taco_draws(shape: tuple[int, int], window: int, k: int, generator: torch.Generator) -> TacoDraws:
    """The uniform numbers `sample_taco_pairs` uses for a [B, L] batch, drawn ahead (outside a compiled
    step, which cannot take a generator): the neighbour scores [B, L, 2 window], the fallback positive
    [B, L] and the negatives [B, L, K]. `generator` lives on the batch's device."""
    device = generator.device
    return (torch.rand((*shape, 2 * window), generator=generator, device=device),
            torch.rand(shape, generator=generator, device=device, dtype=torch.float64),
            torch.rand((*shape, k), generator=generator, device=device, dtype=torch.float64))


def sample_taco_pairs(valid: torch.Tensor, window: int, k: int, draws: torch.Generator | TacoDraws,
                      group: int | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """For every position of valid [B, L]: a positive position [B, L] of the same sequence, K negatives
    [B, L, K] as flat indices into B*L (valid positions of the other sequences of its group of `group`
    consecutive sequences; None: the micro-batch), and which anchors have negatives at all [B] (a group whose
    other sequences are empty has none). Only rows where `valid` is set are meaningful. `draws`:
    `taco_draws`' numbers, or a generator on valid's device to draw them."""
    bsz, length = valid.shape
    size = group_size(bsz, group)
    if size < 2:
        raise ValueError("TACO draws negatives from other sequences: a group needs >= 2 sequences")
    if isinstance(draws, torch.Generator):
        draws = taco_draws((bsz, length), window, k, draws)
    u_scores, u_other, u_negatives = draws
    device = valid.device
    pos = torch.arange(length, device=device)
    # positive: a random valid neighbour within the window ...
    steps = torch.arange(1, window + 1, device=device)  # (made on the device: no copy from the host)
    offsets = torch.cat([-steps.flip(0), steps])  # -w .. -1, 1 .. w
    cand = pos[:, None] + offsets  # [L, 2w]
    in_range = (cand >= 0) & (cand < length)
    cand = cand.clamp(0, length - 1)
    cand_valid = in_range & valid[:, cand]  # [B, L, 2w]
    scores = u_scores.masked_fill(~cand_valid, -1.0)
    positive = cand.expand(bsz, length, -1).gather(-1, scores.argmax(-1, keepdim=True)).squeeze(-1)
    # ... else a random other valid position of the sequence (the r-th valid one, skipping itself)
    in_seq = valid.long().cumsum(1)  # [B, L]: valid positions up to and including t
    count = in_seq[:, -1:]  # [B, 1]
    r = _below(count - 1, u_other)
    r = r + (r >= in_seq - 1).long()
    other = torch.searchsorted(in_seq, r + 1).clamp(max=length - 1)
    other = torch.where(count > 1, other, pos)  # alone in its sequence: itself
    positive = torch.where(cand_valid.any(-1), positive, other)
    # negatives: uniform over the valid positions of the group's other sequences (the r-th one of the group,
    # skipping the anchor's own sequence)
    groups, span = bsz // size, size * length  # span: positions per group
    count = count.view(groups, size)
    before = (count.cumsum(1) - count).view(bsz, 1, 1)  # valid positions in the group's earlier sequences
    pool = (count.sum(1, keepdim=True) - count).view(bsz)
    r = _below(pool[:, None, None], u_negatives)
    r = r + torch.where(r >= before, count.view(bsz, 1, 1), 0)
    in_group = valid.view(groups, span).long().cumsum(1)
    found = torch.searchsorted(in_group, (r + 1).view(groups, -1)).clamp(max=span - 1)  # within the group
    negatives = (found + torch.arange(groups, device=device)[:, None] * span).view(bsz, length, k)
    return positive, negatives, pool > 0


class _GatheredDots(torch.autograd.Function):
    """dots[n, c] = q[n] . keys[columns[n, c]], differentiable in q only (keys are detached). Both ways are
    one fused PyTorch kernel that reads the rows of `keys` it needs: forward the per-sample-weight gradient
    kernel of embedding_bag (a dot per (anchor, column)), backward embedding_bag itself with the incoming
    gradient as per-sample weights (sum_c grad[n, c] * keys[columns[n, c]]). No [N, C, H] copy of the
    gathered rows is made or kept, and every shape is fixed by the input shapes."""

    @staticmethod
    def forward(ctx: Any, q: torch.Tensor, keys: torch.Tensor, columns: torch.Tensor) -> torch.Tensor:
        n, c = columns.shape
        offsets = torch.arange(0, n * c, c, device=columns.device)  # bag n: samples n*c .. n*c + c - 1
        bag_of_sample = torch.arange(n * c, device=columns.device) // c
        ctx.save_for_backward(keys, columns)
        return torch.ops.aten._embedding_bag_per_sample_weights_backward(
            q.contiguous(), keys, columns.reshape(-1), offsets, bag_of_sample, 0).view(n, c)  # (0: mode sum)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        keys, columns = ctx.saved_tensors
        return F.embedding_bag(columns, keys, mode="sum", per_sample_weights=grad.contiguous()), None, None


def gathered_dots(q: torch.Tensor, keys: torch.Tensor, columns: torch.Tensor) -> torch.Tensor:
    """q [N, H] . keys[columns] -> [N, C] (`_GatheredDots`); the gradient reaches q only."""
    return _GatheredDots.apply(q, keys.detach(), columns)


@in_fp32
def taco_loss(g: torch.Tensor, valid: torch.Tensor, positive: torch.Tensor, negatives: torch.Tensor,
              tau: float, denominator: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """g [B, L, H] normalized token vectors (anchors keep their gradient; positives and negatives are
    detached); valid [B, L] (the anchors); positive [B, L]; negatives [B, L, K] flat indices into B*L.
    Returns (loss averaged over valid anchors, or the sum over `denominator` where given
    (tacl.objectives.step_denominator); accuracy counts: positive scored above every negative)."""
    bsz, length, hidden = g.shape
    flat = g.reshape(bsz * length, hidden)
    own = (torch.arange(bsz, device=g.device)[:, None] * length + positive).reshape(-1, 1)
    columns = torch.cat([own, negatives.reshape(bsz * length, -1)], 1)
    logits = gathered_dots(flat, flat, columns) / tau  # [B*L, 1 + K]
    anchors = valid.flatten()
    target = torch.where(anchors, 0, IGNORE_INDEX)
    loss = F.cross_entropy(logits, target, ignore_index=IGNORE_INDEX, reduction="sum")
    return mean_of(loss, anchors.sum(), denominator), counts(logits.argmax(-1) == 0, anchors)


@dataclass
class TACO:
    tau: float = 0.07
    window: int = 2
    negatives: int = 50
    weight: float = 1.0
    keep_nsp: bool = False
    negatives_group: int | None = None  # sequences per group of negatives (None: the micro-batch)
    name: str = "taco"
    needs_teacher: bool = False

    def __post_init__(self) -> None:
        check_negatives_group(self.negatives_group, "taco")

    def draws(self, batch: dict[str, torch.Tensor], draws: GroupDraws) -> dict[str, Any]:
        """Each group's numbers for every position up to the run's widest micro-batch, cut to this one's width
        ([B, W], packed or not: the draws of a packed batch are its padded twin's), each group's cut before they
        are joined: new tensors of the batch's own shape, never views, as the compiled loss expects them."""
        bsz, width = batch["attention_mask"].shape
        size = group_size(bsz, self.negatives_group)
        shape = (size, draw_width(batch))

        def group(generator: torch.Generator) -> TacoDraws:
            return tuple(u[:, :width] for u in taco_draws(shape, self.window, self.negatives, generator))

        return {"pairs": draws.draw(bsz, size, group)}

    def __call__(self, model: Any, teacher: Any, batch: dict[str, torch.Tensor],
                 draws: dict[str, Any]) -> tuple[dict, dict]:
        out = encode(encoder(model), batch, output_hidden_states=True)
        losses, metrics = mlm_nsp_terms(model, batch, out, with_nsp=self.keep_nsp)
        valid = batch["attention_mask"].bool()
        positive, negatives, has_negatives = sample_taco_pairs(valid, self.window, self.negatives, draws["pairs"],
                                                               self.negatives_group)
        # (a packed batch's vectors gathered into the padded [B, W] layout: the same draws and pairs)
        g = F.normalize(per_sequence(out.hidden_states[-1] - out.hidden_states[0], batch).float(), dim=-1)
        loss, metrics["taco_acc"] = taco_loss(g, valid & has_negatives[:, None], positive, negatives, self.tau,
                                              step_denominator(batch, "tokens"))
        losses["taco"] = self.weight * loss
        return losses, metrics
