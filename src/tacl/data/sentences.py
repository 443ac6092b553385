"""The `sentences` form, on token spans (as tacl.data.nsp builds NSP pairs): how RoBERTa and the families after
it were pretrained, without NSP. Each example is a run of consecutive whole sentences of one document (the
DOC-SENTENCES input of Liu et al. 2019), as many as fit in `max_len - 2` tokens; the shard writer wraps it in
the tokenizer's first and last special tokens.

Per document, as for NSP pairs (data.short_seq_prob): with probability `short_seq_prob` the document's target
length is drawn uniformly from [2, max_len - 2] instead of max_len - 2; a sequence takes whole sentences while
it stays within the target. A sentence longer than max_len - 2 tokens is an example of its own, cut to its
first max_len - 2 tokens (the rest is dropped). Every random decision comes from `rng`, so a shard is a function
of its seed.
"""

from __future__ import annotations

import random

import numpy as np


def create_sequences(
    sentence_offsets: np.ndarray,
    doc_sentences: np.ndarray,
    max_len: int,
    short_seq_prob: float,
    rng: random.Random,
    dupe_factor: int = 1,
) -> np.ndarray:
    """The examples of all documents of one shard, as token spans [start, end) (n x 2 int64).

    sentence_offsets: int array, sentence s spans tokens [offsets[s], offsets[s+1]).
    doc_sentences: int array, document d spans sentences [doc_sentences[d], doc_sentences[d+1]).
    """
    max_tokens = max_len - 2
    offsets = sentence_offsets.tolist()
    docs = doc_sentences.tolist()
    spans: list[tuple[int, int]] = []
    for _ in range(dupe_factor):
        for d in range(len(docs) - 1):
            target = rng.randint(2, max_tokens) if rng.random() < short_seq_prob else max_tokens
            s, last = docs[d], docs[d + 1]
            while s < last:
                start, end = offsets[s], min(offsets[s + 1], offsets[s] + max_tokens)
                s += 1
                while s < last and offsets[s + 1] - start <= target:
                    end = offsets[s + 1]
                    s += 1
                spans.append((start, end))
    return np.array(spans, dtype=np.int64).reshape(-1, 2)
