"""`tacl publish`: each model pretrained in a results folder as the Hugging Face Hub takes it, and its upload.

For every exported model (`models/OBJECTIVE`, pretrained with an objective other than `none`) a folder
`publish/OBJECTIVE` (tacl.runtime.layout) holds:

- the export's files, hard-linked (copied where the filesystem cannot link), so that the export stays where
  the workflow's other jobs read it;
- README.md, the model card: the Hub's metadata (base_model, language, datasets, license, pipeline_tag
  fill-mask, tags, and a model-index of every finished GLUE, SQuAD, CoNLL-2003 and declared-task number the
  report's tables show for the model, its split and the number of fine-tuning seeds its mean is over), then
  the same in words;
- tacl_config.json, what made the model, read from the run's own records: the pretraining settings that
  decide its result (the run's run.json), the start model's record, the data's source, cleaning and shards,
  and the export's summary; data_summary.json, the data stage's counts; training_curves.png and .csv, the
  report's training curve of this run.

The numbers come from tacl.report.tables.finished, which the report's tables come from, shown to the
tables' one decimal, so that a card says what the report says. The start model itself (objective `none`) gets
no folder: it is not a model this workflow made (publish the model it came from).

`push` uploads one folder with huggingface_hub: from a login node (a compute node does not reach the Hub:
`push_refusal`), with the token of `hf auth login` or HF_TOKEN (`hub_token`).
"""

from __future__ import annotations

import json
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import pandas as pd

from tacl.objectives.registry import REGISTRY
from tacl.report.expected import EXPECTED, read_expected
from tacl.report.tables import (GLUE_COLUMNS, PERCENT_FAMILIES, SQUAD_COLUMNS, cell_text, finished, presets,
                                summary_row)
from tacl.runtime.io import InputError, atomic_path, read_json, write_json_atomic, write_text_atomic
from tacl.runtime.layout import Layout

CARD = "README.md"
CONFIG = "tacl_config.json"  # (config.json is the model's own, transformers')
DATA_SUMMARY = "data_summary.json"
CURVES = "training_curves"  # .png and .csv
WORKFLOW = "tacl-workflow"
PIPELINE = "fill-mask"  # a pretrained encoder with its masked-LM head
NO_LICENSE = "other"  # the Hub's id for a license it does not list; the card says none was given

# Built-in tasks on the Hub: (dataset id, its configuration, the dataset's name, the Hub's task type)
HUB_TASKS = {
    "cola": ("nyu-mll/glue", "cola", "GLUE CoLA", "text-classification"),
    "sst2": ("nyu-mll/glue", "sst2", "GLUE SST-2", "text-classification"),
    "mrpc": ("nyu-mll/glue", "mrpc", "GLUE MRPC", "text-classification"),
    "stsb": ("nyu-mll/glue", "stsb", "GLUE STS-B", "text-classification"),
    "qqp": ("nyu-mll/glue", "qqp", "GLUE QQP", "text-classification"),
    "mnli": ("nyu-mll/glue", "mnli", "GLUE MNLI", "text-classification"),
    "qnli": ("nyu-mll/glue", "qnli", "GLUE QNLI", "text-classification"),
    "rte": ("nyu-mll/glue", "rte", "GLUE RTE", "text-classification"),
    "wnli": ("nyu-mll/glue", "wnli", "GLUE WNLI", "text-classification"),
    "squad_v1": ("rajpurkar/squad", None, "SQuAD 1.1", "question-answering"),
    "squad_v2": ("rajpurkar/squad_v2", None, "SQuAD 2.0", "question-answering"),
    "conll2003": ("eriktks/conll2003", None, "CoNLL-2003", "token-classification"),
}
DECLARED_TASK_TYPES = {"classification": "text-classification", "regression": "text-classification",
                       "token_classification": "token-classification", "extractive_qa": "question-answering"}
# our split names as the Hub's datasets name theirs
HUB_SPLITS = {"dev": "validation", "dev_matched": "validation_matched", "dev_mismatched": "validation_mismatched",
              "test": "test"}
