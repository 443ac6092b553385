"""What the trainer reads: verified shards, a seeded epoch order, and masked micro-batches built in
DataLoader worker processes, off the training loop's critical path.

The data position is one integer, the number of samples consumed so far. Sample p of the run is example
`permutation(epoch)[p % n]` with `epoch = p // n`, and its mask is a function of (seed, epoch, example).
Step s trains on the positions [s*G, (s+1)*G) of the global batch G; with `group_by_length` they are sorted
by length (ties by position) before they are cut into micro-batches of `micro` samples, so that a
micro-batch holds sequences of similar length and little padding. Micro-batch j of step s is therefore a
pure function of (seed, s, j): whichever rank, worker process or resumed chunk builds it, it is the same.

Every micro-batch also carries the step's counts (`step_counts`: its selected positions, its real tokens
and its number of micro-batches), which its losses divide by so that the step's loss does not depend on
how the step is cut (tacl.objectives.step_denominator), and `draw_width`, the widest micro-batch the run
can build, the width of its groups' per-position random draws (tacl.objectives.GroupDraws), and, on the
host, whether it has no padding at all (`no_padding`: every sequence as long as the micro-batch is wide), so
that its attention runs without a mask (tacl.objectives.sdpa_mask) with no read from the device. A packed
micro-batch (`packing`) has no padding by construction and keeps its own attention path.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterator, Sequence

import numpy as np
import torch

from tacl.data.masking import IGNORE_INDEX, MaskingSpec, example_keys, mask_batch
from tacl.data import NO_PADDING
from tacl.data.packing import pack_sequences
from tacl.data.shards import ShardSet
from tacl.data.tensors import as_tensors


def epoch_permutation(n: int, seed: int, epoch: int) -> np.ndarray:
    return np.random.default_rng([seed, epoch, 0x5EED]).permutation(n)


@dataclass(frozen=True)
class Batching:
    """How the global batch of a step is cut into micro-batches."""

    global_batch: int
    micro_batch: int
    group_by_length: bool = True
    pad_multiple: int = 8  # max_len: every sequence padded to max_len (the reference's way)
    packing: bool = False  # micro-batches in the packed layout (tacl.data.packing): no padding at all
    max_len: int | None = None  # the data's longest sequence (sizes `draw_width`); None: each batch's own width

    def width(self, lengths: np.ndarray) -> int:
        """The padded width of a micro-batch: its longest sequence, rounded up to pad_multiple."""
        return -(-int(lengths.max()) // self.pad_multiple) * self.pad_multiple

    def draw_width(self, width: int) -> int:
        """The width of the groups' per-position draws: the widest micro-batch the run can build (max_len
        rounded up to pad_multiple); without max_len, this batch's `width`."""
        return self.width(np.array([self.max_len])) if self.max_len else width

    @property
    def micro_batches(self) -> int:
        """Micro-batches per optimizer step, over all ranks."""
        return self.global_batch // self.micro_batch


