"""The shard format: one binary file per shard plus a JSON manifest.

    header   32 bytes: magic b"TACLSHRD", u32 format version, u32 bytes per token id (2 or 4),
             u64 number of examples n, u64 number of tokens
    offsets  int64[n + 1]   example e is tokens[offsets[e]:offsets[e+1]]
    len_a    uint16[n]      length of the first segment with its specials: positions >= len_a have segment id 1
    nsp      uint8[n]       1 = B is a random segment from another document, 0 = B follows A (or no B)
    (zero padding to a multiple of 8 bytes)
    tokens   uint16 or uint32[number of tokens]

An example has one of two forms, the same in every shard of a manifest (its `form`, from the start model's
family, tacl.runtime.family):

    nsp_pairs   BERT's NSP pairs: [CLS] A [SEP] B [SEP], len_a = the length of [CLS] A [SEP], the NSP label
    sentences   consecutive whole sentences of one document, wrapped in the tokenizer's first and last special
                tokens (<s> ... </s> for RoBERTa and XLM-R, [CLS] ... [SEP] for DeBERTa-v3 and ModernBERT):
                len_a = the whole length (every segment id 0), label 0

Files are written under a temporary name and renamed, so a killed writer never leaves a shard that
looks complete; the manifest records every shard's sha256, counts, form, tokenizer hash and config hash, and
the reader checks them before training starts.
"""

from __future__ import annotations

import bisect
import os
import struct
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from tacl.runtime.family import Family
from tacl.runtime.io import InputError, atomic_path, read_json, sha256_file

MAGIC = b"TACLSHRD"
FORMAT_VERSION = 1
_HEADER = struct.Struct("<8sIIQQ")
NSP_PAIRS, SENTENCES = "nsp_pairs", "sentences"
FORMS = (NSP_PAIRS, SENTENCES)
EXAMPLES = {NSP_PAIRS: "NSP examples", SENTENCES: "sequences of whole sentences"}  # (a form's examples, in words)


def form_of(family: Family) -> str:
    """The form of the examples a family was pretrained on: NSP pairs where it was pretrained with NSP."""
    return NSP_PAIRS if family.nsp else SENTENCES


def manifest_form(manifest: dict[str, Any]) -> str:
    """The form of a manifest's examples (a manifest written before forms existed holds NSP pairs)."""
    return manifest.get("form", NSP_PAIRS)


def token_dtype(vocab_size: int) -> np.dtype:
    return np.dtype(np.uint16) if vocab_size <= np.iinfo(np.uint16).max + 1 else np.dtype(np.uint32)


def write_shard(
    path: str | os.PathLike,
    flat_tokens: np.ndarray,
    spans: np.ndarray,
    nsp: np.ndarray,
    cls_id: int,
    sep_id: int,
    dtype: np.dtype,
    unk_id: int | None = None,
) -> dict[str, int]:
    """Write examples `[CLS] flat[a0:a1] [SEP] flat[b0:b1] [SEP]`, one per row of `spans` (n x 4); the counts
    (`_write`)."""
    spans = np.asarray(spans, dtype=np.int64).reshape(-1, 4)
    n = len(spans)
    len_a_tokens = spans[:, 1] - spans[:, 0]
    len_b_tokens = spans[:, 3] - spans[:, 2]
    lengths = len_a_tokens + len_b_tokens + 3
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    total = int(offsets[-1])
    starts = offsets[:-1]
    sep1_pos, sep2_pos = starts + 1 + len_a_tokens, offsets[1:] - 1
    tokens = np.empty(total, dtype=dtype)
    tokens[starts] = cls_id
    tokens[sep1_pos] = sep_id
    tokens[sep2_pos] = sep_id
    # Gather every A and B segment with one fancy index: segment i copies flat[src_i + k] to out_i + k.
    seg_out = np.concatenate([starts + 1, sep1_pos + 1])
    seg_src = np.concatenate([spans[:, 0], spans[:, 2]])
    seg_len = np.concatenate([len_a_tokens, len_b_tokens])
    before = np.cumsum(seg_len) - seg_len
    k = np.arange(int(seg_len.sum()), dtype=np.int64)
    tokens[np.repeat(seg_out - before, seg_len) + k] = flat_tokens[np.repeat(seg_src - before, seg_len) + k]
    len_a = (len_a_tokens + 2).astype(np.uint16)
    return _write(path, offsets, len_a, nsp, tokens, dtype, unk_id)


def write_sequences(path: str | os.PathLike, flat_tokens: np.ndarray, spans: np.ndarray, first_id: int, last_id: int,
                    dtype: np.dtype, unk_id: int | None = None) -> dict[str, int]:
    """Write examples `[first] flat[s0:s1] [last]` (the `sentences` form), one per row of `spans` (n x 2):
    every segment id 0 (len_a = the whole length), every label 0; the counts (`_write`)."""
    spans = np.asarray(spans, dtype=np.int64).reshape(-1, 2)
    n = len(spans)
    inner = spans[:, 1] - spans[:, 0]
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(inner + 2, out=offsets[1:])
    starts = offsets[:-1]
    tokens = np.empty(int(offsets[-1]), dtype=dtype)
    tokens[starts] = first_id
    tokens[offsets[1:] - 1] = last_id
    before = np.cumsum(inner) - inner
    k = np.arange(int(inner.sum()), dtype=np.int64)
    tokens[np.repeat(starts + 1 - before, inner) + k] = flat_tokens[np.repeat(spans[:, 0] - before, inner) + k]
    return _write(path, offsets, (inner + 2).astype(np.uint16), np.zeros(n, np.uint8), tokens, dtype, unk_id)


