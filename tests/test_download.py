"""A Hugging Face source under data.max_lines: streamed only as far as the clean step reads, on a local
Hugging Face-format fixture (several parquet files of real Wikipedia articles from ../shared/data)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import SHARED_DATA, needs_shared
from tacl.data.clean import clean_corpus
from tacl.data.download import download_corpus
from tacl.data.sources import read_wikiextractor

pytestmark = needs_shared("wikipedia")


def bytes_read() -> int:
    """Bytes this process has read so far (read(2) and the like, page cache included)."""
    return int(next(line.split()[1] for line in Path("/proc/self/io").read_text().splitlines()
                    if line.startswith("rchar:")))


@pytest.fixture(scope="module")
def hf_fixture(tmp_path_factory) -> Path:
    """wikimedia/wikipedia's layout: data/train-0000k-of-00004.parquet with id, url, title, text."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    root = tmp_path_factory.mktemp("wiki_hf")
    (root / "data").mkdir()
    articles = [a for a in read_wikiextractor(sorted((SHARED_DATA / "wikipedia").glob("wiki_0[0-3]"))) if a.text]
    per_file = -(-len(articles) // 4)
    for k in range(4):
        part = articles[k * per_file:(k + 1) * per_file]
        urls = [f"https://en.wikipedia.org/wiki?curid={a.id}" for a in part]
        table = pa.table({"id": [a.id for a in part], "url": urls,
                          "title": [a.title for a in part], "text": [a.text for a in part]})
        pq.write_table(table, root / "data" / f"train-{k:05d}-of-00004.parquet", row_group_size=256)
    return root


def test_capped_download_reads_a_fraction_and_cleans_to_the_same_corpus(hf_fixture, tmp_path):
    source = {"kind": "hf", "dataset": str(hf_fixture), "config": None, "split": "train", "text_field": "text"}
    import datasets  # noqa: F401  (modules read at import would count as bytes read by the first download)

    from tacl.data.clean import clean_article
    from tacl.data.sources import hf_articles, load_hf

    clean_article("Warm up the splitter. Twice over.")
    next(hf_articles(load_hf(source, str(tmp_path / "warm"), streaming=True), source))
    cap = 1500  # lines: the stream stops inside the first of the four files
    out = {}
    for name, max_lines in (("whole", 0), ("capped", cap)):
        before = bytes_read()
        record = download_corpus(source, str(tmp_path / name / "cache"), str(tmp_path / name / "raw.json"),
                                 max_lines=max_lines, heldout_fraction=0.05)
        read = bytes_read() - before
        stats = clean_corpus(str(tmp_path / name / "raw.json"), *(str(tmp_path / name / f) for f in (
            "corpus.txt", "idx.npy", "heldout.txt", "clean.json")), max_lines=cap, heldout_fraction=0.05,
            progress=False)
        out[name] = (record, read, stats)
    (capped, capped_read, capped_stats), (whole, whole_read, whole_stats) = out["capped"], out["whole"]
    total = sum(p.stat().st_size for p in (hf_fixture / "data").glob("*.parquet"))
    print(f"bytes read by the download: capped at {cap} lines {capped_read:,}, whole dataset {whole_read:,} "
          f"(fixture {total:,} bytes in 4 parquet files)")
    assert capped_stats == whole_stats and capped_stats["capped"] and capped_stats["lines"] <= cap
    for f in ("corpus.txt", "heldout.txt", "idx.npy"):
        assert (tmp_path / "capped" / f).read_bytes() == (tmp_path / "whole" / f).read_bytes(), f
    assert capped["rows"] == capped_stats["articles"], "the download stops where the clean step stops"
    assert "rows_file" in capped and "rows_file" not in whole
    assert capped_read < whole_read / 2, (capped_read, whole_read)
    assert json.loads((tmp_path / "capped" / "raw.json").read_text())["rows"] == capped["rows"]
