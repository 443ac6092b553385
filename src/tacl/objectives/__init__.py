"""Pretraining objectives, one module each, each a pure loss function plus a small class that turns a
batch and the model outputs into named loss terms (exact definitions in ../shared/DESIGN.md section 4).

    mlm_nsp   BERT masked LM + next sentence prediction (the "more pretraining" control)
    tacl      MLM + NSP + TaCL token contrastive loss against a frozen teacher (Su et al. 2021)
    taco      MLM + TACO token-alignment contrastive loss (Fu et al. 2022), continual variant
"""

from __future__ import annotations

from typing import Any

OBJECTIVES = ("mlm_nsp", "tacl", "taco")


def build_objective(name: str, params: dict[str, Any] | None = None):
    params = params or {}
    if name == "mlm_nsp":
        from tacl.objectives.mlm_nsp import MlmNsp

        return MlmNsp()
    if name == "tacl":
        from tacl.objectives.tacl import TaCL

        return TaCL(**params)
    if name == "taco":
        from tacl.objectives.taco import TACO

        return TACO(**params)
    raise ValueError(f"unknown objective {name!r} (known: {', '.join(OBJECTIVES)})")
