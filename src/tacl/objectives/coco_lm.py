"""COCO-LM (Meng et al. 2021), continual variant (docs/pretraining.md).

An auxiliary MLM transformer (`aux_layers` layers, initialised from the start model's embeddings, first
layers and MLM head) reads the masked sequence and learns its own MLM loss; at the selected positions its
samples replace the tokens, and no gradient flows from the main model into it. The main model reads the
corrupted sequence and learns:

- Corrective LM: a copy head p_copy(1|h_i) = sigmoid(w_copy . h_i) says whether token i is the original
  (binary cross-entropy over every real position: L_copy), and
  L_LM = -mean over selected i of log( 1(x_i^corrupt = x_i) sg(p_copy(1|h_i)) + sg(p_copy(0|h_i)) softmax(E h_i)[x_i] );
  L_CLM = lambda_copy * L_copy + L_LM.
- Sequence contrastive learning: [CLS] of the corrupted sequence against [CLS] of a cropped view of the
  original (a random contiguous `crop` share of its tokens between [CLS] and [SEP]): InfoNCE on cosine
  similarity with temperature tau (1), symmetric, the other sequences of its group (`negatives_group`
  consecutive sequences of the step's order) as negatives.

The total is L_aux + L_CLM + L_SCL, each term the step's mean (over its selected positions, real tokens
or sequences). The auxiliary model and the copy head are trained and checkpointed with the main model
(exact resume holds for them too); only the main model is exported. Every draw (replacements, crops) is
made on the device from its group's generator (tacl.objectives.GroupDraws), with fixed shapes, ahead of the
forward (`draws`).
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F

from tacl.data.packing import is_packed
from tacl.runtime.io import InputError
from tacl.objectives import (GroupDraws, check_negatives_group, counts, draw_width, group_size, in_fp32, mean_of,
                             step_denominator)
from tacl.objectives.encoders import encoder, mlm_logits
from tacl.objectives.mlm_nsp import IGNORE_INDEX, mlm_loss
from tacl.objectives.packed import encode, first_tokens, padded_index


@in_fp32
def copy_loss(copy_logits: torch.Tensor, original: torch.Tensor, valid: torch.Tensor,
              denominator: torch.Tensor | None = None) -> tuple[torch.Tensor, Any]:
    """BCE of the copy head over the valid positions: copy_logits [B, L] (logit of "this token is the
    original"), original [B, L] bool (the input token equals the clean one), valid [B, L] bool. The sum over
    `denominator` where given (tacl.objectives.step_denominator), else the mean."""
    per_token = F.binary_cross_entropy_with_logits(copy_logits.float(), original.float(), reduction="none")
    loss = mean_of((per_token * valid).sum(), valid.sum(), denominator)
    return loss, counts((copy_logits > 0) == original, valid)


@in_fp32
def corrective_lm_loss(lm_logits: torch.Tensor, copy_logits: torch.Tensor, corrupted: torch.Tensor,
                       targets: torch.Tensor, denominator: torch.Tensor | None = None) -> tuple[torch.Tensor, Any]:
    """L_LM over a fixed-length list of selected positions: lm_logits [K, V], copy_logits [K], corrupted [K]
    (the token the main model read), targets [K] (the original token, IGNORE_INDEX for list padding).
    The copy probability is a stop-gradient weight; the log is taken in log space (logaddexp). The sum over
    `denominator` where given, else the mean."""
    valid = targets != IGNORE_INDEX
    safe = targets.clamp(min=0)
    log_lm = F.log_softmax(lm_logits.float(), -1).gather(1, safe[:, None]).squeeze(1)
    log_copy = F.logsigmoid(copy_logits.float()).detach()  # log p_copy(1|h)
    log_keep = F.logsigmoid(-copy_logits.float()).detach()  # log p_copy(0|h)
    same = corrupted == safe
    log_p = torch.logaddexp(torch.where(same, log_copy, torch.full_like(log_copy, float("-inf"))), log_keep + log_lm)
    loss = mean_of(-(log_p * valid).sum(), valid.sum(), denominator)
    return loss, counts(lm_logits.argmax(-1) == targets, valid)


@in_fp32
def sequence_contrastive_loss(a: torch.Tensor, b: torch.Tensor, tau: float,
                              group: int | None = None) -> tuple[torch.Tensor, Any]:
    """Symmetric InfoNCE on cosine similarity: a [B, H] ([CLS] of the corrupted sequences), b [B, H] ([CLS]
    of their cropped views); row i's positive is column i, the other columns of its group (`group`
    consecutive rows; None: the micro-batch) its negatives. The mean over the B rows (every micro-batch of a
    step holds as many)."""
    size = group_size(len(a), group)
    groups = len(a) // size
    sims = torch.bmm(F.normalize(a.float(), dim=-1).view(groups, size, -1),
                     F.normalize(b.float(), dim=-1).view(groups, size, -1).transpose(1, 2)) / tau  # [G, i, j]
    target = torch.arange(size, device=sims.device).repeat(groups)
    rows, columns = sims.flatten(0, 1), sims.transpose(1, 2).flatten(0, 1)
    loss = (F.cross_entropy(rows, target) + F.cross_entropy(columns, target)) / 2
    return loss, counts(rows.argmax(-1) == target, torch.ones_like(target, dtype=torch.bool))


def uniform(draws: torch.Generator | torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
    """Uniform float64 numbers in [0, 1) of this shape: `draws` itself when they were drawn ahead (outside a
    compiled step, which cannot take a generator), else drawn from the generator `draws`."""
    if isinstance(draws, torch.Generator):
        return torch.rand(shape, generator=draws, device=draws.device, dtype=torch.float64)
    return draws


def sample_rows(probs: torch.Tensor, draws: torch.Generator | torch.Tensor) -> torch.Tensor:
    """One draw per row of probs [K, V] by inverting the row's cumulative distribution with one uniform
    number (`draws`: [K, 1], or a generator): K random numbers instead of torch.multinomial's K x V
    exponentials (41% of a CPU step)."""
    cdf = probs.double().cumsum(-1)
    u = uniform(draws, (len(probs), 1)) * cdf[:, -1:]
    return torch.searchsorted(cdf, u).squeeze(1).clamp(max=probs.shape[1] - 1)


def crop_span(n: torch.Tensor, share: float, draws: torch.Generator | torch.Tensor
              ) -> tuple[torch.Tensor, torch.Tensor]:
    """(start s, length m) of the crop of each sequence of n [B] real tokens: the tokens between its [CLS]
    (position 0) and its last [SEP] (position n-1) are c = n-2; m = ceil(share * c) of them (in float64) from
    a uniform start s in [0, c-m], one float64 number per sequence (`draws`: [B], or a generator)."""
    c = (n - 2).clamp(min=0)
    m = torch.ceil(c.double() * share).long().clamp(max=c)
    u = uniform(draws, (len(n),))
    return torch.minimum((u * (c - m + 1)).long(), c - m), m


def crop_view(ids: torch.Tensor, token_type: torch.Tensor, attention: torch.Tensor, share: float, pad_id: int,
              draws: torch.Generator | torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(ids, token types, attention) of `[CLS] x[s+1 .. s+m] [SEP]` per row, its crop (`crop_span`) of the
    tokens between the row's [CLS] and its last [SEP]. Shapes stay [B, L]."""
    length = ids.shape[1]
    n = attention.sum(1)  # [B] real tokens
    start, m = crop_span(n, share, draws)
    j = torch.arange(length, device=ids.device)[None, :]
    source = (start[:, None] + j).clamp(max=length - 1)  # position j >= 1 of the view reads s + j
    sep = ids.gather(1, (n - 1).clamp(min=0)[:, None])
    body = ids.gather(1, source)
    view = torch.where(j == 0, ids[:, :1], torch.where(j <= m[:, None], body,
                                                       torch.where(j == m[:, None] + 1, sep, pad_id)))
    last_type = token_type.gather(1, (n - 1).clamp(min=0)[:, None])
    types = torch.where(j <= m[:, None], token_type.gather(1, source), last_type)
    keep = j <= m[:, None] + 1
    return view, torch.where(keep, types, 0), keep.long()


