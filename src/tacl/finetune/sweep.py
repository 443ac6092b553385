"""Fine-tuning sweeps (`finetune.sweep`) and the selection of one setting per (model, task) on dev.

A sweep is a grid per task: lists of lr, batch, epochs (and warmup_ratio, weight_decay) whose product gives
the task's settings. `grid: reference` starts from the single setting of `finetune.hparams` (TaCL's, as the
reference ran it); `grid: bert` from the BERT paper's GLUE grid (lr 5e-5, 4e-5, 3e-5, 2e-5; batch 32; 3
epochs; SQuAD and NER keep their single setting); lists under `glue`, `squad`, `ner` and `tasks.TASK`
replace the grid's for that family or task (the user's own).

A setting is named by its values, `lr3e-5_b32_e3`, plus `_wu0.06` / `_wd0.1` where warmup or weight decay
differ from the fine-tuning preset's (`finetune.preset`): the name is the same whatever else the sweep
holds, so adding a value to a list adds jobs and renames none, and the name and the preset alone give the
job its values back (`parse_setting`).

Selection (`select`): for each (model, task) the setting with the best mean over seeds of the task's
headline dev number (MCC, F1, Spearman, accuracy, SQuAD F1 as BERT and TaCL report them); equal means go to
the setting whose name sorts first. Scores selected on dev are optimistic as estimates of dev itself.
"""

from __future__ import annotations

import itertools
import math
import re
from pathlib import Path
from typing import Any

from tacl.finetune import FAMILY_HPARAMS, PRESETS
from tacl.runtime.io import InputError, read_json

SWEEP_KEYS = ("lr", "batch", "epochs", "warmup_ratio", "weight_decay")
GRIDS = {
    "reference": {},
    "bert": {"glue": {"lr": [5e-5, 4e-5, 3e-5, 2e-5], "batch": [32], "epochs": [3]}},
}
# The headline dev number of each task, as BERT and TaCL report it: (split, metric) in metrics.json.
HEADLINE_DEV = {
    "cola": ("dev", "matthews"), "sst2": ("dev", "accuracy"), "mrpc": ("dev", "f1"), "stsb": ("dev", "spearman"),
    "qqp": ("dev", "f1"), "mnli": ("dev_matched", "accuracy"), "qnli": ("dev", "accuracy"),
    "rte": ("dev", "accuracy"), "wnli": ("dev", "accuracy"), "squad_v1": ("dev", "f1"), "squad_v2": ("dev", "f1"),
    "conll2003": ("dev", "f1"),
}
_NAME = re.compile(r"lr(?P<lr>[^_]+)_b(?P<batch>\d+)_e(?P<epochs>[^_]+)(?:_wu(?P<warmup_ratio>[^_]+))?"
                   r"(?:_wd(?P<weight_decay>[^_]+))?")


def number(x: float) -> str:
    """A short text that reads back as exactly the same float: 3e-05 -> 3e-5, 1e-4 -> 1e-4, 0.06 -> 0.06,
    3.0 -> 3 (small values in e-notation, from the shortest repr, so nothing is rounded)."""
    x = float(x)
    if x.is_integer():
        return str(int(x))
    if abs(x) < 0.01:
        from decimal import Decimal

        return f"{Decimal(repr(x)).normalize():e}"
    return repr(x)


def setting_name(values: dict[str, Any], preset: str) -> str:
    name = f"lr{number(values['lr'])}_b{int(values['batch'])}_e{number(values['epochs'])}"
    for key, tag in (("warmup_ratio", "wu"), ("weight_decay", "wd")):
        if float(values[key]) != PRESETS[preset][key]:
            name += f"_{tag}{number(values[key])}"
    return name


def parse_setting(name: str, preset: str) -> dict[str, Any]:
    """The values a setting's name stands for (the preset's warmup and weight decay where it names none)."""
    m = _NAME.fullmatch(name)
    if not m:
        raise InputError(f"{name!r} is not a fine-tuning setting name (e.g. lr3e-5_b32_e3)")
    values = {k: float(v) if v is not None else PRESETS[preset][k] for k, v in m.groupdict().items()}
    values["batch"] = int(values["batch"])
    if values["epochs"].is_integer():
        values["epochs"] = int(values["epochs"])
    return values


def base_hparams(family: str, hparams: dict[str, Any], task: str, preset: str) -> dict[str, Any]:
    """A task's single setting: the family's defaults, the preset, the config's `finetune.hparams` (the
    family's, then the task's)."""
    own = hparams.get("tasks", {}).get(task, {})
    return {**FAMILY_HPARAMS[family], **PRESETS[preset], **hparams.get(family, {}), **own}


