"""`tacl analysis ...`: self-similarity of one model, and the plot over all models."""

from __future__ import annotations

import argparse
import json

from tacl.finetune import GLUE_CLASSIFICATION
from tacl.runtime.device import DEVICES


def register(stages: argparse._SubParsersAction) -> None:
    p = stages.add_parser("analysis", help="layer-wise self-similarity")
    cmds = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    c = cmds.add_parser("similarity", help="self-similarity of one model on held-out sentences")
    c.add_argument("--model", required=True)
    c.add_argument("--name", help="the model's name in tables (default: the folder name)")
    c.add_argument("--heldout", required=True, help="held-out corpus, one sentence per line")
    c.add_argument("--sentences", type=int, default=50000)
    c.add_argument("--seed", type=int, default=0)
    c.add_argument("--max-len", type=int, default=128)
    c.add_argument("--device", default="auto", choices=DEVICES,
                   help="cuda: stop at once unless a GPU is usable (the config's `device`)")
    c.add_argument("--out", required=True)
    c.add_argument("--embeddings-data", help="also evaluate sentence embeddings on this (embeddings-data) file")
    c.add_argument("--embeddings-out", help="where those results go")
    c.set_defaults(func=_similarity)
    c = cmds.add_parser("embeddings-data", help="STS-B dev pairs and a labelled set, once (login node)")
    c.add_argument("--source", required=True, help="a GLUE source as JSON (tsv folder or hf)")
    c.add_argument("--cache-dir", help="Hugging Face datasets cache (a source's own cache_dir wins)")
    c.add_argument("--cluster-task", default="sst2", choices=GLUE_CLASSIFICATION)
    c.add_argument("--max-pairs", type=int, default=0, help="0 = all")
    c.add_argument("--max-sentences", type=int, default=0, help="0 = all")
    c.add_argument("--seed", type=int, default=0)
    c.add_argument("--out", required=True)
    c.set_defaults(func=_embeddings_data, online=True)
    c = cmds.add_parser("embeddings", help="sentence embeddings of one model: STS-B Spearman, k-means ARI/AMI")
    c.add_argument("--model", required=True)
    c.add_argument("--name")
    c.add_argument("--data", required=True, help="from `tacl analysis embeddings-data`")
    c.add_argument("--max-len", type=int, default=128)
    c.add_argument("--seed", type=int, default=0)
    c.add_argument("--device", default="auto", choices=DEVICES)
    c.add_argument("--out", required=True)
    c.set_defaults(func=_embeddings)
    c = cmds.add_parser("plot", help="self-similarity (one line per model, layer on x) and [CLS] cosines")
    c.add_argument("--inputs", nargs="+", required=True, help="the models' similarity JSON files")
    c.add_argument("--out", required=True, help="the self-similarity and anisotropy plot")
    c.add_argument("--cls-out", help="also the [CLS] cosine figure")
    c.set_defaults(func=_plot)


def _similarity(a: argparse.Namespace) -> None:
    from tacl.analysis.similarity import run_similarity

    result = run_similarity(a.model, a.heldout, a.sentences, a.seed, a.out, a.max_len, a.name, a.device,
                            a.embeddings_data, a.embeddings_out)
    for part in result["cls_cosine"].values():
        part.pop("values", None)  # (in the JSON file, not in the log)
    print(json.dumps(result))


def _plot(a: argparse.Namespace) -> None:
    from pathlib import Path

    from tacl.analysis.similarity import plot, plot_cls

    results = [json.loads(Path(p).read_text()) for p in a.inputs]
    plot(results, a.out)
    if a.cls_out:
        plot_cls(results, a.cls_out)


def _embeddings_data(a: argparse.Namespace) -> None:
    from tacl.analysis.embeddings import prepare
    from tacl.runtime.io import with_cache

    source = with_cache(json.loads(a.source), a.cache_dir)
    print(json.dumps(prepare(source, a.cluster_task, a.max_pairs, a.max_sentences, a.seed, a.out)))


def _embeddings(a: argparse.Namespace) -> None:
    from tacl.analysis.embeddings import run_embeddings

    print(json.dumps(run_embeddings(a.model, a.data, a.out, a.name, a.device, a.max_len, a.seed)))