# our metric names as the Hub's metric ids (the others are the same in both)
HUB_METRICS = {"matthews": "matthews_correlation", "pearson": "pearsonr", "spearman": "spearmanr",
               "exact": "exact_match"}
METRIC_WORDS = {"matthews": "MCC", "accuracy": "accuracy", "f1": "F1", "pearson": "Pearson", "spearman": "Spearman",
                "exact": "EM", "macro_f1": "macro F1"}
# The environment of a scheduler's job: a compute node, which does not reach the Hub
JOB_VARIABLES = ("SLURM_JOB_ID", "PBS_JOBID")


@dataclass(frozen=True)
class Cell:
    """One number a report table shows: a task's metric on a split, and the table's column label."""

    task: str
    split: str
    metric: str
    label: str


def report_cells(tasks: list[str], records: dict[str, dict[str, Any]]) -> list[Cell]:
    """The numbers of the report's headline tables, in their order: GLUE dev's columns, SQuAD dev's at null
    threshold 0 (the dev-tuned threshold's scores are not comparable with published numbers: the report
    keeps them apart, and the card leaves them out), CoNLL-2003's dev and test F1, each declared task's
    metric on dev and on its labelled test split."""
    cells = [Cell(task, split, metric, label) for label, task, split, metrics in GLUE_COLUMNS if task in tasks
             for metric in metrics]
    cells += [Cell(task, "dev", metric, label) for label, task, metric in SQUAD_COLUMNS
              if task in tasks and not metric.startswith("best_")]
    if "conll2003" in tasks:
        cells += [Cell("conll2003", split, "f1", f"CoNLL-2003 F1 ({split})") for split in ("dev", "test")]
    for task, record in records.items():
        if record.get("declared"):
            metric = record["declared"]["metric"]
            cells += [Cell(task, split, metric, f"{task} ({metric}, {split})") for split in ("dev", "test")
                      if split in record.get("splits", {})]
    return cells


def model_results(summary: pd.DataFrame, long: pd.DataFrame, chosen: dict[tuple[str, str], dict[str, Any]],
                  model: str, cells: list[Cell]) -> list[dict[str, Any]]:
    """Each report number of `model` that has a finished run: its cell, the mean as the table prints it
    (`value`, one decimal) and in full, the sample std, the number of seeds, the table's text, the selected
    setting and the fine-tuning preset."""
    out = []
    for c in cells:
        row = summary_row(summary, model, c.task, c.split, c.metric)
        if row is None:
            continue
        runs = long[(long.model == model) & (long.task == c.task)]
        out.append({"task": c.task, "split": c.split, "metric": c.metric, "label": c.label,
                    "value": float(f"{row['mean']:.1f}"), "mean": float(row["mean"]),
                    "std": None if pd.isna(row["std"]) else float(row["std"]), "seeds": int(row["n"]),
                    "text": cell_text(summary, model, c.task, c.split, [c.metric]),
                    "setting": chosen.get((model, c.task), {}).get("setting"),
                    "preset": presets(long, model, {c.task}),
                    "percent": bool(set(runs.family) & PERCENT_FAMILIES)})
    return out


def eval_results(results: list[dict[str, Any]], records: dict[str, dict[str, Any]]) -> list[Any]:
    """The results as huggingface_hub's EvalResult, the model-index's entries: the Hub's task, dataset
    (configuration, split, the examples evaluated) and metric ids, the value as the report's table prints it,
    and a metric name that says the split and how many fine-tuning seeds the mean is over."""
    from huggingface_hub import EvalResult

    out = []
    for r in results:
        record = records.get(r["task"], {})
        dataset, config, name, task_type = hub_task(r["task"], record)
        examples = record.get("splits", {}).get(r["split"])
        seeds = f"mean over {r['seeds']} fine-tuning seed{'s' if r['seeds'] > 1 else ''}"
        scale = ", x100" if r["percent"] else ""
        out.append(EvalResult(
            task_type=task_type, task_name=r["task"], dataset_type=dataset, dataset_config=config,
            dataset_name=f"{name} ({examples} {r['split']} examples)" if examples else name,
            dataset_split=hub_split(r["task"], r["split"], record), metric_type=HUB_METRICS.get(r["metric"],
                                                                                              r["metric"]),
            metric_value=r["value"],
            metric_name=f"{METRIC_WORDS.get(r['metric'], r['metric'])} ({r['split']}{scale}, {seeds})"))
    return out