def task_grid(task: str, family: str, hparams: dict[str, Any], sweep: dict[str, Any], preset: str
              ) -> dict[str, list]:
    """The lists whose product is the task's settings."""
    base = base_hparams(family, hparams, task, preset)
    grid = {k: [base[k]] for k in SWEEP_KEYS}
    for lists in (GRIDS[sweep.get("grid", "reference")].get(family), sweep.get(family),
                  (sweep.get("tasks") or {}).get(task)):
        grid.update({k: v for k, v in (lists or {}).items() if v is not None})  # (None: the schema's "not given")
    return grid


def task_settings(task: str, family: str, hparams: dict[str, Any], sweep: dict[str, Any], preset: str) -> list[str]:
    """The names of a task's settings, in grid order, each once."""
    grid = task_grid(task, family, hparams, sweep, preset)
    names = [setting_name(dict(zip(SWEEP_KEYS, values)), preset)
             for values in itertools.product(*(grid[k] for k in SWEEP_KEYS))]
    return list(dict.fromkeys(names))


def setting_hparams(task: str, family: str, hparams: dict[str, Any], setting: str, preset: str) -> dict[str, Any]:
    """The hyperparameters of one job: the task's single setting with the setting's values over it."""
    return {**base_hparams(family, hparams, task, preset), **parse_setting(setting, preset)}


def headline_key(task: str, metrics: dict[str, Any] | None = None) -> tuple[str, str]:
    """(split, metric) of the task's headline dev number: a built-in task's, else (a declared task) what its
    metrics.json names."""
    if task in HEADLINE_DEV:
        return HEADLINE_DEV[task]
    if metrics and isinstance(metrics.get("headline"), list) and len(metrics["headline"]) == 2:
        return tuple(metrics["headline"])  # type: ignore[return-value]
    raise InputError(f"{task}: not a built-in task, and its metrics.json names no headline number")


def headline(task: str, metrics: dict[str, Any]) -> float:
    """The task's headline dev number from a metrics.json (NaN where it is missing or not a number)."""
    split, metric = headline_key(task, metrics)
    value = metrics.get("dev", {}).get(split, {}).get(metric)
    return float(value) if isinstance(value, (int, float)) else math.nan


def select(task: str, runs: list[dict[str, Any]], key: tuple[str, str] | None = None) -> dict[str, Any]:
    """The setting with the best mean headline dev number over its seeds (runs: {setting, seed, score});
    equal means (to 1e-9) go to the setting whose name sorts first. Also each setting's mean, std, seeds,
    and the best seed of the chosen one (for test predictions and intermediate-task starts). `key`: the
    headline's (split, metric), for a task that is not built in."""
    by_setting: dict[str, dict[int, float]] = {}
    for r in runs:
        by_setting.setdefault(r["setting"], {})[int(r["seed"])] = float(r["score"])
    if not by_setting:
        raise InputError(f"selection for {task}: no finished runs")
    summary = {}
    for name, seeds in sorted(by_setting.items()):
        values = [v for v in seeds.values() if not math.isnan(v)]
        mean = sum(values) / len(values) if values else math.nan
        std = math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1)) if len(values) > 1 else math.nan
        summary[name] = {"mean": mean, "std": std, "seeds": sorted(seeds)}
    chosen = min(summary, key=lambda n: (_rank(summary[n]["mean"]), n))
    seeds = by_setting[chosen]
    best_seed = min(seeds, key=lambda s: (_rank(seeds[s]), s))
    split, metric = key or HEADLINE_DEV[task]
    return {"task": task, "split": split, "metric": metric, "setting": chosen, "best_seed": best_seed,
            "settings": summary}


def _rank(score: float) -> float:
    """Sort key: higher scores first, equal to 1e-9 counted equal, NaN last."""
    return math.inf if math.isnan(score) else -round(score, 9)


def select_runs(task: str, metrics_files: list[str]) -> dict[str, Any]:
    """`select` over finished runs, read from their metrics.json (RUN/SETTING/seedN/metrics.json)."""
    runs, key = [], None
    for path in metrics_files:
        m = read_json(path)
        key = headline_key(task, m)
        runs.append({"setting": Path(path).parents[1].name, "seed": m["seed"], "score": headline(task, m)})
    return select(task, runs, key)
