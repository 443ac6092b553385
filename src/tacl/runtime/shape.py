"""The size of a BERT encoder (layers, hidden and intermediate sizes, vocabulary) and the parameters it holds:
what the plan's estimates (tacl.planning.estimates) and a fine-tuning seed's memory estimate
(tacl.finetune.side_by_side) count."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Shape:
    layers: int
    hidden: int
    intermediate: int
    vocab: int
    source: str = "the start model"

    @property
    def encoder(self) -> int:
        """Non-embedding parameters of the encoder (attention, feed-forward, layer norms)."""
        h, i = self.hidden, self.intermediate
        return self.layers * (4 * h * h + 4 * h + 2 * h * i + i + h + 4 * h)

    @property
    def head(self) -> int:
        """What the MLM head multiplies per masked position: its transform and the vocabulary projection."""
        return self.hidden * self.hidden + self.hidden * self.vocab

    @property
    def total(self) -> int:
        """Every parameter a checkpoint holds: the encoder, the embeddings (the vocabulary projection of the
        MLM head is tied to them), the head's transform and the pooler."""
        return self.encoder + (self.vocab + 512 + 2) * self.hidden + 2 * self.hidden * self.hidden
