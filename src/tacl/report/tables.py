"""`tacl report`'s tables: collect every finished fine-tune
(results_dir/finetune/MODEL/TASK/seedN/metrics.json), summarise over seeds (mean, sample std, n) and compute
tables beside the published numbers (reference_numbers.csv, each row with its source and split);
tacl.report.compose writes them, and the report around them. Missing or failed runs show as "-" and are
listed, so one failed task never keeps the others out of the tables.

Like with like: our columns are dev scores and say so; published GLUE rows are GLUE test-server numbers and
say so; the GLUE average is computed as BERT and TaCL compute it (`glue_average`), only from all nine
numbers, and never derived for a row whose metrics are unknown; SQuAD 2.0's headline is EM/F1 at null
threshold 0 (what the paper reports), the dev-tuned threshold's scores have their own columns. Every table
says which fine-tuning preset the runs used, and `differences` says which objective beats which beyond
seed noise. The CSV files hold no path or time, so the same runs give the same bytes.

A result file that does not parse (a metrics.json cut short, an analysis JSON overwritten) is named in one
log line and left out (`read_result`): the tables are built from the rest, and report.md lists it beside
the missing runs.
"""

from __future__ import annotations

import json
import logging
import math
from importlib import resources
from pathlib import Path
from typing import Any

import pandas as pd

from tacl.runtime.layout import Layout
from tacl.finetune.sweep import HEADLINE_DEV, select
from tacl.objectives.registry import REGISTRY
from tacl.runtime.family import model_type_of

log = logging.getLogger("tacl.report")

# (column label, task, split, metrics shown) of the GLUE dev table; GLUE scores are fractions, shown x100
GLUE_COLUMNS = [
    ("CoLA (MCC, dev)", "cola", "dev", ["matthews"]),
    ("SST-2 (acc, dev)", "sst2", "dev", ["accuracy"]),
    ("MRPC (F1/acc, dev)", "mrpc", "dev", ["f1", "accuracy"]),
    ("STS-B (P/S, dev)", "stsb", "dev", ["pearson", "spearman"]),
    ("QQP (F1/acc, dev)", "qqp", "dev", ["f1", "accuracy"]),
    ("MNLI-m (acc, dev)", "mnli", "dev_matched", ["accuracy"]),
    ("MNLI-mm (acc, dev)", "mnli", "dev_mismatched", ["accuracy"]),
    ("QNLI (acc, dev)", "qnli", "dev", ["accuracy"]),
    ("RTE (acc, dev)", "rte", "dev", ["accuracy"]),
    ("WNLI (acc, dev)", "wnli", "dev", ["accuracy"]),
]
# One number per task, as BERT and TaCL report it (label, task, split, metric; reference_numbers.csv's task
# key): MCC for CoLA, F1 for MRPC and QQP, Spearman for STS-B, accuracy elsewhere; SQuAD F1 at threshold 0.
HEADLINE = [
    ("CoLA", "cola", "dev", "matthews", "cola"),
    ("SST-2", "sst2", "dev", "accuracy", "sst2"),
    ("MRPC", "mrpc", "dev", "f1", "mrpc"),
    ("STS-B", "stsb", "dev", "spearman", "stsb"),
    ("QQP", "qqp", "dev", "f1", "qqp"),
    ("MNLI-m", "mnli", "dev_matched", "accuracy", "mnli_m"),
    ("MNLI-mm", "mnli", "dev_mismatched", "accuracy", "mnli_mm"),
    ("QNLI", "qnli", "dev", "accuracy", "qnli"),
    ("RTE", "rte", "dev", "accuracy", "rte"),
    ("WNLI", "wnli", "dev", "accuracy", "wnli"),
    ("SQuAD 1.1 F1", "squad_v1", "dev", "f1", "squad_v1"),
    ("SQuAD 2.0 F1", "squad_v2", "dev", "f1", "squad_v2"),
    ("CoNLL-2003 F1", "conll2003", "dev", "f1", "conll2003"),
]
GLUE_AVERAGE_LABELS = ("CoLA", "SST-2", "MRPC", "STS-B", "QQP", "MNLI-m", "MNLI-mm", "QNLI", "RTE")
SQUAD_COLUMNS = [  # (label, task, metric); the dev-tuned ones only ever hold our own runs
    ("SQuAD 1.1 EM (dev)", "squad_v1", "exact"),
    ("SQuAD 1.1 F1 (dev)", "squad_v1", "f1"),
    ("SQuAD 2.0 EM (dev, null threshold 0)", "squad_v2", "exact"),
    ("SQuAD 2.0 F1 (dev, null threshold 0)", "squad_v2", "f1"),
    ("SQuAD 2.0 best EM (dev-tuned threshold, not comparable)", "squad_v2", "best_exact"),
    ("SQuAD 2.0 best F1 (dev-tuned threshold, not comparable)", "squad_v2", "best_f1"),
]
PERCENT_FAMILIES = {"glue", "ner"}  # fractions in metrics.json; SQuAD is already in percent
OURS = "this workflow"  # the source of our own rows
# Every objective is compared with these, seed by seed: the MLM control the experiment ran (mlm_nsp for a
# family pretrained with NSP, mlm for the others; a BERT experiment may run both) and the start model
CONTROLS = ("mlm_nsp", "mlm", "none")
# The family whose published numbers reference_numbers.csv holds (BERT-base's, and TaCL's from BERT-base)
PUBLISHED_FAMILY = "bert"