def crop_lengths(lengths: tuple[int, ...], share: float) -> tuple[int, ...]:
    """The lengths m + 2 of the cropped views of sequences of these lengths n (m = ceil(share * (n - 2)), in
    float64 as on the device), from the host's lengths of a packed micro-batch. Computed eagerly, outside the
    compiled step: dynamo cannot trace `math.ceil` of a dynamic length times a float."""
    return tuple(min(math.ceil(max(n - 2, 0) * share), max(n - 2, 0)) + 2 for n in lengths)


def packed_crop_view(clean: torch.Tensor, token_type: torch.Tensor, cu_seqlens: torch.Tensor,
                     view_lengths: tuple[int, ...], share: float,
                     draws: torch.Generator | torch.Tensor) -> dict[str, Any]:
    """`crop_view` on a packed row: clean, token_type [1, T] -> the views as a packed batch of their own (the
    keys of tacl.data.packing that the encoder reads), of the lengths `crop_lengths` gives; the crops are
    `crop_view`'s (`crop_span`, the same draws), so a packed micro-batch sees the same views as its padded
    twin."""
    device = clean.device
    total = sum(view_lengths)
    n = cu_seqlens[1:] - cu_seqlens[:-1]
    start, m = crop_span(n, share, draws)
    view_cu = F.pad((m + 2).cumsum(0), (1, 0))
    seq = torch.searchsorted(view_cu[1:], torch.arange(total, device=device), right=True)  # [Tv]
    j = torch.arange(total, device=device) - view_cu.index_select(0, seq)
    m_t, n_t, start_t = m.index_select(0, seq), n.index_select(0, seq), start.index_select(0, seq)
    # as crop_view: position 0 is [CLS]; 1..m the body from s + j; m + 1 the last [SEP]; the token types are
    # those of s + j up to m, then the [SEP]'s
    token = torch.where(j == 0, 0, torch.where(j <= m_t, start_t + j, n_t - 1))
    kind = torch.where(j <= m_t, start_t + j, n_t - 1)
    first = cu_seqlens.index_select(0, seq)
    width = max(view_lengths)
    position = torch.arange(width, device=device)[None, :]
    real = position < (m + 2)[:, None]  # [B, Wv]
    return {"input_ids": clean[0].index_select(0, first + token)[None],
            "token_type_ids": token_type[0].index_select(0, first + kind)[None],
            "position_ids": j[None], "cu_seqlens": view_cu, "lengths": view_lengths, "max_seqlen": width,
            "attention_mask": real, "unpad_index": seq * width + j}


