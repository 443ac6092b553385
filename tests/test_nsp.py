"""NSP instances against a slow reference: Google BERT's create_instances_from_document on token lists."""

import random

import numpy as np
import pytest

from tacl.data.nsp import create_instances


def reference_instances(all_documents, max_seq_length, short_seq_prob, rng):
    """Google's code (create_pretraining_data.py), lists of tokens, no masking; the random document is
    drawn once from the other documents (the one documented change)."""
    out = []
    for document_index in range(len(all_documents)):
        document = all_documents[document_index]
        max_num_tokens = max_seq_length - 3
        target_seq_length = max_num_tokens
        if rng.random() < short_seq_prob:
            target_seq_length = rng.randint(2, max_num_tokens)
        current_chunk, current_length, i = [], 0, 0
        while i < len(document):
            segment = document[i]
            current_chunk.append(segment)
            current_length += len(segment)
            if i == len(document) - 1 or current_length >= target_seq_length:
                if current_chunk:
                    a_end = 1
                    if len(current_chunk) >= 2:
                        a_end = rng.randint(1, len(current_chunk) - 1)
                    tokens_a = []
                    for j in range(a_end):
                        tokens_a.extend(current_chunk[j])
                    tokens_b = []
                    coin = len(current_chunk) >= 2
                    if len(current_chunk) == 1 or rng.random() < 0.5:
                        is_random_next = True
                        target_b_length = target_seq_length - len(tokens_a)
                        random_document_index = rng.randint(0, len(all_documents) - 2)
                        if random_document_index >= document_index:
                            random_document_index += 1
                        random_document = all_documents[random_document_index]
                        random_start = rng.randint(0, len(random_document) - 1)
                        for j in range(random_start, len(random_document)):
                            tokens_b.extend(random_document[j])
                            if len(tokens_b) >= target_b_length:
                                break
                        i -= len(current_chunk) - a_end
                    else:
                        is_random_next = False
                        random_document_index = document_index
                        for j in range(a_end, len(current_chunk)):
                            tokens_b.extend(current_chunk[j])
                    while len(tokens_a) + len(tokens_b) > max_num_tokens:
                        trunc = tokens_a if len(tokens_a) > len(tokens_b) else tokens_b
                        if rng.random() < 0.5:
                            del trunc[0]
                        else:
                            trunc.pop()
                    out.append((tokens_a, tokens_b, is_random_next, coin))
                current_chunk, current_length = [], 0
            i += 1
    return out


def random_documents(rng: random.Random, n_docs: int):
    docs, next_token = [], 1000
    for _ in range(n_docs):
        doc = []
        for _ in range(rng.randint(1, 30)):
            length = rng.choice([rng.randint(1, 12), rng.randint(10, 60), rng.randint(50, 300)])
            doc.append(list(range(next_token, next_token + length)))  # token ids unique in the corpus
            next_token += length
        docs.append(doc)
    return docs


def flatten(docs):
    lengths = [len(s) for d in docs for s in d]
    flat = np.array([t for d in docs for s in d for t in s], dtype=np.int64)
    sentence_offsets = np.concatenate([[0], np.cumsum(lengths)])
    doc_sentences = np.concatenate([[0], np.cumsum([len(d) for d in docs])])
    return flat, sentence_offsets, doc_sentences


@pytest.mark.parametrize("max_len,short_seq_prob", [(128, 0.1), (256, 0.1), (64, 0.5), (512, 0.0)])
def test_matches_reference_exactly(max_len, short_seq_prob):
    for trial in range(25):
        docs = random_documents(random.Random(trial), n_docs=random.Random(trial).randint(2, 40))
        flat, sent_off, doc_sent = flatten(docs)
        ours = create_instances(sent_off, doc_sent, max_len, short_seq_prob, random.Random(99 + trial))
        ref = reference_instances(docs, max_len, short_seq_prob, random.Random(99 + trial))
        assert len(ours) == len(ref)
        for x, (ta, tb, is_random, _) in zip(ours, ref):
            assert flat[x.a_start : x.a_end].tolist() == ta
            assert flat[x.b_start : x.b_end].tolist() == tb
            assert x.is_random_next == is_random