def reference_numbers() -> pd.DataFrame:
    with resources.files("tacl.report").joinpath("reference_numbers.csv").open() as f:
        return pd.read_csv(f)


def start_family(results_dir: str | Path) -> str | None:
    """The family of the start model the results come from: what init_model recorded in the results
    directory's start model (tacl_start.json's `family`, else its config.json's `model_type`), or None before
    that model exists. The results directory itself answers, as for every table: `tacl report RESULTS_DIR`
    needs no config, and a config edited since the runs cannot change it."""
    return model_type_of(Layout(str(results_dir)).start, read=read_result)  # (a damaged file: named, passed over)


def published_numbers(family: str | None) -> pd.DataFrame:
    """The published rows to place beside results from a start model of `family`: reference_numbers.csv's for a
    BERT (or where the family is not known yet), none for another family, whose numbers they are not."""
    refs = reference_numbers()
    return refs if family in (None, PUBLISHED_FAMILY) else refs.iloc[0:0]


def no_published_number(family: str) -> str:
    return (f"no published number: the start model is of the {family} family, and the published numbers here are "
            "BERT-base's (reference_numbers.csv)")


LONG_COLUMNS = ["model", "task", "setting", "family", "preset", "start", "seed", "split", "metric", "value"]


def read_result(path: str | Path, damaged: list[str] | None = None, keys: tuple[str, ...] = ()) -> Any | None:
    """A result file's JSON; None when it does not parse or is not an object with `keys`: then one log line
    names it, and it goes into `damaged` (the report is built from the rest)."""
    try:
        value = json.loads(Path(path).read_text(encoding="utf-8"))
        problem = None if isinstance(value, dict) and all(k in value for k in keys) else \
            f"not a JSON object with {', '.join(keys)}" if keys else "not a JSON object"
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        problem = f"not valid JSON ({e})"
    if problem is None:
        return value
    log.warning("%s: damaged, %s; left out of the report", path, problem)
    if damaged is not None:
        damaged.append(str(path))
    return None


