"""What a results directory is to hold, as the config asks for it: `RESULTS_DIR/expected.json`, written by the
workflow whenever Snakemake starts jobs (onstart). `tacl report RESULTS_DIR` and `tacl status` read it, so
that they know the expected runs without the config or Snakemake: tables from what has finished can be made
at any time, beside a running workflow, and name the runs still missing.

Its paths are relative to the results directory; `results_dir` is the directory as the config names
it (the report's title says the same in both ways of making it)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tacl.runtime.layout import Layout
from tacl.runtime.io import InputError, read_json, write_json_atomic

EXPECTED = "expected.json"
VERSION = 1
# In the report folder: what the tables were built from (runs found, missing), written last by the workflow's
# report rule, its output that the workflow asks for. Any other report (the one written after a failed job,
# `tacl report RESULTS_DIR`) removes it, so that Snakemake never takes those tables for the rule's.
RECORD = "report.json"


def write_expected(results_dir: str | Path, expected: dict[str, Any]) -> Path:
    path = Path(results_dir, EXPECTED)
    write_json_atomic(path, {"version": VERSION, **expected})
    return path


def read_expected(results_dir: str | Path) -> dict[str, Any] | None:
    """What the results directory is to hold, or None when there is none (a results directory no Snakemake of
    this version has run in)."""
    path = Path(results_dir, EXPECTED)
    if not path.is_file():
        return None
    wanted = read_json(path)
    if wanted.get("version") != VERSION:
        raise InputError(f"{path}: written by another version of the workflow (version {wanted.get('version')}, "
                         f"this one reads {VERSION}); run snakemake once more to rewrite it")
    return wanted


def report_inputs(results_dir: str | Path, wanted: dict[str, Any]) -> dict[str, Any]:
    """build_report's arguments for what `wanted` (expected.json) asks for: the same as the workflow's report
    rule passes (the analysis files that exist so far), with paths under `results_dir`."""
    layout = Layout(str(Path(results_dir)))
    similarity = [Path(layout.similarity(m)) for m in wanted["analysed_models"]]
    embeddings = [Path(layout.embeddings(m)) for m in wanted["analysed_models"]]
    png, cls_png = Path(layout.similarity_png), Path(layout.cls_png)
    return {"results_dir": layout.results, "models": wanted["models"], "tasks": wanted["tasks"],
            "expected": wanted["expected"], "similarity": [str(p) for p in similarity if p.is_file()],
            "out_dir": layout.report, "similarity_png": str(png) if png.is_file() else None,
            "cls_png": str(cls_png) if cls_png.is_file() else None,
            "embeddings": [str(p) for p in embeddings if p.is_file()] if wanted["embeddings_enabled"] else [],
            "embeddings_enabled": wanted["embeddings_enabled"], "name": wanted["results_dir"]}


def report_now(results_dir: str | Path) -> dict[str, Any]:
    """Every table, plot, report.md and report.html from what has finished so far (reads files, starts
    nothing); returns the runs found and the missing ones."""
    from tacl.report.compose import build_report

    wanted = read_expected(results_dir)
    if wanted is None:
        raise InputError(f"{Path(results_dir, EXPECTED)}: not found; the workflow writes it when Snakemake starts "
                         "jobs for this results directory (run snakemake once), and the tables need it to know "
                         "which runs the config asks for")
    return build_report(**report_inputs(results_dir, wanted))
