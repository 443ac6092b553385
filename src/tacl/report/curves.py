"""Training curves of every pretraining run, from its `run/metrics.jsonl`: each loss term and the learning
rate against the step, one panel per objective. The same numbers go to `training_curves.csv`, so the figure
can be checked against the files it was drawn from. Where chunks resumed from a checkpoint (`Run.boundaries`)
is the run's history, not a result: the report lists it beside the figure, which is the same for a run
killed and resumed as for one that was not."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from tacl.runtime.io import write_text_atomic
from tacl.report.document import save_png
from tacl.pretrain.metrics import read_lines

# what a metric line holds besides the losses (accuracies end in _acc, shares such as tacl_attn's effective
# share of its token weights in _ess)
NOT_LOSSES = {"step", "samples", "tokens", "lr", "tokens_per_s", "elapsed_s"}
NOT_LOSS_ENDINGS = ("_acc", "_ess")


@dataclass
class Run:
    objective: str
    metrics: list[dict[str, Any]]
    boundaries: list[int] = field(default_factory=list)  # steps at which a later chunk resumed

    @property
    def terms(self) -> list[str]:
        """The loss terms, total `loss` first, then the objective's own terms in the order it logs them."""
        seen: dict[str, None] = {}
        for m in self.metrics:
            for key, value in m.items():
                if key not in NOT_LOSSES and not key.endswith(NOT_LOSS_ENDINGS) and isinstance(value, (int, float)):
                    seen.setdefault(key)
        return sorted(seen, key=lambda k: (k != "loss", list(seen).index(k)))


def pretraining_runs(results_dir: str | Path, order: list[str] | None = None) -> list[Run]:
    """Every run under results_dir/pretrain/*/run with metric lines: those named in `order` first, in that
    order, then the others by name."""
    found = {p.parents[1].name: p.parent for p in Path(results_dir, "pretrain").glob("*/run/metrics.jsonl")}
    names = [o for o in (order or []) if o in found] + sorted(set(found) - set(order or []))
    runs = []
    for name in names:
        lines = read_lines(found[name])
        metrics = [m for m in lines if "event" not in m]
        starts = sorted({m["step"] for m in lines if m.get("event") == "chunk_start" and m["step"] > 0})
        if metrics:
            runs.append(Run(name, metrics, starts))
    return runs


def curves_table(runs: list[Run]) -> pd.DataFrame:
    """objective, step, series (each loss term, and lr), value: the points of the figure."""
    rows = [{"objective": r.objective, "step": m["step"], "series": key, "value": m[key]}
            for r in runs for key in r.terms + ["lr"] for m in r.metrics if key in m]
    return pd.DataFrame(rows, columns=["objective", "step", "series", "value"])


def curves_figure(runs: list[Run]) -> Any:
    """One panel per objective: the loss terms (left axis) and the learning rate (right axis, grey) against
    the step."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(max(1, len(runs)), 1, figsize=(9, 2.6 * max(1, len(runs))), squeeze=False)
    if not runs:
        axes[0, 0].text(0.5, 0.5, "no pretraining run has logged yet", ha="center", va="center")
        axes[0, 0].set_axis_off()
    for ax, run in zip(axes[:, 0], runs):
        for term in run.terms:
            points = [(m["step"], m[term]) for m in run.metrics if term in m]
            ax.plot(*zip(*points), label=term, linewidth=2.0 if term == "loss" else 1.2)
        ax.set_title(run.objective, fontsize=10, loc="left")
        positive = all(m[t] > 0 for m in run.metrics for t in run.terms if t in m)
        ax.set_yscale("log" if positive else "linear")  # (small contrastive terms beside MLM's ~10)
        ax.set_ylabel("loss" + (" (log scale)" if positive else ""))
        lr = ax.twinx()
        lr.plot([m["step"] for m in run.metrics], [m["lr"] for m in run.metrics], color="grey", linestyle=":",
                label="lr")
        lr.set_ylabel("learning rate", color="grey")
        handles = ax.get_legend_handles_labels()
        more = lr.get_legend_handles_labels()
        # beside the panel, right of the lr axis, off the curves (the PNG is cut to what it holds)
        ax.legend(handles[0] + more[0], handles[1] + more[1], fontsize=7, loc="upper left",
                  bbox_to_anchor=(1.17, 1.0), borderaxespad=0.0)
    axes[-1, 0].set_xlabel("optimizer step")
    fig.tight_layout()
    return fig


def write_curves(out_dir: str | Path, runs: list[Run]) -> list[Run]:
    """training_curves.png and training_curves.csv in out_dir, of the runs (pretraining_runs)."""
    write_text_atomic(Path(out_dir) / "training_curves.csv", curves_table(runs).to_csv(index=False))
    save_png(curves_figure(runs), Path(out_dir) / "training_curves.png", dpi=110)
    return runs