def collect(results_dir: str | Path, damaged: list[str] | None = None) -> pd.DataFrame:
    """Long table of every finished run (finetune/MODEL/TASK/SETTING/seedN/metrics.json): model, task,
    setting, family, preset, start (the task it started from, or ""), seed, split, metric, value (percent).
    A metrics.json that does not read back is left out and named in `damaged` (`read_result`)."""
    rows = []
    for path in sorted(Path(results_dir, "finetune").glob("*/*/*/seed*/metrics.json")):
        m = read_result(path, damaged, ("task", "family", "seed"))
        if m is None:
            continue
        run = {"model": path.parents[3].name, "task": m["task"], "setting": path.parents[1].name,
               "family": m["family"], "preset": m.get("preset", "standard"),
               "start": (m.get("start_from") or "").split(":")[0], "seed": m["seed"]}
        scale = 100.0 if m["family"] in PERCENT_FAMILIES else 1.0
        for section in ("dev", "test"):
            for split, metrics in m.get(section, {}).items():
                for metric, value in metrics.items():
                    if isinstance(value, (int, float)) and not isinstance(value, bool) and metric != "examples" \
                            and not metric.endswith(("_total", "_thresh")):
                        rows.append({**run, "split": split, "metric": metric, "value": float(value) * scale})
    return pd.DataFrame(rows, columns=LONG_COLUMNS)


def selections(long: pd.DataFrame, declared: dict[str, tuple[str, str]] | None = None
               ) -> dict[tuple[str, str], dict[str, Any]]:
    """(model, task) -> the setting selected on dev (tacl.finetune.sweep.select) among the finished runs;
    `declared`: the declared tasks' headlines (`declared_headlines`; a task with none is left out)."""
    out = {}
    if long.empty:
        return out
    for (model, task), part in long.groupby(["model", "task"], sort=True):
        key = HEADLINE_DEV.get(task) or (declared or {}).get(task)
        if key is None:
            continue
        split, metric = key
        scores = part[(part.split == split) & (part.metric == metric)]
        runs = [{"setting": r.setting, "seed": int(r.seed), "score": r.value} for r in scores.itertuples()]
        if runs:
            out[(model, task)] = select(task, runs, key)
    return out


def finished(results_dir: str | Path, tasks: list[str], damaged: list[str]
             ) -> tuple[pd.DataFrame, dict[str, dict[str, Any]], dict[tuple[str, str], dict[str, Any]], pd.DataFrame,
                        pd.DataFrame]:
    """The finished fine-tunes as the report's tables count them: every run found, each task's preparation
    record, the setting selected on dev per (model, task), that setting's runs, and their summary over seeds
    (mean, sample std, n). The report (tacl.report.compose) and the model cards (tacl.report.publish) both
    take their numbers from here, so that a card's numbers are the report's."""
    every = collect(results_dir, damaged)
    tasks_prepared = prepared(results_dir, tasks, damaged)
    chosen = selections(every, declared_headlines(tasks_prepared))
    long = selected(every, chosen)  # the headline tables and the differences: the selected settings
    return every, tasks_prepared, chosen, long, summarise(long)


def declared_headlines(records: dict[str, dict[str, Any]]) -> dict[str, tuple[str, str]]:
    """task -> (split, metric) of each declared task's headline, from its preparation record (`prepared`)."""
    return {t: (r["headline"][0], r["headline"][1]) for t, r in records.items()
            if r.get("declared") and len(r.get("headline") or ()) == 2}


def declared_headline_rows(records: dict[str, dict[str, Any]]) -> list[tuple[str, str, str, str, str]]:
    """The declared tasks' headline numbers as HEADLINE's rows (label, task, split, metric, key); an F1 of one
    class names it in the label ("pairs (f1 of duplicate)")."""
    classes = f1_classes(records)
    return [(f"{t} ({metric_label(t, metric, classes)})" if t in classes and metric == "f1" else t, t, split,
             metric, t) for t, (split, metric) in declared_headlines(records).items()]


