"""Packed micro-batches: a micro-batch's sequences concatenated into one row of real tokens, no padding.

`pack_sequences` turns a padded, masked batch (tacl.data.pretraining.PretrainingData.arrays) into the packed
layout, on the host, in the DataLoader worker that built it. The masks are those of the padded batch, so a
packed micro-batch trains on exactly the tokens, masks and labels of its padded twin. Keys:

    input_ids, clean_ids, token_type_ids, position_ids   [1, T]  T = the micro-batch's real tokens; the
                                                                  position ids restart at 0 per sequence
    special_tokens_packed                                 [1, T]  [CLS]/[SEP] in the packed row
    cu_seqlens                                            [B+1]   sequence b is tokens cu[b] .. cu[b+1]-1
    unpad_index                                           [T]     padded flat position b * W + j of each token
    mlm_index, mlm_targets                                [K]     as in the padded batch, positions into T
    attention_mask, special_tokens_mask, mlm_mask         [B, W]  the padded batch's masks (for losses that
                                                                  work per sequence, after `unpad_index`)
    nsp_labels                                            [B]
    step_counts, draw_width                                       as in the padded batch (the step's counts)
    lengths (tuple of ints), max_seqlen (int)                     on the host: no device read is needed to
                                                                  size attention kernels or COCO-LM's views

The encoder never sees padding (tacl.objectives.packed keeps attention within each sequence); only the small
per-sequence loss tensors keep the [B, W] layout where the padded reference defines them that way.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tacl.data.tensors import as_tensors

# keys of the padded batch that the packed layout keeps as they are ([B, W] or [B], or host values)
KEPT = ("attention_mask", "special_tokens_mask", "mlm_mask", "nsp_labels", "mlm_targets", "num_tokens", "step_counts",
        "draw_width")


def pack_sequences(arrays: dict[str, Any]) -> dict[str, Any]:
    """The packed layout (module docstring, as tensors) of a padded batch's numpy arrays
    (PretrainingData.arrays)."""
    attention = arrays["attention_mask"].astype(bool)
    bsz, width = attention.shape
    lengths = attention.sum(1).astype(np.int64)
    cu = np.zeros(bsz + 1, dtype=np.int64)
    np.cumsum(lengths, out=cu[1:])
    real = attention.reshape(-1)  # padded rows keep their real tokens first: flat order is packed order

    def row(name: str) -> np.ndarray:
        return arrays[name].reshape(-1)[real][None, :]

    position = np.arange(width)[None, :].repeat(bsz, 0)
    # mlm_index: flat padded position b * W + j  ->  packed position cu[b] + j (list padding stays 0)
    flat = arrays["mlm_index"]
    packed = {
        "input_ids": row("input_ids"),
        "clean_ids": row("clean_ids"),
        "token_type_ids": row("token_type_ids"),
        "position_ids": position.reshape(-1)[real][None, :],
        "special_tokens_packed": row("special_tokens_mask"),
        "cu_seqlens": cu,
        "unpad_index": np.flatnonzero(real),
        "mlm_index": np.where(arrays["mlm_targets"] >= 0, cu[flat // width] + flat % width, 0),
        **{k: arrays[k] for k in KEPT if k in arrays},
        "lengths": tuple(int(n) for n in lengths),
        "max_seqlen": int(lengths.max()),
    }
    return as_tensors(packed)


def is_packed(batch: dict[str, Any]) -> bool:
    return "cu_seqlens" in batch
