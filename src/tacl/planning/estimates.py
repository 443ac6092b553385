"""What a run will cost, before it starts: jobs per rule and per resource class, the GPU-hours requested and
expected, the longest chain of jobs and the disk held at the peak; and the runtimes that the workflow asks
the scheduler for, sized from the same estimates.

Expected time = the model FLOPs of the work / (GPUs x the GPU's dense bf16 peak x an assumed model FLOPs
utilisation), plus a start-up allowance per job. FLOPs per token (docs/development.md, the MFU count): 6 N for
a trained encoder of N non-embedding parameters (forward and backward), 2 N for a forward-only one (TaCL's
teacher, evaluation), plus attention, 12 x layers x hidden x sequence length trained, a third of it forward
only (DeBERTa's relative position terms added); the MLM head (its transform and vocabulary projection) on the
masked positions only, pretrain.mlm_probability of them (the family's rate where unset: 15%, ModernBERT's
30%). N and the head follow the start model's config, per family (tacl.runtime.shape). Tokens: pretraining,
steps x global batch x the mean padded length (the data stage's own mean once it has run, else 0.625 x
max_len, the shared Wikipedia sample's; 9% padding with length grouping, 37% without); fine-tuning, the
task's train examples x epochs x its mean padded length as its batching makes it (random batches by default:
34-67% padding on GLUE, measured per task; grouped 9%), and its dev and test examples once (published sizes,
or the task's own once prepare_task has counted them). The assumptions are printed with the plan and set in
the config (`plan`).

Requests: runtime = the safety factor x the expected minutes, at least `plan.min_runtime_minutes`; a
pretraining chunk asks for at most `pretrain.chunk.runtime_minutes` (a chunk that runs short of time saves
and the next one goes on, so a low estimate costs a queue wait, never work), and a chunk after the first sizes
its request from the speed its predecessor measured. An explicit `finetune.runtime_minutes` wins.
"""

from __future__ import annotations

import glob
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tacl.runtime.family import FAMILIES
from tacl.runtime.io import disk_bytes, size_text
from tacl.runtime.shape import Shape

# Train / dev+test examples of each task as published (GLUE, SQuAD: the features, i.e. windows of 384 tokens;
# CoNLL-2003: sentences), and a typical mean length in WordPiece tokens with [CLS]/[SEP] (bert-base-uncased).
TASK_SIZES = {
    "cola": (8551, 1043 + 1063, 11), "sst2": (67349, 872 + 1821, 13), "mrpc": (3668, 408 + 1725, 53),
    "stsb": (5749, 1500 + 1379, 31), "qqp": (363846, 40430 + 390965, 30),
    "mnli": (392702, 9815 + 9832 + 9796 + 9847, 39), "qnli": (104743, 5463 + 5463, 50),
    "rte": (2490, 277 + 3000, 70), "wnli": (635, 71 + 146, 37),
    "squad_v1": (88641, 10833, 180), "squad_v2": (131754, 12232, 180), "conll2003": (14041, 3250 + 3453, 25),
}
# A task with no published size (a declared one) until prepare_task has counted it: train, evaluated, mean tokens
UNKNOWN_TASK_SIZE = (10000, 2000, 64)
# Share of padded positions in random batches of 32 (fine-tuning's default batching), measured on the team's GLUE
# files (benchmarks/finetune_step.py, docs/finetuning.md); tasks not measured get RANDOM_PADDING_DEFAULT. Grouped
# batches (group_by_length: true) carry 2-6%: GROUPED_PADDING.
RANDOM_PADDING = {"mrpc": 0.335, "rte": 0.480, "qnli": 0.506, "wnli": 0.544, "stsb": 0.599, "sst2": 0.668}
RANDOM_PADDING_DEFAULT = 0.55
GROUPED_PADDING = 0.09
BERT_BASE = {"layers": 12, "hidden": 768, "intermediate": 3072, "vocab": 30522}