def f1_classes(records: dict[str, dict[str, Any]]) -> dict[str, str]:
    """task -> the class its `f1` is the F1 of: GLUE's MRPC and QQP class 1, a declared classification task's
    positive_label as its preparation record (`prepared`) names it."""
    from tacl.finetune import glue

    out = {t: glue.positive_label(t) for t in glue.TASKS if glue.positive_label(t) is not None}
    out.update({t: r["declared"]["positive_label"] for t, r in records.items()
                if (r.get("declared") or {}).get("positive_label") is not None})
    return out  # type: ignore[return-value]


def metric_label(task: str, metric: str, classes: dict[str, str]) -> str:
    """A metric as a table names it: an F1 of one class with that class ("f1 of duplicate", `f1_classes`)."""
    return f"{metric} of {classes[task]}" if metric == "f1" and task in classes else metric


def declared_table(summary: pd.DataFrame, long: pd.DataFrame, models: list[str],
                   records: dict[str, dict[str, Any]], chance: dict[str, dict[str, Any]]) -> pd.DataFrame:
    """The declared tasks: each one's headline metric on dev (and on its test split where it has one; an F1 of
    one class named with it, `metric_label`), our rows (the selected setting), then the chance row, scored from
    the task's own files."""
    classes = f1_classes(records)
    columns = [(f"{t} ({metric_label(t, r['declared']['metric'], classes)}, {split})", t, split,
                r["declared"]["metric"], r["family"])
               for t, r in records.items() if r.get("declared") for split in ("dev", "test") if split in r["splits"]]
    rows = [{"model": model, "source": OURS, "preset": presets(long, model, {c[1] for c in columns}),
             **{label: cell_text(summary, model, task, split, [metric]) for label, task, split, metric, _ in columns}}
            for model in models]
    if any(c[1] in chance for c in columns):
        row = {"model": "chance", "source": "chance (train and evaluated files)", "preset": "-"}
        for label, task, split, metric, family in columns:
            score = chance.get(task, {}).get("dev", {}).get(split, {}).get(metric)
            scale = 100.0 if family in PERCENT_FAMILIES else 1.0
            row[label] = f"{scale * score:.1f}" if isinstance(score, (int, float)) else "-"
        rows.append(row)
    return pd.DataFrame(rows)


def selected(long: pd.DataFrame, chosen: dict[tuple[str, str], dict[str, Any]]) -> pd.DataFrame:
    """The runs of the selected setting of each (model, task): what the headline tables show."""
    if long.empty:
        return long
    keep = [chosen.get((r.model, r.task), {}).get("setting") == r.setting for r in long.itertuples()]
    return long[keep]


def sweep_table(long: pd.DataFrame, chosen: dict[tuple[str, str], dict[str, Any]],
                classes: dict[str, str] | None = None) -> pd.DataFrame:
    """Every setting of every (model, task): the headline dev number's mean ± std over seeds (an F1 of one
    class named with it, `classes`: `f1_classes`), and which setting was selected."""
    rows = []
    for (model, task), choice in chosen.items():
        for setting, s in choice["settings"].items():
            std = f" ± {s['std']:.1f}" if len(s["seeds"]) > 1 and not math.isnan(s["std"]) else ""
            rows.append({"model": model, "task": task, "setting": setting,
                         "dev": f"{choice['split']} {metric_label(task, choice['metric'], classes or {})}",
                         "mean ± std": f"{s['mean']:.1f}{std}",
                         "seeds": len(s["seeds"]), "selected": "yes" if setting == choice["setting"] else ""})
    return pd.DataFrame(rows, columns=["model", "task", "setting", "dev", "mean ± std", "seeds", "selected"])


def prepared(results_dir: str | Path, tasks: list[str], damaged: list[str] | None = None) -> dict[str, dict[str, Any]]:
    """task -> what `tacl finetune prepare` recorded of it (finetune_data: split sizes, chance), where it has."""
    out = {}
    for task in tasks:
        path = Path(results_dir, "finetune_data", f"{task}.json")
        record = (read_result(path, damaged) or {}) if path.is_file() else {}
        if record:
            out[task] = record
    return out