def _write(path: str | os.PathLike, offsets: np.ndarray, len_a: np.ndarray, nsp: np.ndarray, tokens: np.ndarray,
           dtype: np.dtype, unk_id: int | None = None) -> dict[str, int]:
    """Write the shard; its examples, its tokens and how many of them are `unk_id` (0 where None: a tokenizer
    without an unknown token)."""
    n, total = len(offsets) - 1, len(tokens)
    with atomic_path(path) as tmp:
        with open(tmp, "wb") as f:
            f.write(_HEADER.pack(MAGIC, FORMAT_VERSION, dtype.itemsize, n, total))
            f.write(offsets.tobytes())
            f.write(len_a.tobytes())
            f.write(np.asarray(nsp, dtype=np.uint8).tobytes())
            f.write(b"\0" * (-f.tell() % 8))
            f.write(tokens.tobytes())
    unknown = 0 if unk_id is None else int(np.count_nonzero(tokens == unk_id))
    return {"examples": n, "tokens": total, "unk_tokens": unknown}


class Shard:
    """Random access to one shard file (memory-mapped)."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        if not self.path.is_file():
            raise InputError(f"{self.path}: shard file not found")
        with open(self.path, "rb") as f:
            head = f.read(_HEADER.size)
        if len(head) < _HEADER.size:
            raise InputError(f"{self.path}: truncated shard (no header)")
        magic, version, itemsize, n, total = _HEADER.unpack(head)
        if magic != MAGIC or version != FORMAT_VERSION or itemsize not in (2, 4):
            raise InputError(f"{self.path}: not a tacl shard (format {FORMAT_VERSION})")
        pos = _HEADER.size
        self.offsets = np.memmap(self.path, np.int64, "r", pos, (n + 1,))
        pos += 8 * (n + 1)
        self.len_a = np.memmap(self.path, np.uint16, "r", pos, (n,)) if n else np.zeros(0, np.uint16)
        pos += 2 * n
        self.nsp = np.memmap(self.path, np.uint8, "r", pos, (n,)) if n else np.zeros(0, np.uint8)
        pos += n
        pos += -pos % 8
        expected = pos + itemsize * total
        if self.path.stat().st_size != expected:
            raise InputError(f"{self.path}: size {self.path.stat().st_size} != {expected} from its header")
        dtype = np.uint16 if itemsize == 2 else np.uint32
        self.tokens = np.memmap(self.path, dtype, "r", pos, (total,)) if total else np.zeros(0, dtype)
        self.n = n

    def __len__(self) -> int:
        return self.n

    def example(self, i: int) -> tuple[np.ndarray, int, int]:
        """(token ids, length of the first segment with its specials, NSP label) of example i."""
        return (np.asarray(self.tokens[self.offsets[i] : self.offsets[i + 1]], dtype=np.int64),
                int(self.len_a[i]), int(self.nsp[i]))


class ShardSet:
    """All shards of a manifest, verified, with global random access to examples."""

    def __init__(self, manifest_path: str | os.PathLike, tokenizer_hash: str | None = None,
                 verify: bool = True, tokenizer_name: str = "the tokenizer given"):
        """`tokenizer_hash`: refuse shards written by another tokenizer (tacl.runtime.hub.tokenizer_hash) than
        this one, which `tokenizer_name` names in the message."""
        self.manifest_path = Path(manifest_path)
        self.manifest: dict[str, Any] = read_json(self.manifest_path)
        written = self.manifest["tokenizer"]
        if tokenizer_hash is not None and written["hash"] != tokenizer_hash:
            raise InputError(
                f"{self.manifest_path.parent}: these shards were written with tokenizer {written['name']!r} (hash "
                f"{written['hash']}), not with {tokenizer_name} (hash {tokenizer_hash}); build the shards with the "
                "start model's tokenizer (config keys `tokenizer`, else `model`) or train from a start model of theirs"
            )
        root = self.manifest_path.parent
        self.shards: list[Shard] = []
        for entry in self.manifest["shards"]:
            path = root / entry["file"]
            if not path.is_file():
                raise InputError(f"{path}: shard listed in {self.manifest_path} is missing")
            if path.stat().st_size != entry["bytes"]:
                raise InputError(f"{path}: size differs from {self.manifest_path} (shard changed or truncated)")
            if verify and sha256_file(path) != entry["sha256"]:
                raise InputError(f"{path}: sha256 differs from {self.manifest_path} (shard is corrupt)")
            shard = Shard(path)
            if len(shard) != entry["examples"]:
                raise InputError(f"{path}: {len(shard)} examples, manifest says {entry['examples']}")
            self.shards.append(shard)
        self.starts = np.cumsum([0] + [len(s) for s in self.shards]).tolist()

    def __len__(self) -> int:
        return self.starts[-1]

    def example(self, i: int) -> tuple[np.ndarray, int, int]:
        if not 0 <= i < len(self):
            raise IndexError(i)
        k = bisect.bisect_right(self.starts, i) - 1
        return self.shards[k].example(i - self.starts[k])

    def lengths(self, indices: np.ndarray) -> np.ndarray:
        """Token counts of these examples, read from the offsets alone (vectorised per shard)."""
        indices = np.asarray(indices, dtype=np.int64)
        which = np.searchsorted(self.starts, indices, side="right") - 1
        out = np.empty(len(indices), dtype=np.int64)
        for k in np.unique(which):
            at = which == k
            local = indices[at] - self.starts[k]
            offsets = self.shards[k].offsets
            out[at] = offsets[local + 1] - offsets[local]
        return out

    def examples(self, indices: Sequence[int]) -> list[tuple[np.ndarray, int, int]]:
        return [self.example(int(i)) for i in indices]
