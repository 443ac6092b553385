import math

import pytest
import torch

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