def baselines(results_dir: str | Path, tasks: list[str],
              damaged: list[str] | None = None) -> dict[str, dict[str, Any]]:
    """task -> chance as `tacl finetune prepare` scored it from the task's own files (finetune_data)."""
    return {task: r["baseline"] for task, r in prepared(results_dir, tasks, damaged).items() if r.get("baseline")}


def summarise(long: pd.DataFrame) -> pd.DataFrame:
    if long.empty:
        return pd.DataFrame(columns=["model", "task", "split", "metric", "mean", "std", "n"])
    g = long.groupby(["model", "task", "split", "metric"], sort=False)["value"]
    return g.agg(mean="mean", std="std", n="count").reset_index()


def summary_row(summary: pd.DataFrame, model: str, task: str, split: str, metric: str) -> pd.Series | None:
    """The summary's row (mean, std, n) of one model, task, split and metric, or None."""
    hit = summary[(summary.model == model) & (summary.task == task) & (summary.split == split)
                  & (summary.metric == metric)]
    return None if hit.empty else hit.iloc[0]


def cell_text(summary: pd.DataFrame, model: str, task: str, split: str, metrics: list[str]) -> str:
    """A table's cell: each metric's mean over seeds, with ± its sample std where several seeds ran, to one
    decimal, '/' between metrics, '-' for a metric with no finished run."""
    parts = []
    for metric in metrics:
        r = summary_row(summary, model, task, split, metric)
        if r is None:
            parts.append("-")
            continue
        parts.append(f"{r['mean']:.1f}" + (f" ± {r['std']:.1f}" if r["n"] > 1 and not math.isnan(r["std"]) else ""))
    return " / ".join(parts)


def glue_average(scores: dict[str, float]) -> float | None:
    """The GLUE average as BERT and TaCL report it: the plain mean of the nine numbers (CoLA MCC, SST-2,
    MRPC F1, STS-B Spearman, QQP F1, MNLI-m and MNLI-mm separately, QNLI, RTE; WNLI left out), keyed by
    GLUE_AVERAGE_LABELS. None unless all nine are there: an average of some tasks compares with nothing."""
    if any(label not in scores for label in GLUE_AVERAGE_LABELS):
        return None
    return sum(scores[label] for label in GLUE_AVERAGE_LABELS) / len(GLUE_AVERAGE_LABELS)


def headline_means(summary: pd.DataFrame, model: str) -> dict[str, float]:
    """Label -> mean over seeds of each HEADLINE number this model has."""
    out = {}
    for label, task, split, metric, _ in HEADLINE:
        r = summary_row(summary, model, task, split, metric)
        if r is not None:
            out[label] = float(r["mean"])
    return out


def presets(long: pd.DataFrame, model: str, tasks: set[str]) -> str:
    names = sorted(set(long[(long.model == model) & long.task.isin(tasks)]["preset"])) if not long.empty else []
    return ", ".join(names) or "-"


def _started(long: pd.DataFrame, model: str, task: str) -> str:
    """' (from MNLI)' where the shown runs of (model, task) started from another task's fine-tune."""
    starts = set(long[(long.model == model) & (long.task == task)]["start"]) - {""} if not long.empty else set()
    return f" (from {', '.join(sorted(starts)).upper()})" if starts else ""


