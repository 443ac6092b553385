"""Clean + sentence-split with the TaCL recipe.

Per article: split on newlines; stop at the first line starting with "References", "External links",
"Category:" or "See also"; drop paragraphs under 3 words; split sentences (blingfire); drop sentences
under 3 characters; drop the document if fewer than 2 sentences remain.

Output: one sentence per line, a blank line after each document (`corpus.txt`), a byte-offset index of
the documents (`corpus.idx.npy`, read by the shard jobs), a held-out sample of whole documents chosen by
a hash of the article id (`heldout.txt`, never in the training corpus), and statistics (JSON).
"""

from __future__ import annotations

import hashlib
import itertools
import multiprocessing as mp
from typing import Any, Iterable, Iterator

import blingfire
import numpy as np

from tacl.data.sources import Article, iter_articles
from tacl.io import InputError, atomic_path, read_json, write_json_atomic

STOP_PREFIXES = ("References", "External links", "Category:", "See also")
MIN_PARAGRAPH_WORDS = 3
MIN_SENTENCE_CHARS = 3
MIN_DOCUMENT_SENTENCES = 2


def clean_article(text: str) -> list[str]:
    """The sentences TaCL keeps from one article (empty if the document is dropped)."""
    sentences: list[str] = []
    for paragraph in text.split("\n"):
        paragraph = paragraph.strip()
        if paragraph.startswith(STOP_PREFIXES):
            break
        if len(paragraph.split()) < MIN_PARAGRAPH_WORDS:
            continue
        for sentence in blingfire.text_to_sentences(paragraph).split("\n"):
            sentence = sentence.strip()
            if len(sentence) >= MIN_SENTENCE_CHARS:
                sentences.append(sentence)
    return sentences if len(sentences) >= MIN_DOCUMENT_SENTENCES else []


def is_heldout(article_id: str, fraction: float) -> bool:
    """A stable, order-independent choice of held-out documents."""
    if fraction <= 0:
        return False
    digest = int.from_bytes(hashlib.sha1(article_id.encode()).digest()[:8], "big")
    return digest < fraction * 2**64


def _clean_batch(batch: list[Article]) -> list[tuple[str, list[str]]]:
    return [(a.id, clean_article(a.text)) for a in batch]


def _batches(articles: Iterable[Article], size: int) -> Iterator[list[Article]]:
    it = iter(articles)
    while batch := list(itertools.islice(it, size)):
        yield batch


def _cleaned(articles: Iterable[Article], workers: int, batch: int = 256) -> Iterator[tuple[str, list[str]]]:
    """Clean in parallel, in source order, reading the source only a bounded window ahead."""
    batches = _batches(articles, batch)
    if workers <= 1:
        for b in batches:
            yield from _clean_batch(b)
        return
    with mp.get_context("fork").Pool(workers) as pool:
        while window := list(itertools.islice(batches, workers * 4)):
            for result in pool.map(_clean_batch, window):
                yield from result


def clean_corpus(
    raw_json: str,
    out_corpus: str,
    out_index: str,
    out_heldout: str,
    out_stats: str,
    max_lines: int | None = None,
    heldout_fraction: float = 0.0,
    workers: int = 1,
    progress: bool = True,
) -> dict[str, Any]:
    """Clean the corpus described by `raw_json` (written by the download step).

    `max_lines` caps `corpus.txt` (sentence lines plus the blank line after each document), stopping
    before the first document that would cross it, as the paper took the first 20M lines.
    """
    from tqdm import tqdm

    raw = read_json(raw_json)
    articles = iter_articles(raw["source"], raw.get("cache_dir"))
    stats = {"articles": 0, "documents": 0, "sentences": 0, "lines": 0,
             "heldout_documents": 0, "heldout_sentences": 0, "capped": False, "max_lines": max_lines}
    offsets = [0]
    with atomic_path(out_corpus) as tmp_corpus, atomic_path(out_heldout) as tmp_heldout:
        with open(tmp_corpus, "wb") as corpus, open(tmp_heldout, "wb") as heldout:
            bar = tqdm(_cleaned(articles, workers), desc="clean", unit=" articles", disable=not progress,
                       mininterval=2.0)
            for article_id, sentences in bar:
                stats["articles"] += 1
                if not sentences:
                    continue
                block = ("\n".join(sentences) + "\n\n").encode("utf-8")
                if is_heldout(article_id, heldout_fraction):
                    heldout.write(block)
                    stats["heldout_documents"] += 1
                    stats["heldout_sentences"] += len(sentences)
                    continue
                if max_lines and stats["lines"] + len(sentences) + 1 > max_lines:
                    stats["capped"] = True
                    break
                corpus.write(block)
                offsets.append(offsets[-1] + len(block))
                stats["documents"] += 1
                stats["sentences"] += len(sentences)
                stats["lines"] += len(sentences) + 1
            bar.close()
        if stats["documents"] < 2:
            raise InputError(
                f"{raw_json}: the corpus has {stats['documents']} document(s) after cleaning "
                f"({stats['articles']} articles read); NSP needs at least 2"
            )
        with atomic_path(out_index) as tmp_index:
            with open(tmp_index, "wb") as f:
                np.save(f, np.asarray(offsets, dtype=np.int64))
    write_json_atomic(out_stats, stats)
    return stats


def read_documents(corpus: str, index: str, start: int, stop: int) -> list[list[str]]:
    """Documents [start, stop) of a cleaned corpus, as lists of sentences, read by byte range."""
    offsets = np.load(index)
    n_docs = len(offsets) - 1
    if not 0 <= start <= stop <= n_docs:
        raise InputError(f"{index}: documents [{start}, {stop}) out of range (corpus has {n_docs})")
    with open(corpus, "rb") as f:
        f.seek(int(offsets[start]))
        blob = f.read(int(offsets[stop] - offsets[start])).decode("utf-8")
    if blob and not blob.endswith("\n\n"):
        raise InputError(f"{corpus}: does not match its index {index} (rerun the clean step)")
    return [doc.split("\n") for doc in blob[:-2].split("\n\n")] if blob else []
