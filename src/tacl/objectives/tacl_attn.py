"""TaCL with attention-weighted tokens: the second proposal of the published TaCL reproduction ("an
attention-based mechanism that weighs the importance of different tokens in the contrastive objective").

L = L_MLM + L_NSP + (1/|M|) sum_{i in M} w_i l_i,   l_i = TaCL's term of masked token i (tacl.py),

  a_i = sum_{q real} (1/H) sum_h P_h[q, i]      the attention token i receives in teacher layer `layer`
                                                 (clean sequence; H heads; q over the real query tokens)
  w_i = |G| a_i^p / sum_{k in G} a_k^p           p = `power`; G the masked tokens of i's group of
                                                 `negatives_group` sequences of the step's order

so the weights sum to |G| in each group, to |M| over the step, and the loss keeps TaCL's scale (a weighted
mean of the same terms, over the step's masked tokens M). Summed, not
averaged, over the queries: a token that receives the average share has a_i = 1 in a sequence of any
length (an average would favour the tokens of short sequences). p = 0 weighs every token alike, p > 1
sharpens. `weighting: uniform` is TaCL itself, computed by the same code (bit for bit).

P_h = softmax(Q_h K_h^T / sqrt(d) + padding mask), with Q and K the layer's own query and key projections
of its input, recomputed in fp32 (TF32 matmuls on a GPU) from the hidden states that the teacher's one
pass returns: no second teacher pass, no eager attention, no host synchronisation, fixed shapes. The
weights are constants (the teacher is frozen). Attention dropout (a teacher in train mode) is not applied
to P. That holds for BERT, RoBERTa, XLM-R and ELECTRA, whose layers are BERT's. A DeBERTa teacher runs
eager attention anyway (transformers has no SDPA for it) and returns its own probabilities, relative
positions included (`output_attentions`): P_h is those, mean over heads in the same way (with attention
dropout where the teacher is in train mode). A ModernBERT start model is refused
(tacl.objectives.registry.family_error): its query and key carry rotary positions and its SDPA returns no
probabilities. Metric `tacl_weight_ess`: the weights' effective share of the masked tokens, sum over groups of
(sum_G w)^2 / sum over groups of |G| sum_G w^2, 1 when they are uniform.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from tacl.objectives import group_size, in_fp32
from tacl.objectives.encoders import bert_style_attention, padded_inputs, self_attention
from tacl.objectives.tacl import _EXCLUDED, TaCL
from tacl.runtime.io import InputError

WEIGHTINGS = ("attention", "uniform")


@in_fp32
def attention_received(hidden: torch.Tensor, query_weight: torch.Tensor, query_bias: torch.Tensor,
                       key_weight: torch.Tensor, key_bias: torch.Tensor, heads: int, allowed: torch.Tensor | None,
                       queries: torch.Tensor) -> torch.Tensor:
    """a [B, L]: the attention each token receives in one layer, mean over heads, summed over the query
    tokens `queries` [B, L] bool. hidden [B, L, D] the layer's input; its query and key projections;
    allowed: which keys a query may attend (True), broadcastable to [B, 1, L, L] (SDPA's [B, 1, 1, L]
    padding mask, or a block mask), None: every key (a micro-batch without padding, tacl.objectives.sdpa_mask).
    In fp32 whatever the inputs' dtype."""
    bsz, length, _ = hidden.shape
    q = F.linear(hidden, query_weight, query_bias).view(bsz, length, heads, -1).transpose(1, 2)  # [B, h, L, d]
    k = F.linear(hidden, key_weight, key_bias).view(bsz, length, heads, -1).transpose(1, 2)
    scores = (q @ k.transpose(-1, -2)) * q.shape[-1] ** -0.5
    if allowed is not None:
        scores = scores.masked_fill(~allowed, _EXCLUDED)
    probs = scores.softmax(-1)  # [B, h, query, key]
    return torch.einsum("bhqk,bq->bk", probs, queries.to(probs.dtype)) / heads


@in_fp32
def attention_from_probabilities(probs: torch.Tensor, queries: torch.Tensor) -> torch.Tensor:
    """a [B, L] as `attention_received` gives it, from a layer's own attention probabilities [B, h, L, L] (an
    eager encoder's `output_attentions`)."""
    return torch.einsum("bhqk,bq->bk", probs, queries.to(probs.dtype)) / probs.shape[1]


