"""What the trainer reads: verified shards, a seeded epoch order, and masked batches.

The data position is one integer, the number of samples consumed so far. Sample p of the run is example
`permutation(epoch)[p % n]` with `epoch = p // n`, and its mask comes from its own generator
(`masking.example_rng`), so any position can be reproduced without replaying the ones before it.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import torch

from tacl.data.masking import IGNORE_INDEX, MaskingSpec, example_rng, mask_example
from tacl.data.shards import ShardSet


def epoch_permutation(n: int, seed: int, epoch: int) -> np.ndarray:
    return np.random.default_rng([seed, epoch, 0x5EED]).permutation(n)


class PretrainingData:
    def __init__(self, shards: ShardSet, spec: MaskingSpec, seed: int, pad_multiple: int = 8):
        self.shards = shards
        self.spec = spec
        self.seed = seed
        self.pad_multiple = pad_multiple
        self._perm: tuple[int, np.ndarray] | None = None

    def __len__(self) -> int:
        return len(self.shards)

    def locate(self, position: int) -> tuple[int, int]:
        """(epoch, example index) of the sample at a global data position."""
        n = len(self.shards)
        epoch = position // n
        if self._perm is None or self._perm[0] != epoch:
            self._perm = (epoch, epoch_permutation(n, self.seed, epoch))
        return epoch, int(self._perm[1][position % n])

    def batch(self, positions: Sequence[int]) -> dict[str, torch.Tensor]:
        """A padded, masked batch of the samples at these data positions."""
        examples = []
        for p in positions:
            epoch, index = self.locate(p)
            ids, len_a, nsp = self.shards.example(index)
            masked, labels = mask_example(ids, self.spec, example_rng(self.seed, epoch, index))
            examples.append((ids, masked, labels, len_a, nsp))
        return collate(examples, self.spec, self.pad_multiple)


def collate(examples: list[tuple[np.ndarray, np.ndarray, np.ndarray, int, int]], spec: MaskingSpec,
            pad_multiple: int = 8) -> dict[str, torch.Tensor]:
    longest = max(len(e[0]) for e in examples)
    length = -(-longest // pad_multiple) * pad_multiple
    b = len(examples)
    clean = np.full((b, length), spec.pad_id, dtype=np.int64)
    masked = np.full((b, length), spec.pad_id, dtype=np.int64)
    labels = np.full((b, length), IGNORE_INDEX, dtype=np.int64)
    token_type = np.zeros((b, length), dtype=np.int64)
    attention = np.zeros((b, length), dtype=np.int64)
    nsp = np.zeros(b, dtype=np.int64)
    for row, (ids, m, lab, len_a, label) in enumerate(examples):
        n = len(ids)
        clean[row, :n], masked[row, :n], labels[row, :n] = ids, m, lab
        token_type[row, len_a:n] = 1
        attention[row, :n] = 1
        nsp[row] = label
    special = np.isin(clean, spec.special_ids)
    return {
        "input_ids": torch.from_numpy(masked),
        "clean_ids": torch.from_numpy(clean),
        "token_type_ids": torch.from_numpy(token_type),
        "attention_mask": torch.from_numpy(attention),
        "mlm_labels": torch.from_numpy(labels),
        "nsp_labels": torch.from_numpy(nsp),
        "special_tokens_mask": torch.from_numpy(special),
    }


def describe(data: PretrainingData) -> dict[str, Any]:
    m = data.shards.manifest
    return {"examples": len(data), "tokens": m["totals"]["tokens"], "shards": m["totals"]["shards"],
            "tokenizer": m["tokenizer"], "config_hash": m["config_hash"]}
