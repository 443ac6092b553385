"""What the workflow's report rule and handlers do, from the config and the results folder: the report rule's
arguments (the same ones after a failed job, for tables from whatever has finished: onerror) and what onstart
writes to RESULTS_DIR/expected.json (tacl.report.expected). Above the stages: it reads the config's lists
(tacl.experiment.design)."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

from tacl.experiment.design import embeddings_enabled, expected_runs, finetune_models, tabled_models
from tacl.runtime.layout import Layout


def embeddings_outputs(config: dict[str, Any], layout: Layout) -> list[str]:
    """Every model's sentence-embedding results, when that evaluation runs (analysis.embeddings.enabled)."""
    if not embeddings_enabled(config):
        return []
    return [layout.embeddings(m) for m in finetune_models(config)]


def report_args(config: dict[str, Any], layout: Layout) -> str:
    """Arguments of `tacl report`, shared by the rule and the onerror handler: the analyses that are there."""
    similarity = [layout.similarity(m) for m in finetune_models(config)]
    args = [
        "--results", layout.results,
        "--models", *tabled_models(config),
        "--tasks", *config["finetune"]["tasks"],
        "--expected", json.dumps(expected_runs(config)),
        "--similarity", *[p for p in similarity if os.path.exists(p)],
        "--embeddings", *[p for p in embeddings_outputs(config, layout) if os.path.exists(p)],
        *([] if embeddings_enabled(config) else ["--embeddings-disabled"]),
        "--out", layout.report,
    ]
    if os.path.exists(layout.similarity_png):
        args += ["--similarity-png", layout.similarity_png]
    if os.path.exists(layout.cls_png):
        args += ["--cls-png", layout.cls_png]
    return " ".join(shlex.quote(str(a)) for a in args)


def expected_of(config: dict[str, Any], layout: Layout) -> dict[str, Any]:
    """What this results directory is to hold (RESULTS_DIR/expected.json, less its version), for `tacl report
    RESULTS_DIR` (tables from what has finished, at any time) and `tacl status`, which read files only."""
    return {
        "results_dir": layout.results,
        "objectives": config["pretrain"]["objectives"],
        "models": tabled_models(config),
        "analysed_models": finetune_models(config),
        "tasks": config["finetune"]["tasks"],
        "expected": expected_runs(config),
        "embeddings_enabled": embeddings_enabled(config),
        "language": config["data"]["language"],  # (the training text's, for the model cards: tacl publish)
    }


def partial_report(config: dict[str, Any], layout: Layout, src: str) -> None:
    """After a failed job: tables from whatever has finished (`tacl report` from the checkout's `src`), so that
    one failure never hides the rest; nothing before any fine-tune has finished."""
    if not any(os.path.exists(f"{layout.run_dir(r)}/metrics.json") for r in expected_runs(config)):
        return
    cmd = f"{sys.executable} -m tacl report {report_args(config, layout)}"
    env = dict(os.environ, PYTHONPATH=src + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run(cmd, shell=True, env=env, capture_output=True, text=True, check=False)
    if proc.returncode == 0:
        print(f"\nsome jobs failed; tables from the finished runs: {layout.report}/report.md")
    else:
        print(f"\nsome jobs failed, and the partial report failed too:\n{proc.stderr[-2000:]}")


def track_report(config: dict[str, Any], layout: Layout) -> None:
    """onsuccess: the report's tables (CSV as tracker tables, and report.md) and the resolved config, to the
    config's trackers beyond TensorBoard (tacl.runtime.tracking), in one tracked run of kind `report`; sent
    again only when the report's record changed since they were last sent (its hash kept with the run's ids
    in RESULTS_DIR/tracking/report.json). A tracker that fails says so in one line; the workflow has
    succeeded all the same."""
    from tacl.report.expected import RECORD
    from tacl.runtime.io import sha256_file, write_json_atomic
    from tacl.runtime.tracking import FINISHED, RunInfo, TrackedRun, job_spec

    spec = job_spec(config.get("tracking") or {}, layout.results)
    record = Path(layout.report) / RECORD
    if spec is None or not record.is_file():
        return
    state = Path(layout.tracking) / "report.json"
    digest = sha256_file(record)[:16]
    if state.is_file() and json.loads(state.read_text()).get("sent") == digest:
        return
    report = Path(layout.report)
    run = TrackedRun(spec, state, RunInfo(kind="report", name="report", group="report", identity="report",
                                          config=config))
    run.files(sorted(report.glob("*.csv")) + sorted(report.glob("report.md")), "report")
    run.close(FINISHED)
    if not run.failed:
        write_json_atomic(state, {**run.state, "sent": digest})
        print(f"report's tables sent to {', '.join(spec['trackers'])} (docs/tracking.md)")
