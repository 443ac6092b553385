"""TACO: token-alignment contrastive learning (Fu et al. 2022), continual variant.

g_t = normalize(h_t - e_t), h the last layer, e the embedding-layer output. Each anchor t (every non-pad
position) has one positive t' of the same sequence with 0 < |t - t'| <= window (a random other position
of the sequence if there is none) and K negatives drawn uniformly from the other sequences of the batch;
positive and negatives are detached. Loss: InfoNCE with temperature tau, averaged over anchors, added to
MLM (NSP only if `keep_nsp`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from tacl.objectives.mlm_nsp import mlm_nsp_terms


def sample_taco_pairs(valid: torch.Tensor, window: int, k: int,
                      generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Positive position [B, L] (same sequence) and K negatives as flat indices into B*L [B, L, K]
    (other sequences), for every position; only rows where `valid` is set are meaningful."""
    bsz, length = valid.shape
    if bsz < 2:
        raise ValueError("TACO draws negatives from other sequences: the micro batch needs >= 2 sequences")
    pos = torch.arange(length).expand(bsz, length)
    # positive: a random valid neighbour within the window, else a random other valid position
    offsets = torch.tensor([o for o in range(-window, window + 1) if o != 0])
    cand = pos[..., None] + offsets  # [B, L, 2w]
    in_range = (cand >= 0) & (cand < length)
    cand_valid = in_range & valid.gather(1, cand.clamp(0, length - 1).view(bsz, -1)).view_as(cand)
    scores = torch.rand(cand.shape, generator=generator).masked_fill(~cand_valid, -1.0)
    positive = cand.gather(-1, scores.argmax(-1, keepdim=True)).squeeze(-1)
    for b, t in (valid & ~cand_valid.any(-1)).nonzero().tolist():  # rare: no valid neighbour in the window
        others = valid[b].nonzero().squeeze(-1)
        others = others[others != t]
        positive[b, t] = others[torch.randint(len(others), (1,), generator=generator)] if len(others) else t
    # negatives: uniform over the valid positions of the other sequences
    flat_valid = valid.flatten().nonzero().squeeze(-1)
    seq_of = flat_valid // length
    negatives = torch.zeros(bsz, length, k, dtype=torch.long)
    for b in range(bsz):
        pool = flat_valid[seq_of != b]
        if len(pool) == 0:
            raise ValueError("TACO: no valid token in the other sequences of the batch")
        negatives[b] = pool[torch.randint(len(pool), (length, k), generator=generator)]
    return positive, negatives


def taco_loss(g: torch.Tensor, valid: torch.Tensor, positive: torch.Tensor, negatives: torch.Tensor,
              tau: float) -> tuple[torch.Tensor, torch.Tensor]:
    """g [B, L, H] normalized token vectors (anchors keep their gradient; positives and negatives are
    detached); valid [B, L]; positive [B, L]; negatives [B, L, K] flat indices into B*L.
    Returns (loss averaged over valid anchors, accuracy: positive scored above every negative)."""
    bsz, length, hidden = g.shape
    keys = g.detach().reshape(bsz * length, hidden)
    b, t = valid.nonzero(as_tuple=True)
    anchor = g[b, t]  # [N, H]
    pos_logit = (anchor * keys[b * length + positive[b, t]]).sum(-1, keepdim=True)  # [N, 1]
    neg_logit = torch.bmm(keys[negatives[b, t]], anchor[:, :, None]).squeeze(-1)  # [N, K]
    logits = torch.cat([pos_logit, neg_logit], -1).float() / tau
    target = torch.zeros(len(b), dtype=torch.long, device=g.device)
    return F.cross_entropy(logits, target), (logits.argmax(-1) == 0).float().mean()


@dataclass
class TACO:
    tau: float = 0.07
    window: int = 2
    negatives: int = 50
    weight: float = 1.0
    keep_nsp: bool = False
    name: str = "taco"
    needs_teacher: bool = False

    def __call__(self, model: Any, teacher: Any, batch: dict[str, torch.Tensor],
                 generator: torch.Generator) -> tuple[dict, dict]:
        out = model.bert(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                         token_type_ids=batch["token_type_ids"], output_hidden_states=True)
        losses, metrics = mlm_nsp_terms(model, batch, out.last_hidden_state, out.pooler_output,
                                        with_nsp=self.keep_nsp)
        valid = batch["attention_mask"].bool()
        positive, negatives = sample_taco_pairs(valid.cpu(), self.window, self.negatives, generator)
        g = F.normalize((out.hidden_states[-1] - out.hidden_states[0]).float(), dim=-1)
        loss, metrics["taco_acc"] = taco_loss(g, valid, positive.to(g.device), negatives.to(g.device), self.tau)
        losses["taco"] = self.weight * loss
        return losses, metrics