def hub_task(task: str, record: dict[str, Any]) -> tuple[str, str | None, str, str]:
    """(dataset id, configuration, name, the Hub's task type) of a task: a built-in one's Hub dataset; a
    declared one's Hub dataset where it came from the Hub, else the task's own name."""
    if task in HUB_TASKS:
        return HUB_TASKS[task]
    declared = record.get("declared") or {}
    source = (record.get("source") or {}).get("source") or {}
    task_type = DECLARED_TASK_TYPES.get(declared.get("kind"), "text-classification")
    if source.get("kind") == "hf" and source.get("name"):
        return source["name"], source.get("config"), task, task_type
    return task, None, task, task_type


def hub_split(task: str, split: str, record: dict[str, Any]) -> str:
    """The dataset's own name of our split: the Hub's for a built-in task, the declared split where a declared
    task names one of its Hub dataset, else ours."""
    if task in HUB_TASKS:
        return HUB_SPLITS.get(split, split)
    given = ((record.get("source") or {}).get("splits") or {}).get(split)
    hub = ((record.get("source") or {}).get("source") or {}).get("kind") == "hf"
    return given if hub and isinstance(given, str) else split


# -- what made the model ----------------------------------------------------------------------------------------


def public(name: Any) -> Any:
    """A model or tokenizer as the card may name it: a Hub name or package as it is, a local folder by its last
    part (no path of this machine goes to the Hub)."""
    if isinstance(name, str) and (name.startswith(("/", "~", ".")) or name.count("/") > 1):
        return Path(name).name
    return name


def exported(layout: Layout, name: str) -> bool:
    return Path(layout.model(name)).is_dir() and Path(layout.model_summary(name)).is_file()


def base_model(start: dict[str, Any]) -> str | None:
    """The Hub name of the model this one continued from, or None: a random start (trained from scratch), a
    local folder or a Python package's model has none on the Hub."""
    init = start.get("init") or {}
    name = (start.get("given") or {}).get("model")
    if init.get("kind", "pretrained") == "random" or not isinstance(name, str):
        return None
    if name.startswith(("package:", "/", ".", "~")) or name.count("/") > 1 or not name.strip():
        return None
    return name


def language_of(given: str | None, wanted: dict[str, Any], source: dict[str, Any]) -> str:
    """The language of the text the model was trained on: `given` (--language), else the config's
    data.language as the workflow recorded it (expected.json), else the Wikipedia configuration a Hub source
    names (`20231101.hr`: hr). An ISO 639 code, as the Hub asks."""
    language = given or wanted.get("language")
    if not language and source.get("kind") == "hf":
        m = re.fullmatch(r"\d{8}\.([a-z]{2,3})", str(source.get("config", "")))
        language = m.group(1) if m else None
    if not language:
        raise InputError("the language of the training text is not recorded here (expected.json has no "
                         "`language`: run snakemake once more for this results folder to record it); give it with "
                         "--language, an ISO 639 code such as en or hr")
    if not re.fullmatch(r"[a-z]{2,3}(-[A-Za-z0-9]+)?", language):
        raise InputError(f"--language {language!r}: not an ISO 639 code (two or three small letters, e.g. en, hr)")
    return language


def datasets_of(source: dict[str, Any]) -> list[str]:
    """The Hub datasets the training text came from: a Hub source's dataset; WikiExtractor files hold
    Wikipedia's text (wikimedia/wikipedia is Wikipedia on the Hub); plain text files name none."""
    if source.get("kind") == "hf" and source.get("dataset"):
        return [source["dataset"]]
    if source.get("kind") == "wikiextractor":
        return ["wikimedia/wikipedia"]
    return []


