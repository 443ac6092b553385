"""Pretraining objectives, one module each, each a pure loss function plus a small class that turns a
batch and the model outputs into named loss terms (exact definitions in docs/pretraining.md, Objectives).
The list of objectives, and what each name builds, is tacl.objectives.registry:

    mlm_nsp   BERT masked LM + next sentence prediction (the "more pretraining" control)
    mlm       masked LM alone (the control of a family pretrained without NSP: RoBERTa and the others)
    tacl      MLM + NSP + TaCL token contrastive loss against a frozen teacher (Su et al. 2021)
    tacl_batch  tacl with cross-sequence negatives (tacl.negatives: batch), its own model in the tables
    tacl_attn   tacl with each masked token's term weighted by the attention it receives in the teacher
    taco      MLM + TACO token-alignment contrastive loss (Fu et al. 2022), continual variant
    coco_lm   COCO-LM: auxiliary MLM corrupts, corrective LM + sequence contrast (Meng et al. 2021)

The hot path has no host-device synchronisation: every loss and metric stays a tensor on the device, and
shapes never depend on tensor values (fixed-shape gathers and ignore_index instead of boolean indexing or
`nonzero`). An objective returns (losses, metrics): losses are 0-d tensors, metrics are counts
`[correct, total]` that the trainer sums over a logging interval and divides once when it logs.

The package imports no torch itself (the Snakefile reads the registry while it parses); the objective
modules do.

A step's loss is the same whatever the micro-batch, the number of ranks and the accumulation steps:

- every loss that averages over selected positions or tokens divides its micro-batch's sum by the step's
  count over the number of micro-batches of the step (`step_denominator`, from the counts the loader puts in
  each micro-batch), so that the mean of the micro-batches' losses, which DeepSpeed's accumulation and
  all-reduce take, is the step's mean (transformers' `num_items_in_batch` for gradient accumulation);
- in-batch negatives and weights normalised over several sequences come from fixed groups of
  `negatives_group` sequences of the step's order (`group_size`), never from the whole micro-batch, which
  holds whole groups;
- each group's random numbers come from a generator seeded for that group of that step, in shapes fixed by
  the run, not by the micro-batch (`GroupDraws`).

Only dropout's draws depend on the micro-batch (they are seeded per micro-batch).

An objective is called as `objective(model, teacher, batch, draws)`; one that draws random numbers (TACO's
pairs, COCO-LM's samples and crops) has a method `draws(batch, group_draws)` that makes them ahead, as a
dict of tensors (`objective_draws`): a compiled step (`pretrain.compile`) cannot take a generator.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, TypeVar

from tacl.data import NO_PADDING  # noqa: F401 (read here by the trainer and the tests)
from tacl.objectives.registry import OBJECTIVES, build_objective, objective_params  # noqa: F401 (the API)
from tacl.runtime.io import InputError

if TYPE_CHECKING:
    import torch

F = TypeVar("F", bound=Callable[..., Any])


def in_fp32(loss: F) -> F:
    """Run a loss function in fp32 even inside torch.autocast: its floating-point tensor arguments are cast to
    fp32 and autocast is off while it runs (under autocast, a `.float()` before a matmul does not stop the
    matmul from running in bf16: the similarity logits of a contrastive loss would come out bf16)."""
    import torch

    def fp32(x: Any) -> Any:  # (float64 stays as it is)
        return x.float() if isinstance(x, torch.Tensor) and x.dtype in (torch.bfloat16, torch.float16) else x

    @functools.wraps(loss)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        device = next((x.device.type for x in (*args, *kwargs.values()) if isinstance(x, torch.Tensor)), "cpu")
        with torch.autocast(device, enabled=False):
            return loss(*map(fp32, args), **{k: fp32(v) for k, v in kwargs.items()})

    return wrapper  # type: ignore[return-value]


def counts(correct: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """[correct among valid, valid] as an int64 pair (an accuracy, summable over micro-batches)."""
    import torch

    return torch.stack([(correct & valid).sum(), valid.sum()])


def accuracy(pair: torch.Tensor) -> float:
    """correct / total of a `counts` pair (nan when there was nothing to count)."""
    correct, total = pair.tolist()
    return correct / total if total else float("nan")


def sdpa_mask(attention_mask: torch.Tensor, no_padding: bool = False) -> torch.Tensor | None:
    """A [B, L] padding mask as SDPA's 4-D boolean mask (True = attend), or None where the micro-batch has no
    padding (`no_padding`, a host flag the loader sets: `NO_PADDING`): SDPA then runs without a mask, which
    lets it pick flash attention on a GPU (it cannot with any mask). Given a 2-D mask, transformers would ask
    `mask.all()` on every forward to decide whether it may drop it, a host-device sync; the flag decides it
    on the host instead."""
    if no_padding:
        return None
    return attention_mask[:, None, None, :].bool()


# The host flag NO_PADDING (a Python bool, tacl.data) the loader puts in every padded micro-batch:
# True where no sequence of the micro-batch has padding (every one as long as the micro-batch is wide). A
# compiled step specialises on it: at most two graphs, one with the mask and one without
# (tacl.pretrain.trainer.Pretrainer.compile_losses).


# The step's counts that the loader puts in every micro-batch as `step_counts` (int64, in this order): the
# positions selected for MLM, the real tokens, and the number of micro-batches the step is cut into (all ranks).
STEP_COUNTS = ("masked", "tokens", "micro_batches")


def step_denominator(batch: dict[str, Any], kind: str) -> torch.Tensor | None:
    """What a micro-batch divides its sum of per-`kind` terms by ("masked": one term per selected position,
    "tokens": one per real token), so that the mean of the step's micro-batch losses is the step's mean: the
    step's count over its number of micro-batches (a device scalar, no sync). None for a batch without
    `step_counts` (one built outside the trainer): the loss is then the micro-batch's own mean."""
    counts = batch.get("step_counts")
    if counts is None:
        return None
    return counts[STEP_COUNTS.index(kind)].clamp(min=1).float() / counts[STEP_COUNTS.index("micro_batches")].float()


