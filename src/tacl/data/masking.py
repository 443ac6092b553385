"""Dynamic BERT masking, one explicit generator per example.

Per example: choose round(15%) of the non-special positions (at least 1, at most `max_predictions`,
25% of max_len by default) uniformly without replacement; of those, 80% become [MASK], 10% a random
token (never a special or [unusedN] token), 10% stay. The generator for an example is seeded from
(seed, epoch, example index), so a mask depends only on which example is read when: the data position
alone fixes every batch, whatever the batch size, the number of ranks or a resume in between.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import numpy as np

IGNORE_INDEX = -100
_UNUSED = re.compile(r"^(\[unused\d+\]|<unused\d+>)$")


@dataclass(frozen=True)
class MaskingSpec:
    mask_id: int
    pad_id: int
    special_ids: np.ndarray
    replacement_ids: np.ndarray
    max_predictions: int
    mlm_prob: float = 0.15
    mask_prob: float = 0.8
    random_prob: float = 0.1

    @classmethod
    def from_tokenizer(cls, tokenizer: Any, max_len: int, mlm_prob: float = 0.15) -> "MaskingSpec":
        vocab = tokenizer.get_vocab()
        special = set(tokenizer.all_special_ids)
        unused = {i for t, i in vocab.items() if _UNUSED.match(t)}
        replacement = np.array(sorted(set(range(len(tokenizer))) - special - unused), dtype=np.int64)
        return cls(
            mask_id=tokenizer.mask_token_id,
            pad_id=tokenizer.pad_token_id,
            special_ids=np.array(sorted(special), dtype=np.int64),
            replacement_ids=replacement,
            max_predictions=max(1, int(0.25 * max_len)),
            mlm_prob=mlm_prob,
        )


def example_rng(seed: int, epoch: int, index: int) -> np.random.Generator:
    return np.random.default_rng([seed, epoch, index])


def mask_example(ids: np.ndarray, spec: MaskingSpec, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """(masked ids, labels): labels hold the original id at selected positions, IGNORE_INDEX elsewhere."""
    candidates = np.flatnonzero(~np.isin(ids, spec.special_ids))
    labels = np.full_like(ids, IGNORE_INDEX)
    masked = ids.copy()
    if len(candidates) == 0:
        return masked, labels
    n = min(spec.max_predictions, max(1, int(round(len(candidates) * spec.mlm_prob))))
    chosen = rng.choice(candidates, size=n, replace=False)
    labels[chosen] = ids[chosen]
    r = rng.random(n)
    masked[chosen[r < spec.mask_prob]] = spec.mask_id
    to_random = chosen[(r >= spec.mask_prob) & (r < spec.mask_prob + spec.random_prob)]
    masked[to_random] = spec.replacement_ids[rng.integers(0, len(spec.replacement_ids), len(to_random))]
    return masked, labels
