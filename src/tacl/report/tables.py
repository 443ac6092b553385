"""`tacl report`: collect every finished fine-tune (results_dir/finetune/MODEL/TASK/seedN/metrics.json),
summarise over seeds (mean, sample std, n) and write tables beside the published numbers
(reference_numbers.csv, each row with its source). Missing or failed runs show as "-" and are listed, so
one failed task never keeps the others out of the tables."""

from __future__ import annotations

import json
import math
from importlib import resources
from pathlib import Path
from typing import Any

import pandas as pd

from tacl.io import atomic_path, write_text_atomic

# (column label, task, dev split, metrics shown); GLUE scores are fractions, shown x100
GLUE_COLUMNS = [
    ("CoLA (MCC)", "cola", "dev", ["matthews"]),
    ("SST-2 (acc)", "sst2", "dev", ["accuracy"]),
    ("MRPC (F1/acc)", "mrpc", "dev", ["f1", "accuracy"]),
    ("STS-B (P/S)", "stsb", "dev", ["pearson", "spearman"]),
    ("QQP (F1/acc)", "qqp", "dev", ["f1", "accuracy"]),
    ("MNLI-m (acc)", "mnli", "dev_matched", ["accuracy"]),
    ("MNLI-mm (acc)", "mnli", "dev_mismatched", ["accuracy"]),
    ("QNLI (acc)", "qnli", "dev", ["accuracy"]),
    ("RTE (acc)", "rte", "dev", ["accuracy"]),
    ("WNLI (acc)", "wnli", "dev", ["accuracy"]),
]
REFERENCE_GLUE_TASK = {"cola": "CoLA", "sst2": "SST-2", "mrpc": "MRPC", "stsb": "STS-B", "qqp": "QQP",
                       "mnli_m": "MNLI-m", "mnli_mm": "MNLI-mm", "qnli": "QNLI", "rte": "RTE"}
SQUAD_COLUMNS = [("SQuAD 1.1 EM", "squad_v1", "exact"), ("SQuAD 1.1 F1", "squad_v1", "f1"),
                 ("SQuAD 2.0 EM", "squad_v2", "main_exact"), ("SQuAD 2.0 F1", "squad_v2", "main")]
PERCENT_FAMILIES = {"glue", "ner"}  # fractions in metrics.json; SQuAD is already in percent


def reference_numbers() -> pd.DataFrame:
    with resources.files("tacl.report").joinpath("reference_numbers.csv").open() as f:
        return pd.read_csv(f)


def collect(results_dir: str | Path) -> pd.DataFrame:
    """Long table: model, task, family, seed, split, metric, value (percent)."""
    rows = []
    for path in sorted(Path(results_dir, "finetune").glob("*/*/seed*/metrics.json")):
        m = json.loads(path.read_text())
        model = path.parents[2].name
        scale = 100.0 if m["family"] in PERCENT_FAMILIES else 1.0
        for section in ("dev", "test"):
            for split, metrics in m.get(section, {}).items():
                for metric, value in metrics.items():
                    if isinstance(value, (int, float)) and not isinstance(value, bool) and metric != "examples" \
                            and not metric.endswith(("_total", "_thresh")):
                        rows.append({"model": model, "task": m["task"], "family": m["family"], "seed": m["seed"],
                                     "split": split, "metric": metric, "value": float(value) * scale})
    return pd.DataFrame(rows, columns=["model", "task", "family", "seed", "split", "metric", "value"])


def summarise(long: pd.DataFrame) -> pd.DataFrame:
    if long.empty:
        return pd.DataFrame(columns=["model", "task", "split", "metric", "mean", "std", "n"])
    g = long.groupby(["model", "task", "split", "metric"], sort=False)["value"]
    return g.agg(mean="mean", std="std", n="count").reset_index()


def _cell(summary: pd.DataFrame, model: str, task: str, split: str, metrics: list[str]) -> str:
    parts = []
    for metric in metrics:
        hit = summary[(summary.model == model) & (summary.task == task) & (summary.split == split)
                      & (summary.metric == metric)]
        if hit.empty:
            parts.append("-")
            continue
        r = hit.iloc[0]
        parts.append(f"{r['mean']:.1f}" + (f" ± {r['std']:.1f}" if r["n"] > 1 and not math.isnan(r["std"]) else ""))
    return " / ".join(parts)


