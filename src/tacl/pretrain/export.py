"""`tacl pretrain export`: the finished student (or, for objective `none`, the starting checkpoint) in
Hugging Face format, with a JSON summary of the run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tacl.pretrain import checkpoint
from tacl.pretrain.metrics import read_metrics
from tacl.pretrain.model import checkpoint_state_dict, export_model, start_identity
from tacl.runtime.io import InputError, read_json


REMOVED = "checkpoints-removed.json"  # in a run directory whose checkpoints went after its export


def removed_note(run_dir: str | Path) -> dict[str, Any] | None:
    path = Path(run_dir) / REMOVED
    return read_json(path) if path.is_file() else None


def removed_message(run_dir: str | Path, note: dict[str, Any]) -> str:
    return (f"{run_dir}: its checkpoints were removed after the model was exported to {note['export']} "
            f"(pretrain.remove_checkpoints: true; the run had reached step {note['step']}), and this job needs "
            f"them. To train the run again from the start model, delete {run_dir} and run again; if nothing "
            "about the run changed, `snakemake ... --touch` marks its finished outputs up to date instead")


def remove_checkpoints(run_dir: str, out_dir: str, tag: str) -> None:
    """After the export is written (pretrain.remove_checkpoints): the checkpoints go, a note stays."""
    import shutil

    from tacl.runtime.io import write_json_atomic

    write_json_atomic(Path(run_dir) / REMOVED, {"export": out_dir, "checkpoint": tag, "step": int(tag[4:])})
    shutil.rmtree(Path(run_dir) / checkpoint.CHECKPOINTS)


def export(start_model: str, out_dir: str, summary_path: str, run_dir: str | None = None,
           marker: str | None = None, remove: bool = False) -> dict[str, Any]:
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
        note = removed_note(run_dir)
        raise InputError(removed_message(run_dir, note) if note else f"{run_dir}: no checkpoint to export")
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
    if remove:
        remove_checkpoints(run_dir, out_dir, tag)
    return summary