@in_fp32
def token_weights(received: torch.Tensor, anchors: torch.Tensor, power: float,
                  group: int | None = None) -> torch.Tensor:
    """w [B, L] = |G| a_i^p / sum_{k in G} a_k^p on the anchors (anchors [B, L] bool), G the anchors of i's
    group of `group` consecutive sequences (None: the micro-batch), 0 elsewhere; all 0 in a group without
    anchors. a is scaled by its largest value on G first, so that a^p stays in [0, 1] for any power."""
    tiny = torch.finfo(received.dtype).tiny
    groups = received.shape[0] // group_size(received.shape[0], group)
    on = anchors.reshape(groups, -1)
    a = received.reshape(groups, -1).masked_fill(~on, 0.0)
    a = a / a.amax(1, keepdim=True).clamp(min=tiny)
    q = torch.where(on, a.pow(power), 0.0)
    return (q * (on.sum(1, keepdim=True) / q.sum(1, keepdim=True).clamp(min=tiny))).view_as(received)


def effective_share(weights: torch.Tensor, anchors: torch.Tensor, group: int | None = None) -> torch.Tensor:
    """[sum over groups of (sum_G w)^2, sum over groups of |G| sum_G w^2]: a pair the trainer sums over a
    logging interval and divides (1 = uniform); groups as in `token_weights`."""
    groups = weights.shape[0] // group_size(weights.shape[0], group)
    w = weights.reshape(groups, -1)
    total = w.sum(1)
    return torch.stack([(total * total).sum(), (anchors.reshape(groups, -1).sum(1) * (w * w).sum(1)).sum()]).double()


@dataclass
class TaCLAttn(TaCL):
    """TaCL (tau, negatives, teacher_train_mode from `pretrain.tacl`) with the weights of `pretrain.tacl_attn`."""

    layer: int = -1  # 1..L, or -1 = the last (negative: from the end)
    power: float = 1.0
    weighting: str = "attention"  # attention | uniform (TaCL's own loss)
    name: str = "tacl_attn"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.weighting not in WEIGHTINGS:
            raise InputError(f"pretrain.tacl_attn.weighting: {self.weighting!r} is not one of {', '.join(WEIGHTINGS)}")
        if self.power < 0:
            raise InputError(f"pretrain.tacl_attn.power: {self.power} is negative")
        if self.layer == 0:
            raise InputError("pretrain.tacl_attn.layer: 0 is not a layer (1..L, or -1 for the last)")

    def check(self, start_dir: str) -> None:
        """Before anything is built: the layer exists in the start model."""
        from transformers import AutoConfig

        layers = AutoConfig.from_pretrained(start_dir).num_hidden_layers
        if not (1 <= self.layer <= layers or -layers <= self.layer <= -1):
            raise InputError(f"pretrain.tacl_attn.layer: {self.layer}, but the start model has {layers} layers "
                             f"(1..{layers}, or -1 for the last)")

    def teacher_side(self, teacher: Any, batch: dict[str, torch.Tensor],
                     metrics: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor | None]:
        if self.weighting == "uniform":
            return super().teacher_side(teacher, batch, metrics)
        inputs = padded_inputs(teacher, batch, "clean_ids")
        k = self.layer - 1 if self.layer > 0 else teacher.config.num_hidden_layers + self.layer
        queries = batch["attention_mask"].bool()
        if bert_style_attention(teacher):  # recomputed from the layer's query and key (SDPA gives no probabilities)
            out = teacher(**inputs, output_hidden_states=True)
            attention = self_attention(teacher, k)
            received = attention_received(out.hidden_states[k], attention.query.weight, attention.query.bias,
                                          attention.key.weight, attention.key.bias, attention.num_attention_heads,
                                          inputs["attention_mask"], queries)
        else:  # DeBERTa's eager attention returns its probabilities (relative positions included)
            out = teacher(**inputs, output_attentions=True)
            received = attention_from_probabilities(out.attentions[k], queries)
        anchors = batch["mlm_mask"]
        weights = token_weights(received, anchors, self.power, self.negatives_group)
        metrics["tacl_weight_ess"] = effective_share(weights, anchors, self.negatives_group)
        return out.last_hidden_state, weights
