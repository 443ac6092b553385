"""NSP instances with Google BERT's `create_instances_from_document` logic, on token spans.

A document is a run of consecutive sentences in one flat token array, so every segment (A or B) is a
contiguous span `[start, end)` of that array; an instance is two spans and a label. Nothing is copied
until the shard writer gathers the spans, and truncation moves span ends instead of popping tokens.

Same random decisions, in the same order, as Google's code with Python's `random.Random`:
  target length (short_seq_prob), the A/B split point, random-next (50%), the random document and
  start sentence, and the token-by-token random truncation from the front or back of the longer side.
One deliberate difference: the random document is drawn from the *other* documents (one draw),
where Google's code retries 10 times and may still end up with the same document.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Instance:
    a_start: int
    a_end: int
    b_start: int
    b_end: int
    is_random_next: bool


def create_instances(
    sentence_offsets: np.ndarray,
    doc_sentences: np.ndarray,
    max_len: int,
    short_seq_prob: float,
    rng: random.Random,
    dupe_factor: int = 1,
) -> list[Instance]:
    """NSP instances for all documents of one shard.

    sentence_offsets: int array, sentence s spans tokens [offsets[s], offsets[s+1]).
    doc_sentences: int array, document d spans sentences [doc_sentences[d], doc_sentences[d+1]).
    """
    n_docs = len(doc_sentences) - 1
    if n_docs < 2:
        raise ValueError("NSP needs at least two documents")
    offsets = sentence_offsets.tolist()
    docs = doc_sentences.tolist()
    instances: list[Instance] = []
    for _ in range(dupe_factor):
        for d in range(n_docs):
            _document_instances(offsets, docs, d, n_docs, max_len, short_seq_prob, rng, instances)
    return instances


def _document_instances(
    offsets: list[int], docs: list[int], d: int, n_docs: int, max_len: int, short_seq_prob: float,
    rng: random.Random, out: list[Instance],
) -> None:
    max_num_tokens = max_len - 3
    target = max_num_tokens
    if rng.random() < short_seq_prob:
        target = rng.randint(2, max_num_tokens)
    first, last = docs[d], docs[d + 1]  # sentences of this document: [first, last)
    chunk_start = first  # current chunk: sentences [chunk_start, i]
    i = first
    while i < last:
        chunk_len = offsets[i + 1] - offsets[chunk_start]
        if i == last - 1 or chunk_len >= target:
            n_chunk = i + 1 - chunk_start
            a_end_sent = chunk_start + (rng.randint(1, n_chunk - 1) if n_chunk >= 2 else 1)
            a_start, a_end = offsets[chunk_start], offsets[a_end_sent]
            if n_chunk == 1 or rng.random() < 0.5:
                is_random = True
                target_b = target - (a_end - a_start)
                r = rng.randint(0, n_docs - 2)
                r += r >= d
                r_first, r_last = docs[r], docs[r + 1]
                s = r_first + rng.randint(0, r_last - r_first - 1)
                b_start = offsets[s]
                while True:  # whole sentences until target_b is reached or the document ends
                    s += 1
                    if s == r_last or offsets[s] - b_start >= target_b:
                        break
                b_end = offsets[s]
                i = a_end_sent - 1  # the unused sentences of the chunk go back to the document
            else:
                is_random = False
                b_start, b_end = a_end, offsets[i + 1]
            while (a_end - a_start) + (b_end - b_start) > max_num_tokens:
                if a_end - a_start > b_end - b_start:
                    if rng.random() < 0.5:
                        a_start += 1
                    else:
                        a_end -= 1
                elif rng.random() < 0.5:
                    b_start += 1
                else:
                    b_end -= 1
            out.append(Instance(a_start, a_end, b_start, b_end, is_random))
            chunk_start = i + 1
        i += 1
