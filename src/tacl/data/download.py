"""Download (login node, internet): fetch the corpus into the local cache and the tokenizer into
the results tree, so that every later job runs offline."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

from tacl.data.headings import TACL, StopRule
from tacl.data.sources import expand_paths
from tacl.runtime.hub import from_hub, load_tokenizer, resolve_pretrained, tokenizer_hash
from tacl.runtime.io import InputError, atomic_path, sha256_file, stable_hash, write_json_atomic


def download_corpus(source: dict[str, Any], cache_dir: str, out_json: str, max_lines: int = 0,
                    heldout_fraction: float = 0.0, splitter: str = "blingfire",
                    stops: StopRule | None = None) -> dict[str, Any]:
    """Make the corpus available offline and describe it in `out_json` (read by the clean step).

    A Hugging Face dataset with `max_lines` (data.max_lines) is streamed only as far as the clean step will
    read it: each article is cleaned as the clean step will clean it (same splitter, stop rule, None for
    TaCL's, and held-out choice), and the stream stops at the article whose document crosses the cap,
    where the clean step stops too. The articles read are saved as JSON lines in the cache (`rows_file`), so
    that the clean job reads them offline. Without a cap, the whole dataset is downloaded (English Wikipedia:
    about 20 GB)."""
    record: dict[str, Any] = {"source": source, "cache_dir": os.path.abspath(cache_dir)}
    if source["kind"] == "hf" and max_lines:
        record.update(download_capped(source, cache_dir, max_lines, heldout_fraction, splitter, stops))
    elif source["kind"] == "hf":
        from tacl.data.sources import load_hf

        ds = load_hf(source, cache_dir)
        record.update(num_rows=ds.num_rows, fingerprint=ds._fingerprint)
    else:
        paths = expand_paths(source.get("paths", []))
        if not paths:
            raise InputError("data.source.paths: no corpus files given")
        files = []
        for p in paths:
            if p.stat().st_size == 0:
                raise InputError(f"{p}: corpus file is empty")
            files.append({"path": str(p.resolve()), "bytes": p.stat().st_size, "sha256": sha256_file(p)})
        record["files"] = files
    write_json_atomic(out_json, record)
    return record


def download_capped(source: dict[str, Any], cache_dir: str, max_lines: int, heldout_fraction: float,
                    splitter: str, stops: StopRule | None = None) -> dict[str, Any]:
    """Stream the articles the clean step will read under `max_lines` into a JSON-lines file in the cache."""
    from tacl.data.clean import capped_documents
    from tacl.data.sources import hf_articles, load_hf

    name = re.sub(r"[^A-Za-z0-9_.-]+", "_", f"{source['dataset']}-{source.get('config')}-{source.get('split')}")
    stops = TACL if stops is None else stops
    language = stops.given()  # (TaCL's headings name no file of their own: the name stays as it was)
    headings = f"-stops{stable_hash(language, 8)}" if language else ""
    path = Path(cache_dir) / f"{name}-{splitter}{headings}-heldout{heldout_fraction:g}-{max_lines}-lines.jsonl"
    rows = 0
    with (from_hub(source["dataset"], "dataset", "`data.source` (kind wikiextractor or text)", cache_dir),
          atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8") as f):  # (the stream reads the Hub as it goes)
        for article, _, _ in capped_documents(hf_articles(load_hf(source, cache_dir, streaming=True), source),
                                              max_lines, heldout_fraction, splitter, stops=stops):
            f.write(json.dumps({"id": article.id, "title": article.title, "text": article.text}) + "\n")
            rows += 1
    return {"rows_file": str(path.resolve()), "rows": rows, "max_lines": max_lines, "sentence_splitter": splitter,
            "heldout_fraction": heldout_fraction, "bytes": path.stat().st_size, "sha256": sha256_file(path), **language}


TOKENIZER_META = "tacl_tokenizer.json"
TOKENIZER_BACKEND = "tacl_backend.json"


def tokenizer_given(name: str, family: str | None, start_model: str | None) -> dict[str, str | None]:
    """What the tokenizer job is given that decides its result, as it keeps it (`given` in tacl_tokenizer.json)
    and as the workflow compares it for a rerun (tacl.experiment.design.start_family_given): the tokenizer's name,
    a random start model's family where it is not bert, the start model where it is not the tokenizer's name
    (None where not given)."""
    return {"name": name, "family": family if family and family != "bert" else None,
            "start_model": start_model if start_model and start_model != name else None}


def start_family(model: str | None, family_name: str | None = None) -> str:
    """The family of the start model (tacl.runtime.family): `family_name` for a random start model
    (model_init.family), else the `model_type` of `model`: a folder's from its JSON files
    (tacl.runtime.family.model_type_of), a Hub name's from its config on the Hub; bert where neither is given."""
    from tacl.runtime.family import family, model_type_of

    if family_name or not model:
        return family(family_name or "bert", "model_init.family").name
    path = resolve_pretrained(model)
    if Path(path).is_dir():
        return family(model_type_of(path), "model").name
    from transformers import AutoConfig

    with from_hub(model, "model", "`model`"):
        found = getattr(AutoConfig.from_pretrained(path), "model_type", None)
    return family(found, "model").name


def fetch_tokenizer(name: str, out_dir: str, family: str | None = None, start_model: str | None = None) -> str:
    """Save the tokenizer next to the data it will write, so shards and training share one copy.

    Besides the Hugging Face files, two files for the shard jobs, which need no `transformers`:
    the effective Rust tokenizer with padding and truncation off (`tacl_backend.json`; transformers may
    override the saved normaliser from tokenizer_config.json, so the backend is taken from the loaded
    tokenizer) and its special ids, hash and the start model's family (`tacl_tokenizer.json`: `family` for a
    random start model, else `start_model`'s, see `start_family`; the family decides the form of the shards'
    examples, tacl.data.shards). The first and last special tokens of a sequence are the
    tokenizer's own `cls_token` and `sep_token` ([CLS] and [SEP], <s> and </s>): a tokenizer without them is
    refused here.
    """
    from tokenizers import Tokenizer

    tok = load_tokenizer(name)
    missing = [t for t in ("cls_token", "sep_token", "mask_token", "pad_token") if getattr(tok, f"{t}_id") is None]
    if missing:
        raise InputError(f"tokenizer {name!r}: no {', '.join(missing)}; the data stage wraps each sequence in the "
                         "tokenizer's cls_token and sep_token, and masking needs its mask_token and pad_token "
                         "(`tokenizer` or `model` names it)")
    start_family_name = start_family(start_model, family)
    backend = Tokenizer.from_str(tok.backend_tokenizer.to_str())
    backend.no_padding()
    backend.no_truncation()
    out = Path(out_dir)
    with atomic_path(out) as tmp:
        tok.save_pretrained(str(tmp))
        backend.save(str(tmp / TOKENIZER_BACKEND))
        write_json_atomic(tmp / TOKENIZER_META, {
            "name": name, "source": resolve_pretrained(name), "hash": tokenizer_hash(tok),
            "vocab_size": len(tok), "cls_id": tok.cls_token_id, "sep_id": tok.sep_token_id,
            "family": start_family_name, "given": tokenizer_given(name, family, start_model),
        })
    return str(out)
