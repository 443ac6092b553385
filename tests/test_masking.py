import numpy as np
import pytest

from tacl.data.masking import IGNORE_INDEX, MaskingSpec, example_keys, mask_batch

MASK64 = (1 << 64) - 1
GOLDEN = 0x9E3779B97F4A7C15


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


def pad(seqs, pad_id=0):
    width = max(len(s) for s in seqs)
    out = np.full((len(seqs), width), pad_id, dtype=np.int64)
    for i, s in enumerate(seqs):
        out[i, : len(s)] = s
    return out, np.array([len(s) for s in seqs])


def mask_all(seqs, spec, seed=1, epoch=0, first=0):
    """Mask in batches of 32 (as micro-batches would), return per-sequence (masked, labels)."""
    out = []
    for start in range(0, len(seqs), 32):
        chunk = seqs[start : start + 32]
        ids, lengths = pad(chunk, spec.pad_id)
        index = np.arange(first + start, first + start + len(chunk))
        masked, labels = mask_batch(ids, lengths, example_keys(seed, np.full(len(chunk), epoch), index), spec)
        out += [(masked[i, : len(s)], labels[i, : len(s)], masked[i, len(s):], labels[i, len(s):])
                for i, s in enumerate(chunk)]
    return out


# -- the slow, obvious reference: the same hashes with Python integers, one position at a time ----------------


def mix(x):
    x ^= x >> 30
    x = (x * 0xBF58476D1CE4E5B9) & MASK64
    x ^= x >> 27
    x = (x * 0x94D049BB133111EB) & MASK64
    return x ^ (x >> 31)


def reference_mask(ids, spec, seed, epoch, index):
    key = mix((seed + GOLDEN) & MASK64)
    key = mix((key + epoch + GOLDEN) & MASK64)
    key = mix((key + index + GOLDEN) & MASK64)

    def bits(t, stream):
        return mix((key + ((3 * t + stream + 1) * GOLDEN)) & MASK64)

    def uniform(t, stream):
        return (bits(t, stream) >> 11) / 2**53

    special = set(spec.special_ids.tolist())
    candidates = [t for t in range(len(ids)) if int(ids[t]) not in special]
    n = min(spec.max_predictions, max(1, round(len(candidates) * spec.mlm_prob))) if candidates else 0
    chosen = sorted(candidates, key=lambda t: (uniform(t, 0), t))[:n]
    masked, labels = [int(i) for i in ids], [IGNORE_INDEX] * len(ids)
    for t in chosen:
        labels[t] = int(ids[t])
        u = uniform(t, 1)
        if u < spec.mask_prob:
            masked[t] = spec.mask_id
        elif u < spec.mask_prob + spec.random_prob:
            masked[t] = int(spec.replacement_ids[bits(t, 2) % len(spec.replacement_ids)])
    return masked, labels


def test_vectorised_masking_equals_the_loop_reference(spec, tokenizer):
    seqs = sample_sequences(tokenizer, 40, np.random.default_rng(3))
    seqs.append(np.array([101, 102, 102]))  # nothing to mask
    for i, (masked, labels, masked_pad, labels_pad) in enumerate(mask_all(seqs, spec, seed=7, epoch=2, first=100)):
        ref_masked, ref_labels = reference_mask(seqs[i], spec, 7, 2, 100 + i)
        assert masked.tolist() == ref_masked and labels.tolist() == ref_labels, i
        assert (labels_pad == IGNORE_INDEX).all() and (masked_pad == spec.pad_id).all(), "padding is untouched"


def test_replacement_ids_exclude_special_and_unused(spec, tokenizer):
    tokens = set(tokenizer.convert_ids_to_tokens(spec.replacement_ids.tolist()))
    assert not tokens & set(tokenizer.all_special_tokens)
    assert not any(t.startswith("[unused") for t in tokens)
    assert len(spec.replacement_ids) == len(tokenizer) - 5 - 994  # bert-base-uncased: 5 specials, 994 unused
    assert spec.max_predictions == 64


