"""The encoder families a start model may come from, and what differs between them that a stage must know
before it builds anything: whether the family was pretrained with next sentence prediction (its sequences
are then BERT's NSP pairs, else whole sentences), whether its embeddings take token type ids, which attention
implementation it runs, whether its attention can read packed batches, and the masking rate its authors used.

The family of a checkpoint is its config's `model_type`; a random start model names it in `model_init.family`.
Nothing here imports torch or transformers (the Snakefile and the shard jobs read it).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from tacl.runtime.io import InputError, read_json

START_META = "tacl_start.json"  # what `tacl pretrain init-model` records beside a start model, its family among it


@dataclass(frozen=True)
class Family:
    name: str  # transformers' model_type
    nsp: bool  # pretrained with next sentence prediction (an NSP head, NSP pairs with segment ids)
    token_types: bool  # the embeddings add token type ids (the encoder's forward takes them)
    attention: str  # the attn_implementation its models load with: sdpa where transformers has it
    packing: bool  # its attention goes through transformers' attention interface (tacl.objectives.packed)
    mlm_probability: float  # the share of tokens its authors' MLM selected
    summary: str


FAMILIES: dict[str, Family] = {f.name: f for f in (
    Family("bert", True, True, "sdpa", True, 0.15, "BERT (Devlin et al. 2019): WordPiece, MLM + NSP"),
    Family("roberta", False, True, "sdpa", True, 0.15, "RoBERTa (Liu et al. 2019): byte-level BPE, MLM alone"),
    Family("xlm-roberta", False, True, "sdpa", True, 0.15, "XLM-R (Conneau et al. 2020): SentencePiece, 100 "
           "languages, MLM alone"),
    Family("deberta-v2", False, True, "eager", False, 0.15, "DeBERTa-v2/v3 (He et al. 2021): disentangled "
           "attention, SentencePiece"),
    Family("electra", False, True, "sdpa", True, 0.15, "ELECTRA (Clark et al. 2020): the discriminator or "
           "generator as an encoder"),
    Family("modernbert", False, False, "sdpa", False, 0.30, "ModernBERT (Warner et al. 2024): rotary positions, "
           "MLM alone at 30%"),
)}


def family(model_type: str | None, key: str = "model") -> Family:
    """The family of a checkpoint whose config says `model_type`; InputError naming `key` for another."""
    if model_type not in FAMILIES:
        raise InputError(f"{key}: a {model_type} checkpoint; the start model must be one of "
                         f"{', '.join(FAMILIES)} (an encoder with a masked-LM head, or one that can take one)")
    return FAMILIES[model_type]


def model_type_of(folder: str | os.PathLike, read: Callable[[Path], Any] = read_json) -> str | None:
    """The model_type of the checkpoint in `folder`, from its JSON files alone: the family its tacl_start.json
    records (START_META: a start model written by `tacl pretrain init-model`), else its config.json's
    `model_type`; None where it has neither, or there is no such folder (a Hub name's config is fetched by its
    caller). `read` reads a file (read_json: an error for one that does not parse; the report's passes over it)."""
    for name, key in ((START_META, "family"), ("config.json", "model_type")):
        path = Path(folder) / name
        found = read(path) if path.is_file() else None
        if isinstance(found, dict) and found.get(key):
            return str(found[key])
    return None