def data_record(layout: Layout) -> dict[str, Any]:
    """What the data stage recorded of the training text, without this machine's paths: the source (its
    files by name, size and sha256), the cleaning's settings and counts, the shards' settings and form, and
    the counts of data/summary.json."""
    data = Path(layout.data)
    raw = read_json(data / "raw.json") if (data / "raw.json").is_file() else {}
    source = {k: v for k, v in (raw.get("source") or {}).items() if k != "cache_dir"}
    if source.get("paths"):
        source["paths"] = [Path(p).name for p in source["paths"]]
    files = [{"name": Path(f["path"]).name, **{k: f[k] for k in ("bytes", "sha256") if k in f}}
             for f in raw.get("files", [])]
    clean = read_json(data / "clean.json") if (data / "clean.json").is_file() else {}
    manifest = read_json(layout.manifest) if Path(layout.manifest).is_file() else {}
    tokenizer = dict((manifest.get("shards") or [{}])[0].get("tokenizer") or {})
    if "name" in tokenizer:
        tokenizer["name"] = public(tokenizer["name"])
    shards = {"settings": manifest.get("config"), "form": manifest.get("form"),
              "tokenizer": tokenizer or None} if manifest else None
    summary = read_json(layout.data_summary) if Path(layout.data_summary).is_file() else None
    if summary and "tokenizer" in summary:
        summary["tokenizer"] = public(summary["tokenizer"])
    return {"source": source, "files": files or None, "cleaning": clean or None, "shards": shards,
            "summary": summary}


def made_of(layout: Layout, name: str) -> dict[str, Any]:
    """tacl_config.json: what made the model, from the run's own records (the config may have changed since):
    the objective, the pretraining settings that decide its result (run.json's `result`, and its `identity`:
    the data and start model it trained on), the start model's record, the data's (data_record) and the
    export's summary."""
    export = read_json(layout.model_summary(name))
    run_json = Path(layout.pretrain_run(name), "run.json")
    run = read_json(run_json) if run_json.is_file() else {}
    objective = export.get("objective", name)
    start = dict(export.get("start_model") or {})
    if start.get("init", {}).get("kind") != "random":
        start["source"] = public(start.get("source"))
    start["given"] = {**start.get("given", {}), "model": public(start.get("given", {}).get("model"))}
    return {"model": name, "objective": objective,
            "objective_summary": REGISTRY[objective].summary if objective in REGISTRY else None,
            "pretrain": run.get("result"), "identity": run.get("identity"),
            "start_model": start, "data": data_record(layout),
            "export": {k: v for k, v in export.items() if k != "start_model"}}


# -- the card ---------------------------------------------------------------------------------------------------


def card_data(name: str, made: dict[str, Any], results: list[dict[str, Any]], records: dict[str, dict[str, Any]],
              language: str, license: str | None) -> Any:
    """The card's metadata as huggingface_hub's ModelCardData (which writes the model-index as the Hub reads
    it)."""
    from huggingface_hub import ModelCardData

    start = made["start_model"] or {}
    tags = [WORKFLOW, made["objective"], start.get("family"), "pretraining"]
    return ModelCardData(
        language=language, license=license or NO_LICENSE, library_name="transformers",
        base_model=base_model(start), datasets=datasets_of(made["data"]["source"]) or None,
        pipeline_tag=PIPELINE, tags=[t for t in tags if t],
        # (the model-index's name; without results, no model-index and no name)
        model_name=name if results else None, eval_results=eval_results(results, records) or None)


def _number(n: Any) -> str:
    return f"{n:,}" if isinstance(n, int) else str(n)


