"""Download (login node, internet): fetch the corpus into the local cache and the tokenizer into
the results tree, so that every later job runs offline."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from tacl.data.sources import expand_paths
from tacl.hub import load_tokenizer, resolve_pretrained, tokenizer_hash
from tacl.io import InputError, atomic_path, sha256_file, write_json_atomic


def download_corpus(source: dict[str, Any], cache_dir: str, out_json: str) -> dict[str, Any]:
    """Make the corpus available offline and describe it in `out_json` (read by the clean step)."""
    record: dict[str, Any] = {"source": source, "cache_dir": os.path.abspath(cache_dir)}
    if source["kind"] == "hf":
        import datasets

        ds = datasets.load_dataset(
            source["dataset"], source.get("config"), split=source.get("split", "train"), cache_dir=cache_dir
        )
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


TOKENIZER_META = "tacl_tokenizer.json"
TOKENIZER_BACKEND = "tacl_backend.json"


def fetch_tokenizer(name: str, out_dir: str) -> str:
    """Save the tokenizer next to the data it will write, so shards and training share one copy.

    Besides the Hugging Face files, two files for the shard jobs, which need no `transformers`:
    the effective Rust tokenizer with padding and truncation off (`tacl_backend.json`; transformers may
    override the saved normaliser from tokenizer_config.json, so the backend is taken from the loaded
    tokenizer) and its special ids and hash (`tacl_tokenizer.json`).
    """
    from tokenizers import Tokenizer

    tok = load_tokenizer(name)
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
        })
    return str(out)
