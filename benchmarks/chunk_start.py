"""A pretraining chunk's start-up: DeepSpeed's import as the trainer does it (`import_deepspeed`: MLflow hidden
while it imports) against a plain `import deepspeed` (whose autotuner imports MLflow when it is installed),
each in fresh processes, alternated, after torch is imported (torch's own import is the same in both and
timed apart). Every rank of every chunk pays this once. Prints the median seconds of each and their ratio.

    python benchmarks/chunk_start.py [--repeats 5]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

TIMED = """
import sys, time
import torch
t = time.perf_counter()
{body}
print(time.perf_counter() - t, "mlflow" in sys.modules)
"""
WAYS = {
    "plain `import deepspeed`": "import deepspeed",
    "import_deepspeed()": "from tacl.pretrain.distributed import import_deepspeed\nimport_deepspeed()",
}


def timed(body: str) -> tuple[float, bool]:
    """(seconds, whether MLflow was imported) of `body` in a fresh interpreter, after torch's import."""
    proc = subprocess.run([sys.executable, "-c", TIMED.format(body=body)], capture_output=True, text=True,
                          check=True, cwd=REPO)
    seconds, mlflow = proc.stdout.split()[-2:]
    return float(seconds), mlflow == "True"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    times: dict[str, list[float]] = {way: [] for way in WAYS}
    imported: dict[str, bool] = {}
    for _ in range(args.repeats):
        for way, body in WAYS.items():
            seconds, imported[way] = timed(body)
            times[way].append(seconds)
    for way, values in times.items():
        print(f"{way:28s} median {statistics.median(values):.2f} s over {len(values)} processes "
              f"(MLflow imported: {imported[way]})")
    plain, ours = (statistics.median(times[way]) for way in WAYS)
    print(f"ratio plain/ours {plain / ours:.2f}x, {plain - ours:.2f} s saved per rank per chunk")


if __name__ == "__main__":
    main()
