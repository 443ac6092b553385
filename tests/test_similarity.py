import math

import pytest
import torch

from conftest import needs_shared
from tacl.analysis.similarity import pair_cosine_sums, sample_sentences, self_similarity


def test_pair_cosine_sums_match_loops():
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(3, 7, 5, generator=g, dtype=torch.float64)
    mask = torch.tensor([[1] * 7, [1] * 4 + [0] * 3, [1] * 2 + [0] * 5])
    sums, pairs = pair_cosine_sums(hidden, mask)
    for b in range(3):
        n = int(mask[b].sum())
        ref = sum(float(torch.nn.functional.cosine_similarity(hidden[b, i], hidden[b, j], dim=0))
                  for i in range(n) for j in range(i + 1, n))
        assert sums[b].item() == pytest.approx(ref, rel=1e-9)
        assert pairs[b].item() == n * (n - 1) / 2


def test_self_similarity_is_micro_averaged(demo_data, tokenizer):
    """Against a loop over sentences, one forward pass each: sum of all pair cosines / number of pairs."""
    from transformers import AutoModel

    sentences = ["The cat sat on the mat.", "A much longer sentence, with several more tokens in it, here.", "Hi."]
    values = self_similarity(str(demo_data["start"]), sentences, batch=2, device="cpu")
    model = AutoModel.from_pretrained(demo_data["start"]).eval()
    total = [0.0] * len(values)
    pairs = 0
    for s in sentences:
        ids = tokenizer(s, return_tensors="pt")
        with torch.no_grad():
            layers = model(**ids, output_hidden_states=True).hidden_states[1:]
        n = ids["input_ids"].shape[1]
        pairs += n * (n - 1) // 2
        for k, h in enumerate(layers):
            h = h[0]
            total[k] += sum(float(torch.nn.functional.cosine_similarity(h[i], h[j], dim=0))
                            for i in range(n) for j in range(i + 1, n))
    assert len(values) == 2
    assert values == pytest.approx([t / pairs for t in total], rel=1e-4)


def test_sample_sentences(tmp_path):
    (tmp_path / "h.txt").write_text("".join(f"sentence number {i}\n" if i % 7 else "\n" for i in range(100)))
    a = sample_sentences(str(tmp_path / "h.txt"), 10, seed=1)
    assert len(a) == 10 and a == sample_sentences(str(tmp_path / "h.txt"), 10, seed=1)
    assert len(sample_sentences(str(tmp_path / "h.txt"), 1000, seed=1)) == 85
    assert not math.isnan(len(a))


def test_anisotropy_is_the_mean_cosine_across_sentences(demo_data, tokenizer):
    """Against a loop over every pair of tokens from different sentences, per layer."""
    from transformers import AutoModel

    from tacl.analysis.similarity import layer_similarities

    sentences = ["The cat sat on the mat.", "A much longer sentence, with several more tokens in it, here.", "Hi."]
    _, anisotropy = layer_similarities(str(demo_data["start"]), sentences, batch=2, device="cpu")
    model = AutoModel.from_pretrained(demo_data["start"]).eval()
    with torch.no_grad():
        layers = [model(**tokenizer(s, return_tensors="pt"), output_hidden_states=True).hidden_states[1:]
                  for s in sentences]
    for k in range(len(anisotropy)):
        vectors = [(a, v) for a in range(3) for v in layers[a][k][0]]
        cross = [float(torch.nn.functional.cosine_similarity(u, v, dim=0))
                 for i, (a, u) in enumerate(vectors) for b, v in vectors[i + 1:] if a != b]
        assert anisotropy[k] == pytest.approx(sum(cross) / len(cross), rel=1e-6)


def test_sentence_embedding_scores_against_loops():
    import numpy as np
    from scipy.stats import rankdata

    from tacl.analysis.embeddings import cluster_scores, sts_spearman

    rng = np.random.default_rng(0)
    a, b, gold = rng.normal(size=(20, 6)), rng.normal(size=(20, 6)), rng.uniform(0, 5, 20)
    cosines = [float(a[i] @ b[i] / np.linalg.norm(a[i]) / np.linalg.norm(b[i])) for i in range(20)]
    r1, r2 = rankdata(cosines), rankdata(gold)
    pearson_of_ranks = float(np.corrcoef(r1, r2)[0, 1])
    assert sts_spearman(a, b, gold) == pytest.approx(pearson_of_ranks, rel=1e-9)
    centres = np.array([[10.0, 0, 0], [0, 10.0, 0], [0, 0, 10.0]])
    points = np.concatenate([c + rng.normal(scale=0.1, size=(15, 3)) for c in centres])
    labels = [str(k) for k in range(3) for _ in range(15)]
    assert cluster_scores(points, labels) == {"ari": 1.0, "ami": 1.0}
    shuffled = cluster_scores(points, list(rng.permutation(labels)))
    assert abs(shuffled["ari"]) < 0.2 and abs(shuffled["ami"]) < 0.2


