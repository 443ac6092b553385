"""`tacl pretrain export`: the finished student (or, for objective `none`, the starting checkpoint) in
Hugging Face format, with a JSON summary of the run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tacl.io import InputError, read_json
from tacl.pretrain import checkpoint
from tacl.pretrain.metrics import read_metrics
from tacl.pretrain.model import checkpoint_state_dict, export_model, start_identity


def export(start_model: str, out_dir: str, summary_path: str, run_dir: str | None = None,
           marker: str | None = None) -> dict[str, Any]:
    if run_dir is None:
        summary = {"objective": "none", "steps": 0, "tokens": 0, "wall_s": 0.0,
                   "start_model": start_identity(start_model)}
        export_model(None, start_model, out_dir, summary, summary_path)
        return summary
    final = read_json(marker) if marker else None
    if final is not None and not final["done"]:
        raise InputError(f"{marker}: the run has not reached its target step ({final['step']}/{final['steps']})")
    tag = checkpoint.latest_tag(run_dir)
    if tag is None:
        raise InputError(f"{run_dir}: no checkpoint to export")
    chunks = sorted(Path(marker).parent.glob("chunk-*.json")) if marker else []
    metrics = read_metrics(run_dir)
    last = metrics[-1] if metrics else {}
    summary = {
        "objective": final["objective"] if final else read_json(Path(run_dir) / "run.json")["settings"]["objective"],
        "steps": final["step"] if final else int(tag[4:]),
        "samples": final["samples"] if final else None,
        "tokens": final["tokens"] if final else last.get("tokens"),
        "chunks": len(chunks),
        "wall_s": round(sum(read_json(c)["wall_s"] for c in chunks), 1),
        "final": {k: v for k, v in last.items() if k not in ("step", "samples", "elapsed_s")},
        "checkpoint": tag,
        "start_model": start_identity(start_model),
    }
    export_model(checkpoint_state_dict(Path(run_dir) / checkpoint.CHECKPOINTS, tag), start_model, out_dir,
                 summary, summary_path)
    return summary
