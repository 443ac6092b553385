"""The fine-tuning loop shared by GLUE, SQuAD and NER: AdamW with linear warmup and decay, batches grouped
by length and padded to their longest row (or, finetune.shapes buckets, to a few fixed widths and the full
batch size: `bucket_width`, `pad_batch`), bf16 autocast on GPU, gradient clipping, seeded data order; and
batched prediction (`prediction_batches`).

Length grouping (`group_by_length`, off by default, see below; `epoch_batches`): random batches of GLUE
and SQuAD rows are 33-67% padding (SST-2, STS-B, MRPC, RTE, QNLI, WNLI at batch 32, the MiniLM tokenizer); each epoch's
random permutation is cut into megabatches of MEGABATCH batches, each sorted by length and cut into batches,
and the epoch's batches then go in a random order: 2-6% padding. Every example is seen once per epoch, the
number of steps is the same, and the order is fixed by the seed, as without grouping; what changes is
which examples share a batch (ones of similar length, drawn from a random megabatch), as with Hugging Face's
LengthGroupedSampler (which keeps each megabatch's batches longest first instead of shuffling them). Off for
contrastive fine-tuning, whose in-batch negatives would all be of the anchor's length
(tacl.finetune.contrastive.DEFAULTS). Batches are not rounded up to a multiple of 8: on grouped batches that
added 4-18 points of padding (SST-2's rows are 13 tokens long on average), and no kernel here needs it.
benchmarks/finetune_step.py measures all of this. Prediction runs the rows sorted by length.

Off by default because it changed the scores of short fine-tunes beyond seed noise: the demo's MiniLM on
800 QNLI rows for one epoch (50 steps, one megabatch) reached 53.0 dev accuracy grouped against 65.5 with
random batches, seed 0 (its loss stayed at chance, 0.693); `benchmarks/finetune_fidelity.py --against random`
on MRPC (1,000 rows, 3 epochs) gave accuracy 68.9 / 73.5 / 77.0 grouped against 76.0 / 72.6 / 74.8 random.
Batches of one length carry skewed labels where length and label go together; a long fine-tune averages
that out, a short one (RTE, MRPC, STS-B at paper scale: 234-540 steps) may not. `group_by_length: true`
under `finetune.hparams` turns it on where the padding saved is worth it (MNLI, QQP on a GPU).

Speed on a GPU: a batch is pinned and copied without blocking, the padding mask goes in as SDPA's 4-D mask,
AdamW is PyTorch's fused kernel and the loss stays on the device (read every LOG_EVERY steps): a step
(`train_step`) never waits for the device. Precision: under bf16 autocast the task head (classifier,
qa_outputs) and the contrastive losses run in fp32, so SQuAD's start/end and null scores, STS-B's regression
and the similarity logits are fp32."""

from __future__ import annotations

import collections
import logging
import random
import signal
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence, TypeVar

import numpy as np
import torch

from tacl.runtime.compile import compiled_or_eager, compiles, give_up_compiling
from tacl.runtime.device import computes_bf16, device_info, fast_fp32_matmul, resolve_device
from tacl.finetune import FAMILY_HPARAMS, PRESETS, resume
from tacl.finetune.resume import Checkpointing
from tacl.objectives import in_fp32, sdpa_mask
from tacl.runtime import signals
from tacl.runtime.io import InputError, stable_hash

log = logging.getLogger("tacl.finetune")

DEFAULT_HPARAMS = FAMILY_HPARAMS["glue"]
LOG_EVERY = 200  # steps between log lines with the mean training loss (the only time it is read)
MEGABATCH = 50  # batches per megabatch of length grouping (as Hugging Face's LengthGroupedSampler)
# finetune.shapes: buckets (`bucket_width`): a batch is padded to the next power of two from BUCKET_FLOOR
# tokens, capped at max_len, and to the full number of rows; prediction batches hold about EVAL_TOKENS
# tokens (at least eval_batch rows)
BUCKET_FLOOR = 16
EVAL_TOKENS = 32768
SHAPES = ("auto", "exact", "buckets")
TASK_HEADS = ("classifier", "qa_outputs")  # the Hugging Face task models' heads, run in fp32
T = TypeVar("T")


