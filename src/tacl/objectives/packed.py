"""The encoders and losses on packed micro-batches (tacl.data.packing): no compute on padding.

A packed micro-batch is one row of T real tokens. Attention stays within each sequence:

- on CUDA in bf16/fp16, `torch.nn.attention.varlen.varlen_attn` (flash attention over the sequences marked
  by `cu_seqlens`; its grid is sized by the host's `max_seqlen`, so nothing is read back from the device);
- elsewhere (the CPU, fp32 on CUDA, tests), the row's query, key and value copied into the padded [B, W]
  layout for one masked scaled_dot_product_attention call, and the result copied back: there attention
  computes on padding as the padded path does, and only the rest (the linear layers, most of the work) runs
  on real tokens alone.

Neither takes attention-probability dropout (varlen_attn has none), so packed training has no attention
dropout on any device; hidden-state dropout is unchanged. Position ids restart at 0 in every sequence and the
token type ids are the padded batch's.

Every model that reads packed batches uses the attention function `ATTENTION` (`use_packed_attention`),
which runs PyTorch's SDPA, as `attn_implementation="sdpa"` does, on padded batches: one model serves both
layouts (the padded one stays the reference). `encode` refuses a packed batch for a model without it (its
attention would cross sequences).

The losses: MLM gathers the masked positions of the row (`mlm_index` points into T); NSP and COCO-LM's
sequence contrast read each sequence's [CLS] at `cu_seqlens[:-1]`; TaCL's within-sequence contrast and
TACO's pairs work on the [B, W] layout of the padded batch, the row's vectors copied into it
(`per_sequence`): those losses cost O(B W^2 H) and O(B W K H) against the encoder's O(T H^2) per layer, and
they then draw and compute exactly what the padded reference does.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch
import torch.nn.functional as F

from tacl.data.packing import is_packed
from tacl.objectives.encoders import encoder_kwargs, pooler

ATTENTION = "tacl_packed"


def _varlen_attn() -> Any:
    """torch's varlen_attn where it takes what `packed_attention` passes (`scale` by keyword: torch 2.9's
    has none), else None: the SDPA path everywhere, as on a torch without it (before 2.9)."""
    import inspect

    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return None
    return varlen_attn if "scale" in inspect.signature(varlen_attn).parameters else None


VARLEN = _varlen_attn()


def use_varlen(query: torch.Tensor) -> bool:
    """varlen_attn (flash attention) takes CUDA tensors in bf16 or fp16."""
    return VARLEN is not None and query.is_cuda and query.dtype in (torch.bfloat16, torch.float16)


class PackedSequences(NamedTuple):
    """Where the sequences of a packed row are, for the attention function (device tensors, host ints)."""

    cu_seqlens: torch.Tensor  # int32 [B+1]: sequence b is tokens cu[b] .. cu[b+1]-1 of the row
    max_seqlen: int  # its longest sequence (sizes varlen_attn's grid; read from the host, never the device)
    unpad_index: torch.Tensor  # [T]: the flat padded position b * W + j of each token of the row
    key_mask: torch.Tensor  # [B, 1, 1, W] bool: the padded layout's real positions


def packed_attention(module: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                     attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                     packed_sequences: PackedSequences | None = None, **kwargs: Any) -> tuple[torch.Tensor, None]:
    """A transformers attention function: query/key/value [1, heads, T, d] of a packed row when
    `packed_sequences` is given (no dropout), else SDPA as usual. Returns [1, T, heads, d]."""
    if packed_sequences is None:
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)
    p = packed_sequences
    q, k, v = (x[0].transpose(0, 1) for x in (query, key, value))  # [T, heads, d]
    if use_varlen(query):
        return VARLEN(q, k, v, p.cu_seqlens, p.cu_seqlens, p.max_seqlen, p.max_seqlen, scale=scaling)[None], None
    # elsewhere: copied into the padded [B, W] layout for one masked SDPA call and back (on the CPU one call
    # per sequence is slower still: its splits and joins copy more than the padding costs)
    bsz, width = p.key_mask.shape[0], p.key_mask.shape[-1]
    blocks = [padded_rows(x, p.unpad_index, bsz, width).transpose(1, 2) for x in (q, k, v)]
    out = F.scaled_dot_product_attention(*blocks, attn_mask=p.key_mask, scale=scaling)  # [B, heads, W, d]
    return _Rows.apply(out.transpose(1, 2).flatten(0, 1), p.unpad_index)[None], None


def padded_rows(x: torch.Tensor, unpad_index: torch.Tensor, bsz: int, width: int) -> torch.Tensor:
    """x [T, ...] of a packed row in the padded layout [B, W, ...] (zeros on padding). An index_copy, whose
    gradient is a gather: the gradient of a gather (index_select) is a serial scatter-add on the CPU."""
    return x.new_zeros(bsz * width, *x.shape[1:]).index_copy(0, unpad_index, x).view(bsz, width, *x.shape[1:])


class _Rows(torch.autograd.Function):
    """x.index_select(0, index) for distinct indices, whose gradient is an index_copy into zeros (not the
    serial scatter-add of index_select's)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(index)
        ctx.rows = x.shape[0]
        return x.index_select(0, index)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        (index,) = ctx.saved_tensors
        return grad.new_zeros(ctx.rows, *grad.shape[1:]).index_copy(0, index, grad), None


def _register() -> None:
    from transformers import AttentionInterface, AttentionMaskInterface
    from transformers.masking_utils import sdpa_mask

    AttentionInterface.register(ATTENTION, packed_attention)
    AttentionMaskInterface.register(ATTENTION, sdpa_mask)  # padded batches: SDPA's masks


def use_packed_attention(*modules: Any) -> None:
    """Switch every transformers model in these modules (and their submodules) to `packed_attention`."""
    from transformers import PreTrainedModel

    _register()
    for module in modules:
        for m in module.modules() if module is not None else ():
            if isinstance(m, PreTrainedModel):
                m.set_attn_implementation(ATTENTION)


def padded_index(batch: dict[str, Any], index: torch.Tensor) -> torch.Tensor:
    """Flat positions of `batch` (`mlm_index`: a packed row's, or b * W + j on the padded layout) as positions
    of the padded [B, W] layout: a packed batch's through its `unpad_index`, a padded batch's as they are."""
    return batch["unpad_index"].index_select(0, index) if is_packed(batch) else index


def sequences(batch: dict[str, Any]) -> PackedSequences:
    """The attention function's view of a packed batch."""
    return PackedSequences(batch["cu_seqlens"].int(), int(batch["max_seqlen"]), batch["unpad_index"],
                           batch["attention_mask"].bool()[:, None, None, :])


def encode(encoder: Any, batch: dict[str, Any], ids: str = "input_ids", **kwargs: Any) -> Any:
    """A bare encoder's output (BertModel, RobertaModel, ...: tacl.objectives.encoders) on a padded or a packed
    batch (read from its `ids` key)."""
    if not is_packed(batch):
        return encoder(**encoder_kwargs(encoder, batch, ids), **kwargs)
    if encoder.config._attn_implementation != ATTENTION:
        raise RuntimeError(f"a packed batch needs attention within sequences: call use_packed_attention on the "
                           f"model (it uses {encoder.config._attn_implementation!r})")
    return encoder(**encoder_kwargs(encoder, batch, ids), packed_sequences=sequences(batch), **kwargs)


def first_tokens(hidden: torch.Tensor, batch: dict[str, Any]) -> torch.Tensor:
    """[B, H]: each sequence's first ([CLS]) vector, of hidden [B, L, H] (padded) or [1, T, H] (packed)."""
    if not is_packed(batch):
        return hidden[:, 0]
    return hidden[0].index_select(0, batch["cu_seqlens"][:-1])


def pooled(model: Any, out: Any, batch: dict[str, Any]) -> torch.Tensor:
    """BERT's pooled [CLS] output per sequence (the NSP head's input)."""
    if not is_packed(batch):
        return out.pooler_output
    return pooler(model)(first_tokens(out.last_hidden_state, batch)[:, None])


def per_sequence(x: torch.Tensor, batch: dict[str, Any]) -> torch.Tensor:
    """[1, T, ...] of a packed batch as the padded batch's [B, W, ...] (zeros on padding, which is outside
    every loss); a padded batch's tensors as they are."""
    if not is_packed(batch):
        return x
    return padded_rows(x[0], batch["unpad_index"], *batch["attention_mask"].shape)
