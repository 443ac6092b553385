"""`tacl similarity`: layer-wise self-similarity (TaCL section 5) and anisotropy (Ethayarajh 2019).

For each sentence, encoded as `[CLS] s [SEP]`, and each layer 1..L: the cosine similarity of every pair
of distinct token vectors. The layer's score is micro-averaged over sentences: the sum of all pairs'
cosines over the number of pairs. Lower means more distinguishable token vectors. Anisotropy, the
baseline it is read against: the mean cosine between tokens of different sentences, per layer.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import numpy as np
import torch

from tacl import RESULT_VERSIONS
from tacl.device import resolve_device
from tacl.hub import resolve_pretrained
from tacl.io import InputError, write_json_atomic


def sample_sentences(path: str, n: int, seed: int, min_tokens: int = 2) -> list[str]:
    """n sentences drawn uniformly (seeded) from a corpus file (one sentence per line)."""
    p = Path(path)
    if not p.is_file():
        raise InputError(f"{p}: held-out corpus not found")
    lines = [line.strip() for line in p.read_text(encoding="utf-8").splitlines() if line.strip()]
    lines = [s for s in lines if len(s.split()) >= min_tokens]
    if not lines:
        raise InputError(f"{p}: no sentences to sample")
    rng = random.Random(seed)
    return lines if len(lines) <= n else rng.sample(lines, n)


def pair_cosine_sums(hidden: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """hidden [B, T, H], mask [B, T] -> (sum over distinct pairs of cosines, number of pairs), per sequence."""
    x = torch.nn.functional.normalize(hidden.double(), dim=-1) * mask[..., None]
    total = x.sum(1)  # [B, H]: sum_i x_i ; sum_{i != j} x_i.x_j = |sum x|^2 - sum |x_i|^2
    pairs_sum = ((total * total).sum(-1) - (x * x).sum((1, 2))) / 2
    n = mask.sum(1).double()
    return pairs_sum.double(), n * (n - 1) / 2


def cross_sentence_sums(hidden: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """hidden [B, T, H], mask [B, T] -> (sum of the normalised token vectors [H], sum over sentences of the
    squared norm of each sentence's sum, per-sentence token counts [B]): what the mean cosine between tokens
    of different sentences is made of, summed over batches (see `layer_similarities`)."""
    x = torch.nn.functional.normalize(hidden.double(), dim=-1) * mask[..., None]
    per_sentence = x.sum(1)  # [B, H]
    return per_sentence.sum(0), (per_sentence * per_sentence).sum(), mask.sum(1).double()


@torch.no_grad()
def layer_similarities(model_dir: str, sentences: list[str], max_len: int = 128, batch: int = 64,
                       device: str = "auto") -> tuple[list[float], list[float]]:
    """(self-similarity, anisotropy) for layers 1..L, from one pass over the sentences.

    Self-similarity: micro-averaged mean cosine of the pairs of distinct tokens of a sentence. Anisotropy
    (Ethayarajh 2019), its baseline: the mean cosine of all pairs of tokens from different sentences,
    (|sum of all vectors|^2 - sum over sentences of |their sum|^2) / (T^2 - sum of n_s^2), exactly, with no
    sampling."""
    from transformers import AutoModel, AutoTokenizer

    dev = resolve_device(device)
    model_dir = resolve_pretrained(model_dir)
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModel.from_pretrained(model_dir).to(dev).eval()
    sums, pairs = None, 0.0
    total, squares, tokens, token_squares = None, None, 0.0, 0.0
    for i in range(0, len(sentences), batch):
        enc = tok(sentences[i : i + batch], truncation=True, max_length=max_len, padding=True, return_tensors="pt")
        enc = {k: v.to(dev) for k, v in enc.items()}
        hidden = model(**enc, output_hidden_states=True).hidden_states[1:]  # layers 1..L
        mask = enc["attention_mask"]
        layer_sums = torch.stack([pair_cosine_sums(h, mask)[0].sum() for h in hidden])
        sums = layer_sums if sums is None else sums + layer_sums
        pairs += float(pair_cosine_sums(hidden[0], mask)[1].sum())
        cross = [cross_sentence_sums(h, mask) for h in hidden]
        layer_total = torch.stack([c[0] for c in cross])  # [L, H]
        layer_squares = torch.stack([c[1] for c in cross])  # [L]
        total = layer_total if total is None else total + layer_total
        squares = layer_squares if squares is None else squares + layer_squares
        n = cross[0][2]
        tokens, token_squares = tokens + float(n.sum()), token_squares + float((n * n).sum())
    anisotropy = ((total * total).sum(-1) - squares) / (tokens * tokens - token_squares)
    return (sums / pairs).tolist(), anisotropy.tolist()


def self_similarity(model_dir: str, sentences: list[str], max_len: int = 128, batch: int = 64,
                    device: str = "auto") -> list[float]:
    """Micro-averaged self-similarity for layers 1..L."""
    return layer_similarities(model_dir, sentences, max_len, batch, device)[0]


def run_similarity(model_dir: str, heldout: str, n: int, seed: int, out_json: str, max_len: int = 128,
                   name: str | None = None, device: str = "auto") -> dict[str, Any]:
    resolve_device(device)  # a job that asked for a GPU and has none stops before reading anything
    sentences = sample_sentences(heldout, n, seed)
    values, anisotropy = layer_similarities(model_dir, sentences, max_len, device=device)
    result = {"model": name or Path(model_dir).name, "sentences": len(sentences), "seed": seed,
              "max_len": max_len, "layers": list(range(1, len(values) + 1)), "self_similarity": values,
              "anisotropy": anisotropy,
              "given": {"sentences": n, "seed": seed, "max_len": max_len, "version": RESULT_VERSIONS["analysis"]}}
    write_json_atomic(out_json, result)
    return result


def plot(results: list[dict[str, Any]], out_png: str) -> None:
    import matplotlib
    import matplotlib.ticker

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from tacl.io import atomic_path

    fig, ax = plt.subplots(figsize=(9, 4))
    for k, r in enumerate(results):
        color = f"C{k}"
        ax.plot(r["layers"], r["self_similarity"], marker="o", color=color, label=f"{r['model']} self-similarity")
        if "anisotropy" in r:
            ax.plot(r["layers"], r["anisotropy"], marker="x", linestyle="--", color=color,
                    label=f"{r['model']} anisotropy")
    ax.set_xlabel("layer")
    ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
    ax.set_ylabel("mean cosine of token pairs")
    ax.set_title(f"Same sentence (solid) and different sentences (dashed), {results[0]['sentences']} held-out "
                 "sentences" if results else "", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(loc="upper left", bbox_to_anchor=(1.02, 1.0), fontsize=8, borderaxespad=0.0)  # beside the curves
    fig.tight_layout()
    with atomic_path(out_png) as tmp:
        fig.savefig(tmp, format="png", dpi=120, bbox_inches="tight")
    plt.close(fig)