def hyperparameters(defaults: dict[str, Any], preset: str, overrides: dict[str, Any]) -> dict[str, Any]:
    """A fine-tune's hyperparameters: the family's defaults, then the preset, then the config's values."""
    if preset not in PRESETS:
        raise InputError(f"finetune.preset: {preset!r} is not one of {', '.join(PRESETS)}")
    if not isinstance(overrides.get("group_by_length", True), bool):
        raise InputError(f"finetune.hparams: group_by_length is {overrides['group_by_length']!r}, not true or false")
    return {**defaults, **PRESETS[preset], **overrides}


@dataclass
class Run:
    """Where and how a fine-tune runs."""

    device: torch.device
    bf16: bool
    compile: bool = False  # torch.compile the model (finetune.compile, resolved)
    buckets: bool = False  # batches of a few fixed shapes (finetune.shapes, resolved; `bucket_width`)

    @classmethod
    def detect(cls, precision: str = "auto", device: str = "auto", compile: bool | str = "auto",
               shapes: str = "auto") -> "Run":
        """`device` as in the config (auto | cuda | cpu): a job that asked for a GPU and sees none stops
        here with tacl.runtime.device.DeviceError, before any data is tokenized or any model is built. `compile`:
        finetune.compile (auto: on a GPU); `shapes`: finetune.shapes (auto: buckets where compiled)."""
        if shapes not in SHAPES:
            raise InputError(f"finetune.shapes: {shapes!r} is not one of {', '.join(SHAPES)}")
        where = resolve_device(device)
        bf16 = computes_bf16(precision, where.type)
        fast_fp32_matmul(where)
        compiled = compiles(compile, where, "finetune")
        return cls(where, bf16, compiled, shapes == "buckets" or (shapes == "auto" and compiled))

    def describe(self) -> dict[str, Any]:
        """What metrics.json records about the run's device (GPU model and count, torch, CUDA, NCCL)."""
        return device_info(self.device)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def load_task_model(auto_class: Any, model_dir: str, seed: int, **kwargs: Any) -> torch.nn.Module:
    """`auto_class.from_pretrained(model_dir, **kwargs)` with every RNG seeded first: the new task head's
    random initialisation belongs to the fine-tuning seed (unseeded, it differs in every process, and a
    (model, task, seed) run could not be repeated). The attention of the model's family (`attention_of`:
    SDPA, whose batches carry its 4-D mask, or DeBERTa's eager attention); the head runs in fp32 under
    autocast (`heads_in_fp32`)."""
    seed_everything(seed)
    return heads_in_fp32(auto_class.from_pretrained(model_dir, attn_implementation=attention_of(model_dir),
                                                    **kwargs))


def attention_of(model_dir: str) -> str:
    """The attn_implementation a model directory loads with: its family's (tacl.runtime.family, the family its
    JSON files name: model_type_of), SDPA for a model_type outside the families."""
    from tacl.runtime.family import FAMILIES, model_type_of

    kind = model_type_of(model_dir)
    return FAMILIES[kind].attention if kind in FAMILIES else "sdpa"


def takes_sdpa_mask(model: torch.nn.Module) -> bool:
    """Whether the model's batches carry SDPA's 4-D padding mask (`to_device`): not DeBERTa's (eager attention,
    which takes the 2-D mask) nor ModernBERT's (whose sliding-window layers make their own from the 2-D one).
    ModernBERT's task models read the 2-D mask too (mean pooling, `_qa_loss`); making its masks from it,
    transformers 5.23 reads it on the host (`padding_mask.all()`, masking_utils._ignore_bidirectional_mask_sdpa:
    twice per forward, for the global and the sliding-window layers; not where the model is compiled). It does
    not unpad: that is flash_attention_2's, which no family loads with."""
    return model.config.model_type not in ("deberta-v2", "modernbert")


def input_names(tokenizer: Any) -> tuple[str, ...]:
    """What a row keeps of the tokenizer's output: the inputs the tokenizer gives its model (token type ids
    only where it gives them: BERT's, not RoBERTa's or ModernBERT's)."""
    return tuple(tokenizer.model_input_names)


def heads_in_fp32(model: torch.nn.Module) -> torch.nn.Module:
    """Make the task head (`TASK_HEADS`) compute in fp32 even inside bf16 autocast: its outputs feed
    decisions (SQuAD's span and null scores against a threshold, STS-B's regression, argmax). The encoder
    stays in bf16; the head is one small matmul."""
    for name in TASK_HEADS:
        head = getattr(model, name, None)
        if isinstance(head, torch.nn.Module) and not getattr(head, "_tacl_fp32", False):
            head.forward = in_fp32(head.forward)
            head._tacl_fp32 = True
    return model


