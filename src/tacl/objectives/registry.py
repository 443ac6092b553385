"""The one list of pretraining objectives: what a name builds, which `pretrain.<section>` keys it reads and
what the workflow must know about it. Everything else that names objectives comes from here: the
trainer (`build_objective`), the settings (`objective_params`), the config check and the trainer
(`group_error`, `packing_error`), the rules' wildcard constraints (`OBJECTIVE_PATTERN` in
workflow/rules/common.smk), the command line and the benchmark's choices; the schema's enums are checked
equal to it (tests/test_registry.py).

Imported by the Snakefile while it parses: nothing here imports torch.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any

from tacl.runtime.family import Family


@dataclass(frozen=True)
class Objective:
    name: str
    builds: str  # "module:Class" in tacl.objectives, called with the objective's params
    summary: str
    sections: tuple[str, ...] = ()  # pretrain.<section> dicts merged (in order) into its params
    fixed: dict[str, Any] = field(default_factory=dict)  # params the objective sets itself, over the sections'
    # its loss reads a fixed group of sequences (in-batch negatives, weights normalised over the group): it takes
    # `negatives_group` (pretrain.negatives_group), and a micro-batch must hold whole groups
    grouped: bool = False
    variant_of: str | None = None  # the objective it changes one thing of: the report's differences compare the two


REGISTRY: dict[str, Objective] = {o.name: o for o in (
    Objective("mlm_nsp", "mlm_nsp:MlmNsp", "BERT masked LM + next sentence prediction (the control)"),
    Objective("mlm", "mlm_nsp:MlmNsp", "masked LM alone (the control of a family pretrained without NSP)",
              fixed={"name": "mlm", "with_nsp": False}),
    Objective("tacl", "tacl:TaCL", "MLM + NSP + TaCL token contrast against a frozen teacher", ("tacl",)),
    Objective("tacl_batch", "tacl:TaCL", "TaCL with the other sequences' tokens as negatives too", ("tacl",),
              {"negatives": "batch", "name": "tacl_batch"}, grouped=True, variant_of="tacl"),
    Objective("tacl_attn", "tacl_attn:TaCLAttn", "TaCL with each masked token weighted by the attention it "
              "receives in the teacher", ("tacl", "tacl_attn"), grouped=True, variant_of="tacl"),
    Objective("taco", "taco:TACO", "MLM + TACO token-alignment contrast", ("taco",), grouped=True),
    Objective("coco_lm", "coco_lm:COCOLM", "COCO-LM: corrective LM + sequence contrast with an auxiliary MLM",
              ("coco_lm",), grouped=True),
)}
OBJECTIVES = tuple(REGISTRY)
# every model a config may name in pretrain.objectives and finetune.models: the start model itself, then these
MODELS = ("none", *OBJECTIVES)
# the rules' wildcard constraint for an objective's name
OBJECTIVE_PATTERN = "|".join(OBJECTIVES)
# pretrain.negatives_group's default (the schema's, checked equal by tests/test_registry.py): the reference
# implementations' per-device batch (TaCL: 256 sequences over 8 V100s)
NEGATIVES_GROUP = 32


def spec(name: str) -> Objective:
    if name not in REGISTRY:
        raise ValueError(f"unknown objective {name!r} (known: {', '.join(OBJECTIVES)})")
    return REGISTRY[name]


def objective_params(pretrain: dict[str, Any], name: str) -> dict[str, Any]:
    """The objective's settings from config.yaml's `pretrain` section: its sections' keys, merged, and a grouped
    objective's `negatives_group` (none for a name that is no objective, e.g. "" for the settings every
    objective shares; build_objective names it)."""
    params: dict[str, Any] = {}
    if name not in REGISTRY:
        return params
    for section in REGISTRY[name].sections:
        params.update(pretrain.get(section) or {})
    if REGISTRY[name].grouped:
        params["negatives_group"] = pretrain.get("negatives_group", NEGATIVES_GROUP)
    return params


def group_error(objectives: list[str], group: int | None, micro_batch: int | str, per_rank: int) -> str | None:
    """Why these objectives cannot train at this micro-batch with groups of `group` sequences
    (pretrain.negatives_group; one line naming both keys), or None. `micro_batch` may be auto, which then
    takes a multiple of the group out of a rank's `per_rank` sequences per step."""
    grouped = ", ".join(o for o in objectives if REGISTRY[o].grouped)
    if not grouped:
        return None
    if group is None:
        return (f"pretrain.negatives_group: not set for {grouped}, which take their negatives from fixed groups of "
                "sequences (settings made by tacl.experiment.design from a config always carry it)")
    size, key = (per_rank, "global_batch / ranks") if micro_batch == "auto" else (micro_batch, "micro_batch")
    if size % group:
        return (f"pretrain.micro_batch: {micro_batch}, but {grouped} take their negatives from fixed groups of "
                f"pretrain.negatives_group={group} sequences, and a micro-batch holds whole groups: "
                f"pretrain.{key} ({size}) must be a multiple of {group}")
    return None


def packing_error(objective: str, params: dict[str, Any]) -> str | None:
    """Why this objective cannot train on packed batches (one line naming the keys), or None."""
    if objective == "tacl_attn":
        return ("pretrain.packing: tacl_attn computes its attention weights on the padded layout; use packing "
                "false for it (its own config) or leave it out of pretrain.objectives")
    return None


def family_error(objective: str, params: dict[str, Any], fam: Family, packing: bool = False) -> str | None:
    """Why this objective cannot train a start model of family `fam` (tacl.runtime.family), packed or not (one
    line naming the keys), or None. Only BERT has an NSP head; packed batches need attention that goes
    through transformers' attention interface (tacl.objectives.packed), which DeBERTa's and ModernBERT's do
    not; tacl_attn reads a teacher layer's attention, which ModernBERT's rotary SDPA layers do not give."""
    if objective == "mlm_nsp" and not fam.nsp:
        return (f"pretrain.objectives: mlm_nsp trains next sentence prediction, which a {fam.name} start model was "
                "not pretrained with and has no head for; use mlm, its control without NSP")
    if objective == "taco" and params.get("keep_nsp") and not fam.nsp:
        return f"pretrain.taco.keep_nsp: true, but a {fam.name} start model has no NSP head; set it to false"
    if objective == "tacl_attn" and fam.name == "modernbert":
        return ("pretrain.objectives: tacl_attn reads a teacher layer's attention probabilities, which a modernbert "
                "start model does not give (rotary positions, SDPA without probabilities); leave tacl_attn out")
    if packing and not fam.packing:
        return (f"pretrain.packing: a {fam.name} start model's attention cannot read packed batches; set "
                "pretrain.packing to false")
    return None


def build_objective(name: str, params: dict[str, Any] | None = None) -> Any:
    """The objective `name` with `params` (from `objective_params`), e.g. TaCL(tau=0.01, ...)."""
    o = spec(name)
    module, cls = o.builds.split(":")
    return getattr(importlib.import_module(f"tacl.objectives.{module}"), cls)(**{**(params or {}), **o.fixed})