def test_invariants_on_many_documents():
    rng = random.Random(7)
    docs = random_documents(rng, 400)
    flat, sent_off, doc_sent = flatten(docs)
    doc_of_token = np.repeat(np.arange(len(docs)), np.diff(sent_off[doc_sent]))
    max_len = 128
    instances = create_instances(sent_off, doc_sent, max_len, 0.1, random.Random(1))
    assert len(instances) > 1000
    random_next = 0
    for x in instances:
        la, lb = x.a_end - x.a_start, x.b_end - x.b_start
        assert la >= 1 and lb >= 1
        assert la + lb + 3 <= max_len
        doc_a = set(doc_of_token[x.a_start : x.a_end])
        doc_b = set(doc_of_token[x.b_start : x.b_end])
        assert len(doc_a) == 1 and len(doc_b) == 1, "a segment never spans two documents"
        if x.is_random_next:
            random_next += 1
            assert doc_a != doc_b, "a random next segment never comes from the same document"
        else:
            assert doc_a == doc_b and x.a_end <= x.b_start, "an actual next segment follows A"
    assert random_next > 0


def test_about_half_random_next():
    """The coin is fair where it is tossed; chunks of one sentence (a document's last, or a sentence
    as long as the target) are always random-next, so on Wikipedia-like documents the share sits a
    little above one half."""
    rng = random.Random(11)
    docs = [[[0] * rng.randint(5, 40) for _ in range(rng.randint(5, 30))] for _ in range(2000)]
    _, s, d = flatten(docs)
    ours = create_instances(s, d, 128, 0.1, random.Random(2))
    ref = reference_instances(docs, 128, 0.1, random.Random(2))
    assert [x.is_random_next for x in ours] == [r[2] for r in ref]
    tossed = [r[2] for r in ref if r[3]]
    assert len(tossed) > 5000
    assert abs(np.mean(tossed) - 0.5) < 0.02
    assert 0.5 < np.mean([x.is_random_next for x in ours]) < 0.6


def test_same_seed_same_instances_and_two_documents_needed():
    docs = random_documents(random.Random(3), 10)
    _, s, d = flatten(docs)
    assert create_instances(s, d, 128, 0.1, random.Random(5)) == create_instances(s, d, 128, 0.1, random.Random(5))
    assert create_instances(s, d, 128, 0.1, random.Random(5)) != create_instances(s, d, 128, 0.1, random.Random(6))
    with pytest.raises(ValueError):
        create_instances(s[:3], np.array([0, 2]), 128, 0.1, random.Random(5))


# -- the sentences form (tacl.data.sentences): whole sentences of one document, for families without NSP ---------


def test_sentences_are_whole_and_within_max_len():
    """Every example is a run of whole consecutive sentences of one document within max_len - 2 tokens, the
    next sentence of its document never fitting; a longer sentence is cut to its first max_len - 2 tokens; every
    sentence is used once per dupe_factor; the same seed gives the same examples, short targets come from it."""
    from tacl.data.sentences import create_sequences

    rng = np.random.default_rng(5)
    lengths = rng.integers(1, 40, 600)
    lengths[[10, 200]] = [90, 300]  # longer than max_len - 2
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    docs = np.unique(np.concatenate([[0], rng.choice(np.arange(1, 600), 50, replace=False), [600]]))
    max_len = 64
    spans = create_sequences(offsets, docs, max_len, 0.0, random.Random(1), dupe_factor=2)
    first_sentence = {int(o): s for s, o in enumerate(offsets[:-1])}
    covered = []
    for start, end in spans.tolist():
        s = first_sentence[start]  # every example starts at a sentence
        d = np.searchsorted(docs, s, side="right") - 1
        if lengths[s] > max_len - 2:
            assert end - start == max_len - 2
            covered.append(s)
            continue
        last = int(np.searchsorted(offsets, end)) - 1  # ends at a sentence's end, within the document
        assert offsets[last + 1] == end and last < docs[d + 1]
        assert end - start <= max_len - 2
        assert last + 1 == docs[d + 1] or offsets[last + 2] - start > max_len - 2  # the next does not fit
        covered += range(s, last + 1)
    assert covered == list(range(600)) * 2
    again = create_sequences(offsets, docs, max_len, 0.3, random.Random(1))
    assert np.array_equal(again, create_sequences(offsets, docs, max_len, 0.3, random.Random(1)))
    assert len(again) > len(spans) // 2 == len(create_sequences(offsets, docs, max_len, 0.0, random.Random(1)))
    # (shorter targets for some documents: more examples)
