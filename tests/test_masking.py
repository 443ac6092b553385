import numpy as np
import pytest

from tacl.data.masking import IGNORE_INDEX, MaskingSpec, example_rng, mask_example


@pytest.fixture(scope="module")
def spec(tokenizer):
    return MaskingSpec.from_tokenizer(tokenizer, max_len=256)


def sample_sequences(tokenizer, n, rng):
    """[CLS] A [SEP] B [SEP] with real-looking ids (no specials inside)."""
    ordinary = np.arange(1996, 29000)
    seqs = []
    for _ in range(n):
        la, lb = rng.integers(20, 120), rng.integers(20, 120)
        a, b = rng.choice(ordinary, la), rng.choice(ordinary, lb)
        seqs.append(np.concatenate([[tokenizer.cls_token_id], a, [tokenizer.sep_token_id], b,
                                    [tokenizer.sep_token_id]]).astype(np.int64))
    return seqs


def test_replacement_ids_exclude_special_and_unused(spec, tokenizer):
    tokens = set(tokenizer.convert_ids_to_tokens(spec.replacement_ids.tolist()))
    assert not tokens & set(tokenizer.all_special_tokens)
    assert not any(t.startswith("[unused") for t in tokens)
    assert len(spec.replacement_ids) == len(tokenizer) - 5 - 994  # bert-base-uncased: 5 specials, 994 unused
    assert spec.max_predictions == 64


def test_fractions_on_a_large_sample(spec, tokenizer):
    seqs = sample_sequences(tokenizer, 4000, np.random.default_rng(0))
    selected = candidates = masked = randomised = kept = 0
    for i, ids in enumerate(seqs):
        out, labels = mask_example(ids, spec, example_rng(1, 0, i))
        sel = labels != IGNORE_INDEX
        special = np.isin(ids, spec.special_ids)
        assert not (sel & special).any(), "special tokens are never selected"
        assert (out[~sel] == ids[~sel]).all(), "unselected positions are untouched"
        assert (labels[sel] == ids[sel]).all()
        selected += sel.sum()
        candidates += (~special).sum()
        masked += (out[sel] == spec.mask_id).sum()
        changed = sel & (out != ids) & (out != spec.mask_id)
        randomised += changed.sum()
        assert not np.isin(out[changed], spec.special_ids).any()
        kept += (sel & (out == ids)).sum()
    assert abs(selected / candidates - 0.15) < 0.002
    assert abs(masked / selected - 0.8) < 0.01
    # a random replacement equals the original with probability ~1/29000, so "kept" is ~10% too
    assert abs(randomised / selected - 0.1) < 0.008
    assert abs(kept / selected - 0.1) < 0.008


def test_same_seed_same_mask_and_cap(spec, tokenizer):
    ids = sample_sequences(tokenizer, 1, np.random.default_rng(1))[0]
    a = mask_example(ids, spec, example_rng(5, 2, 17))
    b = mask_example(ids, spec, example_rng(5, 2, 17))
    c = mask_example(ids, spec, example_rng(5, 3, 17))
    assert all((x == y).all() for x, y in zip(a, b))
    assert any((x != y).any() for x, y in zip(a, c)), "another epoch gives another mask"
    long_ids = np.concatenate([[101], np.full(1000, 2000), [102]])
    _, labels = mask_example(long_ids, spec, example_rng(0, 0, 0))
    assert (labels != IGNORE_INDEX).sum() == spec.max_predictions
    only_special = np.array([101, 102, 102])
    _, labels = mask_example(only_special, spec, example_rng(0, 0, 0))
    assert (labels == IGNORE_INDEX).all()
