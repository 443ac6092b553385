"""The files and models a config names, checked before any job runs (dry runs too), one line each naming the
key and the path: the corpus files (`data.source.paths`), each task's local fine-tuning files (the GLUE
folder, the SQuAD JSON files, the CoNLL folder), the sentence-embedding evaluation's GLUE files, and the start
model, tokenizer and extra models given as a folder or a package.

Only the inputs of jobs still to run are checked (tacl.planning.plan.plan_jobs says which): a corpus deleted after
the data stage stops nothing, and a task's files are needed while its preparation or a fine-tune of it is to
run. A Hub name is left to the download rules, which fetch it on the login node. Relative paths start at the
working directory, as the jobs' do."""

from __future__ import annotations

import glob
import os
from typing import Any, Protocol

from tacl.experiment.design import embeddings_source, extra_models, task_family, task_source
from tacl.finetune import declared
from tacl.finetune.data import local_files
from tacl.runtime.hub import resolve_pretrained
from tacl.runtime.io import InputError

Problem = tuple[str, str, str, str]  # (key, path or "", what is wrong, what reads it)


class Job(Protocol):
    """A job of the plan (tacl.planning.estimates.Job) as the check reads it: named here, not imported, since
    the plan stands above the experiment."""

    rule: str
    key: str
    done: bool


def line(key: str, path: str, what: str, readers: list[str]) -> str:
    """`key: path: what, for READERS (relative to CWD)`."""
    text = f"{key}: {path}: {what}" if path else f"{key}: {what}" if key else what
    readers = [r for r in readers if r]
    tasks = [r[len("task "):] for r in readers if r.startswith("task ")]
    if len(tasks) > 1:  # (task a, task b: tasks a, b)
        readers = [f"tasks {', '.join(tasks)}"] + [r for r in readers if not r.startswith("task ")]
    if readers:
        text += ", for " + ", ".join(readers)
    return text + ("" if not path or os.path.isabs(path) else f" (relative to {os.getcwd()})")


def corpus_errors(source: dict[str, Any]) -> list[Problem]:
    """Local corpus files (kind wikiextractor or text): each pattern of data.source.paths matches a file."""
    if source["kind"] == "hf":
        return []
    patterns = source.get("paths") or []
    if not patterns:
        return [("data.source.paths", "", f"no corpus files given (data.source.kind {source['kind']})", "")]
    return [("data.source.paths", p, "no file matches", "") for p in patterns
            if not any(os.path.isfile(m) for m in glob.glob(p))]


def file_errors(key: str, source: dict[str, Any], files: list[tuple[str, str | None]], reader: str
                ) -> list[Problem]:
    """The (sub-key, path) pairs of a source (tacl.finetune.data.local_files) that are not set or not there,
    or its `data_dir` where that folder is not there; `reader`: what reads them."""
    root = source.get("data_dir")
    if root and any(sub == "data_dir" for sub, _ in files) and not os.path.isdir(root):
        return [(f"{key}.data_dir", root, "folder not found", reader)]
    return [(f"{key}.{sub}", "", "not set", reader) if path is None else (f"{key}.{sub}", path, "not found", reader)
            for sub, path in files if path is None or not os.path.isfile(path)]


def declared_data_errors(task: str, source: dict[str, Any]) -> list[Problem]:
    """A declared task read from local files, checked against them (its fields there, its dev and test labels
    among train's: tacl.finetune.declared.check_data); a Hugging Face source is checked where the login node
    fetches it (prepare_task)."""
    if not declared.is_declared(source) or source["source"]["kind"] != "files":
        return []
    try:
        declared.check_data(task, source)
    except InputError as e:
        return [("", "", str(e), "")]
    return []


SOURCE_KEYS = {"glue": "finetune.glue_source", "squad": "finetune.squad_source", "ner": "finetune.conll_source"}


def model_error(key: str, name: str) -> str | None:
    """A model or tokenizer given as a folder or a package that is not there; None for one that is, or for a
    Hub name."""
    try:
        resolve_pretrained(name)
    except InputError as e:
        return f"{key}: {e}"
    return None


def input_errors(config: dict[str, Any], jobs: list[Job]) -> list[str]:
    """Every input the config names that a job still to run (`jobs`: tacl.planning.plan.plan_jobs) would not find,
    one line each (what several readers share, once, naming them)."""
    ft = config["finetune"]
    todo = {(j.rule, j.key) for j in jobs if not j.done}
    rules = {rule for rule, _ in todo}
    found: list[Problem] = []
    if "download_corpus" in rules:
        found += corpus_errors(config["data"]["source"])
    for task in ft["tasks"]:
        if ("prepare_task", task) in todo or any(r == "finetune" and k.endswith(f"/{task}") for r, k in todo):
            source = task_source(config, task)
            key = f"{declared.KEY}.{task}" if declared.is_declared(source) else SOURCE_KEYS[task_family(config, task)]
            problems = file_errors(key, source, local_files(task, source), f"task {task}")
            found += problems or declared_data_errors(task, source)
    if "embeddings_data" in rules:
        source = embeddings_source(config)
        key = "analysis.embeddings.source" if config["analysis"]["embeddings"]["source"] else "finetune.glue_source"
        task = config["analysis"]["embeddings"]["cluster_task"]
        files = local_files("stsb", source, ("dev",)) + local_files(task, source, ("dev",))
        found += file_errors(key, source, files, "the sentence-embedding evaluation")
    readers: dict[tuple[str, str, str], list[str]] = {}
    for key, path, what, reader in found:
        readers.setdefault((key, path, what), []).append(reader)
    problems = [line(key, path, what, list(dict.fromkeys(r))) for (key, path, what), r in readers.items()]
    models = []
    if "fetch_tokenizer" in rules:
        models.append(("tokenizer", config["tokenizer"]) if config["tokenizer"] else ("model", config["model"]))
    if "init_model" in rules and config["model_init"].get("kind", "pretrained") != "random":
        models.append(("model", config["model"]))
    models += [(f"finetune.extra_models.{m}", ft["extra_models"][m]) for m in extra_models(config)
               if ("extra_model", m) in todo]
    return problems + [why for key, name in dict.fromkeys(models) if (why := model_error(key, name))]
