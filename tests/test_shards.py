import json
import shutil

import numpy as np
import pytest

from tacl.data.build import build_shard, gather_shards
from tacl.data.clean import clean_corpus
from tacl.data.download import download_corpus
from tacl.data.shards import Shard, ShardSet, write_shard
from tacl.runtime.io import InputError

from conftest import REPO


def test_write_read_round_trip(tmp_path):
    rng = np.random.default_rng(0)
    flat = rng.integers(1000, 30000, 5000)
    spans, nsp = [], []
    for _ in range(200):
        a0, b0 = rng.integers(0, 4800), rng.integers(0, 4800)
        spans.append((a0, a0 + rng.integers(1, 60), b0, b0 + rng.integers(1, 60)))
        nsp.append(rng.integers(0, 2))
    write_shard(tmp_path / "s.bin", flat, np.array(spans), np.array(nsp), 101, 102, np.dtype(np.uint16))
    shard = Shard(tmp_path / "s.bin")
    assert len(shard) == 200
    for i, ((a0, a1, b0, b1), label) in enumerate(zip(spans, nsp)):
        ids, len_a, got_label = shard.example(i)
        expected = [101, *flat[a0:a1], 102, *flat[b0:b1], 102]
        assert ids.tolist() == expected
        assert len_a == a1 - a0 + 2 and got_label == label


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    d = tmp_path_factory.mktemp("corpus")
    download_corpus({"kind": "wikiextractor", "paths": [str(REPO / "examples/demo/wikipedia/wiki_00")]},
                    str(d / "cache"), str(d / "raw.json"))
    clean_corpus(str(d / "raw.json"), str(d / "corpus.txt"), str(d / "corpus.idx.npy"), str(d / "heldout.txt"),
                 str(d / "clean.json"), heldout_fraction=0.05, progress=False)
    return d


def build_all(corpus, tokenizer_dir, out, num_shards=2, max_len=128):
    entries = []
    for k in range(num_shards):
        build_shard(str(corpus / "corpus.txt"), str(corpus / "corpus.idx.npy"), str(tokenizer_dir), k, num_shards,
                    max_len, 0.1, 42, str(out / f"shard-{k:05d}.bin"), str(out / f"shard-{k:05d}.json"))
        entries.append(str(out / f"shard-{k:05d}.json"))
    return gather_shards(entries, str(out / "manifest.json"))


def test_build_is_deterministic_and_verifiable(corpus, tokenizer_dir, tokenizer, tmp_path):
    m1 = build_all(corpus, tokenizer_dir, tmp_path / "a")
    m2 = build_all(corpus, tokenizer_dir, tmp_path / "b")
    assert [e["sha256"] for e in m1["shards"]] == [e["sha256"] for e in m2["shards"]]
    assert m1["totals"]["examples"] > 500 and m1["totals"]["tokens"] > 50000
    assert 0.45 < m1["totals"]["random_next"] / m1["totals"]["examples"] < 0.6
    data = ShardSet(tmp_path / "a" / "manifest.json", tokenizer_hash=m1["tokenizer"]["hash"])
    assert len(data) == m1["totals"]["examples"]
    text = (corpus / "corpus.txt").read_text().lower()
    for i in range(0, len(data), 97):
        ids, len_a, nsp = data.example(i)
        assert len(ids) <= 128 and ids[0] == tokenizer.cls_token_id
        assert ids[len_a - 1] == tokenizer.sep_token_id and ids[-1] == tokenizer.sep_token_id
        assert (np.isin(ids[1:-1], [tokenizer.cls_token_id, tokenizer.pad_token_id])).sum() == 0
        words = tokenizer.decode(ids[1 : len_a - 1]).split()[1:4]  # a few words from inside segment A
        assert all(w in text or "#" in w for w in words)


def test_other_seed_other_shard(corpus, tokenizer_dir, tmp_path):
    e1 = build_shard(str(corpus / "corpus.txt"), str(corpus / "corpus.idx.npy"), str(tokenizer_dir), 0, 2, 128,
                     0.1, 1, str(tmp_path / "x.bin"), str(tmp_path / "x.json"))
    e2 = build_shard(str(corpus / "corpus.txt"), str(corpus / "corpus.idx.npy"), str(tokenizer_dir), 0, 2, 128,
                     0.1, 2, str(tmp_path / "y.bin"), str(tmp_path / "y.json"))
    assert e1["sha256"] != e2["sha256"] and e1["config_hash"] != e2["config_hash"]


