"""One shard job: read a contiguous range of documents, tokenize them in batches, build the examples in the
form of the start model's family (NSP pairs or whole sentences, tacl.data.shards), write the shard and its
manifest entry. A shard's bytes depend only on (corpus, tokenizer, family, config, seed)."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import numpy as np

from tacl.data.clean import read_documents
from tacl.data.nsp import create_instances
from tacl.data.sentences import create_sequences
from tacl.data.shards import FORMAT_VERSION, NSP_PAIRS, form_of, token_dtype, write_sequences, write_shard
from tacl.data.download import TOKENIZER_BACKEND, TOKENIZER_META
from tacl.runtime.family import family
from tacl.runtime.io import InputError, read_json, require_file, sha256_file, stable_hash, write_json_atomic

GROUP = 64  # sentences per tokenizer call
BATCH = 256  # calls per batch (the tokenizer spreads a batch over RAYON_NUM_THREADS threads)


def shard_config(max_len: int, short_seq_prob: float, seed: int, dupe_factor: int, num_shards: int,
                 form: str = NSP_PAIRS) -> dict:
    """The settings a shard is made with, kept in its manifest (and hashed into a pretraining run's identity).
    The form only where it is not NSP pairs: the manifests written before forms existed keep their hash, and the
    runs trained on them their identity."""
    config = {"max_len": max_len, "short_seq_prob": short_seq_prob, "seed": seed,
              "dupe_factor": dupe_factor, "num_shards": num_shards, "format": FORMAT_VERSION}
    return config if form == NSP_PAIRS else {**config, "form": form}


def tokenizer_form(meta: dict[str, Any]) -> str:
    """The form of the examples the shards of this tokenizer (its tacl_tokenizer.json) hold: its family's (a
    tokenizer saved before families were recorded is BERT's)."""
    return form_of(family(meta.get("family", "bert"), "family in tacl_tokenizer.json"))


def shard_range(n_docs: int, shard: int, num_shards: int) -> tuple[int, int]:
    return shard * n_docs // num_shards, (shard + 1) * n_docs // num_shards


def load_backend(tokenizer_dir: str) -> tuple[Any, dict[str, Any]]:
    """The Rust tokenizer and its metadata as saved by `fetch_tokenizer` (no `transformers` import)."""
    from tokenizers import Tokenizer

    meta_path = Path(tokenizer_dir) / TOKENIZER_META
    backend_path = Path(tokenizer_dir) / TOKENIZER_BACKEND
    if not meta_path.is_file() or not backend_path.is_file():
        raise InputError(f"{tokenizer_dir}: not a tokenizer saved by `tacl data tokenizer` "
                         f"({TOKENIZER_META} or {TOKENIZER_BACKEND} missing)")
    return Tokenizer.from_file(str(backend_path)), read_json(meta_path)


def groups_exact(backend: Any, sep_id: int) -> bool:
    """Whether sentences joined by the separator token (nothing around it) come out of the tokenizer exactly as
    each does on its own. The tokenizer splits its added tokens off first and then normalises and pre-tokenizes
    each piece between them apart, so they do where the separator is an added special token matched as it is
    (not stripping the whitespace beside it, not only as a whole word; matched after normalisation only where
    there is no normaliser, which would otherwise see the whole group) and no pre-tokenizer treats a piece by
    where it stands in the text: a Metaspace whose prepend_scheme is "first" puts its "▁" before the first piece
    only, where each sentence on its own would get one."""
    token = backend.get_added_tokens_decoder().get(sep_id)
    saved = json.loads(backend.to_str())
    if (token is None or not token.special or token.lstrip or token.rstrip or token.single_word
            or (token.normalized and saved.get("normalizer") is not None)):
        return False

    def by_position(part: Any) -> bool:
        if isinstance(part, dict):
            if part.get("type") == "Metaspace" and part.get("prepend_scheme", "always") == "first":
                return True
            return any(by_position(v) for v in part.values())
        return isinstance(part, list) and any(by_position(v) for v in part)

    return not by_position(saved.get("pre_tokenizer"))


def unknown_id(backend: Any) -> int | None:
    """The id of the tokenizer's unknown token, as its model produces it (WordPiece's and BPE's `unk_token`,
    Unigram's `unk_id`); None where it has none (byte-level BPE covers every byte)."""
    model = json.loads(backend.to_str()).get("model", {})
    if model.get("unk_id") is not None:
        return int(model["unk_id"])
    return backend.token_to_id(model["unk_token"]) if model.get("unk_token") else None


UNKNOWN_WARN = 0.01  # the share of unknown tokens above which the data summary warns


def unknown_text(unk_tokens: int | None, tokens: int) -> str:
    """The share of unknown tokens as the data summary shows it beside the tokens: " (0.12% unknown)"; empty
    where the count was not recorded."""
    return f" ({unk_tokens / tokens:.2%} unknown)" if unk_tokens is not None and tokens else ""


def unknown_line(unk_tokens: int | None, tokens: int, tokenizer: str | None) -> str | None:
    """A warning line where more than UNKNOWN_WARN of the shards' tokens are the tokenizer's unknown token: a
    tokenizer that does not cover the corpus's language shows before pretraining. None below it, or where the
    count was not recorded (shards written before it was)."""
    if unk_tokens is None or not tokens or unk_tokens / tokens <= UNKNOWN_WARN:
        return None
    return (f"warning: {unk_tokens / tokens:.1%} of the shards' tokens ({unk_tokens} of {tokens}) are the unknown "
            f"token of the tokenizer {tokenizer!r}, which does not cover the corpus's language: give one that does "
            f"as `tokenizer` (or a start model for the language as `model`)")


def encode(backend: Any, sep_id: int, sentences: list[str], progress: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """Token ids of all sentences: (flat ids, per-sentence lengths), each sentence tokenized as on its own.

    Where `groups_exact` holds (WordPiece, byte-level BPE, SentencePiece's Metaspace with a "▁" before every
    piece), sentences go to the Rust tokenizer in groups joined by the separator token, and the separator ids
    in the output mark the sentence boundaries: far fewer, longer calls roughly halve the per-call cost. Spaces
    around the separator would not be neutral: byte-level BPE reads a leading space as part of the next word
    ("Ġword") and a trailing one as a token of its own. A group whose text itself holds the separator, and
    every sentence of a tokenizer where the groups are not exact, are encoded sentence by sentence.
    """
    from tqdm import tqdm

    encode_batch = getattr(backend, "encode_batch_fast", backend.encode_batch)
    separator = backend.id_to_token(sep_id)
    size = GROUP if groups_exact(backend, sep_id) else 1
    groups = [sentences[i : i + size] for i in range(0, len(sentences), size)]
    flat_parts: list[np.ndarray] = []
    length_parts: list[np.ndarray] = []
    for i in tqdm(range(0, len(groups), BATCH), desc="tokenize", unit=" batches", disable=not progress,
                  mininterval=2.0):
        batch = groups[i : i + BATCH]
        for group, enc in zip(batch, encode_batch([separator.join(g) for g in batch], add_special_tokens=False)):
            ids = np.asarray(enc.ids, dtype=np.int64)
            if size == 1:
                flat_parts.append(ids)
                length_parts.append(np.array([len(ids)], dtype=np.int64))
                continue
            is_sep = ids == sep_id
            if int(is_sep.sum()) != len(group) - 1:  # the text itself holds the separator: no shortcut
                per_sentence = [np.asarray(e.ids, dtype=np.int64)
                                for e in encode_batch(group, add_special_tokens=False)]
                flat_parts.extend(per_sentence)
                length_parts.append(np.array([len(x) for x in per_sentence], dtype=np.int64))
                continue
            bounds = np.concatenate([[-1], np.flatnonzero(is_sep), [len(ids)]])
            length_parts.append(np.diff(bounds) - 1)
            flat_parts.append(ids[~is_sep])
    if not flat_parts:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    return np.concatenate(flat_parts), np.concatenate(length_parts)


def build_shard(
    corpus: str,
    index: str,
    tokenizer_dir: str,
    shard: int,
    num_shards: int,
    max_len: int,
    short_seq_prob: float,
    seed: int,
    out_bin: str,
    out_json: str,
    dupe_factor: int = 1,
    progress: bool = False,
) -> dict[str, Any]:
    require_file(corpus, "cleaned corpus")
    require_file(index, "corpus index")
    if not 0 <= shard < num_shards:
        raise InputError(f"shard {shard} is outside data.num_shards={num_shards}")
    backend, tok_meta = load_backend(tokenizer_dir)
    form = tokenizer_form(tok_meta)
    needed = 2 if form == NSP_PAIRS else 1  # an NSP pair's random B comes from another document
    n_docs = len(np.load(index)) - 1
    start, stop = shard_range(n_docs, shard, num_shards)
    if stop - start < needed:
        raise InputError(few_documents(out_bin, shard, num_shards, stop - start, n_docs, form, corpus))
    docs = read_documents(corpus, index, start, stop)
    flat, lengths = encode(backend, tok_meta["sep_id"], [s for d in docs for s in d], progress)
    # Sentences that tokenize to nothing are dropped, and documents left without sentences.
    doc_of_sentence = np.repeat(np.arange(len(docs)), [len(d) for d in docs])
    keep = lengths > 0
    sentence_offsets = np.concatenate([[0], np.cumsum(lengths[keep])])
    per_doc = np.bincount(doc_of_sentence[keep], minlength=len(docs))
    per_doc = per_doc[per_doc > 0]
    doc_sentences = np.concatenate([[0], np.cumsum(per_doc)])
    if len(per_doc) < needed:
        raise InputError(few_documents(out_bin, shard, num_shards, len(per_doc), n_docs, form, corpus,
                                       " with sentences left after tokenization"))

    rng = random.Random(seed * 1_000_003 + shard)
    dtype = token_dtype(tok_meta["vocab_size"])
    if form == NSP_PAIRS:
        instances = create_instances(sentence_offsets, doc_sentences, max_len, short_seq_prob, rng, dupe_factor)
        spans = np.array([(x.a_start, x.a_end, x.b_start, x.b_end) for x in instances], dtype=np.int64)
        nsp = np.array([x.is_random_next for x in instances], dtype=np.uint8)
        counts = write_shard(out_bin, flat, spans, nsp, tok_meta["cls_id"], tok_meta["sep_id"], dtype,
                             unknown_id(backend))
        random_next = int(nsp.sum())
    else:
        spans = create_sequences(sentence_offsets, doc_sentences, max_len, short_seq_prob, rng, dupe_factor)
        counts = write_sequences(out_bin, flat, spans, tok_meta["cls_id"], tok_meta["sep_id"], dtype,
                                 unknown_id(backend))
        random_next = 0
    config = shard_config(max_len, short_seq_prob, seed, dupe_factor, num_shards, form)
    entry = {
        "file": Path(out_bin).name,
        "shard": shard,
        "form": form,
        "documents": int(len(per_doc)),
        "sentences": int(keep.sum()),
        "examples": counts["examples"],
        "tokens": counts["tokens"],
        "unk_tokens": counts["unk_tokens"],  # (the tokenizer's unknown token among them)
        "random_next": random_next,
        "bytes": Path(out_bin).stat().st_size,
        "sha256": sha256_file(out_bin),
        "tokenizer": {k: tok_meta[k] for k in ("name", "hash", "vocab_size")},
        "config": config,
        "config_hash": stable_hash(config),
        "corpus_documents": [start, stop],
    }
    write_json_atomic(out_json, entry)
    return entry


def few_documents(out_bin: str, shard: int, num_shards: int, got: int, n_docs: int, form: str, corpus: str,
                  which: str = "") -> str:
    """The one line for a shard with too few documents for its form."""
    need = ("2 (an NSP pair's second segment may come from another document)" if form == NSP_PAIRS else "1")
    return (f"{out_bin}: shard {shard} of data.num_shards={num_shards} gets {got} document(s){which} of the "
            f"corpus's {n_docs} ({corpus}); {form} need {need} per shard: set data.num_shards to at most "
            f"{max(1, n_docs // (2 if form == NSP_PAIRS else 1))}, or give the corpus more documents")


def gather_shards(shard_jsons: list[str], out_manifest: str) -> dict[str, Any]:
    """The manifest: all shard entries, their totals, and the one tokenizer and config they share."""
    entries = [read_json(p) for p in shard_jsons]
    if not entries:
        raise InputError("no shards to gather")
    out_dir = Path(out_manifest).parent.resolve()
    for path, e in zip(shard_jsons, entries):
        if Path(path).parent.resolve() != out_dir:
            raise InputError(f"{path}: shard entries must sit next to {out_manifest}")
        for key in ("tokenizer", "config_hash", "form"):
            if e.get(key, NSP_PAIRS) != entries[0].get(key, NSP_PAIRS):
                raise InputError(f"{path}: {key} differs from {shard_jsons[0]} (shards from different runs)")
    totals = {k: sum(e[k] for e in entries) for k in ("documents", "sentences", "examples", "tokens",
                                                      "random_next")}
    if all("unk_tokens" in e for e in entries):  # (not in the entries written before it was counted)
        totals["unk_tokens"] = sum(e["unk_tokens"] for e in entries)
    manifest = {
        "format": FORMAT_VERSION,
        "form": entries[0].get("form", NSP_PAIRS),
        "tokenizer": entries[0]["tokenizer"],
        "config": entries[0]["config"],
        "config_hash": entries[0]["config_hash"],
        "totals": {**totals, "shards": len(entries)},
        "shards": sorted(entries, key=lambda e: e["shard"]),
    }
    write_json_atomic(out_manifest, manifest)
    return manifest