class COCOLM(torch.nn.Module):
    """The objective holds the auxiliary MLM model and the copy head: parameters that train and checkpoint
    with the student (inside the DeepSpeed engine) but are not exported."""

    name = "coco_lm"
    needs_teacher = False

    def __init__(self, aux_layers: int | None = None, lambda_copy: float = 50.0, tau: float = 1.0,
                 crop: float = 0.9, negatives_group: int | None = None):
        super().__init__()
        if not 0 < crop <= 1:
            raise InputError(f"pretrain.coco_lm.crop: {crop} is not in (0, 1]")
        check_negatives_group(negatives_group, "coco_lm's sequence contrast")
        self.aux_layers, self.lambda_copy, self.tau, self.crop = aux_layers, lambda_copy, tau, crop
        self.negatives_group = negatives_group
        self.aux: Any = None
        self.copy_head: Any = None

    def check(self, start_dir: str) -> None:
        """Before anything is built: the auxiliary model must be smaller than the main one."""
        from transformers import AutoConfig

        layers = AutoConfig.from_pretrained(start_dir).num_hidden_layers
        if self.aux_layers is None:
            self.aux_layers = max(1, layers // 3)
        if not 1 <= self.aux_layers <= layers:
            raise InputError(f"pretrain.coco_lm.aux_layers: {self.aux_layers} layers for the auxiliary model, but the "
                             f"main model has {layers}; it must be between 1 and {layers}")

    def attach(self, start_dir: str, student: Any) -> None:
        """Build the auxiliary model (from the start checkpoint's bottom layers and MLM head: BERT's
        BertForMaskedLM, another family's masked-LM model) and the copy head."""
        from transformers import AutoConfig, AutoModelForMaskedLM, BertForMaskedLM

        from tacl.runtime.family import family

        config = AutoConfig.from_pretrained(start_dir)
        fam = family(config.model_type)
        if fam.name == "bert":
            self.aux = BertForMaskedLM.from_pretrained(start_dir, num_hidden_layers=self.aux_layers,
                                                       attn_implementation=fam.attention)
        else:
            config.num_hidden_layers = self.aux_layers
            if getattr(config, "layer_types", None) is not None:  # ModernBERT: its first layers' kinds
                config.layer_types = config.layer_types[:self.aux_layers]
            self.aux = AutoModelForMaskedLM.from_pretrained(start_dir, config=config, attn_implementation=fam.attention)
        self.copy_head = torch.nn.Linear(student.config.hidden_size, 1)

    def draws(self, batch: dict[str, torch.Tensor], draws: GroupDraws) -> dict[str, Any]:
        """The uniform numbers of a micro-batch, per group: one per position up to the run's widest
        micro-batch, of which the selected positions' are the auxiliary model's samples, and one per
        sequence (its crop). Positions are those of the padded layout, packed or not."""
        bsz, width = batch["attention_mask"].shape
        size = group_size(bsz, self.negatives_group)
        shape = (size, draw_width(batch))
        positions, crops = draws.draw(bsz, size, lambda generator: (uniform(generator, shape),
                                                                    uniform(generator, (size,))))
        index = padded_index(batch, batch["mlm_index"])
        out = {"samples": positions[:, :width].reshape(-1).index_select(0, index)[:, None], "crops": crops}
        if is_packed(batch):
            out["view_lengths"] = crop_lengths(batch["lengths"], self.crop)
        return out

    def forward(self, model: Any, teacher: Any, batch: dict[str, torch.Tensor],
                draws: dict[str, torch.Tensor]) -> tuple[dict, dict]:
        index, targets = batch["mlm_index"], batch["mlm_targets"]
        # the auxiliary MLM on the masked sequence, and its samples at the selected positions
        aux_hidden = encode(encoder(self.aux), batch).last_hidden_state
        aux_logits = mlm_logits(self.aux, aux_hidden.flatten(0, 1).index_select(0, index))
        losses, metrics = {}, {}
        masked, tokens = step_denominator(batch, "masked"), step_denominator(batch, "tokens")
        losses["aux_mlm"], metrics["aux_mlm_acc"] = mlm_loss(aux_logits, targets, masked)
        with torch.no_grad():
            samples = sample_rows(F.softmax(aux_logits.float(), -1), draws["samples"])
        clean = batch["clean_ids"]
        flat = clean.flatten()
        picked = torch.where(targets != IGNORE_INDEX, samples, flat.index_select(0, index))  # list padding: unchanged
        corrupted = flat.scatter(0, index, picked).view_as(clean)
        # the main model on the corrupted sequence: copy head and corrective LM
        corrupted_batch = {**batch, "input_ids": corrupted}
        hidden = encode(encoder(model), corrupted_batch).last_hidden_state
        copy_logits = self.copy_head(hidden).squeeze(-1)
        valid = torch.ones_like(clean, dtype=torch.bool) if is_packed(batch) else batch["attention_mask"].bool()
        copy, metrics["copy_acc"] = copy_loss(copy_logits, corrupted == clean, valid, tokens)
        lm_logits = mlm_logits(model, hidden.flatten(0, 1).index_select(0, index))
        lm, metrics["clm_acc"] = corrective_lm_loss(lm_logits, copy_logits.flatten().index_select(0, index),
                                                    picked, targets, masked)
        losses["clm"] = self.lambda_copy * copy + lm
        # sequence contrast: [CLS] of the corrupted sequence against [CLS] of a cropped view of the original
        if is_packed(batch):
            view_batch = packed_crop_view(clean, batch["token_type_ids"], batch["cu_seqlens"], draws["view_lengths"],
                                          self.crop, draws["crops"])
        else:
            view, types, attention = crop_view(clean, batch["token_type_ids"], batch["attention_mask"], self.crop,
                                               model.config.pad_token_id or 0, draws["crops"])
            view_batch = {"input_ids": view, "token_type_ids": types, "attention_mask": attention}
        view_cls = first_tokens(encode(encoder(model), view_batch).last_hidden_state, view_batch)
        losses["scl"], metrics["scl_acc"] = sequence_contrastive_loss(first_tokens(hidden, batch), view_cls,
                                                                      self.tau, self.negatives_group)
        return losses, metrics
