"""`tacl analysis embeddings`: sentence embeddings without fine-tuning (docs/results.md).

For every model, with [CLS] and with mean pooling (the last layer's token vectors averaged over the real
tokens, [CLS] and [SEP] included, as sentence-transformers does):
- STS-B dev: Spearman correlation between cos(embedding(s1), embedding(s2)) and the gold scores;
- clustering: k-means (k = the number of labels) of a labelled set's sentences, scored against the labels
  with the adjusted Rand index and the adjusted mutual information (scikit-learn).

`tacl analysis embeddings-data` (a login-node rule) writes the sentences once (STS-B dev pairs and the
labelled set, from the GLUE source of the config), so that the jobs on compute nodes read no dataset.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from tacl.analysis.encoder import load_encoder
from tacl.runtime.io import InputError, read_json, write_json_atomic

POOLINGS = ("cls", "mean")


def prepare(source: dict[str, Any], cluster_task: str, max_pairs: int, max_sentences: int, seed: int,
            out_json: str) -> dict[str, Any]:
    """STS-B dev pairs with scores and a labelled set (a GLUE classification task's dev sentences),
    seeded subsets of at most max_pairs / max_sentences, as JSON."""
    from tacl.finetune import glue
    from tacl.finetune.sequence import load_examples, subset

    if cluster_task not in glue.TASKS or glue.TASKS[cluster_task].is_regression:
        raise InputError(f"analysis.embeddings.cluster_task: {cluster_task!r} is not a GLUE classification task")
    pairs = subset(load_examples("stsb", "dev", source), max_pairs, seed)
    labelled = subset(load_examples(cluster_task, "dev", source), max_sentences, seed)
    data = {"sts": [[e.text_a, e.text_b, float(e.label)] for e in pairs],
            "cluster_task": cluster_task,
            "labelled": [[e.text_a, str(e.label)] for e in labelled]}
    write_json_atomic(out_json, data)
    return {"sts_pairs": len(data["sts"]), "labelled": len(data["labelled"]), "cluster_task": cluster_task}


def embed(model: Any, tokenizer: Any, sentences: list[str], device: Any, max_len: int = 128,
          batch: int = 64) -> dict[str, np.ndarray]:
    """{"cls": [N, H], "mean": [N, H]} from the last layer."""
    import torch

    out: dict[str, list[np.ndarray]] = {p: [] for p in POOLINGS}
    with torch.no_grad():
        for i in range(0, len(sentences), batch):
            enc = tokenizer(sentences[i : i + batch], truncation=True, max_length=max_len, padding=True,
                            return_tensors="pt").to(device)
            hidden = model(**enc).last_hidden_state.float()
            mask = enc["attention_mask"][..., None].float()
            out["cls"].append(hidden[:, 0].cpu().numpy())
            out["mean"].append(((hidden * mask).sum(1) / mask.sum(1)).cpu().numpy())
    return {p: np.concatenate(v) for p, v in out.items()}


def cosine_rows(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a = a / np.linalg.norm(a, axis=1, keepdims=True).clip(1e-12)
    b = b / np.linalg.norm(b, axis=1, keepdims=True).clip(1e-12)
    return (a * b).sum(1)


def sts_spearman(emb_a: np.ndarray, emb_b: np.ndarray, gold: np.ndarray) -> float:
    from scipy.stats import spearmanr

    return float(spearmanr(cosine_rows(emb_a, emb_b), gold).statistic)


def cluster_scores(embeddings: np.ndarray, labels: list[str], seed: int = 0) -> dict[str, float]:
    """k-means with k = the number of distinct labels (10 restarts, seeded) scored with ARI and AMI."""
    from sklearn.cluster import KMeans
    from sklearn.metrics import adjusted_mutual_info_score, adjusted_rand_score

    k = len(set(labels))
    found = KMeans(n_clusters=k, n_init=10, random_state=seed).fit_predict(embeddings.astype(np.float64))
    return {"ari": float(adjusted_rand_score(labels, found)), "ami": float(adjusted_mutual_info_score(labels, found))}


def evaluate(model: Any, data: dict[str, Any], device: str = "auto", max_len: int = 128,
             seed: int = 0) -> tuple[dict[str, Any], np.ndarray]:
    """The scores of one model (a directory, or a tacl.analysis.encoder.Encoder already loaded), and the
    cosines of the STS-B pairs' [CLS] vectors (in data["sts"]'s order, for the [CLS] figure)."""
    encoder = load_encoder(model, device)
    first = embed(encoder.model, encoder.tokenizer, [p[0] for p in data["sts"]], encoder.device, max_len)
    second = embed(encoder.model, encoder.tokenizer, [p[1] for p in data["sts"]], encoder.device, max_len)
    gold = np.array([p[2] for p in data["sts"]])
    labelled = embed(encoder.model, encoder.tokenizer, [s for s, _ in data["labelled"]], encoder.device, max_len)
    labels = [label for _, label in data["labelled"]]
    result: dict[str, Any] = {}
    for pooling in POOLINGS:
        result[pooling] = {"sts_spearman": sts_spearman(first[pooling], second[pooling], gold),
                           **cluster_scores(labelled[pooling], labels, seed)}
    return result, cosine_rows(first["cls"], second["cls"])


def embeddings_result(model: Any, data: dict[str, Any], name: str, device: str = "auto", max_len: int = 128,
                      seed: int = 0) -> tuple[dict[str, Any], np.ndarray]:
    """What `run_embeddings` writes, and the STS-B pairs' [CLS] cosines."""
    scores, cls_cosines = evaluate(model, data, device, max_len, seed)
    return {"model": name, "sts_pairs": len(data["sts"]), "cluster_task": data["cluster_task"],
            "labelled": len(data["labelled"]), **scores}, cls_cosines


def run_embeddings(model_dir: str, data_json: str, out_json: str, name: str | None = None, device: str = "auto",
                   max_len: int = 128, seed: int = 0) -> dict[str, Any]:
    from tacl.runtime.device import resolve_device

    resolve_device(device)  # a job that asked for a GPU and has none stops before reading anything
    result, _ = embeddings_result(model_dir, read_json(data_json), name or Path(model_dir).name, device, max_len,
                                  seed)
    write_json_atomic(out_json, result)
    return result
