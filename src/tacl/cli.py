"""`tacl <stage> <command> ...`: the command line every Snakemake rule calls.

Each stage registers its commands in its own `cli.py`; the commands only parse arguments and call a
function that tests call directly. Bad input ends with one line `tacl: error: ...` and exit status 2 (with
the traceback before it when TACL_DEBUG is set), or the error's own `exit_status` where it has one (a GPU
that will not take the process: tacl.runtime.device.GpuUnavailable).
"""

from __future__ import annotations

import argparse
import errno
import importlib
import logging
import os
import sys
import threading
import traceback

from tacl.cluster.workstation import claim_for_job
from tacl.runtime import signals
from tacl.runtime.io import InputError

STAGES = ("data", "pretrain", "finetune", "analysis", "report", "cluster")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tacl", description=__doc__.splitlines()[0])
    stages = parser.add_subparsers(dest="stage", required=True, metavar="STAGE")
    for name in STAGES:
        importlib.import_module(f"tacl.{name}.cli").register(stages)
    importlib.import_module("tacl.runtime.device").register(stages)  # `tacl doctor`
    importlib.import_module("tacl.planning.cli").register(stages)  # `tacl plan`
    importlib.import_module("tacl.experiment.config").register(stages)  # `tacl config reference`
    importlib.import_module("tacl.planning.figures").register(stages)  # `tacl figures`
    importlib.import_module("tacl.runtime.tracking").register(stages)  # `tacl track sync`
    return parser


def main(argv: list[str] | None = None) -> int:
    if argv is None:  # (the process's own command line: a trainer's catches the stop signals first thing,
        argv = sys.argv[1:]  # as `python -m tacl` does; called with arguments, a test's process is left alone)
        if argv[:2] in signals.TRAINERS:
            signals.catch()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    parser = build_parser()
    if argv[:1] == ["plan"] and argv[1:2] not in (["-h"], ["--help"]):
        args = parser.parse_args(["plan"])
        args.snakemake_args = argv[1:]  # (Snakemake's own: --profile, --configfile, ...)
    else:
        args = parser.parse_args(argv)
    if not getattr(args, "online", False):
        # Only the download commands (run on the login node) may reach the Hugging Face Hub; every other
        # command reads the local cache, as compute nodes without internet must.
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")  # no load reports and advisory warnings in logs
    os.environ.setdefault("HF_HUB_VERBOSITY", "error")  # (a Hub out of reach: no line per retry; one error at the end)
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")  # (also silences transformers' loading bars)
    threading.excepthook = _thread_error
    try:
        # one machine with several GPUs (profiles/workstation): this job's own GPUs, before CUDA starts
        claim_for_job(args)
        result = args.func(args)
    except InputError as e:
        if os.environ.get("TACL_DEBUG"):
            traceback.print_exc()
        print(f"tacl: error: {e}", file=sys.stderr)
        return getattr(e, "exit_status", 2)
    except Exception as e:  # noqa: BLE001 (a full disk is said in one line; every other error as it is)
        full = no_space(e)
        if full is None:
            raise
        if os.environ.get("TACL_DEBUG"):
            traceback.print_exc()
        print(f"tacl: error: {full}", file=sys.stderr)
        return 2
    return int(result or 0)


def _thread_error(hook: threading.ExceptHookArgs) -> None:
    """A background thread's error (a TensorBoard event writer's, say): a full disk is left to the one line the
    job's own error gets (`no_space`) when the job next writes, not printed as a traceback first; any other is
    printed as Python prints it."""
    if hook.exc_value is not None and no_space(hook.exc_value) is not None:
        logging.getLogger("tacl").debug("a background thread stopped: %s", hook.exc_value)
        return
    threading.__excepthook__(hook)


NO_SPACE = (errno.ENOSPC, errno.EDQUOT)
NO_SPACE_WORDS = ("no space left on device", "disk quota exceeded", "file write failed")


def no_space(error: BaseException) -> str | None:
    """The one line for an error that a full file system (or an exhausted quota) caused, anywhere in `error`'s
    chain (torch.save's writer says only "file write failed"); None for any other error."""
    at, seen = error, []
    while at is not None and all(at is not s for s in seen):
        seen.append(at)
        if (isinstance(at, OSError) and at.errno in NO_SPACE) or any(w in str(at).lower() for w in NO_SPACE_WORDS):
            where = f" ({at.filename})" if isinstance(at, OSError) and at.filename else ""
            return (f"no space left on the file system{where}, or the quota there is used up: free space (or raise "
                    "the quota), then run the same command again; what this job saved before is intact (files are "
                    "written under temporary names and renamed once whole)")
        at = at.__cause__ or at.__context__
    return None


if __name__ == "__main__":
    sys.exit(main())
