"""What the objectives read of a model, for every encoder family (tacl.runtime.family): the encoder, the MLM
head on the gathered masked positions, BERT's NSP head and pooler, and the encoder's keyword arguments.

The student is BERT's BertForPreTraining, or the family's masked-LM model (AutoModelForMaskedLM); the teacher
is the bare encoder. Where the families differ:

    bert                   BertForPreTraining: `bert`, `cls.predictions` (MLM), `cls.seq_relationship` (NSP)
    roberta, xlm-roberta   `roberta`, `lm_head`; positions count from the padding id + 1
    deberta-v2             `deberta`, `cls.predictions` (or `lm_predictions` with the word embeddings); eager
                           attention, which takes the 2-D padding mask
    electra                `electra`, `generator_predictions` then `generator_lm_head`
    modernbert             `model`, `head` then `decoder`; no token type ids; global and sliding-window layers

Only BERT has an NSP head: the NSP terms exist where `has_nsp` says so. The vocabulary projection always runs
on the gathered masked positions only (`mlm_logits` takes them as [N, H]).
"""

from __future__ import annotations

from typing import Any

import torch

from tacl.data import NO_PADDING
from tacl.data.packing import is_packed
from tacl.objectives import sdpa_mask
from tacl.runtime.family import Family, family


def family_of(model: Any) -> Family:
    """The family of a transformers model (student, teacher or auxiliary model), from its config."""
    return family(model.config.model_type)


def encoder(model: Any) -> Any:
    """The bare encoder of a model with heads (the model itself for a bare encoder, e.g. the teacher)."""
    return model.base_model


def has_nsp(model: Any) -> bool:
    """Whether the model has BERT's NSP head and pooler (BertForPreTraining)."""
    return family_of(model).nsp and hasattr(getattr(model, "cls", None), "seq_relationship")


def mlm_logits(model: Any, hidden: torch.Tensor) -> torch.Tensor:
    """The MLM head of a masked-LM model on hidden [N, H] (the gathered masked positions): logits [N, V]."""
    kind = model.config.model_type
    if kind in ("roberta", "xlm-roberta"):
        return model.lm_head(hidden)
    if kind == "electra":
        return model.generator_lm_head(model.generator_predictions(hidden))
    if kind == "modernbert":
        return model.decoder(model.head(hidden))
    if kind == "deberta-v2" and not hasattr(model, "cls"):  # DebertaV2ForMaskedLM with legacy: false
        return model.lm_predictions(hidden, model.deberta.embeddings.word_embeddings)
    return model.cls.predictions(hidden)  # BertForPreTraining, BertForMaskedLM, DeBERTa's legacy head


def nsp_logits(model: Any, pooled: torch.Tensor) -> torch.Tensor:
    """BERT's NSP classifier on the pooled [CLS] vectors [B, H]."""
    return model.cls.seq_relationship(pooled)


def pooler(model: Any) -> Any:
    """BERT's pooler (the NSP head's input)."""
    return encoder(model).pooler


def segments(fam: Family) -> bool:
    """Whether the encoder is given the batch's token type ids: where its sequences are NSP pairs of two
    segments (BERT). A family pretrained without NSP reads single segments, token type 0 throughout, which
    its embeddings take when given none (RoBERTa's and XLM-R's have one type, ModernBERT's none)."""
    return fam.nsp and fam.token_types


def padded_inputs(model: Any, batch: dict[str, Any], ids: str = "input_ids") -> dict[str, Any]:
    """The encoder's keyword arguments for a padded batch (read from its `ids` key): token type ids where
    `segments` says; the padding mask as the family's attention takes it with no read on the
    host: SDPA's 4-D boolean mask, none where the batch's `NO_PADDING` flag is set (`sdpa_mask`); DeBERTa's
    eager attention the 2-D mask itself; ModernBERT one mask per kind of layer (`modernbert_masks`)."""
    fam = family_of(model)
    inputs = {"input_ids": batch[ids]}
    if segments(fam):
        inputs["token_type_ids"] = batch["token_type_ids"]
    no_padding = batch.get(NO_PADDING) is True
    if fam.name == "deberta-v2":
        inputs["attention_mask"] = batch["attention_mask"]
    elif fam.name == "modernbert":
        inputs["attention_mask"] = modernbert_masks(model.config, batch["attention_mask"], no_padding)
    else:
        inputs["attention_mask"] = sdpa_mask(batch["attention_mask"], no_padding)
    return inputs


def modernbert_masks(config: Any, attention_mask: torch.Tensor, no_padding: bool = False) -> dict[str, Any]:
    """ModernBERT's masks, made here so that transformers reads nothing on the host to make them: its global
    layers take SDPA's padding mask (none without padding), its sliding-window layers the band
    |i - j| <= config.sliding_window within the real tokens, as 4-D booleans (True = attend)."""
    length = attention_mask.shape[1]
    j = torch.arange(length, device=attention_mask.device)
    band = ((j[:, None] - j[None, :]).abs() <= config.sliding_window)[None, None]  # [1, 1, L, L]
    full = sdpa_mask(attention_mask, no_padding)
    return {"full_attention": full, "sliding_attention": band if full is None else band & full}


def packed_inputs(model: Any, batch: dict[str, Any], ids: str = "input_ids") -> dict[str, Any]:
    """The encoder's keyword arguments for a packed row (tacl.objectives.packed): position ids restart in every
    sequence, counted from the padding id + 1 in RoBERTa's and XLM-R's embeddings, as their padded positions
    are."""
    fam = family_of(model)
    positions = batch["position_ids"]
    if fam.name in ("roberta", "xlm-roberta"):
        positions = positions + (model.config.pad_token_id + 1)
    inputs = {"input_ids": batch[ids], "position_ids": positions}
    if segments(fam):
        inputs["token_type_ids"] = batch["token_type_ids"]
    return inputs


def encoder_kwargs(model: Any, batch: dict[str, Any], ids: str = "input_ids") -> dict[str, Any]:
    """`padded_inputs` or `packed_inputs`, as the batch is."""
    return packed_inputs(model, batch, ids) if is_packed(batch) else padded_inputs(model, batch, ids)


def bert_style_attention(model: Any) -> bool:
    """Whether the model's layers are BERT's (`encoder.layer[k].attention.self` with its `query` and `key`
    projections), from which tacl_attn recomputes a layer's attention probabilities."""
    return family_of(model).name in ("bert", "roberta", "xlm-roberta", "electra")


def self_attention(model: Any, k: int) -> Any:
    """Layer k's self-attention module of a BERT-style encoder (`bert_style_attention`)."""
    return encoder(model).encoder.layer[k].attention.self


def layers(model: Any) -> int:
    return model.config.num_hidden_layers