def card_text(name: str, made: dict[str, Any], results: list[dict[str, Any]], data: Any, results_name: str,
              license: str | None, curve: bool) -> str:
    """README.md: the metadata block, then what the model is, its results (the report's numbers), how it was
    trained, on what data, the files beside it and its license."""
    start, export, pretrain = made["start_model"] or {}, made["export"], made["pretrain"] or {}
    summary = (made["data"].get("summary") or {})
    source = made["data"]["source"]
    init = start.get("init") or {}
    size = ", ".join(f"{k} {v}" for k, v in init.items() if k != "kind")
    begun = (f"from a random initialisation ({size})" if init.get("kind") == "random"
             else f"continued from `{start.get('source')}`")
    lines = [f"---\n{data.to_yaml()}\n---", "", f"# {name}", "",
             f"An encoder of the {start.get('family')} family ({_number(start.get('parameters'))} parameters with "
             f"its pretraining heads) pretrained with the objective `{made['objective']}`"
             + (f" ({made['objective_summary']})" if made["objective_summary"] else "")
             + f", {begun}, for {_number(export.get('steps'))} optimizer steps"
             + (f" ({_number(export.get('tokens'))} tokens)" if export.get("tokens") else "")
             + f" by `{WORKFLOW}`. It is the pretrained encoder, to be fine-tuned (pipeline `{PIPELINE}`, its "
             "masked-LM head included).", "", "## Results", ""]
    if results:
        lines += [f"Fine-tuned by the same workflow: scores x100 where the metric is a fraction, mean ± sample "
                  "std over fine-tuning seeds, of the fine-tuning setting selected on dev; the numbers of the "
                  f"workflow's report ({results_name}/report), which also holds the control models' rows and "
                  "the chance rows to read them against.", "",
                  "| task | split | metric | mean ± std | seeds | setting | preset |",
                  "|---|---|---|---|---|---|---|"]
        lines += [f"| {r['task']} | {r['split']} | {r['metric']} | {r['text']} | {r['seeds']} | {r['setting']} | "
                  f"{r['preset']} |" for r in results]
    else:
        lines.append("No fine-tune of this model had finished when this card was written.")
    lines += ["", "## Training", "",
              f"The settings that decide the result (from the run's own record; all of them in `{CONFIG}`):", "",
              "| setting | value |", "|---|---|"]
    lines += [f"| {k} | `{json.dumps(v)}` |" for k, v in pretrain.items()]
    if export.get("chunks"):
        lines += ["", f"Trained in {export['chunks']} chunks, {export.get('wall_s')} s in all."]
    lines += ["", "## Data", "", _data_words(source, summary), ""]
    if curve:
        lines += ["## Training curve", "", f"![training curve]({CURVES}.png)", "",
                  f"Each loss term and the learning rate against the optimizer step (the points: `{CURVES}.csv`).",
                  ""]
    lines += ["## Files", "",
              "- the model: config.json, the weights and the tokenizer, as `transformers` saves them;",
              f"- `{CONFIG}`: what made the model: the pretraining settings, the start model, the data's source, "
              "cleaning and shards, the export's summary;",
              f"- `{DATA_SUMMARY}`: the data stage's counts;"]
    if curve:
        lines.append(f"- `{CURVES}.png`, `{CURVES}.csv`: the training curve.")
    lines += ["", "## License", "", _license_words(license, start), ""]
    return "\n".join(lines)


def _data_words(source: dict[str, Any], summary: dict[str, Any]) -> str:
    kind = source.get("kind")
    where = (f"the Hugging Face dataset `{source.get('dataset')}` (`{source.get('config')}`, split "
             f"`{source.get('split')}`)" if kind == "hf" else
             f"WikiExtractor text of Wikipedia ({', '.join(source.get('paths') or [])})" if kind == "wikiextractor"
             else f"plain text files ({', '.join(source.get('paths') or [])})")
    if not summary:
        return f"Text from {where}."
    counts = ", ".join(f"{_number(summary[k])} {k}" for k in ("documents", "sentences", "examples", "tokens",
                                                               "shards") if k in summary)
    return f"Text from {where}: {counts} (`{DATA_SUMMARY}`), tokenized with `{summary.get('tokenizer')}`."


def _license_words(license: str | None, start: dict[str, Any]) -> str:
    if license:
        return f"{license} (as given to `tacl publish --license`)."
    return ("Not stated (`license: other`): choose one with `tacl publish --license ID` (an id of the Hub's list), "
            "as the start model's license and the training text's allow (Wikipedia's text is CC BY-SA 4.0)"
            + (f"; the start model: `{start.get('source')}`." if (start.get("init") or {}).get("kind") != "random"
               else "."))