def glue_table(summary: pd.DataFrame, long: pd.DataFrame, models: list[str], tasks: list[str],
               chance: dict[str, dict[str, Any]] | None = None) -> pd.DataFrame:
    """Our rows (the selected setting of each task), then the chance row computed from the task files."""
    columns = [c for c in GLUE_COLUMNS if c[1] in tasks]
    table = []
    for model in models:
        row = {"model": model, "source": OURS, "preset": presets(long, model, {c[1] for c in columns})}
        for label, task, split, metrics in columns:
            row[label] = cell_text(summary, model, task, split, metrics) + _started(long, model, task)
        means = headline_means(summary, model)
        avg = glue_average(means)
        have = sum(label in means for label in GLUE_AVERAGE_LABELS)
        row["GLUE avg (dev)"] = f"{avg:.1f}" if avg is not None else f"- ({have}/9 numbers)"
        table.append(row)
    if chance and any(c[1] in chance for c in columns):
        row = {"model": "majority class / constant", "source": "chance (train and dev files)", "preset": "-"}
        for label, task, split, metrics in columns:
            scores = chance.get(task, {}).get("dev", {}).get(split)
            row[label] = " / ".join(f"{100 * scores[m]:.1f}" for m in metrics) if scores else "-"
        row["GLUE avg (dev)"] = "-"
        table.append(row)
    return pd.DataFrame(table)


def glue_reference_table(refs: pd.DataFrame, family: str | None = None) -> pd.DataFrame:
    """The published GLUE rows, one per (source, model), each naming its split; the average as published
    (never derived here: the quotation's numbers cannot be reconciled with the paper's average). With no
    published rows for a start model of another family (`published_numbers`), one row that says so."""
    keys = {key: label for label, _, _, _, key in HEADLINE if label in GLUE_AVERAGE_LABELS}
    glue = refs[refs.task.isin(list(keys) + ["glue_avg"])]
    if glue.empty and family not in (None, PUBLISHED_FAMILY):
        return pd.DataFrame([{"source": no_published_number(family), "model": "-", "split": "-", "metrics": "-",
                              **{label: "-" for label in keys.values()}, "GLUE avg (as published)": "-"}])
    rows = []
    for (source, model, split), part in glue.groupby(["source", "model", "split"], sort=False):
        row = {"source": source, "model": model, "split": split}
        metrics = {r.task: r.metric for r in part.itertuples() if r.task in keys}
        row["metrics"] = ", ".join(sorted(set(metrics.values()))) if metrics else "-"
        for key, label in keys.items():
            hit = part[part.task == key]
            row[label] = f"{hit.value.iloc[0]:.1f}" if not hit.empty else "-"
        avg = part[part.task == "glue_avg"]
        row["GLUE avg (as published)"] = f"{avg.value.iloc[0]:.1f}" if not avg.empty else "-"
        rows.append(row)
    return pd.DataFrame(rows)


def squad_table(summary: pd.DataFrame, long: pd.DataFrame, models: list[str], refs: pd.DataFrame,
                tasks: list[str], chance: dict[str, dict[str, Any]] | None = None,
                family: str | None = None) -> pd.DataFrame:
    """Our rows, the chance row, and the published rows (`refs`); with none for a start model of another
    family (`published_numbers`), one row that says so."""
    columns = [c for c in SQUAD_COLUMNS if c[1] in tasks]
    rows = []
    for model in models:
        rows.append({"model": model, "source": OURS, "split": "dev",
                     "preset": presets(long, model, {c[1] for c in columns}),
                     **{label: cell_text(summary, model, task, "dev", [metric]) for label, task, metric in columns}})
    if chance and "squad_v2" in chance:
        scores = chance["squad_v2"]["dev"]["dev"]
        rows.append({"model": "no answer to any question", "source": "chance (dev file)", "split": "dev",
                     "preset": "-", **{label: f"{scores[metric]:.1f}" if task == "squad_v2" and metric in scores
                                       else "-" for label, task, metric in columns}})
    ref = refs[refs.task.isin(tasks) & (refs.split == "dev")]
    if ref.empty and family not in (None, PUBLISHED_FAMILY) and columns:
        rows.append({"model": "-", "source": no_published_number(family), "split": "dev", "preset": "-",
                     **{label: "-" for label, _, _ in columns}})
    for (source, model), part in ref.groupby(["source", "model"], sort=False):
        row = {"model": model, "source": source, "split": "dev", "preset": "-"}
        for label, task, metric in columns:
            hit = part[(part.task == task) & (part.metric == metric)]
            row[label] = f"{hit.value.iloc[0]:.1f}" if not hit.empty else "-"
        rows.append(row)
    return pd.DataFrame(rows)