def test_fractions_on_a_large_sample(spec, tokenizer):
    seqs = sample_sequences(tokenizer, 4000, np.random.default_rng(0))
    selected = candidates = masked = randomised = kept = 0
    for ids, (out, labels, _, _) in zip(seqs, mask_all(seqs, spec)):
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


def test_positions_are_chosen_uniformly(spec, tokenizer):
    """Every candidate position is selected with the same probability (no bias towards the start)."""
    seq = sample_sequences(tokenizer, 1, np.random.default_rng(2))[0]
    hits = np.zeros(len(seq))
    for epoch in range(400):
        ids, lengths = pad([seq] * 32, spec.pad_id)
        _, labels = mask_batch(ids, lengths, example_keys(0, np.full(32, epoch), np.arange(32)), spec)
        hits += (labels != IGNORE_INDEX).sum(0)
    inner = hits[~np.isin(seq, spec.special_ids)] / (400 * 32)
    assert abs(inner.mean() - 0.15) < 0.005 and inner.std() < 0.012  # binomial sd ~ 0.0028 per position


def test_same_key_same_mask_whatever_the_batch_and_cap(spec, tokenizer):
    seqs = sample_sequences(tokenizer, 3, np.random.default_rng(1))
    ids, lengths = pad(seqs, spec.pad_id)
    keys = example_keys(5, np.array([2, 2, 3]), np.array([17, 18, 17]))
    together = mask_batch(ids, lengths, keys, spec)
    alone = mask_batch(ids[:1, : lengths[0]], lengths[:1], keys[:1], spec)
    assert (together[0][0, : lengths[0]] == alone[0][0]).all() and (together[1][0, : lengths[0]] == alone[1][0]).all()
    again = mask_batch(*pad([seqs[0]] * 2, spec.pad_id), example_keys(5, np.array([2, 3]), np.array([17, 17])), spec)
    assert (again[1][0] != again[1][1]).any(), "another epoch gives another mask"
    long_ids, long_len = pad([np.concatenate([[101], np.full(1000, 2000), [102]])], spec.pad_id)
    _, labels = mask_batch(long_ids, long_len, example_keys(0, np.zeros(1), np.zeros(1)), spec)
    assert (labels != IGNORE_INDEX).sum() == spec.max_predictions


def start_folder(tmp_path, model_type):
    """A start model's folder as far as its family goes: a config naming its model_type."""
    import json

    folder = tmp_path / model_type
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": model_type}))
    return str(folder)


def test_mlm_probability_reaches_the_masking(tokenizer, tmp_path):
    """pretrain.mlm_probability, else the start model's family's rate, decides how many positions masking selects
    (the loader's step counts read the same spec: tests/test_packing.py); set, it is part of the run's identity,
    unset it leaves the identity of the runs made before it as it was."""
    from tacl.pretrain.form import masking_spec
    from tacl.pretrain.settings import TrainSettings

    pretrain = {"steps": 10, "global_batch": 16, "micro_batch": 16}
    assert "mlm_probability" not in TrainSettings.from_config(pretrain, "mlm", 128).result()
    settings = TrainSettings.from_config({**pretrain, "mlm_probability": 0.4}, "mlm", 128)
    assert settings.result()["mlm_probability"] == 0.4
    bert, modernbert = start_folder(tmp_path, "bert"), start_folder(tmp_path, "modernbert")
    specs = {0.15: masking_spec(tokenizer, 256, None, bert), 0.30: masking_spec(tokenizer, 256, None, modernbert),
             0.4: masking_spec(tokenizer, 256, settings.mlm_probability, bert)}
    assert [spec.mlm_prob for spec in specs.values()] == list(specs)
    assert [spec.max_predictions for spec in specs.values()] == [64, 128, 170]  # (64 as before other rates)
    seqs = sample_sequences(tokenizer, 64, np.random.default_rng(3))
    candidates = sum(len(s) - 3 for s in seqs)
    for rate, spec in specs.items():
        chosen = sum(int((labels != IGNORE_INDEX).sum()) for _, labels, _, _ in mask_all(seqs, spec))
        assert chosen == specs[rate].selected(seqs).sum()
        assert abs(chosen / candidates - rate) < 0.01
