"""The figures README.md and docs/ quote, each from one place: what the paper's experiment costs (the plan of a
fresh run of config.yaml, computed as the workflow computes it), the figures measured once, on a stated
machine (docs/figures.yaml: the demo's time), and the demo's GLUE table (from a finished `make demo` in the
checkout, which `--write` needs for that block). A document holds each in a generated block,

    <!-- figures: NAME -->TEXT<!-- /figures -->

(invisible markers in the rendered page); `tacl figures --write` rewrites every block of README.md and
docs/*.md, and tests/test_docs.py fails where one differs from what this module makes of its source."""

from __future__ import annotations

import re
import tempfile
from pathlib import Path
from typing import Any

import yaml

from tacl.experiment.config import SCHEMA
from tacl.runtime.io import InputError, size_text, write_text_atomic

REPO = SCHEMA.parents[2]  # the checkout this package is imported from
MEASURED = REPO / "docs" / "figures.yaml"
BLOCK = re.compile(r"<!-- figures: ([\w-]+) -->(.*?)<!-- /figures -->", re.S)


def documents() -> list[Path]:
    return [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


def paper_config(config_path: Path = REPO / "config.yaml", results_dir: str = "results/paper") -> dict[str, Any]:
    """config.yaml with the schema's defaults filled in, as the workflow reads it."""
    from snakemake.utils import validate

    config = yaml.safe_load(Path(config_path).read_text())
    config["results_dir"] = results_dir
    validate(config, str(SCHEMA), set_default=True)
    return config


def paper_plan(config_path: Path = REPO / "config.yaml") -> str:
    """config.yaml's plan, as `tacl plan` prints it for a run that has not started: jobs, GPU-hours asked for
    and expected on each GPU of plan.gpus, pretraining's and fine-tuning's share, disk at the peak."""
    from tacl.runtime.layout import Layout
    from tacl.planning import estimates
    from tacl.planning.plan import disk, expected_on_each_gpu, plan_jobs
    from tacl.planning.sizing import Sizing

    with tempfile.TemporaryDirectory() as tmp:
        config = paper_config(config_path, f"{tmp}/results")  # (nothing done yet)
        sizing = Sizing.of(config, Layout.of(config))
        jobs = plan_jobs(sizing, set())
        peak = disk(sizing)
    asked, expected = estimates.gpu_hours(jobs)
    on = expected_on_each_gpu(sizing, jobs)
    first, *others = on.values()
    rules = {rule: estimates.gpu_hours([j for j in jobs if j.rule == rule])[1]
             for rule in ("pretrain_chunk", "finetune")}
    return (f"{len(jobs)} jobs, {sum(1 for j in jobs if j.gpus)} of them on GPUs; {asked:.1f} GPU-hours asked for "
            f"against {first[0]:.1f} expected on {first[1]}" +
            (f" ({', '.join(f'{h:.1f} on {name}' for h, name in others)})" if others else "") +
            f": pretraining {rules['pretrain_chunk']:.1f} of them, fine-tuning {rules['finetune']:.1f}; "
            f"{size_text(peak.total)} of disk at the peak")


def paper_rates(config_path: Path = REPO / "config.yaml") -> str:
    """The rates config.yaml's plan assumes, per GPU of plan.gpus: peak and model FLOPs utilisation."""
    gpus = paper_config(config_path)["plan"]["gpus"]
    return "; ".join(f"{g['name']}: {g['peak_tflops']:g} TFLOP/s peak, MFU {g['pretrain_mfu']:g} pretraining and "
                     f"{g['finetune_mfu']:g} fine-tuning" for g in gpus.values())


def demo_time(measured: dict[str, Any]) -> str:
    """`make demo`'s time as measured (docs/figures.yaml `demo`)."""
    d = measured["demo"]
    low, high = d["bare_clone_minutes"]
    return (f"about {high} minutes on {d['machine']} from a bare clone, creating `.venv` included ({low} to {high} "
            f"measured on a clone of the {d['bare_clone_version']} version); about "
            f"{round(d['with_venv_seconds'] / 60)} once `.venv` exists ({d['with_venv_seconds']} s measured "
            f"{d['with_venv_measured']})")


def demo_table(config_path: Path = REPO / "examples" / "demo" / "config.yaml") -> str | None:
    """The GLUE dev table of a finished `make demo` in this checkout (its report's glue_dev.md), as a block's
    lines; None where the demo has not run here."""
    from tacl.runtime.layout import Layout

    table = REPO / Layout.of(yaml.safe_load(Path(config_path).read_text())).report / "glue_dev.md"
    return f"\n{table.read_text().strip()}\n" if table.is_file() else None


def rendered(measured_path: Path = MEASURED) -> dict[str, str | None]:
    """Every generated block's text, by name (None: not known here, the block stays as it is)."""
    measured = yaml.safe_load(Path(measured_path).read_text())
    return {"paper-plan": paper_plan(), "paper-rates": paper_rates(), "demo-time": demo_time(measured),
            "demo-glue": demo_table()}


def rewrite(text: str, figures: dict[str, str | None]) -> str:
    """`text` with each generated block's content replaced by its figure (an unknown name is an error; a
    figure not known here leaves its block as it is)."""
    def block(m: re.Match) -> str:
        if m.group(1) not in figures:
            raise InputError(f"generated block {m.group(1)!r}: no such figure (known: {', '.join(figures)})")
        figure = figures[m.group(1)]
        return m.group(0) if figure is None else f"<!-- figures: {m.group(1)} -->{figure}<!-- /figures -->"

    return BLOCK.sub(block, text)


def register(commands: Any) -> None:
    c = commands.add_parser("figures", help="the figures README.md and docs/ quote (the paper plan, measured times)")
    c.add_argument("--write", action="store_true", help="rewrite their generated blocks in README.md and docs/*.md")
    c.set_defaults(func=_figures)


def _figures(a: Any) -> None:
    figures = rendered()
    if not a.write:
        for name, text in figures.items():
            print(f"{name}: {'(not here: run make demo first)' if text is None else text}")
        return
    for doc in documents():
        text = doc.read_text()
        new = rewrite(text, figures)
        if new != text:
            write_text_atomic(doc, new)
            print(f"rewrote {doc.relative_to(REPO)}")