def glue_average(summary: pd.DataFrame, model: str) -> tuple[float | None, int]:
    """Mean over tasks (WNLI excluded, as in BERT's GLUE average) of each task's main score; MNLI counts
    once, the mean of matched and mismatched."""
    scores = []
    for task in ("cola", "sst2", "mrpc", "stsb", "qqp", "mnli", "qnli", "rte"):
        hit = summary[(summary.model == model) & (summary.task == task) & (summary.metric == "main")]
        if not hit.empty:
            scores.append(hit["mean"].mean())
    return (sum(scores) / len(scores), len(scores)) if scores else (None, 0)


def glue_table(summary: pd.DataFrame, models: list[str], tasks: list[str]) -> pd.DataFrame:
    columns = [c for c in GLUE_COLUMNS if c[1] in tasks]
    table = []
    for model in models:
        row = {"model": model}
        for label, task, split, metrics in columns:
            row[label] = _cell(summary, model, task, split, metrics)
        avg, n = glue_average(summary, model)
        row["GLUE avg"] = f"{avg:.1f} ({n} tasks)" if avg is not None else "-"
        table.append(row)
    return pd.DataFrame(table)


def glue_reference_table(refs: pd.DataFrame) -> pd.DataFrame:
    glue = refs[(refs.split == "test") & refs.task.isin(REFERENCE_GLUE_TASK)]
    rows = []
    for source, part in glue.groupby("source", sort=False):
        row = {"published (GLUE test server)": source}
        for _, r in part.iterrows():
            row[REFERENCE_GLUE_TASK[r.task]] = f"{r.value:.1f}"
        rows.append(row)
    return pd.DataFrame(rows).fillna("-")


def squad_table(summary: pd.DataFrame, models: list[str], refs: pd.DataFrame, tasks: list[str]) -> pd.DataFrame:
    columns = [c for c in SQUAD_COLUMNS if c[1] in tasks]
    rows = []
    for model in models:
        rows.append({"model": model, **{label: _cell(summary, model, task, "dev", [metric])
                                        for label, task, metric in columns}})
    ref = refs[refs.task.isin(tasks) & (refs.split == "dev")]
    for (source, model), part in ref.groupby(["source", "model"], sort=False):
        row = {"model": f"{model} ({source})"}
        for label, task, metric in columns:
            want = {"main_exact": "exact", "main": "f1"}.get(metric, metric)
            hit = part[(part.task == task) & (part.metric == want)]
            row[label] = f"{hit.value.iloc[0]:.1f}" if not hit.empty else "-"
        rows.append(row)
    return pd.DataFrame(rows)


def ner_table(summary: pd.DataFrame, models: list[str]) -> pd.DataFrame:
    return pd.DataFrame([{"model": m, "CoNLL-2003 dev F1": _cell(summary, m, "conll2003", "dev", ["f1"]),
                          "CoNLL-2003 test F1": _cell(summary, m, "conll2003", "test", ["f1"])} for m in models])


def status_table(long: pd.DataFrame, expected: list[dict[str, Any]]) -> tuple[pd.DataFrame, list[str]]:
    """Finished seeds per (model, task) against what the config asks for, and the missing runs."""
    done = {(r.model, r.task, int(r.seed)) for r in long[["model", "task", "seed"]].drop_duplicates().itertuples()}
    counts: dict[tuple[str, str], list[int]] = {}
    missing = []
    for e in expected:
        key = (e["model"], e["task"])
        counts.setdefault(key, [0, 0])[1] += 1
        if (e["model"], e["task"], int(e["seed"])) in done:
            counts[key][0] += 1
        else:
            missing.append(f"{e['model']}/{e['task']}/seed{e['seed']}")
    table = pd.DataFrame([{"model": m, "task": t, "finished": f"{a}/{b}"} for (m, t), (a, b) in counts.items()])
    return table, missing


def similarity_table(paths: list[str]) -> pd.DataFrame:
    rows = []
    for p in paths:
        r = json.loads(Path(p).read_text())
        rows.append({"model": r["model"], **{f"L{i}": f"{v:.3f}" for i, v in zip(r["layers"], r["self_similarity"])}})
    return pd.DataFrame(rows)


def markdown(df: pd.DataFrame) -> str:
    return df.to_markdown(index=False, disable_numparse=True) if not df.empty else "(nothing yet)"