# -- the folder -------------------------------------------------------------------------------------------------


def link_files(src: Path, dst: Path) -> str:
    """Every file of the export `src` (not its hidden ones, such as Snakemake's timestamp) into `dst`: hard
    links where the filesystem makes them, copies elsewhere. Returns 'linked', 'copied' or both."""
    how = set()
    for f in sorted(src.iterdir()):
        if f.name.startswith(".") or not f.is_file():
            continue
        try:
            os.link(f, dst / f.name)
            how.add("linked")
        except OSError:
            shutil.copy2(f, dst / f.name)
            how.add("copied")
    return " and ".join(sorted(how)) or "none"


def write_folder(layout: Layout, name: str, card: str, made: dict[str, Any], run: Any) -> str:
    """The Hub-ready folder of one model, written under a temporary name and renamed into place; returns how
    the model's files came in (link_files)."""
    from tacl.report.curves import curves_figure, curves_table
    from tacl.report.document import save_png

    with atomic_path(layout.hub_folder(name)) as tmp:
        tmp.mkdir()
        how = link_files(Path(layout.model(name)), tmp)
        write_text_atomic(tmp / CARD, card)
        write_json_atomic(tmp / CONFIG, made)
        if made["data"]["summary"] is not None:
            write_json_atomic(tmp / DATA_SUMMARY, made["data"]["summary"])
        if run is not None:
            write_text_atomic(tmp / f"{CURVES}.csv", curves_table([run]).to_csv(index=False))
            save_png(curves_figure([run]), tmp / f"{CURVES}.png", dpi=110)
    return how


def wanted_of(results_dir: str) -> dict[str, Any]:
    """expected.json of `results_dir`: the tasks and objectives the workflow recorded."""
    wanted = read_expected(results_dir)
    if wanted is None:
        raise InputError(f"{Path(results_dir, EXPECTED)}: not found; the workflow writes it when Snakemake starts "
                         "jobs for this results directory, and the cards need it to know the tasks and models")
    return wanted


def to_publish(results_dir: str, models: list[str] | None = None) -> tuple[list[str], dict[str, str]]:
    """The models that get a folder (every exported one, or `models`, each of which must be), and those left
    out, each with why: the start model (objective `none`), not a model this workflow made, and the ones not
    exported yet. Reads expected.json and looks for the exports, nothing more."""
    layout = Layout(str(Path(results_dir)))
    objectives = list(wanted_of(results_dir).get("objectives") or [])
    unknown = [m for m in models or [] if m not in objectives]
    if unknown:
        raise InputError(f"--models {' '.join(unknown)}: not an objective of {results_dir} (its objectives: "
                         f"{', '.join(objectives)})")
    left: dict[str, str] = {}
    for name in models or objectives:
        if name == "none":
            left[name] = ("the start model itself (objective none), not a model this workflow made: publish the "
                          "model it came from")
        elif not exported(layout, name):
            if models:
                raise InputError(f"{layout.model(name)}: not exported yet (the workflow's export_model job writes "
                                 "it, with its summary beside it)")
            left[name] = f"not exported yet ({layout.model(name)})"
    return [m for m in models or objectives if m not in left], left


def publish(results_dir: str, models: list[str] | None = None, license: str | None = None,
            language: str | None = None) -> list[dict[str, Any]]:
    """The Hub-ready folder of every exported model of `results_dir` (or of `models`); returns, per model,
    its folder, the number of results its card holds and how its files came in, or why it has none
    (to_publish). Reads files only; the tasks are those the workflow recorded (expected.json)."""
    from tacl.report.curves import pretraining_runs

    layout = Layout(str(Path(results_dir)))
    wanted = wanted_of(results_dir)
    names, left = to_publish(results_dir, models)
    language = language_of(language, wanted, data_record(layout)["source"])
    tasks = wanted.get("tasks") or []
    _, records, chosen, long, summary = finished(results_dir, tasks, [])  # (a damaged file: logged, left out)
    cells = report_cells(tasks, records)
    runs = {r.objective: r for r in pretraining_runs(results_dir)}
    out = [{"model": name, "skipped": why} for name, why in left.items()]
    for name in names:
        made = made_of(layout, name)
        results = model_results(summary, long, chosen, name, cells)
        data = card_data(name, made, results, records, language, license)
        card = card_text(name, made, results, data, wanted.get("results_dir", results_dir), license,
                         name in runs)
        how = write_folder(layout, name, card, made, runs.get(name))
        out.append({"model": name, "folder": layout.hub_folder(name), "results": len(results), "files": how})
    return out


