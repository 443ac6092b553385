"""`tacl finetune submissions`: one zip per model with what goes to the GLUE test server and the SQuAD
predictions, from the setting selected on dev for each task (its best dev seed), never from the others."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path
from typing import Any

from tacl.runtime.io import InputError, atomic_path, read_json


def selected_run(selection: str | Path, with_label: bool = False) -> Path | tuple[Path, str]:
    """The run folder a selection (finetune/MODEL/TASK/selected.json) points at: its setting's best seed
    (with_label: and TASK:SETTING/seedN, naming it)."""
    chosen = read_json(selection)
    run = Path(selection).parent / chosen["setting"] / f"seed{chosen['best_seed']}"
    return (run, f"{chosen['task']}:{chosen['setting']}/seed{chosen['best_seed']}") if with_label else run


def package(selections: list[str], out_zip: str) -> dict[str, Any]:
    """Zip the selected runs' GLUE test predictions (the server's file names, e.g. QNLI.tsv, MNLI-m.tsv) and
    SQuAD dev predictions (TASK-dev-predictions.json), with selection.json saying where each file came from."""
    manifest = []
    files: dict[str, Path] = {}
    for selection in selections:
        run = selected_run(selection)
        task = read_json(selection)["task"]
        if not (run / "metrics.json").is_file():
            raise InputError(f"{selection}: the selected run {run} has no metrics.json")
        entry = {"task": task, "run": str(run), "files": []}
        for path in sorted((run / "submission").glob("*.tsv")):
            files[path.name] = path
            entry["files"].append(path.name)
        if (run / "predictions.json").is_file():
            name = f"{task}-dev-predictions.json"
            files[name] = run / "predictions.json"
            entry["files"].append(name)
        manifest.append(entry)
    with atomic_path(out_zip) as tmp:
        with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as z:
            for name, path in sorted(files.items()):
                z.write(path, arcname=name)
            z.writestr("selection.json", json.dumps(manifest, indent=1))
    return {"zip": out_zip, "files": sorted(files)}
