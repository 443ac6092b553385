"""Whether the shards suit the run before anything is built: their form (tacl.data.shards: NSP pairs or whole
sentences) against what the objective reads and against the start model's family (tacl.runtime.family)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tacl.data.shards import NSP_PAIRS, form_of, manifest_form
from tacl.runtime.family import FAMILIES


def reads_nsp(objective: Any) -> bool:
    """Whether the objective trains next sentence prediction whatever the family: its `with_nsp` (mlm_nsp; not
    mlm) or `keep_nsp` (TACO). The others add NSP where the start model's family has it, and the shards' form
    follows that family (`form_error`'s second check)."""
    return any(bool(getattr(objective, key, False)) for key in ("with_nsp", "keep_nsp"))


def start_family_name(start_model: str) -> str | None:
    """The family of the start model (its config's model_type), None for a type outside tacl.runtime.family."""
    from transformers import AutoConfig

    from tacl.runtime.hub import resolve_pretrained

    model_type = getattr(AutoConfig.from_pretrained(resolve_pretrained(start_model)), "model_type", None)
    return model_type if model_type in FAMILIES else None


def mlm_probability(configured: float | None, start_model: str) -> float:
    """The share of tokens masking selects: pretrain.mlm_probability, else the start model's family's (0.15 for
    BERT and a family outside tacl.runtime.family, 0.30 for ModernBERT)."""
    if configured is not None:
        return configured
    family = start_family_name(start_model)
    return FAMILIES[family].mlm_probability if family else FAMILIES["bert"].mlm_probability


def form_error(manifest_path: str, manifest: dict[str, Any], objective_name: str, objective: Any,
               start_model: str) -> str | None:
    """Why these shards cannot train this objective from this start model (one line), or None."""
    form, folder = manifest_form(manifest), Path(manifest_path).parent
    family = start_family_name(start_model)
    if reads_nsp(objective) and form != NSP_PAIRS:
        return (f"pretrain.objectives: {objective_name} trains next sentence prediction, which needs NSP pairs, but "
                f"the shards in {folder} hold {form} (the start model's family, {family or 'unknown'}, was "
                "pretrained without NSP): leave it out of pretrain.objectives for this family (mlm is MLM alone)")
    if family is not None and form != form_of(FAMILIES[family]):
        return (f"{folder}: these shards hold {form}, and the start model {start_model} is of family {family}, "
                f"pretrained on {form_of(FAMILIES[family])}: build the shards again for this start model (its "
                "family is what the tokenizer job records: `snakemake --forcerun fetch_tokenizer`)")
    return None
