"""Dynamic BERT masking, vectorised over a batch, each example's mask a pure function of its identity.

Per example: choose round(mlm_prob x the non-special positions) of them (mlm_prob: pretrain.mlm_probability,
else the start model's family's rate, 15% for BERT; at least 1, at most `max_predictions`, 25% of max_len at
15%: `max_share`) uniformly without replacement; of those, 80% become the tokenizer's mask token, 10% a random
token (never a special or [unusedN] token), 10% stay.

Every random number is a counter-based hash (splitmix64) of (seed, epoch, example index, position, stream):
no generator state, so a whole padded batch is masked with a few numpy operations, and an example gets
the same mask whatever batch, worker process, rank or resume it is read in. The data position alone fixes
every batch. (`tests/test_masking.py` checks the vectorised code against a loop over the same hashes.)
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import numpy as np

IGNORE_INDEX = -100
_UNUSED = re.compile(r"^(\[unused\d+\]|<unused\d+>)$")

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
# streams of random numbers per position
SELECT, DECIDE, REPLACE = 0, 1, 2


def max_share(mlm_prob: float) -> float:
    """The most positions masking selects in one sequence, as a share of max_len: 25% at BERT's 15% and below
    (Google's 20 of 128), 5/3 of the rate above it (50% at ModernBERT's 30%)."""
    return 0.25 if mlm_prob <= 0.15 else min(1.0, mlm_prob * 5 / 3)


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
            max_predictions=max(1, int(max_share(mlm_prob) * max_len)),
            mlm_prob=mlm_prob,
        )

    def predictions(self, candidates: np.ndarray) -> np.ndarray:
        """How many positions to select, given each example's number of candidate positions."""
        n = np.minimum(self.max_predictions, np.maximum(1, np.rint(candidates * self.mlm_prob).astype(np.int64)))
        return np.where(candidates > 0, n, 0)

    def selected(self, examples: list[np.ndarray]) -> np.ndarray:
        """How many positions `mask_batch` selects in each of these examples (token ids, unpadded), without
        masking them: their candidates are the tokens that are not special."""
        if not examples:
            return np.zeros(0, dtype=np.int64)
        special = np.isin(np.concatenate(examples), self.special_ids)
        starts = np.cumsum([0] + [len(e) for e in examples[:-1]])
        lengths = np.array([len(e) for e in examples], dtype=np.int64)
        return self.predictions(lengths - np.add.reduceat(special.astype(np.int64), starts))


def mix64(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser: a bijection of uint64 that scrambles every bit (arrays wrap modulo 2^64)."""
    x = np.asarray(x, dtype=np.uint64)
    x = (x ^ (x >> np.uint64(30))) * _M1
    x = (x ^ (x >> np.uint64(27))) * _M2
    return x ^ (x >> np.uint64(31))


def example_keys(seed: int, epochs: np.ndarray, indices: np.ndarray) -> np.ndarray:
    """One 64-bit key per example, from (seed, epoch, example index)."""
    base = mix64(np.full(len(indices), seed, dtype=np.uint64) + _GOLDEN)
    base = mix64(base + np.asarray(epochs, dtype=np.uint64) + _GOLDEN)
    return mix64(base + np.asarray(indices, dtype=np.uint64) + _GOLDEN)


def position_bits(keys: np.ndarray, length: int, stream: int) -> np.ndarray:
    """[B, length] uint64: the random bits of every position of every example, for one stream."""
    counters = (np.arange(length, dtype=np.uint64) * np.uint64(3) + np.uint64(stream + 1)) * _GOLDEN
    return mix64(keys[:, None] + counters[None, :])


def uniform(bits: np.ndarray) -> np.ndarray:
    """uint64 -> float64 uniform in [0, 1) (the top 53 bits)."""
    return (bits >> np.uint64(11)).astype(np.float64) * (1.0 / (1 << 53))


def mask_batch(ids: np.ndarray, lengths: np.ndarray, keys: np.ndarray,
               spec: MaskingSpec) -> tuple[np.ndarray, np.ndarray]:
    """(masked ids, labels) for a padded batch ids [B, L] whose rows hold `lengths` real tokens; labels
    hold the original id at the selected positions, IGNORE_INDEX elsewhere."""
    b, length = ids.shape
    real = np.arange(length)[None, :] < np.asarray(lengths)[:, None]
    candidates = real & ~np.isin(ids, spec.special_ids)
    n = spec.predictions(candidates.sum(1))
    # uniform choice without replacement: the n candidates with the smallest random keys
    u = np.where(candidates, uniform(position_bits(keys, length, SELECT)), 2.0)
    order = np.argsort(u, axis=1, kind="stable")
    rank = np.empty_like(order)
    np.put_along_axis(rank, order, np.arange(length)[None, :].repeat(b, 0), axis=1)
    chosen = rank < n[:, None]
    labels = np.where(chosen, ids, IGNORE_INDEX)
    decide = uniform(position_bits(keys, length, DECIDE))
    to_mask = chosen & (decide < spec.mask_prob)
    to_random = chosen & (decide >= spec.mask_prob) & (decide < spec.mask_prob + spec.random_prob)
    replacement = spec.replacement_ids[
        (position_bits(keys, length, REPLACE) % np.uint64(len(spec.replacement_ids))).astype(np.int64)]
    masked = np.where(to_mask, spec.mask_id, np.where(to_random, replacement, ids))
    return masked, labels
