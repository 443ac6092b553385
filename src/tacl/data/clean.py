"""Clean + sentence-split with the TaCL recipe.

Per article: split on newlines; stop at the first line that heads one of the article's closing sections
(tacl.data.headings: `data.language` picks a built-in list, `data.stop_headings` gives one instead; English's,
TaCL's recipe, stops at the first line starting with "References", "External links", "Category:" or "See
also"; any other list at a line that is a listed heading, or a compound heading line such as "Izvori i
literatura", `StopRule.stops_at`); drop paragraphs under 3 words; split sentences; drop sentences under 3
characters; drop the document if fewer than 2 sentences remain.

Two sentence splitters (`data.sentence_splitter`):
- `blingfire` (default): a statistical splitter; the stop line itself is dropped.
- `regex`: the reference's own rules (`split_like_reference`): dots of titles,
  suffixes, initials, acronyms, web domains and "Ph.D." are protected, a closing quote moves before its
  terminator, every other '.', '?' and '!' ends a sentence, and whatever follows a paragraph's last
  terminator is dropped (headings, unpunctuated list lines; decimals such as 10.4 are split). As in the
  reference, the stop line itself is kept when it has 3 or more words.

Output: one sentence per line, a blank line after each document (`corpus.txt`), a byte-offset index of
the documents (`corpus.idx.npy`, read by the shard jobs), a held-out sample of whole documents chosen by
a hash of the article id (`heldout.txt`, never in the training corpus), and statistics (JSON).
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import multiprocessing as mp
import re
from typing import Any, Iterable, Iterator

import numpy as np

from tacl.data.headings import TACL, StopRule
from tacl.data.sources import Article, iter_articles
from tacl import RESULT_VERSIONS
from tacl.runtime.io import InputError, atomic_path, read_json, write_json_atomic

MIN_PARAGRAPH_WORDS = 3
MIN_SENTENCE_CHARS = 3
MIN_DOCUMENT_SENTENCES = 2


SPLITTERS = ("blingfire", "regex")

# -- the reference's regular-expression splitter, rule by rule ------------------------------------------------
# A protected dot becomes _DOT until the end; _CUT marks a sentence end decided by a rule.
_DOT, _CUT = "\x00", "\x01"
_LETTER = r"([A-Za-z])"
_TITLE = re.compile(r"(Mr|St|Mrs|Ms|Dr)[.]")  # Mr. Smith, St. Louis (anywhere, as the reference)
_DOMAIN = re.compile(r"[.](com|net|org|io|gov)")  # example.com
_SUFFIX = r"(Inc|Ltd|Jr|Sr|Co)"
_STARTER = (r"(Mr|Mrs|Ms|Dr|He\s|She\s|It\s|They\s|Their\s|Our\s|We\s|But\s|However\s|That\s|This\s"
            r"|Wherever)")
_ACRONYM = r"([A-Z][.][A-Z][.](?:[A-Z][.])?)"
_RULES = [  # applied in this order to " " + paragraph + "  "
    (re.compile(r"\s" + _LETTER + r"[.] "), " \\1" + _DOT + " "),  # an initial: "J. Smith"
    (re.compile(_ACRONYM + " " + _STARTER), "\\1" + _CUT + " \\2"),  # "... the U.S. He went" ends
    (re.compile(_LETTER + "[.]" + _LETTER + "[.]" + _LETTER + "[.]"), "\\1" + _DOT + "\\2" + _DOT + "\\3" + _DOT),
    (re.compile(_LETTER + "[.]" + _LETTER + "[.]"), "\\1" + _DOT + "\\2" + _DOT),  # U.S., e.g.
    (re.compile(" " + _SUFFIX + "[.] " + _STARTER), " \\1" + _CUT + " \\2"),  # "Acme Inc. He" ends
    (re.compile(" " + _SUFFIX + "[.]"), " \\1" + _DOT),  # "Acme Inc. makes"
    (re.compile(" " + _LETTER + "[.]"), " \\1" + _DOT),  # a single letter before a dot
]


def split_like_reference(paragraph: str) -> list[str]:
    """The sentences the reference's regular-expression splitter finds in one paragraph (see the module
    docstring); text after the last terminator is dropped."""
    text = " " + paragraph.replace("\n", " ") + "  "
    text = _TITLE.sub("\\1" + _DOT, text)
    text = _DOMAIN.sub(_DOT + "\\1", text)
    text = text.replace("Ph.D.", "Ph" + _DOT + "D" + _DOT)
    for pattern, replacement in _RULES:
        text = pattern.sub(replacement, text)
    for quote in ("\u201d", '"'):  # a closing quote moves before the terminator: .” -> ”.
        text = text.replace("." + quote, quote + ".")
    text = text.replace('!"', '"!').replace('?"', '"?')
    for terminator in ".?!":
        text = text.replace(terminator, terminator + _CUT)
    pieces = text.replace(_DOT, ".").split(_CUT)
    return [p.strip() for p in pieces[:-1]]  # the last piece follows the last terminator: dropped


def _split(paragraph: str, splitter: str) -> list[str]:
    if splitter == "regex":
        return split_like_reference(paragraph)
    import blingfire  # (only here: a node that splits with `regex` needs no blingfire installed)

    return blingfire.text_to_sentences(paragraph).split("\n")


def clean_article(text: str, splitter: str = "blingfire", stops: StopRule = TACL) -> list[str]:
    """The sentences TaCL keeps from one article (empty if the document is dropped); `stops`: the stop rule
    (tacl.data.headings.stop_rule)."""
    if splitter not in SPLITTERS:
        raise InputError(f"data.sentence_splitter: {splitter!r} is not one of {', '.join(SPLITTERS)}")
    sentences: list[str] = []
    for paragraph in text.split("\n"):
        paragraph = paragraph.strip()
        stop = stops.stops_at(paragraph)
        if stop and splitter != "regex":
            break
        if len(paragraph.split()) >= MIN_PARAGRAPH_WORDS:
            for sentence in _split(paragraph, splitter):
                sentence = sentence.strip()
                if len(sentence) >= MIN_SENTENCE_CHARS:
                    sentences.append(sentence)
        if stop:  # the reference keeps the stop line itself (when it has 3+ words), then stops
            break
    return sentences if len(sentences) >= MIN_DOCUMENT_SENTENCES else []


def is_heldout(article_id: str, fraction: float) -> bool:
    """A stable, order-independent choice of held-out documents."""
    if fraction <= 0:
        return False
    digest = int.from_bytes(hashlib.sha1(article_id.encode()).digest()[:8], "big")
    return digest < fraction * 2**64


def _clean_batch(batch: list[Article], splitter: str = "blingfire",
                 stops: StopRule = TACL) -> list[list[str]]:
    return [clean_article(a.text, splitter, stops) for a in batch]


def _batches(articles: Iterable[Article], size: int) -> Iterator[list[Article]]:
    it = iter(articles)
    while batch := list(itertools.islice(it, size)):
        yield batch


def _cleaned(articles: Iterable[Article], workers: int, splitter: str = "blingfire", batch: int = 256,
             stops: StopRule = TACL) -> Iterator[tuple[Article, list[str]]]:
    """(article, its sentences), cleaned in parallel, in source order, reading the source only a bounded
    window ahead."""
    batches = _batches(articles, batch)
    clean = functools.partial(_clean_batch, splitter=splitter, stops=stops)
    if workers <= 1:
        for b in batches:
            yield from zip(b, clean(b))
        return
    with mp.get_context("fork").Pool(workers) as pool:
        while window := list(itertools.islice(batches, workers * 4)):
            for b, result in zip(window, pool.map(clean, window)):
                yield from zip(b, result)


def capped_documents(articles: Iterable[Article], max_lines: int | None, heldout_fraction: float,
                     splitter: str = "blingfire", workers: int = 1,
                     stops: StopRule = TACL) -> Iterator[tuple[Article, list[str], str]]:
    """(article, sentences, role) in source order; role is "train", "heldout", "dropped" (nothing kept) or
    "over": the first training document that would take the corpus past `max_lines` (lines = sentences plus
    the blank line after each document), the last one yielded. What the clean step writes, and what a capped
    download must fetch."""
    lines = 0
    for article, sentences in _cleaned(articles, workers, splitter, stops=stops):
        if not sentences:
            yield article, sentences, "dropped"
        elif is_heldout(article.id, heldout_fraction):
            yield article, sentences, "heldout"
        elif max_lines and lines + len(sentences) + 1 > max_lines:
            yield article, sentences, "over"
            return
        else:
            lines += len(sentences) + 1
            yield article, sentences, "train"


def clean_given(max_lines: int | None, heldout_fraction: float, splitter: str,
                stops: StopRule = TACL) -> dict[str, Any]:
    """The settings a clean job ran with, as its record keeps them (tacl.experiment.reruns compares them); the
    stop rule only where it is not TaCL's (`StopRule.given`)."""
    # (0 and None both mean no cap: the job is given `max_lines or None`)
    return {"max_lines": max_lines or None, "heldout_fraction": heldout_fraction, "sentence_splitter": splitter,
            "version": RESULT_VERSIONS["data"], **stops.given()}


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
    splitter: str = "blingfire",
    stops: StopRule = TACL,
) -> dict[str, Any]:
    """Clean the corpus described by `raw_json` (written by the download step).

    `max_lines` caps `corpus.txt` (sentence lines plus the blank line after each document), stopping
    before the first document that would cross it, as the paper took the first 20M lines.
    """
    from tqdm import tqdm

    if splitter not in SPLITTERS:
        raise InputError(f"data.sentence_splitter: {splitter!r} is not one of {', '.join(SPLITTERS)}")
    raw = read_json(raw_json)
    articles = iter_articles(raw["source"], raw.get("cache_dir"), raw.get("rows_file"))
    stats = {"articles": 0, "documents": 0, "sentences": 0, "lines": 0, "sentence_splitter": splitter,
             "heldout_documents": 0, "heldout_sentences": 0, "capped": False, "max_lines": max_lines,
             "given": clean_given(max_lines, heldout_fraction, splitter, stops)}
    offsets = [0]
    with atomic_path(out_corpus) as tmp_corpus, atomic_path(out_heldout) as tmp_heldout:
        with open(tmp_corpus, "wb") as corpus, open(tmp_heldout, "wb") as heldout:
            documents = capped_documents(articles, max_lines, heldout_fraction, splitter, workers, stops)
            bar = tqdm(documents, desc="clean", unit=" articles", disable=not progress, mininterval=2.0)
            for _, sentences, role in bar:
                stats["articles"] += 1
                if role == "over":
                    stats["capped"] = True
                    break
                if role == "dropped":
                    continue
                block = ("\n".join(sentences) + "\n\n").encode("utf-8")
                if role == "heldout":
                    heldout.write(block)
                    stats["heldout_documents"] += 1
                    stats["heldout_sentences"] += len(sentences)
                    continue
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
