"""The model every analysis of a job reads: loaded once (tacl.analysis.similarity, tacl.analysis.embeddings)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tacl.runtime.device import resolve_device
from tacl.runtime.hub import resolve_pretrained

if TYPE_CHECKING:  # (the annotation only: tacl.analysis.embeddings imports this module, and no torch)
    import torch


@dataclass
class Encoder:
    """A model loaded once for every analysis of a job."""

    tokenizer: Any
    model: Any
    device: torch.device


def load_encoder(model_dir: "str | Encoder", device: str = "auto") -> Encoder:
    """The encoder of a Hugging Face model directory (or package:NAME) on the device, in eval mode."""
    if isinstance(model_dir, Encoder):
        return model_dir
    from transformers import AutoModel, AutoTokenizer

    dev = resolve_device(device)
    path = resolve_pretrained(model_dir)
    return Encoder(AutoTokenizer.from_pretrained(path), AutoModel.from_pretrained(path).to(dev).eval(), dev)