def to_device(batch: dict[str, torch.Tensor], device: torch.device, sdpa: bool = True) -> dict[str, torch.Tensor]:
    """A padded batch on the device, its padding mask as SDPA's 4-D mask (`sdpa_mask`) where `sdpa`
    (`takes_sdpa_mask`), else as it is. To a GPU each tensor is pinned and copied without blocking (a copy
    from pageable memory waits for the device)."""
    if device.type == "cuda":
        batch = {k: v.pin_memory().to(device, non_blocking=True) for k, v in batch.items()}
    else:
        batch = {k: v.to(device) for k, v in batch.items()}
    return {**batch, "attention_mask": sdpa_mask(batch["attention_mask"])} if sdpa else batch


def bucket_width(length: int, max_len: int) -> int:
    """The width a batch whose longest row has `length` tokens is padded to under finetune.shapes buckets:
    the next power of two from BUCKET_FLOOR, capped at max_len (never under `length`). GLUE's max_len 128
    gives 4 widths (16, 32, 64, 128), SQuAD's 384 gives 6 (16 ... 256, 384)."""
    width = BUCKET_FLOOR
    while width < length:
        width *= 2
    return max(length, min(width, max_len))


def pad_batch(rows: Sequence[dict[str, list[int]]], pad_id: int, label_pad: int = -100, width: int | None = None,
              size: int | None = None) -> dict[str, torch.Tensor]:
    """Pad a list of tokenized rows to the longest (or to `width`); labels are padded with -100 when they
    are sequences, stacked as they are when scalars. `size`: that many rows, the ones added ignored rows
    that add nothing to a loss: one attended padding token (a row with none would make NaN in attention),
    labels -100 (a regression's NaN: `_model_loss` leaves them out), start and end positions at `width`
    (what a Hugging Face QA model's loss ignores)."""
    length = max(len(r["input_ids"]) for r in rows) if width is None else width
    n = len(rows) if size is None else size
    out: dict[str, torch.Tensor] = {}
    for key in rows[0]:
        values = [r[key] for r in rows]
        if isinstance(values[0], (list, tuple)):
            fill = pad_id if key == "input_ids" else (label_pad if key == "labels" else 0)
            arr = np.full((n, length), fill, dtype=np.int64)
            for i, v in enumerate(values):
                arr[i, : len(v)] = v
            if key == "attention_mask":
                arr[len(rows):, 0] = 1
            out[key] = torch.from_numpy(arr)
        else:
            if n > len(rows):
                regression = key == "labels" and isinstance(values[0], float)
                ignored = length if key in ("start_positions", "end_positions") else label_pad
                values = values + [float("nan") if regression else ignored] * (n - len(rows))
            out[key] = torch.tensor(values)
    return out


def epoch_batches(lengths: np.ndarray, batch: int, rng: np.random.Generator, grouped: bool = True
                  ) -> list[np.ndarray]:
    """One epoch's batches, as index arrays into the rows (of these `lengths`): ceil(n / batch) of them, all
    full but one, every row once. Ungrouped: a random permutation cut into batches. Grouped: the permutation
    cut into megabatches of MEGABATCH batches, each sorted by length (stably: rows of equal length keep
    their random order) and cut into batches, then the batches in a random order."""
    n = len(lengths)
    order = rng.permutation(n)
    if grouped:
        step = batch * MEGABATCH
        order = np.concatenate([mega[np.argsort(lengths[mega], kind="stable")]
                                for mega in np.split(order, range(step, n, step))])
    batches = [order[i : i + batch] for i in range(0, n, batch)]
    if grouped:
        batches = [batches[i] for i in rng.permutation(len(batches))]
    return batches


def optimizer_and_schedule(model: torch.nn.Module, hp: dict[str, Any], total_steps: int):
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if p.requires_grad:
            (no_decay if ("bias" in name or "LayerNorm" in name) else decay).append(p)
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": hp["weight_decay"]},
                             {"params": no_decay, "weight_decay": 0.0}], lr=hp["lr"], fused=True)
    warmup = int(round(total_steps * hp["warmup_ratio"]))

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        return max(0.0, (total_steps - step) / max(1, total_steps - warmup))

    return opt, torch.optim.lr_scheduler.LambdaLR(opt, factor)