def interval(diffs: list[float] | None, a: list[float], b: list[float]) -> tuple[float, float, float] | None:
    """(mean difference, low, high) of a 95% t interval: paired on `diffs` when given, else Welch's on the
    two samples a - b. None when a sample has fewer than 2 values."""
    from scipy import stats

    if diffs is not None:
        n = len(diffs)
        if n < 2:
            return None
        mean = sum(diffs) / n
        sd = math.sqrt(sum((d - mean) ** 2 for d in diffs) / (n - 1))
        half = stats.t.ppf(0.975, n - 1) * sd / math.sqrt(n)
        return mean, mean - half, mean + half
    if len(a) < 2 or len(b) < 2:
        return None
    ma, mb = sum(a) / len(a), sum(b) / len(b)
    va = sum((x - ma) ** 2 for x in a) / (len(a) - 1) / len(a)
    vb = sum((x - mb) ** 2 for x in b) / (len(b) - 1) / len(b)
    se = math.sqrt(va + vb)
    if se == 0:
        return ma - mb, ma - mb, ma - mb
    df = (va + vb) ** 2 / (va ** 2 / (len(a) - 1) + vb ** 2 / (len(b) - 1))
    half = stats.t.ppf(0.975, df) * se
    return ma - mb, ma - mb - half, ma - mb + half


def differences_table(long: pd.DataFrame, models: list[str],
                      extra: list[tuple[str, str, str, str, str]] | None = None) -> pd.DataFrame:
    """For every headline number and every model against each control the experiment ran (the MLM control,
    mlm_nsp or mlm, and none), and a variant of an objective (tacl_batch, tacl_attn) against that objective
    (tacl): the mean difference over seeds with its 95% interval, paired by fine-tuning seed where both have
    the same seeds, and whether it exceeds seed noise (the interval excludes 0). `extra`: more headline rows
    (the declared tasks', `declared_headline_rows`)."""
    rows = []
    for label, task, split, metric, _ in HEADLINE + (extra or []):
        part = long[(long.task == task) & (long.split == split) & (long.metric == metric)] if not long.empty else long
        values = {m: dict(zip(g.seed.astype(int), g.value)) for m, g in part.groupby("model")} if not part.empty else {}
        pairs = [(model, control) for control in CONTROLS if control in values for model in models
                 # not a control against itself, nor a pair of controls twice (none vs mlm_nsp says mlm_nsp vs none)
                 if model not in CONTROLS[: CONTROLS.index(control) + 1] and model in values]
        pairs += [(model, REGISTRY[model].variant_of) for model in models if model in values and model in REGISTRY
                  and REGISTRY[model].variant_of in values]
        for model, control in pairs:
            ours, base = values[model], values[control]
            paired = sorted(ours) == sorted(base)
            diffs = [ours[s] - base[s] for s in sorted(ours)] if paired else None
            ci = interval(diffs, list(ours.values()), list(base.values()))
            mean = (sum(ours.values()) / len(ours)) - (sum(base.values()) / len(base))
            rows.append({
                "task": label, "split": split, "model": model, "vs": control,
                "seeds": f"{len(ours)} vs {len(base)}", "paired": "yes" if paired else "no",
                "mean difference": f"{mean:+.2f}",
                "95% interval": f"[{ci[1]:+.2f}, {ci[2]:+.2f}]" if ci else "- (fewer than 2 seeds)",
                "beyond seed noise": ("yes" if ci[1] > 0 or ci[2] < 0 else "no") if ci else "-",
            })
    columns = ["task", "split", "model", "vs", "seeds", "paired", "mean difference", "95% interval",
               "beyond seed noise"]
    return pd.DataFrame(rows, columns=columns)