def write_table(df: pd.DataFrame, stem: Path) -> None:
    """stem.md, stem.csv, stem.tex (each written atomically)."""
    write_text_atomic(stem.with_suffix(".md"), markdown(df) + "\n")
    write_text_atomic(stem.with_suffix(".csv"), df.to_csv(index=False))
    write_text_atomic(stem.with_suffix(".tex"), df.to_latex(index=False, escape=True))


def glue_plot(summary: pd.DataFrame, models: list[str], tasks: list[str], out_png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    cols = [(label, task, split) for label, task, split, _ in GLUE_COLUMNS if task in tasks]
    fig, ax = plt.subplots(figsize=(10, 4))
    width = 0.8 / max(1, len(models))
    for k, model in enumerate(models):
        means, stds = [], []
        for _, task, split in cols:
            hit = summary[(summary.model == model) & (summary.task == task) & (summary.split == split)
                          & (summary.metric == "main")]
            means.append(hit["mean"].iloc[0] if not hit.empty else np.nan)
            stds.append(hit["std"].iloc[0] if not hit.empty and hit["n"].iloc[0] > 1 else 0.0)
        ax.bar(np.arange(len(cols)) + k * width, means, width, yerr=stds, label=model, capsize=2)
    ax.set_xticks(np.arange(len(cols)) + 0.4 - width / 2, [c[0].split(" (")[0] for c in cols])
    ax.set_ylabel("dev score (main metric, x100)")
    ax.set_title("GLUE dev, mean and std over seeds")
    ax.legend(fontsize=8)
    fig.tight_layout()
    with atomic_path(out_png) as tmp:
        fig.savefig(tmp, format="png", dpi=120)
    plt.close(fig)


def build_report(results_dir: str, models: list[str], tasks: list[str], expected: list[dict[str, Any]],
                 similarity: list[str], out_dir: str, similarity_png: str | None = None) -> dict[str, Any]:
    """Every table and plot for the configured models and tasks; returns the runs found and missing."""
    out = Path(out_dir)
    long = collect(results_dir)
    summary = summarise(long)
    refs = reference_numbers()
    write_text_atomic(out / "runs.csv", long.to_csv(index=False))
    write_text_atomic(out / "summary.csv", summary.to_csv(index=False))
    glue_tasks = [t for t in tasks if t in {c[1] for c in GLUE_COLUMNS}]
    glue = glue_table(summary, models, glue_tasks)
    squad = squad_table(summary, models, refs, tasks)
    status, missing = status_table(long, expected)
    sim = similarity_table(similarity)
    tables = {"glue_dev": glue, "glue_published": glue_reference_table(refs), "squad_dev": squad,
              "status": status, "self_similarity": sim}
    lines = [f"# Results ({results_dir})", "",
             "Dev-set scores x100, mean ± sample std over fine-tuning seeds; '-' = no finished run.", ""]
    if glue_tasks:
        lines += ["## GLUE dev", "", markdown(glue), "",
                  "GLUE avg: mean of the tasks' main scores (MRPC, QQP: mean of F1 and accuracy; STS-B: mean of "
                  "Pearson and Spearman; MNLI: mean of m and mm), WNLI excluded.", "", "![GLUE dev](glue_dev.png)",
                  "", "## Published numbers (GLUE test server: not comparable one-to-one with dev scores)", "",
                  markdown(tables["glue_published"]), ""]
    if any(t.startswith("squad") for t in tasks):
        lines += ["## SQuAD dev", "", markdown(squad), "",
                  "SQuAD 2.0: the null-answer threshold tuned on dev, as the official evaluation script does.", ""]
    if "conll2003" in tasks:
        tables["ner"] = ner_table(summary, models)
        lines += ["## CoNLL-2003 NER (entity F1, seqeval)", "", markdown(tables["ner"]), ""]
    lines += ["## Self-similarity (lower = more distinguishable token vectors)", "", markdown(sim), ""]
    if similarity_png:
        lines += [f"![self-similarity]({Path(similarity_png).name})", ""]
    lines += ["## Runs", "", markdown(status), ""]
    if missing:
        lines += [f"Missing or failed ({len(missing)}): " + ", ".join(missing), ""]
    for name, df in tables.items():
        write_table(df, out / name)
    glue_plot(summary, models, glue_tasks, out / "glue_dev.png")
    write_text_atomic(out / "report.md", "\n".join(lines))
    return {"runs": int(long[["model", "task", "seed"]].drop_duplicates().shape[0]) if not long.empty else 0,
            "missing": missing}
