"""`tacl analysis similarity`: layer-wise self-similarity (TaCL section 5) and anisotropy (Ethayarajh
2019), and the [CLS] cosine distributions, from one load of the model (the job's sentence-embedding
evaluation, tacl.analysis.embeddings, reuses it).

For each sentence, encoded as `[CLS] s [SEP]`, and each layer 1..L: the cosine similarity of every pair
of distinct token vectors. The layer's score is micro-averaged over sentences: the sum of all pairs'
cosines over the number of pairs. Lower means more distinguishable token vectors. Anisotropy, the
baseline it is read against: the mean cosine between tokens of different sentences, per layer.

[CLS] cosines (anisotropy at the sequence level, as the COCO-LM lecture shows it): cos of the last layer's
[CLS] vectors over random pairs of the held-out sentences (disjoint pairs from a seeded permutation), and,
where the sentence-embedding evaluation runs, over the STS-B dev pairs scored STS_TOP or more (4 = "mostly
equivalent" .. 5 = "completely equivalent"): their mean, std, quantiles and values.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import numpy as np
import torch

from tacl import RESULT_VERSIONS
from tacl.analysis.encoder import Encoder, load_encoder
from tacl.runtime.device import resolve_device
from tacl.runtime.io import InputError, read_json, write_json_atomic


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


STS_TOP = 4.0  # the STS-B dev pairs of the [CLS] figure: gold score at least this (of 0..5)
QUANTILES = (0.05, 0.25, 0.5, 0.75, 0.95)
CLS_LABELS = {"random": "random held-out pairs", "sts_top": f"STS-B dev pairs scored >= {STS_TOP:g}"}


def layer_similarities(model: "str | Encoder", sentences: list[str], max_len: int = 128, batch: int = 64,
                       device: str = "auto") -> tuple[list[float], list[float]]:
    """(self-similarity, anisotropy) for layers 1..L, from one pass over the sentences."""
    r = representations(load_encoder(model, device), sentences, max_len, batch)
    return r["self_similarity"], r["anisotropy"]


@torch.no_grad()
def representations(encoder: Encoder, sentences: list[str], max_len: int = 128,
                    batch: int = 64) -> dict[str, Any]:
    """Self-similarity and anisotropy for layers 1..L, and the sentences' last-layer [CLS] vectors,
    normalised ([N, H] float64 numpy), from one pass.

    Self-similarity: micro-averaged mean cosine of the pairs of distinct tokens of a sentence. Anisotropy
    (Ethayarajh 2019), its baseline: the mean cosine of all pairs of tokens from different sentences,
    (|sum of all vectors|^2 - sum over sentences of |their sum|^2) / (T^2 - sum of n_s^2), exactly, with no
    sampling."""
    tok, model, dev = encoder.tokenizer, encoder.model, encoder.device
    cls = []
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
        cls.append(torch.nn.functional.normalize(hidden[-1][:, 0].double(), dim=-1).cpu())
    anisotropy = ((total * total).sum(-1) - squares) / (tokens * tokens - token_squares)
    return {"self_similarity": (sums / pairs).tolist(), "anisotropy": anisotropy.tolist(),
            "cls": torch.cat(cls).numpy()}


def self_similarity(model_dir: str, sentences: list[str], max_len: int = 128, batch: int = 64,
                    device: str = "auto") -> list[float]:
    """Micro-averaged self-similarity for layers 1..L."""
    return layer_similarities(model_dir, sentences, max_len, batch, device)[0]


def random_pair_cosines(vectors: np.ndarray, seed: int) -> np.ndarray:
    """Cosines of disjoint random pairs of rows (N // 2 pairs, from a permutation seeded by `seed`); the rows
    are unit vectors."""
    order = np.random.default_rng(seed).permutation(len(vectors))
    half = len(vectors) // 2
    return (vectors[order[:half]] * vectors[order[half : 2 * half]]).sum(1)


def cosine_summary(cosines: np.ndarray) -> dict[str, Any]:
    """pairs, mean, std (sample; None for one pair), the QUANTILES and the values (rounded to 5 decimals) of a
    set of cosines."""
    c = np.asarray(cosines, dtype=np.float64)
    if len(c) == 0:
        return {"pairs": 0}
    return {"pairs": len(c), "mean": float(c.mean()), "std": float(c.std(ddof=1)) if len(c) > 1 else None,
            "quantiles": {f"q{round(100 * q):02d}": float(np.quantile(c, q)) for q in QUANTILES},
            "values": [round(float(x), 5) for x in c]}


def run_similarity(model_dir: str, heldout: str, n: int, seed: int, out_json: str, max_len: int = 128,
                   name: str | None = None, device: str = "auto", embeddings_data: str | None = None,
                   embeddings_out: str | None = None) -> dict[str, Any]:
    """The job: self-similarity, anisotropy and the [CLS] cosines of one model on `n` held-out sentences,
    and (embeddings_data) its sentence-embedding evaluation, written to `embeddings_out`, whose STS-B pairs
    give the [CLS] cosines of the top pairs. The model is loaded once."""
    resolve_device(device)  # a job that asked for a GPU and has none stops before reading anything
    if embeddings_data and not embeddings_out:
        raise InputError("the sentence-embedding evaluation (--embeddings-data) needs --embeddings-out")
    sentences = sample_sentences(heldout, n, seed)
    encoder = load_encoder(model_dir, device)
    r = representations(encoder, sentences, max_len)
    name = name or Path(model_dir).name
    cls = {"random": {"label": CLS_LABELS["random"], **cosine_summary(random_pair_cosines(r["cls"], seed))}}
    if embeddings_data:
        from tacl.analysis.embeddings import embeddings_result

        data = read_json(embeddings_data)
        scores, sts_cls = embeddings_result(encoder, data, name, device)  # (its own max_len and seed)
        write_json_atomic(embeddings_out, scores)
        top = np.array([p[2] >= STS_TOP for p in data["sts"]], dtype=bool)
        cls["sts_top"] = {"label": CLS_LABELS["sts_top"], "min_score": STS_TOP, **cosine_summary(sts_cls[top])}
    result = {"model": name, "sentences": len(sentences), "seed": seed, "max_len": max_len,
              "layers": list(range(1, len(r["self_similarity"]) + 1)), "self_similarity": r["self_similarity"],
              "anisotropy": r["anisotropy"], "cls_cosine": cls,
              "given": {"sentences": n, "seed": seed, "max_len": max_len, "version": RESULT_VERSIONS["analysis"]}}
    write_json_atomic(out_json, result)
    return result


def plot(results: list[dict[str, Any]], out_png: str) -> None:
    import matplotlib
    import matplotlib.ticker

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from tacl.runtime.io import atomic_path

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


def plot_cls(results: list[dict[str, Any]], out_png: str) -> None:
    """One panel per model: the histogram (density) of cos([CLS]) over random held-out pairs and, where
    measured, over the top STS-B dev pairs, on one shared axis."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from tacl.runtime.io import atomic_path

    results = [r for r in results if "cls_cosine" in r]
    values = [np.asarray(part.get("values", [])) for r in results for part in r["cls_cosine"].values()]
    low = min([float(v.min()) for v in values if len(v)] or [-1.0])
    bins = np.linspace(max(-1.0, low - 0.02), 1.0, 51)
    cols = min(4, max(1, len(results)))
    rows = max(1, -(-len(results) // cols))
    fig, axes = plt.subplots(rows, cols, figsize=(3.2 * cols, 2.4 * rows), sharex=True, squeeze=False)
    for ax, r in zip(axes.flat, results):
        for k, key in enumerate(CLS_LABELS):
            part = r["cls_cosine"].get(key)
            if not part or not part.get("pairs"):
                continue
            ax.hist(part["values"], bins=bins, density=True, color=f"C{k}", alpha=0.55 if k == 0 else 1.0,
                    histtype="stepfilled" if k == 0 else "step", linewidth=1.5,
                    label=f"{part['label']} (n={part['pairs']}, mean {part['mean']:.2f})")
        ax.set_title(r["model"], fontsize=9)
        ax.legend(fontsize=6, loc="upper left")
        ax.tick_params(labelsize=7)
    for ax in list(axes.flat)[len(results):]:
        ax.axis("off")
    for ax in axes[-1]:
        ax.set_xlabel("cosine of the [CLS] vectors (last layer)", fontsize=8)
    for ax in axes[:, 0]:
        ax.set_ylabel("density", fontsize=8)
    fig.tight_layout()
    with atomic_path(out_png) as tmp:
        fig.savefig(tmp, format="png", dpi=120)
    plt.close(fig)
