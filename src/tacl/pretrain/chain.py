"""The chain of a pretraining run's chunk jobs as the workflow follows it: chunk k's marker
(`pretrain/OBJECTIVE/chunk-K.json`) says whether the run is done; if not, chunk k+1 goes on from the checkpoint.

`pretrain.chunk.max_chunks` bounds the chunks that one run of the workflow starts, not the chain: the chunks
already there when Snakemake started are followed whatever the cap says (a finished chain is found after the
cap was lowered), and a run stopped by the cap goes on when the same command runs again."""

from __future__ import annotations

import os
from typing import Callable

from tacl.runtime.io import InputError, read_json


def chunks_present(marker_of: Callable[[int], str]) -> int:
    """How many chunks of a chain have their markers, from chunk 0 on without a gap (those a run of the
    workflow finds when it starts)."""
    k = 0
    while os.path.exists(marker_of(k)):
        k += 1
    return k


def final_marker(objective: str, marker_of: Callable[[int], str], present: int, cap: int) -> str:
    """The marker of the chunk that finished the run: chunk 0, 1, ... followed until one says done.
    `marker_of(k)` gives chunk k's marker (in the workflow it raises while chunk k is still to run, which
    makes Snakemake run it); the first `present` chunks were there when this run of the workflow started,
    and at most `cap` more are started. Past that, an InputError that names the cap and says that the same
    command goes on."""
    k = 0
    while True:
        path = marker_of(k)
        marker = read_json(path)
        if marker["done"]:
            return path
        k += 1
        if k >= present + cap:
            raise InputError(
                f"pretraining {objective}: not done after pretrain.chunk.max_chunks={cap} chunks in this run of "
                f"the workflow (step {marker['step']} of {marker['steps']} after {k} chunks in all; see {path}). "
                f"The same command again goes on from the checkpoint, with up to {cap} more chunks; raise "
                "pretrain.chunk.max_chunks or pretrain.chunk.runtime_minutes to go further in one run")