def mean_of(total: torch.Tensor, count: torch.Tensor, denominator: torch.Tensor | None) -> torch.Tensor:
    """A sum as a loss: over `denominator` (`step_denominator`) where it is given, else over its own count."""
    return total / (count.clamp(min=1) if denominator is None else denominator)


def group_size(sequences: int, group: int | None) -> int:
    """The sequences per group of a micro-batch of `sequences` (group None: the micro-batch is one group, for
    a call outside the trainer); the micro-batch must hold whole groups."""
    if group is None:
        return sequences
    if sequences % group:
        raise ValueError(f"a micro-batch of {sequences} sequences does not hold whole groups of negatives_group="
                         f"{group}")
    return group


def check_negatives_group(group: int | None, takes: str) -> None:
    """InputError, naming pretrain.negatives_group, where `takes` (what takes its negatives from the other
    sequences of a group: an objective, or one of its terms) would have fewer than 2 sequences per group (the
    schema's minimum). None: the micro-batch is the group (a call outside the trainer)."""
    if group is not None and group < 2:
        raise InputError(f"pretrain.negatives_group: {group}, but {takes} takes negatives from the other sequences "
                         "of a group: 2 or more")


@dataclass
class GroupDraws:
    """Where a micro-batch's groups draw their random numbers: group k of the step (k counted over the step's
    order) from `generator` seeded with `seed(k)`, so that its numbers are the same whichever micro-batch,
    rank or resumed chunk computes it. `first`: the index of the micro-batch's first sequence in the step."""

    generator: torch.Generator
    seed: Callable[[int], int]
    first: int = 0

    def draw(self, sequences: int, group: int, make: Callable[[torch.Generator], tuple]) -> tuple:
        """`make(generator)` once per group of the micro-batch (`sequences` of them, `group` per group), each
        right after its group's seed; its tensors (one group's, in shapes that must not depend on the
        micro-batch) concatenated along their first dimension."""
        import torch

        parts = []
        for k in range(sequences // group):
            self.generator.manual_seed(self.seed(self.first // group + k))
            parts.append(make(self.generator))
        return tuple(torch.cat(part) for part in zip(*parts))


def draw_width(batch: dict[str, Any]) -> int:
    """The width of a group's per-position draws: the widest micro-batch of the run (`draw_width`, from the
    loader), so that a position's number does not depend on its micro-batch's width; else the batch's own."""
    return batch.get("draw_width", batch["attention_mask"].shape[1])


def seeded_draws(generator: torch.Generator) -> GroupDraws:
    """GroupDraws for a call outside the trainer (tests, benchmarks): group k seeded with the generator's own
    seed plus k."""
    base = generator.initial_seed()
    return GroupDraws(generator, lambda k: base + k)


def objective_draws(objective: Any, batch: dict[str, torch.Tensor], draws: GroupDraws) -> dict[str, Any]:
    """The random numbers an objective draws for this micro-batch (none for most)."""
    return objective.draws(batch, draws) if hasattr(objective, "draws") else {}