@dataclass
class Progress:
    """How far a seed's training has gone, and what its training record sums: kept in its checkpoint beside
    the model, the optimizer and the RNGs (`_save`, `_resume`). The losses stay on the device; `add` reads
    them on the host only for a log line."""

    total: int  # the fine-tune's steps
    recent: collections.deque[torch.Tensor]  # the last losses (a tenth of an epoch), the record's final loss
    interval: torch.Tensor  # the loss summed since the last log line
    started: float  # when this process began to train
    step: int = 0
    positions: int = 0  # padded positions of the batches, for the record
    before_s: float = 0.0  # seconds trained before the checkpoint this process resumed
    resumed_at: list[int] = field(default_factory=list)  # the steps the seed was resumed at

    def add(self, loss: torch.Tensor) -> None:
        """A step done, with its loss; every LOG_EVERY steps a log line with their mean."""
        self.recent.append(loss)
        self.interval += loss
        self.step += 1
        if self.step % LOG_EVERY == 0:
            log.info("fine-tune step %d/%d: mean loss %.4f", self.step, self.total, float(self.interval) / LOG_EVERY)
            self.interval.zero_()

    def train_s(self) -> float:
        """Seconds trained, before the checkpoint and since."""
        return self.before_s + time.time() - self.started


def train(model: torch.nn.Module, rows: list[dict[str, Any]], hp: dict[str, Any], seed: int, run: Run,
          pad_id: int, extra_loss: Callable[[torch.nn.Module, dict, Any], torch.Tensor] | None = None,
          task_weight: float = 1.0, checkpoint: Checkpointing | None = None) -> dict:
    """Train for hp["epochs"] epochs over `rows` (tokenized, unpadded); returns a short training record.

    The loss is task_weight * the model's own loss + `extra_loss(model, batch, outputs)` (e.g. supervised
    TaCL for NER, a contrastive term on [CLS] for classification). With `checkpoint` (its path in the seed's
    folder), the seed resumes from the checkpoint there, saves every `checkpoint.minutes`, and on SIGUSR1,
    SIGUSR2 or SIGTERM, before the job's end time (`checkpoint.end`, with time to save every seed that trains
    at once) or after `checkpoint.stop_after` steps, saves and raises `Stopped` (tacl.finetune.resume). A stop
    signal that came before the first step raises `Stopped` there, with nothing saved (nothing was trained);
    once trained, `checkpoint.save_trained` saves the trained state for a stop while the seed predicts
    (`Checkpointing.stop_point`, which `predict` calls between batches)."""
    from tqdm import tqdm

    seed_everything(seed)
    model.to(run.device).train()
    if run.compile:  # in place (parameter names stay)
        compile_model(model, run, hp["max_len"])
    steps_per_epoch = -(-len(rows) // hp["batch"])
    total = steps_per_epoch * hp["epochs"]
    opt, sched = optimizer_and_schedule(model, hp, total)
    order_rng = np.random.default_rng(seed)
    lengths = np.array([len(r["input_ids"]) for r in rows])
    grouped = hp.get("group_by_length", False)
    progress = Progress(total, collections.deque(maxlen=max(1, steps_per_epoch // 10)),
                        torch.zeros((), device=run.device), time.time())
    first_epoch, done_in_epoch = 0, 0
    # (what the checkpoint belongs to: a checkpoint of other settings, data or seed is not resumed)
    identity = stable_hash({"seed": seed, "steps": total, "rows": len(rows), "tokens": int(lengths.sum()),
                            "hparams": hp})
    state = resume.load(checkpoint.path, identity) if checkpoint else None
    if state is not None:
        first_epoch, done_in_epoch = _resume(state, progress, model, opt, sched, order_rng, run.device)
        log.info("fine-tune: resumed from %s at step %d/%d (epoch %d, batch %d of %d)", checkpoint.path,
                 progress.step, total, first_epoch + 1, done_in_epoch, steps_per_epoch)
    last_save, steps_here = time.time(), 0
    limit = resume.TimeLimit.of(checkpoint, model) if checkpoint else None
    if limit is not None and checkpoint.end is not None:
        log.info("fine-tune: %s", limit.describe())
    epoch_rng = order_rng.bit_generator.state
    bar = tqdm(total=total, initial=progress.step, desc="fine-tune", unit=" steps", disable=not sys.stderr.isatty())
    with signals.catching():
        if signals.stop_requested():  # (while it loaded, tokenized or compiled: nothing trained, nothing to save)
            raise resume.Stopped(f"stopped by {signals.first()} before training at step {progress.step}/{total}"
                                 f"{_saved_before(checkpoint)}: running the job again trains this seed")
        for epoch in range(first_epoch, hp["epochs"]):
            epoch_rng = order_rng.bit_generator.state  # (a checkpoint draws the epoch's order again from it)
            batches = epoch_batches(lengths, hp["batch"], order_rng, grouped)
            for b, indices in enumerate(batches):
                if epoch == first_epoch and b < done_in_epoch:
                    continue  # (done before the checkpoint)
                step_started = time.time()
                batch, positions = _padded_batch(rows, indices, lengths, hp, run, pad_id, takes_sdpa_mask(model))
                progress.positions += positions
                progress.add(train_step(model, batch, opt, sched, hp, run, extra_loss, task_weight))
                steps_here += 1
                bar.update(1)
                if checkpoint is None:
                    if signals.stop_requested():
                        raise resume.Stopped(f"stopped by {signals.first()} at step {progress.step}/{total}, with "
                                             "no checkpoint: running the job again trains this seed from the start")
                    continue
                limit.deadline.observe_step(time.time() - step_started)
                stop = _why_stop(signals.received(), steps_here == checkpoint.stop_after,
                                 progress.step < total and limit.near())
                due = checkpoint.minutes is not None and time.time() - last_save >= 60 * checkpoint.minutes
                if stop or (due and progress.step < total):
                    limit.saved(_save(checkpoint, identity, progress, epoch, b + 1, epoch_rng, model, opt, sched))
                    last_save = time.time()
                if stop:
                    bar.close()
                    raise resume.Stopped(f"stopped {stop} at step {progress.step}/{total}, saved in "
                                         f"{checkpoint.path}: running the job again resumes this seed there")
    bar.close()
    if checkpoint is not None:  # (trained: a stop signal while it predicts saves this state, `stop_point`)
        rng, epoch, done = resume.rng_states(), hp["epochs"] - 1, steps_per_epoch
        checkpoint.save_trained = lambda: _save(checkpoint, identity, progress, epoch, done, epoch_rng, model, opt,
                                                sched, rng)
    return _record(progress, hp, rows, lengths, grouped)


def _padded_batch(rows: list[dict[str, Any]], indices: np.ndarray, lengths: np.ndarray, hp: dict[str, Any],
                  run: Run, pad_id: int, sdpa: bool = True) -> tuple[dict[str, torch.Tensor], int]:
    """The training batch of these rows on the device, padded to its longest row (under finetune.shapes
    buckets to that row's `bucket_width`, and to the full batch size: every batch full, of one of a few
    widths), and the positions it computes."""
    width, size = int(lengths[indices].max()), len(indices)
    if run.buckets:
        width, size = bucket_width(width, hp["max_len"]), hp["batch"]
    batch = to_device(pad_batch([rows[j] for j in indices], pad_id, width=width, size=size), run.device, sdpa)
    return batch, size * width


def _resume(state: dict[str, Any], progress: Progress, model: torch.nn.Module, opt: torch.optim.Optimizer,
            sched: Any, order_rng: np.random.Generator, device: torch.device) -> tuple[int, int]:
    """Put a checkpoint's state back (tacl.finetune.resume.load): model, optimizer and LR schedule, the batch
    order's generator as at the start of the checkpoint's epoch, the progress and every RNG; returns that
    epoch and its batches done before the checkpoint."""
    model.load_state_dict(state["model"])
    opt.load_state_dict(state["optimizer"])
    sched.load_state_dict(state["scheduler"])
    order_rng.bit_generator.state = state["order_rng"]
    progress.step, progress.positions, progress.before_s = state["step"], state["positions"], state["train_s"]
    progress.resumed_at = state["resumed_at"] + [state["step"]]
    progress.recent.extend(state["recent"].to(device).unbind(0) if len(state["recent"]) else [])
    progress.interval = state["interval"].to(device)
    resume.restore_rng_states(state["rng"])
    return state["epoch"], state["batch"]


def _saved_before(checkpoint: Checkpointing | None) -> str:
    """', its checkpoint (PATH) kept as it was' where the seed has one, for a stop before training."""
    return f", its checkpoint ({checkpoint.path}) kept as it was" if checkpoint and checkpoint.path and \
        checkpoint.path.is_file() else ""


def _why_stop(received: list[int], step_cap: bool, time_limit: bool) -> str | None:
    """Why a seed saves and stops after a step, in words (None: it goes on): the first stop signal it received,
    else the step cap of a test (`Checkpointing.stop_after`), else its job's end time near."""
    if received:
        return f"by {signal.Signals(received[0]).name}"
    if step_cap:
        return "by step cap"
    if time_limit:
        return "before the job's time limit"
    return None


def _save(checkpoint: Checkpointing, identity: str, progress: Progress, epoch: int, batches: int,
          epoch_rng: dict[str, Any], model: torch.nn.Module, opt: torch.optim.Optimizer, sched: Any,
          rng: dict[str, Any] | None = None) -> float:
    """Save the seed's whole state in its checkpoint, `batches` batches into `epoch` (whose batch order
    `epoch_rng` draws again), with every RNG's state now (or `rng`, as it was at the end of training), saying
    so; returns the seconds the save took."""
    seconds = resume.save(checkpoint.path, {
        "identity": identity, "step": progress.step, "epoch": epoch, "batch": batches, "order_rng": epoch_rng,
        "model": model.state_dict(), "optimizer": opt.state_dict(), "scheduler": sched.state_dict(),
        "rng": rng or resume.rng_states(), "positions": progress.positions, "interval": progress.interval,
        "recent": torch.stack(list(progress.recent)) if progress.recent else torch.zeros(0),
        "train_s": progress.train_s(), "resumed_at": progress.resumed_at})
    log.info("fine-tune step %d/%d: checkpoint saved (%s, %.1f s)", progress.step, progress.total, checkpoint.path,
             seconds)
    return seconds


def _record(progress: Progress, hp: dict[str, Any], rows: list[dict[str, Any]], lengths: np.ndarray,
            grouped: bool) -> dict[str, Any]:
    """The training record (metrics.json's `train`): steps, epochs and rows, the share of padding computed, the
    mean of the recent losses, the seconds trained and the steps the seed was resumed at."""
    positions = progress.positions
    return {"steps": progress.total, "epochs": hp["epochs"], "train_examples": len(rows), "group_by_length": grouped,
            "padding": round(1 - int(lengths.sum()) * hp["epochs"] / positions, 4) if positions else None,
            "final_loss": float(torch.stack(list(progress.recent)).double().mean()) if progress.recent else None,
            "train_s": round(progress.train_s(), 1), "resumed_at": progress.resumed_at}


def compile_model(model: torch.nn.Module, run: Run, max_len: int, backend: str | None = None) -> None:
    """torch.compile `model` in place (`backend`: torch.compile's, default inductor). Exact shapes: dynamic
    shapes, one graph for every batch width and another for prediction. Buckets: static shapes, one graph
    per width for training and one per width for prediction (dynamo's recompile limit raised to that count)."""
    given = {"backend": backend} if backend else {}
    if not run.buckets:
        model.compile(dynamic=True, **given)
        return
    widths = len({bucket_width(n, max_len) for n in range(1, max_len + 1)})
    config = torch._dynamo.config
    name = "recompile_limit" if hasattr(config, "recompile_limit") else "cache_size_limit"
    # (dynamo's settings are per thread, and a graph compiles in a thread of its own: `_compiled_or_eager`
    # makes the setting around every call of the model, whichever thread compiles)
    setattr(model, _DYNAMO_SETTINGS, {name: max(getattr(config, name), 2 * widths + 2)})
    model.compile(dynamic=False, **given)


def _model_loss(model: torch.nn.Module, batch: dict[str, torch.Tensor], run: Run, hidden: bool
                ) -> tuple[Any, torch.Tensor]:
    """The model's outputs and its loss. Under finetune.shapes buckets, a QA model's is `_qa_loss`, and a
    regression's (ignored rows' labels are NaN, `pad_batch`) the mean squared error over the real rows (the
    model's own loss would average over every row)."""
    labels = batch.get("labels")
    if run.buckets and "start_positions" in batch:
        return _qa_loss(model, batch, hidden)
    if not run.buckets or labels is None or not labels.is_floating_point():
        outputs = model(**batch, output_hidden_states=hidden)
        return outputs, outputs.loss
    outputs = model(**{k: v for k, v in batch.items() if k != "labels"}, output_hidden_states=hidden)
    real = ~labels.isnan()
    error = (outputs.logits.float().view(-1) - labels.nan_to_num().view(-1)) * real
    return outputs, (error * error).sum() / real.sum().clamp(min=1)


def _qa_loss(model: torch.nn.Module, batch: dict[str, torch.Tensor], hidden: bool) -> tuple[Any, torch.Tensor]:
    """A Hugging Face QA model's loss (the mean of the start and end cross-entropies over the rows, positions
    at the width ignored) under finetune.shapes buckets: its softmax runs over every position of the padded
    width, so the positions past the batch's longest row (the ones bucketing adds) are left out, and the loss
    is exact padding's."""
    positions = {k: batch[k] for k in ("start_positions", "end_positions")}
    outputs = model(**{k: v for k, v in batch.items() if k not in positions}, output_hidden_states=hidden)
    width = outputs.start_logits.shape[1]
    added = ~batch["attention_mask"].reshape(len(outputs.start_logits), width).any(0)  # (no row attends there)
    loss = 0.0
    for logits, key in ((outputs.start_logits, "start_positions"), (outputs.end_logits, "end_positions")):
        loss = loss + torch.nn.functional.cross_entropy(logits.float().masked_fill(added, float("-inf")),
                                                        positions[key].clamp(0, width), ignore_index=width)
    return outputs, loss / 2


def _loss_and_backward(model: torch.nn.Module, batch: dict[str, torch.Tensor], run: Run,
                       extra_loss: Callable | None, task_weight: float) -> torch.Tensor:
    with torch.autocast(run.device.type, dtype=torch.bfloat16, enabled=run.bf16):
        outputs, loss = _model_loss(model, batch, run, extra_loss is not None)
        loss = loss * task_weight
        if extra_loss is not None:
            loss = loss + extra_loss(model, batch, outputs)
    loss.backward()
    return loss


def train_step(model: torch.nn.Module, batch: dict[str, torch.Tensor], opt: torch.optim.Optimizer, sched: Any,
               hp: dict[str, Any], run: Run, extra_loss: Callable | None = None,
               task_weight: float = 1.0) -> torch.Tensor:
    """One optimizer step on a batch already on the device (`to_device`); returns the loss, detached and on
    the device: nothing here waits for the device. A compiled model whose compilation fails goes on
    uncompiled (`_compiled_or_eager`), the batch's gradient computed again from none (the optimizer has not
    stepped, and every step starts without gradients)."""
    def step() -> torch.Tensor:
        return _loss_and_backward(model, batch, run, extra_loss, task_weight)

    loss = _compiled_or_eager(model, step, batch, run, retry=lambda: opt.zero_grad(set_to_none=True))
    if hp.get("grad_clip"):
        torch.nn.utils.clip_grad_norm_(model.parameters(), hp["grad_clip"])
    opt.step()
    sched.step()
    opt.zero_grad(set_to_none=True)
    return loss.detach()


# set on a compiled model: the `_compile_key`s its compiled calls have run
_COMPILED_KEYS = "_tacl_compiled_keys"
# On a compiled model (`compile_model`): dynamo's settings its calls need, made around each call
_DYNAMO_SETTINGS = "_tacl_dynamo_settings"


def _compile_key(model: torch.nn.Module, batch: dict[str, torch.Tensor], run: Run) -> tuple:
    """What a compiled model's call compiles a graph for: training or prediction (the model's `training`
    flag, which dynamo guards on), and under finetune.shapes buckets (static shapes) the batch's shape."""
    return model.training, tuple(batch["input_ids"].shape) if run.buckets else None


def _compiled_or_eager(model: torch.nn.Module, call: Callable[[], T], batch: dict[str, torch.Tensor], run: Run,
                       retry: Callable[[], None] | None = None) -> T:
    """`call()` (a training step's forward and backward, or a prediction batch's forward), on a compiled model
    (`compile_model`) where it compiles (tacl.runtime.compile.compiled_or_eager). The first call of each
    `_compile_key` compiles, in a thread of its own (what a failed compilation leaves behind, inference mode
    included, goes with that thread; `call` sets its own grad mode and autocast, which are the thread's); a
    later failure (a recompilation, not expected) is handled in this thread. A failed compilation sends the
    model on uncompiled, saying so once: dynamo reset, the model's compiled call dropped, `retry()` (training:
    the gradients set to none), and `call()` again. An out-of-memory error, as every error that is not the
    compiler's, propagates."""
    if getattr(model, "_compiled_call_impl", None) is None:  # (what nn.Module.compile sets)
        return call()
    key = _compile_key(model, batch, run)
    seen = getattr(model, _COMPILED_KEYS, None)
    if seen is None:
        seen = set()
        setattr(model, _COMPILED_KEYS, seen)

    def uncompile(failure: str, error: Exception | None) -> None:
        give_up_compiling(log, "finetune.compile: torch.compile failed (%s); this fine-tune goes on uncompiled "
                          "(eager, slower)", failure, lambda: setattr(model, "_compiled_call_impl", None))
        if retry is not None:
            retry()

    settings = getattr(model, _DYNAMO_SETTINGS, None)  # (`compile_model`'s, made in the thread that calls)
    with_settings = torch._dynamo.config.patch(**settings)(call) if settings else call
    out = compiled_or_eager(with_settings, run.device, uncompile, first=key not in seen)
    if model._compiled_call_impl is not None:  # (its graph for `key` compiled)
        seen.add(key)
    return out


@torch.no_grad()
def predict(model: torch.nn.Module, rows: list[dict[str, Any]], run: Run, pad_id: int, batch_size: int,
            outputs_of: Callable[[Any], Sequence[torch.Tensor]], per_token: bool = False,
            max_len: int | None = None, checkpoint: Checkpointing | None = None) -> list[list[np.ndarray]]:
    """Run the model over `rows` (in batches of rows of similar length: longest first, little padding).
    `outputs_of(model_output)` picks tensors of shape [B, ...]; for each, one float32 array per row comes
    back, in the rows' order; `per_token` outputs ([B, L, ...]) are cut to the row's own length. Under
    finetune.shapes buckets (`prediction_batches`), batches of `max_len`'s bucket widths (default: the
    longest row's). A compiled model whose prediction graph fails to compile goes on uncompiled, with one
    warning (`_compiled_or_eager`). With the seed's `checkpoint`, a stop signal saves the trained state and
    stops the seed before the next batch (`Checkpointing.stop_point`)."""
    model.to(run.device).eval()
    lengths = np.array([len(r["input_ids"]) for r in rows])
    kept: list[list[Any]] = []
    for chunk, width, size in prediction_batches(lengths, batch_size, run.buckets, max_len):
        if checkpoint is not None:
            checkpoint.stop_point()
        batch = to_device(pad_batch([{k: v for k, v in rows[j].items() if k != "labels"} for j in chunk], pad_id,
                                    width=width, size=size), run.device, takes_sdpa_mask(model))

        def forward() -> Sequence[torch.Tensor]:  # (grad mode and autocast are per thread: set here)
            with torch.no_grad(), torch.autocast(run.device.type, dtype=torch.bfloat16, enabled=run.bf16):
                return outputs_of(model(**batch))

        out = _compiled_or_eager(model, forward, batch, run)
        for k, t in enumerate(out):
            arr = t.float().cpu().numpy()
            if len(kept) <= k:
                kept.append([None] * len(rows))
            for a, j in enumerate(chunk):
                kept[k][j] = arr[a, : len(rows[j]["input_ids"])] if per_token else arr[a]
    return kept


def prediction_batches(lengths: np.ndarray, batch_size: int, buckets: bool = False, max_len: int | None = None
                       ) -> list[tuple[np.ndarray, int | None, int | None]]:
    """Prediction's batches, longest rows first, as (indices, width, rows) for `pad_batch` (None, None: the
    longest row's width, the batch's own rows). Buckets: each batch's rows share one `bucket_width` and it
    holds max(batch_size, EVAL_TOKENS // width) rows (the last of a width filled with ignored rows): one
    shape per width, and large batches where rows are short."""
    order = np.argsort(-lengths, kind="stable")
    if not buckets:
        return [(order[i : i + batch_size], None, None) for i in range(0, len(order), batch_size)]
    cap = int(max_len or lengths.max(initial=1))
    widths = np.array([bucket_width(int(n), cap) for n in lengths[order]])
    out = []
    i = 0
    while i < len(order):
        width = int(widths[i])
        size = max(batch_size, EVAL_TOKENS // width)
        end = min(i + size, i + int((widths[i:] == width).sum()))
        out.append((order[i:end], width, size))
        i = end
    return out
