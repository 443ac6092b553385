"""Readers for the corpus sources named in config `data.source`.

kinds:
  hf             a Hugging Face dataset (`wikimedia/wikipedia`, `20231101.en`): rows with id, title, text
  wikiextractor  WikiExtractor output files: `<doc id=.. url=.. title=..>` blocks, title line first
  text           plain text files: documents separated by blank lines, one paragraph per line
Every reader yields `Article(id, title, text)` in a fixed order, so the corpus is deterministic.
"""

from __future__ import annotations

import glob
import html
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from tacl.runtime.hub import from_hub
from tacl.runtime.io import InputError

KINDS = ("hf", "wikiextractor", "text")


@dataclass(frozen=True)
class Article:
    id: str
    title: str
    text: str


def expand_paths(patterns: list[str]) -> list[Path]:
    """Expand globs in order; every pattern must match at least one file."""
    paths: list[Path] = []
    for pattern in patterns:
        matches = sorted(glob.glob(pattern))
        if not matches:
            raise InputError(f"{pattern}: corpus file not found (data.source.paths)")
        paths.extend(Path(m) for m in matches if Path(m).is_file())
    return paths


_DOC_OPEN = re.compile(r'<doc id="([^"]*)"[^>]*?title="([^"]*)"[^>]*>')


def read_wikiextractor(paths: list[Path]) -> Iterator[Article]:
    for path in paths:
        doc_id = title = None
        lines: list[str] = []
        with open(path, encoding="utf-8") as f:
            for line in f:
                if doc_id is None:
                    m = _DOC_OPEN.match(line)
                    if m:
                        doc_id, title = m.group(1), html.unescape(m.group(2))
                        lines = []
                    continue
                if line.startswith("</doc>"):
                    body = [ln.rstrip("\n") for ln in lines]
                    if body and body[0].strip() == title:  # WikiExtractor repeats the title first
                        body = body[1:]
                    yield Article(doc_id, title, "\n".join(body))
                    doc_id = None
                else:
                    lines.append(line)


def read_text(paths: list[Path]) -> Iterator[Article]:
    for path in paths:
        block: list[str] = []
        n = 0
        with open(path, encoding="utf-8") as f:
            for line in f:
                if line.strip():
                    block.append(line.rstrip("\n"))
                elif block:
                    yield Article(f"{path.name}:{n}", "", "\n".join(block))
                    n += 1
                    block = []
        if block:
            yield Article(f"{path.name}:{n}", "", "\n".join(block))


def load_hf(source: dict[str, Any], cache_dir: str | None, streaming: bool = False) -> Any:
    """The Hugging Face dataset of `data.source`; `streaming` reads it row by row as it is iterated (only the
    files and row groups it reaches), instead of downloading and converting all of it first."""
    import datasets

    with from_hub(source["dataset"], "dataset", "`data.source` (kind wikiextractor or text)", cache_dir):
        return datasets.load_dataset(source["dataset"], source.get("config"), split=source.get("split", "train"),
                                     cache_dir=cache_dir, streaming=streaming)


def hf_articles(ds: Any, source: dict[str, Any]) -> Iterator[Article]:
    """Articles of a (streamed or downloaded) Hugging Face dataset, in its order."""
    field = source.get("text_field", "text")
    columns = list(ds.column_names or [])
    if columns and field not in columns:
        raise InputError(f"data.source.text_field: column {field!r} not in {source['dataset']} {columns}")
    for i, row in enumerate(ds):
        if field not in row:
            raise InputError(f"data.source.text_field: column {field!r} not in {source['dataset']} {sorted(row)}")
        yield Article(str(row["id"]) if "id" in row else str(i), row.get("title") or "", row[field])


def read_rows_file(path: str) -> Iterator[Article]:
    """The articles a capped download saved (JSON lines: id, title, text)."""
    with open(path, encoding="utf-8") as f:
        for line in f:
            row = json.loads(line)
            yield Article(row["id"], row["title"], row["text"])


def iter_articles(source: dict[str, Any], cache_dir: str | None = None, rows_file: str | None = None
                  ) -> Iterator[Article]:
    kind = source.get("kind")
    if kind == "hf":
        return read_rows_file(rows_file) if rows_file else hf_articles(load_hf(source, cache_dir), source)
    if kind == "wikiextractor":
        return read_wikiextractor(expand_paths(source.get("paths", [])))
    if kind == "text":
        return read_text(expand_paths(source.get("paths", [])))
    raise InputError(f"data.source.kind: {kind!r} is not one of {KINDS}")