def shape_of(config: dict[str, Any], known: dict[str, Any] | None) -> Shape:
    """The start model's size: from the config tacl.experiment.config.start_model_shape found (the model's
    own config.json, a published one, or model_init's sizes), else BERT-base (said so)."""
    if known and known.get("config") and all(known["config"].get(k) for k in (
            "num_hidden_layers", "hidden_size", "intermediate_size")):
        return Shape.of_config(known["config"], known.get("key", "the start model"))
    return Shape(**BERT_BASE, source=f"assumed BERT-base ({config['model']} not found without a download)")


def masked_share(pretrain: dict[str, Any], shape: Shape) -> float:
    """The share of positions the MLM head computes on: pretrain.mlm_probability, else the family's rate."""
    return pretrain.get("mlm_probability") or FAMILIES.get(shape.family, FAMILIES["bert"]).mlm_probability


def train_flops(shape: Shape, seq: float, layers: int | None = None) -> float:
    """FLOPs per token of training an encoder (forward and backward)."""
    share = (shape.layers if layers is None else layers) / shape.layers
    return share * (6 * shape.encoder + 3 * shape.attention_flops(seq))


def forward_flops(shape: Shape, seq: float) -> float:
    return 2 * shape.encoder + shape.attention_flops(seq)


def pretrain_flops_per_token(objective: str, shape: Shape, seq: float, params: dict[str, Any],
                             masked: float | None = None) -> float:
    """FLOPs per (padded) token of a pretraining step of one objective; the MLM head computes on the `masked`
    share of the positions (the family's rate where None)."""
    head = 6 * shape.head * (masked_share({}, shape) if masked is None else masked)
    if objective == "coco_lm":
        aux = params.get("aux_layers") or max(1, shape.layers // 3)
        # the main model on the corrupted sequence and on the cropped original (both trained), the auxiliary
        # MLM model (trained) with its head, the main model's copy and LM heads
        return 2 * train_flops(shape, seq) + train_flops(shape, seq, aux) + 2 * head
    flops = train_flops(shape, seq) + head
    if objective.startswith("tacl"):
        flops += forward_flops(shape, seq)  # the frozen teacher
    return flops


def mean_length(max_len: int, summary: dict[str, Any] | None) -> tuple[float, str]:
    if summary and summary.get("examples"):
        return summary["tokens"] / summary["examples"], "the data stage's mean"
    why = "0.625 x data.max_len (the shared Wikipedia sample's mean; the data stage's own once it has run)"
    return 0.625 * max_len, why


def pretraining_passes(pretrain: dict[str, Any], summary: dict[str, Any] | None) -> str | None:
    """How many times the pretraining steps pass over the shards' sequences, once the data stage has counted
    them (None before, or with nothing to pretrain). A small Wikipedia (another language's) makes it many."""
    if not summary or not summary.get("examples") or not [o for o in pretrain["objectives"] if o != "none"]:
        return None
    sequences = pretrain["steps"] * pretrain["global_batch"]
    passes = sequences / summary["examples"]
    text = (f"pretraining: {pretrain['steps']:,} steps x {pretrain['global_batch']} sequences = "
            f"{sequences / 1e6:.3g} M sequences, {passes:.2g} passes over the shards' {summary['examples']:,}")
    if passes > 1:
        text += (" (each pass masks them anew; fewer pretrain.steps, or a larger data.max_lines where it cuts "
                 "the corpus, give fewer)")
    return text


def padded_length(mean: float, max_len: int, pretrain: dict[str, Any]) -> float:
    if pretrain.get("pad_to_max_len"):
        return float(max_len)
    return min(max_len, mean * (1.10 if pretrain.get("group_by_length", True) else 1.60))


@dataclass
class Gpu:
    name: str
    peak_tflops: float
    pretrain_mfu: float
    finetune_mfu: float
    source: str = "the config's own figures"  # where the figures come from (GPU model, date, command)

    def seconds(self, flops: float, gpus: int, finetune: bool = False) -> float:
        mfu = self.finetune_mfu if finetune else self.pretrain_mfu
        return flops / (gpus * self.peak_tflops * 1e12 * mfu)


def gpus_of(plan: dict[str, Any]) -> dict[str, Gpu]:
    return {k: Gpu(v["name"], v["peak_tflops"], v["pretrain_mfu"], v["finetune_mfu"],
                   v.get("source", "the config's own figures")) for k, v in plan["gpus"].items()}


def pretrain_minutes(objective: str, pretrain: dict[str, Any], shape: Shape, seq: float, gpu: Gpu,
                     steps: int | None = None) -> float:
    """Expected minutes of (the rest of) a pretraining run on its GPUs, without start-up."""
    steps = pretrain["steps"] if steps is None else steps
    ranks = pretrain["nodes"] * pretrain["ranks_per_node"]
    params = pretrain.get("coco_lm", {}) if objective == "coco_lm" else {}
    per_token = pretrain_flops_per_token(objective, shape, seq, params, masked_share(pretrain, shape))
    flops = steps * pretrain["global_batch"] * seq * per_token
    return gpu.seconds(flops, ranks) / 60


def finetune_minutes(task: str, hparams: dict[str, Any], seeds: int, shape: Shape, gpu: Gpu,
                     sizes: dict[str, int] | None = None) -> float:
    """Expected minutes of the seeds of one fine-tuning setting, without start-up: each trains on the train
    split for its epochs and predicts dev and test once."""
    train, evaluated, mean = TASK_SIZES.get(task, UNKNOWN_TASK_SIZE)
    if sizes:
        train = sizes.get("train", train)
        evaluated = sum(n for split, n in sizes.items() if split != "train") or evaluated
    train = min(train, hparams.get("max_train_examples") or train)
    seq = finetune_padded_length(task, hparams, mean)
    flops = (train * hparams.get("epochs", 3) * seq * train_flops(shape, seq)
             + evaluated * seq * forward_flops(shape, seq))
    return seeds * gpu.seconds(flops, 1, finetune=True) / 60


def finetune_padded_length(task: str, hparams: dict[str, Any], mean: float) -> float:
    """The mean padded length a fine-tune computes on: its rows' mean length over the real share of its
    batches (random by default, grouped with group_by_length), at most max_len."""
    grouped = hparams.get("group_by_length", False)
    padding = GROUPED_PADDING if grouped else RANDOM_PADDING.get(task, RANDOM_PADDING_DEFAULT)
    return min(hparams.get("max_len", 128), mean / (1 - padding))


def finetune_mem_mb(task: str, max_len: int, sizes: dict[str, int] | None = None) -> int:
    """Host memory of a fine-tuning job: the process with CUDA's host side (8 GB) and its encoded train split
    (ids, type ids and mask as int64, twice over while batches are built), in whole GB."""
    train = (sizes or {}).get("train") or TASK_SIZES.get(task, UNKNOWN_TASK_SIZE)[0]
    return 1000 * math.ceil((8000 + train * max_len * 48 / 1e6) / 1000)


def similarity_minutes(analysis: dict[str, Any], shape: Shape, gpu: Gpu) -> float:
    """Expected minutes of one model's analyses: a forward pass over the sampled sentences (half max_len long
    on average), at the fine-tuning MFU."""
    seq = analysis["similarity_max_len"]
    tokens = analysis["similarity_sentences"] * seq * 0.5
    return gpu.seconds(tokens * forward_flops(shape, seq), 1, finetune=True) / 60


MIN_SAFETY = 1.25  # a request never sits within 20% of the expected minutes, whatever plan.safety says


def request(expected_minutes: float, plan: dict[str, Any], cap: float | None = None, extra: float = 0.0) -> int:
    """The runtime to ask for: start-up (and `extra`, a chunk's margin) plus safety (at least MIN_SAFETY) x the
    expected minutes, at least the floor, at most `cap`."""
    safety = max(plan["safety"], MIN_SAFETY)
    minutes = max(plan["min_runtime_minutes"], plan["startup_minutes"] + extra + safety * expected_minutes)
    if cap is not None:
        minutes = min(minutes, cap)
    return math.ceil(minutes)


def measured_rest_minutes(marker: dict[str, Any]) -> float | None:
    """Minutes the rest of a run takes at the speed its last chunk measured (steps per second of wall time,
    start-up and saves included), or None when that chunk trained no step."""
    steps, wall = marker.get("steps_this_chunk") or 0, marker.get("wall_s") or 0
    if steps <= 0 or wall <= 0:
        return None
    return (marker["steps"] - marker["step"]) * wall / steps / 60


# -- the plan ---------------------------------------------------------------------------------------------


@dataclass
class Job:
    rule: str
    where: str  # "gpu" (a cluster job with GPUs), "cpu" (a cluster job without) or "login" (this machine)
    gpus: int = 0
    requested_min: float = 0.0  # the runtime asked for (cluster jobs)
    compute_min: float = 0.0  # the expected GPU work on the plan's GPU (GPU jobs), without start-up
    done: bool = False
    key: str = ""  # what the job works on: a pretraining run's objective, a fine-tune's MODEL/TASK
    overhead_min: float = 0.0  # start-up
    finetune: bool = False  # sized with the fine-tuning MFU (fine-tunes and analyses)
    open_ended: bool = False  # a chunk estimated to end on its deadline: how many follow depends on the speed

    @property
    def expected_min(self) -> float:
        return self.compute_min + self.overhead_min


def chunk_requests(minutes: float, pretrain: dict[str, Any], plan: dict[str, Any], cpu: bool
                   ) -> list[tuple[int, float, str]]:
    """(runtime asked for, expected GPU work, what ends it) of each chunk of a run whose work (of
    pretrain.steps steps) is `minutes` on its GPUs, as the chain would go if the estimate holds: each chunk
    asks for the rest of the work (with start-up, margin and the safety factor), at most
    pretrain.chunk.runtime_minutes, and trains until the target ("target"), pretrain.chunk.max_steps steps
    ("max_steps") or that time less start-up and margin ("deadline": then the number of chunks depends on the
    speed the chain really reaches)."""
    chunk = pretrain["chunk"]
    cap, margin = chunk["runtime_minutes"], chunk["margin_minutes"]
    per_chunk = minutes * chunk["max_steps"] / pretrain["steps"] if chunk.get("max_steps") else minutes
    out: list[tuple[int, float, str]] = []
    rest = minutes
    while rest > 1e-9 and len(out) < chunk["max_chunks"]:
        asked = math.ceil(cap) if cpu else request(rest, plan, cap=cap, extra=margin)
        usable = max(asked - plan["startup_minutes"] - margin, asked / 2)
        done = min(rest, usable, per_chunk)
        ends = "target" if done >= rest else ("deadline" if usable < per_chunk else "max_steps")
        out.append((asked, done, ends))
        rest -= done
    return out


def expected_gpu_hours(jobs: list[Job], base: Gpu, gpu: Gpu) -> float:
    """The jobs' expected GPU-hours on `gpu`, their work having been estimated on `base`."""
    total = 0.0
    for job in jobs:
        rate = (base.finetune_mfu / gpu.finetune_mfu) if job.finetune else (base.pretrain_mfu / gpu.pretrain_mfu)
        total += job.gpus * (job.compute_min * base.peak_tflops / gpu.peak_tflops * rate + job.overhead_min)
    return total / 60


def longest_chain(jobs: list[Job], start_from: dict[str, str]) -> list[tuple[str, float]]:
    """The longest chain of jobs that follow one another, with their expected minutes: the data stage, the
    longest pretraining run's chunks and export, the longest fine-tune (after its source task's selection,
    with finetune.start_from), its selection and the report."""
    def first(rule: str) -> list[tuple[str, float]]:
        return [(rule, 0.0)] if any(j.rule == rule for j in jobs) else []

    chain = first("download_corpus") + first("clean") + first("shard") + first("gather_shards")
    runs: dict[str, list[Job]] = {}
    for j in jobs:
        if j.rule == "pretrain_chunk":
            runs.setdefault(j.key, []).append(j)
    if runs:
        longest = max(runs.values(), key=lambda js: sum(j.expected_min for j in js))
        chain += [(j.rule, j.expected_min) for j in longest] + [("export_model", 0.0)]
    else:
        chain += first("init_model") + first("export_start")
    tunes: dict[str, float] = {}
    for j in jobs:
        if j.rule == "finetune":
            tunes[j.key] = max(tunes.get(j.key, 0.0), j.expected_min)

    def path(key: str) -> list[tuple[str, float]]:
        model, task = key.split("/")
        source = start_from.get(task)
        first = f"{model}/{source}"
        before = path(first) + [("select_setting", 0.0)] if source and first in tunes else []
        return before + [("finetune", tunes[key])]

    if tunes:
        chain += max((path(k) for k in tunes), key=lambda c: sum(m for _, m in c)) + [("select_setting", 0.0)]
    return chain + first("report")


@dataclass
class Disk:
    parts: dict[str, float] = field(default_factory=dict)  # what -> bytes

    @property
    def total(self) -> float:
        return sum(self.parts.values())


def checkpoint_bytes(shape: Shape, bf16: bool, zero_stage: int) -> float:
    """One checkpoint: the weights (bf16 at ZeRO 1-3 in bf16, with fp32 masters beside them; fp32 otherwise)
    and AdamW's two fp32 moments."""
    weights, masters = (2, 4) if bf16 and zero_stage else (4, 0)
    return shape.total * (weights + masters + 8)


def corpus_tokens(max_lines: int, source: dict[str, Any] | None = None) -> float:
    """Tokens of a cleaned corpus of max_lines lines (0: no cap), before the data stage has counted them:
    about 30 per line on the shared Wikipedia sample ([CLS] and [SEP] included), and, for local files (a
    `wikiextractor` or `text` source), at most one per 4.5 bytes of them (the same sample: 4.6); a Hub
    source without a cap counts as 20M lines."""
    capped = 30.0 * max_lines if max_lines else None
    patterns = (source or {}).get("paths") or []
    found = [[Path(p) for p in glob.glob(pattern)] for pattern in patterns]
    if patterns and all(found):
        size = sum(disk_bytes(p) for paths in found for p in paths)
        return min(size / 4.5, capped) if capped else size / 4.5
    return capped or 30.0 * 20_000_000


def disk_at_peak(shape: Shape, tokens: float, runs: int, keep: int, bf16: bool, zero_stage: int, exported: int,
                 kept_finetunes: int) -> Disk:
    """What the run holds on disk at its peak, every pretraining run in flight at once: the cleaned corpus
    and its shards, keep + 1 checkpoints per run (the newest is written before the oldest goes; a save that a
    killed chunk left unfinished is removed when the next chunk starts, before it saves, so never more), the
    exported models and the fine-tuned weights that other tasks start from (finetune.start_from)."""
    parts = {"corpus and shards": tokens * (4.3 + (2 if shape.vocab < 65536 else 4) + 0.1)}
    if runs:
        parts[f"checkpoints ({runs} x {keep + 1})"] = runs * (keep + 1) * checkpoint_bytes(shape, bf16, zero_stage)
    parts["exported models"] = exported * shape.total * 4
    if kept_finetunes:
        parts["fine-tuned weights kept"] = kept_finetunes * (shape.total - shape.head) * 4
    return Disk(parts)


def hours(minutes: float) -> str:
    return f"{minutes / 60:.1f} h"


def gpu_hours(jobs: list[Job]) -> tuple[float, float]:
    """The GPU-hours the jobs ask for and are expected to take on the GPU the runtimes are sized for."""
    return sum(j.requested_min * j.gpus for j in jobs) / 60, sum(j.expected_min * j.gpus for j in jobs) / 60


def format_plan(jobs: list[Job], chain: list[tuple[str, float]], disk: Disk, assumptions: list[str],
                gpu_names: dict[str, tuple[float, str]]) -> str:
    """The plan as the start of a run prints it. `chain`: the longest chain of jobs, (rule, expected minutes);
    `gpu_names`: the expected GPU-hours on each GPU model, {key: (hours, name)} (none: a run on CPUs, whose
    runtimes are the configured ones). A job not `done` is to run (its output is not there, or was made with
    settings that changed); a rule with `open_ended` jobs to run counts "at least" (>=) that many."""
    rules: dict[str, list[Job]] = {}
    for job in jobs:
        rules.setdefault(job.rule, []).append(job)
    lines = ["Plan of this run (the whole experiment; 'to run': outputs not there yet, or made with settings that "
             "changed; GPU-hours asked for and expected on the GPU the runtimes are sized for):",
             f"  {'rule':<18} {'jobs':>6} {'to run':>7} {'GPU-h asked':>12} {'expected':>9}  where"]
    where_words = {"gpu": "GPU job", "cpu": "CPU job", "login": "this machine (localrules)"}

    def count(n: int, group: list[Job]) -> str:
        return f">={n}" if any(j.open_ended and not j.done for j in group) else str(n)

    for rule, group in rules.items():
        wheres = sorted({j.where for j in group})
        asked, expected = gpu_hours(group)
        figures = f"{asked:>12.1f} {expected:>9.1f}" if "gpu" in wheres else f"{'':>12} {'':>9}"
        lines.append(f"  {rule:<18} {count(len(group), group):>6} {count(sum(not j.done for j in group), group):>7} "
                     f"{figures}  {', '.join(where_words[w] for w in wheres)}")
    by_class = {w: sum(1 for j in jobs if j.where == w) for w in ("gpu", "cpu", "login")}
    more = any(j.open_ended and not j.done for j in jobs)
    lines.append(f"  jobs: {'at least ' if more else ''}{len(jobs)} ({by_class['gpu']} with GPUs, {by_class['cpu']} "
                 f"without, {by_class['login']} on this machine; {sum(not j.done for j in jobs)} to run)")
    if more:
        lines.append("  >=: pretraining chunks estimated to end on their deadline (pretrain.chunk.runtime_minutes): "
                     "the chain takes as many as the speed it reaches needs")
    requested, expected = gpu_hours(jobs)
    todo_req = gpu_hours([j for j in jobs if not j.done])[0]
    ratio = f"{requested / expected:.1f}x" if expected else "-"
    if gpu_names:
        lines.append(f"  GPU-hours requested: {requested:.1f} ({todo_req:.1f} still to run); expected: "
                     + ", ".join(f"{h:.1f} on {name}" for h, name in gpu_names.values())
                     + f"; requested / expected: {ratio}")
    work = f", {hours(sum(m for _, m in chain))} of GPU work on it" if gpu_names else ""
    lines.append(f"  longest chain: {len(chain)} jobs{work} (" + " -> ".join(_runs(chain)) + ")")
    lines.append(f"  disk at the peak: {size_text(disk.total)} ("
                 + ", ".join(f"{k} {size_text(v)}" for k, v in disk.parts.items()) + ")")
    lines += [f"  assumed: {a}" for a in assumptions]
    return "\n".join(lines)


def _runs(chain: list[tuple[str, float]]) -> list[str]:
    """Rule names of a chain, repeats folded: pretrain_chunk x3."""
    out: list[list] = []
    for rule, _ in chain:
        if out and out[-1][0] == rule:
            out[-1][1] += 1
        else:
            out.append([rule, 1])
    return [f"{r} x{n}" if n > 1 else r for r, n in out]
