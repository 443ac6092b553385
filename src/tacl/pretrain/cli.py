"""`tacl pretrain ...`: init-model, train (one chunk), export."""

from __future__ import annotations

import argparse
import json
import os
import sys


def register(stages: argparse._SubParsersAction) -> None:
    p = stages.add_parser("pretrain", help="continual pretraining on DeepSpeed, in resumable chunks")
    cmds = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    c = cmds.add_parser("init-model", help="write the starting checkpoint (login node: may download)")
    c.add_argument("--model", required=True, help="HF name, local directory or package:NAME")
    c.add_argument("--init", default='{"kind": "pretrained"}', help="model_init as JSON")
    c.add_argument("--tokenizer", required=True, help="tokenizer directory (from `tacl data tokenizer`)")
    c.add_argument("--out", required=True)
    c.set_defaults(func=_init_model, online=True)

    c = cmds.add_parser("train", help="train one chunk: until the target step, the deadline or a signal")
    c.add_argument("--run-dir", required=True, help="checkpoints, metrics, lock (not a Snakemake output)")
    c.add_argument("--start-model", required=True)
    c.add_argument("--manifest", required=True)
    c.add_argument("--settings", required=True,
                   help="TrainSettings as JSON: all of them, or (with --operational) the result settings")
    c.add_argument("--operational", help="the operational settings as JSON (log and checkpoint intervals, ...), "
                                         "which the workflow passes apart from the result settings")
    c.add_argument("--marker", help="JSON written at the end: step reached, done or not")
    c.add_argument("--chunk", type=int, default=0)
    c.add_argument("--deadline", type=float, help="unix time by which the chunk must have exited")
    c.add_argument("--runtime-minutes", type=float, help="the job's wall-clock limit, counted from start")
    c.add_argument("--margin-minutes", type=float, default=10.0, help="stop this long before the deadline")
    c.add_argument("--max-steps", type=int, help="train at most this many steps in this chunk")
    c.add_argument("--nproc", type=int, default=1, help="ranks on this node (re-launches under torchrun)")
    c.add_argument("--no-tensorboard", action="store_true")
    c.add_argument("--tracking", help="the trackers beside TensorBoard (W&B, MLflow) as JSON "
                                      "(tacl.runtime.tracking.job_spec; config `tracking`)")
    c.set_defaults(func=_train)

    c = cmds.add_parser("export", help="save_pretrained the trained student (or the start model)")
    c.add_argument("--start-model", required=True)
    c.add_argument("--run-dir", help="omit to export the starting checkpoint itself (objective none)")
    c.add_argument("--marker", help="the final chunk's marker (must say done)")
    c.add_argument("--out", required=True)
    c.add_argument("--summary", required=True)
    c.add_argument("--remove-checkpoints", action="store_true",
                   help="after the export is written, remove the run's checkpoints (pretrain.remove_checkpoints)")
    c.set_defaults(func=_export)


def _init_model(a: argparse.Namespace) -> None:
    from tacl.pretrain.model import init_start_model

    print(json.dumps(init_start_model(a.model, json.loads(a.init), a.tokenizer, a.out)))


def _train(a: argparse.Namespace) -> int:
    if a.nproc > 1 and "RANK" not in os.environ:
        from tacl.pretrain.distributed import free_port

        argv = sys.argv[1:]
        i = argv.index("--nproc")
        del argv[i : i + 2]
        cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={a.nproc}",
               f"--master_port={free_port()}", "-m", "tacl", *argv]
        os.execv(sys.executable, cmd)
    from tacl.pretrain.settings import TrainSettings
    from tacl.pretrain.trainer import ChunkArgs, train_chunk

    given = json.loads(a.settings)
    if a.operational is not None:
        settings = TrainSettings.from_parts(given, json.loads(a.operational))
    else:
        markers = ("data_version", "bf16_version")
        settings = TrainSettings.from_dict({k: v for k, v in given.items() if k not in markers})
    marker = train_chunk(ChunkArgs(a.run_dir, a.start_model, a.manifest, settings, a.marker, a.chunk, a.deadline,
                                   a.runtime_minutes, a.margin_minutes, a.max_steps,
                                   not a.no_tensorboard, json.loads(a.tracking) if a.tracking else None))
    print(json.dumps(marker))
    return 0


def _export(a: argparse.Namespace) -> None:
    from tacl.pretrain.export import export

    print(json.dumps(export(a.start_model, a.out, a.summary, a.run_dir, a.marker, a.remove_checkpoints)))