def ner_table(summary: pd.DataFrame, long: pd.DataFrame, models: list[str]) -> pd.DataFrame:
    return pd.DataFrame([{"model": m, "source": OURS, "preset": presets(long, m, {"conll2003"}),
                          "CoNLL-2003 F1 (dev)": cell_text(summary, m, "conll2003", "dev", ["f1"]),
                          "CoNLL-2003 F1 (test)": cell_text(summary, m, "conll2003", "test", ["f1"])} for m in models])


def status_table(long: pd.DataFrame, expected: list[dict[str, Any]],
                 chosen: dict[tuple[str, str], dict[str, Any]] | None = None) -> tuple[pd.DataFrame, list[str]]:
    """Finished runs (settings x seeds) per (model, task) against what the config asks for, the setting
    selected on dev, and the missing runs."""
    done = {(r.model, r.task, r.setting, int(r.seed))
            for r in long[["model", "task", "setting", "seed"]].drop_duplicates().itertuples()}
    counts: dict[tuple[str, str], list[int]] = {}
    missing = []
    for e in expected:
        key = (e["model"], e["task"])
        counts.setdefault(key, [0, 0])[1] += 1
        if (e["model"], e["task"], e["setting"], int(e["seed"])) in done:
            counts[key][0] += 1
        else:
            missing.append(f"{e['model']}/{e['task']}/{e['setting']}/seed{e['seed']}")
    table = pd.DataFrame([{"model": m, "task": t, "finished": f"{a}/{b}",
                           "selected setting": (chosen or {}).get((m, t), {}).get("setting", "-")}
                          for (m, t), (a, b) in counts.items()])
    return table, missing


def similarity_table(paths: list[str], key: str = "self_similarity") -> pd.DataFrame:
    """One row per model, one column per layer, of `key` (self_similarity or anisotropy)."""
    rows = []
    for p in paths:
        r = json.loads(Path(p).read_text())
        if key in r:
            rows.append({"model": r["model"], **{f"L{i}": _number(v, ".3f") for i, v in zip(r["layers"], r[key])}})
    return pd.DataFrame(rows)  # (a layer a model does not have is NaN here, '-' in every file written)


def _number(value: float | None, spec: str) -> str:
    """`value` formatted, or '-' where there is no number (never `nan`)."""
    return "-" if value is None or (isinstance(value, float) and math.isnan(value)) else format(value, spec)


def cls_table(paths: list[str]) -> pd.DataFrame:
    """One row per model and pair set of the [CLS] cosine figure (analysis/similarity/MODEL.json's
    `cls_cosine`): pairs, mean, std and quantiles."""
    rows = []
    for p in paths:
        r = json.loads(Path(p).read_text())
        for part in r.get("cls_cosine", {}).values():
            row = {"model": r["model"], "pairs of": part["label"], "pairs": str(part["pairs"])}
            if part["pairs"]:
                row.update({"mean": _number(part["mean"], ".3f"), "std": _number(part["std"], ".3f"),
                            **{q: _number(v, ".3f") for q, v in part["quantiles"].items()}})
            rows.append(row)
    return pd.DataFrame(rows)  # ('-' where there is no number, in every file written)


def embeddings_table(paths: list[str]) -> pd.DataFrame:
    rows = []
    for p in paths:
        r = json.loads(Path(p).read_text())
        row = {"model": r["model"]}
        for pooling, name in (("cls", "[CLS]"), ("mean", "mean")):
            row[f"STS-B dev Spearman ({name})"] = f"{100 * r[pooling]['sts_spearman']:.1f}"
        for pooling, name in (("cls", "[CLS]"), ("mean", "mean")):
            row[f"{r['cluster_task']} k-means ARI / AMI ({name})"] = (f"{100 * r[pooling]['ari']:.1f} / "
                                                                    f"{100 * r[pooling]['ami']:.1f}")
        rows.append(row)
    return pd.DataFrame(rows)