# -- the upload -------------------------------------------------------------------------------------------------


def push_refusal(environ: Mapping[str, str], license: str | None) -> str | None:
    """Why this push cannot go (a scheduler's job: a compute node; HF_HUB_OFFLINE=1; no license given, which
    would publish a card whose license says `other`), or None."""
    job = next((v for v in JOB_VARIABLES if environ.get(v)), None)
    if job:
        return (f"--push: this is a compute node ({job} is set), which does not reach the Hugging Face Hub; run "
                "tacl publish --push from a login node")
    if environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on"):
        return ("--push: HF_HUB_OFFLINE=1 keeps this machine off the Hugging Face Hub (as on a compute node); run "
                "tacl publish --push from a login node, without HF_HUB_OFFLINE")
    if not license:
        return ("--push: give the model's license with --license ID (an id of the Hub's list, e.g. apache-2.0 for "
                "a BERT start, mit for XLM-R, as the start model's and the text's licenses allow); without it the "
                "card says `license: other`")
    return None


def hub_token() -> str:
    """The Hugging Face token of this machine (HF_TOKEN, or the one `hf auth login` saved); never printed."""
    from huggingface_hub import get_token

    token = get_token()
    if not token:
        raise InputError("--push: no Hugging Face token on this machine: log in with `hf auth login` (a token "
                         "with write access, from https://huggingface.co/settings/tokens) or set HF_TOKEN, then run "
                         "again")
    return token


def repo_ids(repo: str, names: list[str]) -> dict[str, str]:
    """model -> the Hub repository it goes to: REPO_ID with {model} in it names one per model; without it, one
    model only."""
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    if "{model}" not in repo and len(names) != 1:
        raise InputError(f"--push {repo}: {len(names)} models to publish ({', '.join(names)}); name one with "
                         "--models, or put {model} in REPO_ID for a repository per model")
    ids = {name: repo.replace("{model}", name) for name in names}
    for repo_id in ids.values():
        try:
            validate_repo_id(repo_id)
        except HFValidationError as e:
            raise InputError(f"--push {repo_id}: not a Hub repository id ({str(e).splitlines()[0]})") from None
    return ids


def push(folder: str, repo_id: str, token: str, private: bool = False) -> str:
    """Upload one Hub-ready folder to the model repository `repo_id` (created if missing; private if asked):
    the URL of the commit. HF_ENDPOINT, when set, names the Hub (as huggingface_hub reads it)."""
    from huggingface_hub import HfApi
    from huggingface_hub.errors import HfHubHTTPError

    from tacl.runtime.hub import hub_failure

    api = HfApi(endpoint=os.environ.get("HF_ENDPOINT") or None, token=token)
    try:
        api.create_repo(repo_id, repo_type="model", private=private, exist_ok=True)
        info = api.upload_folder(repo_id=repo_id, folder_path=folder, repo_type="model", ignore_patterns=[".*"],
                                 commit_message=f"{WORKFLOW}: {Path(folder).name}")  # (not Snakemake's timestamp)
    except Exception as e:
        failure = hub_failure(e)
        if failure is not None and failure[0] == "offline":
            raise InputError(f"--push {repo_id}: {failure[1]}") from None
        if isinstance(e, HfHubHTTPError):
            raise InputError(f"--push {repo_id}: the Hugging Face Hub refused it: {str(e).splitlines()[0]}") from None
        if isinstance(e, ValueError):  # (the Hub found the card's metadata invalid: its reasons, on one line)
            raise InputError(f"--push {repo_id}: {' '.join(str(e).split())}") from None
        raise
    return str(info.commit_url)