class PretrainingData:
    def __init__(self, shards: ShardSet, spec: MaskingSpec, seed: int, batching: Batching):
        self.shards = shards
        self.spec = spec
        self.seed = seed
        self.batching = batching
        self._perms: dict[int, np.ndarray] = {}
        self._counts: dict[int, np.ndarray] = {}

    def __len__(self) -> int:
        return len(self.shards)

    def locate(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(epoch, example index) of the samples at these global data positions."""
        positions = np.asarray(positions, dtype=np.int64)
        n = len(self.shards)
        epochs = positions // n
        index = np.empty_like(positions)
        for epoch in np.unique(epochs):
            if epoch not in self._perms:
                if len(self._perms) > 2:
                    self._perms.pop(min(self._perms))
                self._perms[int(epoch)] = epoch_permutation(n, self.seed, int(epoch))
            at = epochs == epoch
            index[at] = self._perms[int(epoch)][positions[at] % n]
        return epochs, index

    def step_positions(self, step: int) -> np.ndarray:
        """The data positions of optimizer step `step`, in the order it is cut into micro-batches and groups."""
        g = self.batching.global_batch
        positions = np.arange(step * g, (step + 1) * g, dtype=np.int64)
        if self.batching.group_by_length:
            _, index = self.locate(positions)
            positions = positions[np.argsort(self.shards.lengths(index), kind="stable")]
        return positions

    def micro_positions(self, step: int, j: int) -> np.ndarray:
        """The data positions of micro-batch j of optimizer step `step`."""
        m = self.batching.micro_batch
        return self.step_positions(step)[j * m : (j + 1) * m]

    def step_counts(self, step: int) -> np.ndarray:
        """`step_counts` of step `step` (tacl.objectives.STEP_COUNTS): its selected positions, its real tokens
        and its number of micro-batches, over all ranks (the last few steps' kept: a worker builds several
        micro-batches of a step)."""
        if step not in self._counts:
            _, index = self.locate(self.step_positions(step))
            examples = [self.shards.example(int(i))[0] for i in index]
            if len(self._counts) > 2:
                self._counts.pop(min(self._counts))
            self._counts[step] = np.array([self.spec.selected(examples).sum(), sum(len(e) for e in examples),
                                           self.batching.micro_batches], dtype=np.int64)
        return self._counts[step]

    def micro_batch(self, step: int, j: int) -> dict[str, Any]:
        arrays = self.arrays(self.micro_positions(step, j))
        arrays["step_counts"] = self.step_counts(step)
        arrays["draw_width"] = self.batching.draw_width(arrays["input_ids"].shape[1])
        if self.batching.packing:  # the same sequences and masks, concatenated without padding
            return pack_sequences(arrays)
        return as_tensors(arrays)

    def batch(self, positions: Sequence[int]) -> dict[str, Any]:
        """A padded, masked batch of the samples at these data positions (tensors, plus `num_tokens`)."""
        return as_tensors(self.arrays(positions))

    def arrays(self, positions: Sequence[int]) -> dict[str, Any]:
        """`batch` as numpy arrays."""
        epochs, index = self.locate(np.asarray(positions, dtype=np.int64))
        examples = [self.shards.example(int(i)) for i in index]
        lengths = np.array([len(e[0]) for e in examples], dtype=np.int64)
        width = self.batching.width(lengths)
        b = len(examples)
        clean = np.full((b, width), self.spec.pad_id, dtype=np.int64)
        token_type = np.zeros((b, width), dtype=np.int64)
        nsp = np.empty(b, dtype=np.int64)
        for row, (ids, len_a, label) in enumerate(examples):
            clean[row, : len(ids)] = ids
            token_type[row, len_a : len(ids)] = 1
            nsp[row] = label
        masked, labels = mask_batch(clean, lengths, example_keys(self.seed, epochs, index), self.spec)
        attention = np.arange(width)[None, :] < lengths[:, None]
        return {
            "input_ids": masked,
            "clean_ids": clean,
            "token_type_ids": token_type,
            "attention_mask": attention.astype(np.int64),
            "special_tokens_mask": np.isin(clean, self.spec.special_ids),
            "nsp_labels": nsp,
            "mlm_mask": labels != IGNORE_INDEX,
            **masked_index(labels),
            "num_tokens": int(lengths.sum()),
            NO_PADDING: bool(lengths.min() == width),  # (a host flag: attention without a mask)
        }


def masked_positions(labels: np.ndarray, multiple: int = 8) -> dict[str, torch.Tensor]:
    """The selected positions as a fixed-length gather: `mlm_index` (flat positions into B*L, in order)
    and `mlm_targets` (their original ids), padded to a multiple of 8 with position 0 and IGNORE_INDEX, so
    the model never needs a boolean mask or `nonzero` (a host-device sync) to find them."""
    return as_tensors(masked_index(labels, multiple))


def masked_index(labels: np.ndarray, multiple: int = 8) -> dict[str, np.ndarray]:
    """`masked_positions` as numpy arrays."""
    flat = labels.reshape(-1)
    index = np.flatnonzero(flat != IGNORE_INDEX)
    size = max(multiple, -(-len(index) // multiple) * multiple)
    mlm_index = np.zeros(size, dtype=np.int64)
    mlm_targets = np.full(size, IGNORE_INDEX, dtype=np.int64)
    mlm_index[: len(index)] = index
    mlm_targets[: len(index)] = flat[index]
    return {"mlm_index": mlm_index, "mlm_targets": mlm_targets}


class MicroBatches(torch.utils.data.Dataset):
    """The micro-batches one rank trains on from `first_step` to `steps`, in order: item k is accumulation
    step a = k % accumulation of optimizer step first_step + k // accumulation, i.e. micro-batch
    j = a * world + rank (as DeepSpeed's ranks and accumulation steps split the global batch)."""

    def __init__(self, data: PretrainingData, first_step: int, steps: int, accumulation: int, rank: int,
                 world: int):
        self.data, self.first_step, self.steps = data, first_step, steps
        self.accumulation, self.rank, self.world = accumulation, rank, world

    def __len__(self) -> int:
        return max(0, self.steps - self.first_step) * self.accumulation

    def __getitem__(self, k: int) -> dict[str, Any]:
        step, a = self.first_step + k // self.accumulation, k % self.accumulation
        return pack(self.data.micro_batch(step, a * self.world + self.rank))


def pack(batch: dict[str, Any]) -> dict[str, Any]:
    """A batch's tensors as one int64 buffer (`packed`) and its `layout`; other entries stay as they are.
    A worker process then hands one shared-memory tensor to the training process instead of nine (each
    costs about half a millisecond), and a GPU gets one host-to-device copy."""
    tensors = {k: v for k, v in batch.items() if isinstance(v, torch.Tensor)}
    layout = tuple((k, tuple(v.shape), v.dtype == torch.bool) for k, v in tensors.items())
    packed = torch.cat([v.reshape(-1).long() for v in tensors.values()])
    return {"packed": packed, "layout": layout, **{k: v for k, v in batch.items() if k not in tensors}}


def unpack(packed: torch.Tensor, layout: tuple) -> dict[str, torch.Tensor]:
    """The tensors of a `pack`ed batch, as views of `packed` (wherever it now lives; bools converted)."""
    out, at = {}, 0
    for name, shape, is_bool in layout:
        size = int(np.prod(shape, dtype=np.int64))
        view = packed[at : at + size].view(shape)
        out[name] = view.bool() if is_bool else view
        at += size
    return out


def on_device(batch: dict[str, Any], device: torch.device) -> dict[str, Any]:
    """A `pack`ed batch on `device` (a non-blocking copy from pinned memory), with its host values (such as
    a packed batch's sequence lengths) alongside, as they are."""
    host = {k: v for k, v in batch.items() if k not in ("packed", "layout")}
    return {**unpack(batch["packed"].to(device, non_blocking=True), batch["layout"]), **host}


def _one_thread(_: int) -> None:
    torch.set_num_threads(1)  # a worker builds batches with numpy; torch threads would only oversubscribe


def micro_batch_loader(batches: MicroBatches, workers: int, pin_memory: bool,
                       prefetch: int = 4) -> Iterator[dict[str, Any]]:
    """Batches built in `workers` processes (0: in this one), delivered in order, `prefetch` per worker
    ahead, in pinned memory when they go to a GPU (so the copy is asynchronous)."""
    loader = torch.utils.data.DataLoader(
        batches, batch_size=None, shuffle=False, num_workers=workers, pin_memory=pin_memory,
        prefetch_factor=prefetch if workers else None, worker_init_fn=_one_thread if workers else None,
        multiprocessing_context="fork" if workers else None)
    return iter(loader)


def padding_fraction(data: PretrainingData, steps: int) -> float:
    """Share of padding positions in the micro-batches of the first `steps` optimizer steps."""
    g, m = data.batching.global_batch, data.batching.micro_batch
    pad, real = 0, 0
    for step in range(steps):
        for j in range(g // m):
            _, index = data.locate(data.micro_positions(step, j))
            lengths = data.shards.lengths(index)
            width = data.batching.width(lengths)
            pad += width * len(lengths) - int(lengths.sum())
            real += int(lengths.sum())
    return pad / max(1, pad + real)
