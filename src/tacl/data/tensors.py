"""numpy batches as torch tensors: what tacl.data.pretraining and tacl.data.packing both hand on."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch


def as_tensors(arrays: dict[str, Any]) -> dict[str, Any]:
    """numpy arrays as tensors (sharing their memory); other values as they are."""
    return {k: torch.from_numpy(v) if isinstance(v, np.ndarray) else v for k, v in arrays.items()}