def test_corruption_truncation_and_missing_shards_are_caught(corpus, tokenizer_dir, tmp_path):
    out = tmp_path / "s"
    build_all(corpus, tokenizer_dir, out)
    victim = out / "shard-00001.bin"
    blob = bytearray(victim.read_bytes())
    blob[-10] ^= 0xFF
    victim.write_bytes(bytes(blob))
    with pytest.raises(InputError, match=r"shard-00001\.bin: sha256 differs"):
        ShardSet(out / "manifest.json")
    victim.write_bytes(bytes(blob[:-4]))
    with pytest.raises(InputError, match=r"shard-00001\.bin: size differs"):
        ShardSet(out / "manifest.json")
    victim.unlink()
    with pytest.raises(InputError, match=r"shard-00001\.bin: shard listed in .*manifest.json is missing"):
        ShardSet(out / "manifest.json")


def test_other_tokenizer_is_refused(corpus, tokenizer_dir, tmp_path):
    m = build_all(corpus, tokenizer_dir, tmp_path / "s")
    with pytest.raises(InputError, match=r"manifest\.json: shards were written with tokenizer"):
        ShardSet(tmp_path / "s" / "manifest.json", tokenizer_hash="0" * 16)
    # the same vocabulary without lower-casing gives other ids: the effective normaliser is in the hash
    from tacl.runtime.hub import load_tokenizer, tokenizer_hash

    cased_dir = tmp_path / "cased"
    shutil.copytree(tokenizer_dir, cased_dir)
    tj = json.loads((cased_dir / "tokenizer.json").read_text())
    tj["normalizer"]["lowercase"] = False
    (cased_dir / "tokenizer.json").write_text(json.dumps(tj))
    tc = json.loads((cased_dir / "tokenizer_config.json").read_text())
    tc["do_lower_case"] = False
    (cased_dir / "tokenizer_config.json").write_text(json.dumps(tc))
    assert tokenizer_hash(load_tokenizer(str(cased_dir))) != m["tokenizer"]["hash"]


def test_a_failed_write_leaves_no_shard(tmp_path, monkeypatch):
    def killed(fd):
        raise KeyboardInterrupt("killed mid-write")

    monkeypatch.setattr("tacl.runtime.io.os.fsync", killed)
    with pytest.raises(KeyboardInterrupt):
        write_shard(tmp_path / "s.bin", np.arange(100), np.array([[0, 5, 10, 20]]), np.array([1]), 101, 102,
                    np.dtype(np.uint16))
    assert list(tmp_path.iterdir()) == []


def test_too_many_shards_for_the_corpus(corpus, tokenizer_dir, tmp_path):
    with pytest.raises(InputError, match="data.num_shards"):
        build_shard(str(corpus / "corpus.txt"), str(corpus / "corpus.idx.npy"), str(tokenizer_dir), 0, 1000, 128,
                    0.1, 1, str(tmp_path / "x.bin"), str(tmp_path / "x.json"))


def test_missing_input_files_are_named(tmp_path):
    with pytest.raises(InputError, match="nope/wiki_\\*: corpus file not found"):
        download_corpus({"kind": "wikiextractor", "paths": [str(tmp_path / "nope/wiki_*")]}, str(tmp_path),
                        str(tmp_path / "raw.json"))
    (tmp_path / "empty").write_text("")
    with pytest.raises(InputError, match="empty: corpus file is empty"):
        download_corpus({"kind": "text", "paths": [str(tmp_path / "empty")]}, str(tmp_path),
                        str(tmp_path / "raw.json"))
    with pytest.raises(InputError, match="corpus.txt: cleaned corpus not found"):
        build_shard(str(tmp_path / "corpus.txt"), "idx", "tok", 0, 1, 128, 0.1, 1, "x", "y")
    assert not (tmp_path / "raw.json").exists()


def test_grouped_encoding_equals_sentence_by_sentence(corpus, tokenizer_dir, tokenizer):
    from tacl.data.build import encode, load_backend
    from tacl.data.clean import read_documents

    backend, meta = load_backend(str(tokenizer_dir))
    sentences = [s for d in read_documents(str(corpus / "corpus.txt"), str(corpus / "corpus.idx.npy"), 0, 60)
                 for s in d]
    sentences[5] = "A sentence that mentions [SEP] in its own text."
    sentences[70] = "\u200b\u200b\u200b"  # tokenizes to nothing
    flat, lengths = encode(backend, meta["sep_id"], sentences)
    expected = [tokenizer(s, add_special_tokens=False)["input_ids"] for s in sentences]
    assert lengths.tolist() == [len(e) for e in expected]
    assert lengths[70] == 0
    assert flat.tolist() == [t for e in expected for t in e]