@pytest.mark.slow
@needs_shared("glue", "STS-B")
def test_minilm_mean_pooling_on_sts_b_dev(tmp_path):
    """A check of the evaluation on a well-known model: all-MiniLM-L6-v2 (PyPI package), whose published
    STS-B figure is in the 0.8s, with mean pooling on 300 STS-B dev pairs from ../shared/data."""
    from conftest import MINILM, SHARED_DATA
    from tacl.analysis.embeddings import prepare, run_embeddings

    prepare({"kind": "tsv", "data_dir": str(SHARED_DATA / "glue")}, "sst2", 300, 200, 0, str(tmp_path / "data.json"))
    result = run_embeddings(MINILM, str(tmp_path / "data.json"), str(tmp_path / "minilm.json"), "minilm", "cpu")
    assert result["sts_pairs"] == 300 and result["labelled"] == 200 and result["cluster_task"] == "sst2"
    assert 0.78 < result["mean"]["sts_spearman"] < 0.92, result
    assert result["cls"]["sts_spearman"] < result["mean"]["sts_spearman"], "the model was trained with mean pooling"


def test_cls_cosines_equal_a_direct_computation(demo_data, tokenizer, tmp_path):
    """The [CLS] figure's numbers (random held-out pairs; STS-B dev pairs scored 4 or more) against each
    sentence encoded alone and the pairs made by hand; the sentence-embedding scores of the same job are
    those of `run_embeddings`; the table and the figure are drawn from them."""
    import json

    import numpy as np
    from transformers import AutoModel

    from conftest import write_embeddings_fixture
    from tacl.analysis.embeddings import prepare, run_embeddings
    from tacl.analysis.similarity import plot_cls, run_similarity
    from tacl.report.tables import cls_table

    heldout = tmp_path / "heldout.txt"
    heldout.write_text("".join(f"Sentence {i} of the held-out text, with {'some ' * (i % 5)}words.\n"
                               for i in range(40)))
    glue = write_embeddings_fixture(tmp_path / "glue", rows=24)
    prepare({"kind": "tsv", "data_dir": str(glue)}, "sst2", 0, 0, 0, str(tmp_path / "data.json"))
    result = run_similarity(str(demo_data["start"]), str(heldout), 11, 3, str(tmp_path / "sim.json"), 64, "tiny",
                            "cpu", str(tmp_path / "data.json"), str(tmp_path / "emb.json"))
    assert json.loads((tmp_path / "sim.json").read_text()) == result

    model = AutoModel.from_pretrained(demo_data["start"]).eval()

    def cls(sentence):
        with torch.no_grad():
            v = model(**tokenizer(sentence, return_tensors="pt", truncation=True, max_length=64)).last_hidden_state
        return v[0, 0].double()

    def cosine(a, b):
        return float(torch.nn.functional.cosine_similarity(cls(a), cls(b), dim=0))

    sentences = sample_sentences(str(heldout), 11, 3)
    order = np.random.default_rng(3).permutation(11)
    expected = {"random": [cosine(sentences[order[k]], sentences[order[5 + k]]) for k in range(5)]}
    data = json.loads((tmp_path / "data.json").read_text())
    expected["sts_top"] = [cosine(a, b) for a, b, score in data["sts"] if score >= 4]
    assert 0 < len(expected["sts_top"]) < len(data["sts"])
    for key, values in expected.items():
        got = result["cls_cosine"][key]
        assert got["pairs"] == len(values) and got["values"] == pytest.approx(values, abs=2e-5)
        assert got["mean"] == pytest.approx(np.mean(values), abs=1e-6)
        assert got["std"] == pytest.approx(np.std(values, ddof=1), abs=1e-6)
        assert got["quantiles"] == pytest.approx({f"q{q:02d}": np.quantile(values, q / 100)
                                                  for q in (5, 25, 50, 75, 95)}, abs=1e-6)
    assert json.loads((tmp_path / "emb.json").read_text()) == run_embeddings(
        str(demo_data["start"]), str(tmp_path / "data.json"), str(tmp_path / "alone.json"), "tiny", "cpu")

    table = cls_table([str(tmp_path / "sim.json")])
    assert list(table["pairs of"]) == ["random held-out pairs", "STS-B dev pairs scored >= 4"]
    assert list(table["mean"]) == [f"{np.mean(v):.3f}" for v in expected.values()]
    assert list(table["q50"]) == [f"{np.median(v):.3f}" for v in expected.values()]
    plot_cls([result, {**result, "model": "other", "cls_cosine": {"random": result["cls_cosine"]["random"]}}],
             str(tmp_path / "cls.png"))
    assert (tmp_path / "cls.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
