"""What the start model's family (tacl.runtime.family) decides about the data a run trains on, checked before
anything is built: whether the shards' form (tacl.data.shards: NSP pairs or whole sentences) suits the objective
and the family, and the masking rate (pretrain.mlm_probability, else the family's)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tacl.data.masking import MaskingSpec
from tacl.data.shards import NSP_PAIRS, form_of, manifest_form
from tacl.runtime.family import FAMILIES, model_type_of


def reads_nsp(objective: Any) -> bool:
    """Whether the objective trains next sentence prediction whatever the family: its `with_nsp` (mlm_nsp; not
    mlm) or `keep_nsp` (TACO). The others add NSP where the start model's family has it, and the shards' form
    follows that family (`form_error`'s second check)."""
    return any(bool(getattr(objective, key, False)) for key in ("with_nsp", "keep_nsp"))


def start_family_name(start_model: str) -> str | None:
    """The family of the start model (tacl.runtime.family.model_type_of, read from its folder's JSON files), None
    for a type outside tacl.runtime.family. (The trainer's start model is a folder: tacl.pretrain.model.start_family,
    called before this, refuses anything else.)"""
    from tacl.runtime.hub import resolve_pretrained

    found = model_type_of(resolve_pretrained(start_model))
    return found if found in FAMILIES else None


def mlm_probability(configured: float | None, start_model: str) -> float:
    """The share of tokens masking selects: pretrain.mlm_probability, else the start model's family's (0.15 for
    BERT and a family outside tacl.runtime.family, 0.30 for ModernBERT)."""
    if configured is not None:
        return configured
    family = start_family_name(start_model)
    return FAMILIES[family].mlm_probability if family else FAMILIES["bert"].mlm_probability


def masking_spec(tokenizer: Any, max_len: int, configured: float | None, start_model: str) -> MaskingSpec:
    """The run's masking (the loader's masks and its step counts both read it): the tokenizer's special and mask
    ids, at the rate `mlm_probability` gives."""
    return MaskingSpec.from_tokenizer(tokenizer, max_len, mlm_probability(configured, start_model))


def form_error(manifest_path: str, manifest: dict[str, Any], objective_name: str, objective: Any,
               start_model: str) -> str | None:
    """Why these shards cannot train this objective from this start model (one line), or None."""
    form, folder = manifest_form(manifest), Path(manifest_path).parent
    family = start_family_name(start_model)
    if family is not None and form != form_of(FAMILIES[family]):
        return (f"{folder}: these shards hold {form}, and the start model {start_model} is of family {family}, "
                f"pretrained on {form_of(FAMILIES[family])}: build the shards again for this start model (its "
                "family is what the tokenizer job records: `snakemake --forcerun fetch_tokenizer`)")
    if reads_nsp(objective) and form != NSP_PAIRS:
        return (f"pretrain.objectives: {objective_name} trains next sentence prediction, which needs NSP pairs, but "
                f"the shards in {folder} hold {form}"
                + (f" (the start model's family, {family}, was pretrained without NSP)" if family else "")
                + ": leave it out of pretrain.objectives for this family (mlm is MLM alone)")
    return None
