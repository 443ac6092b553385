"""The summary printed before anything runs: which finished work this run does again, and why.

Every job that is expensive, or that everything after it depends on, keeps the settings it ran with (the
same values the workflow passes it among the parameters Snakemake compares): a clean job in clean.json, the
start model in its tacl_start.json, the shards in their manifest, a pretraining run in run.json, a fine-tune
in given.json beside its metrics.json, an analysis in its JSON. Where a finished job's record differs from
what the config says now, Snakemake will run it again; this says so first, one line per rule and change, so
that a user can stop before spending GPU hours (e.g. "pretrain_chunk tacl: lr 0.0001 -> 5e-05"). The words of
a change come from tacl.runtime.io.changed_keys, which the trainer uses too (a pretraining run whose result
settings changed starts again: tacl.pretrain.identity)."""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

from tacl import RESULT_VERSIONS
from tacl.data.build import shard_config, tokenizer_form
from tacl.data.clean import clean_given
from tacl.data.download import TOKENIZER_META
from tacl.experiment.design import (clean_stops, expected_runs, finetune_models, pretrain_settings, setting_hparams,
                                    start_model_init, task_source, tokenizer_given)
from tacl.runtime.layout import Layout
from tacl.finetune import GIVEN, finetune_given
from tacl.runtime.io import changed_keys


@dataclass
class Finished:
    """One finished job's record: `rule` names it (with its objective or model), `record` is the file that
    keeps its settings under `key` (dotted), `done` the output whose presence says it finished, `current`
    what the config gives it now, `label` the job among its rule's (for a count), `then` what follows."""

    rule: str
    record: str
    key: str
    done: str
    current: dict[str, Any]
    label: str = ""
    then: str = ""

    @cached_property
    def changes(self) -> list[str]:
        """What changed in the job's settings ("lr 0.0001 -> 5e-05"); none for a job not finished or without a
        record. Read once: the plan and the rerun summary ask the same jobs."""
        if not Path(self.done).exists():
            return []
        before = recorded(self.record, self.key)
        if before is None:
            return []
        # (a record may keep more than the config decides, e.g. a fine-tune's start model's weights, whose
        # change reruns the job through its input's modification time)
        return changed_keys({k: v for k, v in before.items() if k in self.current}, self.current)


def recorded(path: str, key: str) -> dict[str, Any] | None:
    """The settings kept under `key` in a JSON record; None when the record or the key is not there (a job
    whose output keeps no record of its settings: nothing to compare)."""
    try:
        value: Any = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError):
        return None
    for part in key.split(".") if key else []:
        if not isinstance(value, dict) or part not in value:
            return None
        value = value[part]
    return value if isinstance(value, dict) else None


def rerun_tags(jobs: list[Finished]) -> set[str]:
    """`RULE:LABEL` of each finished job whose settings changed: what the plan (tacl.planning.plan) counts as to
    run, with every job that depends on it."""
    return {f"{job.rule}:{job.label}" for job in jobs if job.changes}


def _recorded_form(layout: Layout) -> str:
    """The form the shards are made in, as the tokenizer the data stage saved decides it (its family); NSP
    pairs before it is saved (the tokenizer job's own change then says why the shards run again)."""
    meta = Path(layout.data) / "tokenizer" / TOKENIZER_META
    return tokenizer_form(json.loads(meta.read_text()) if meta.is_file() else {})


def finished_jobs(config: dict[str, Any], layout: Layout) -> list[Finished]:
    """The finished jobs of an experiment that keep the settings they ran with, beside what the config gives
    them now (the same values the workflow passes the jobs)."""
    d, ft, start = config["data"], config["finetune"], layout.start
    clean, manifest = f"{layout.data}/clean.json", layout.manifest
    raw = f"{layout.data}/raw.json"
    jobs = [
        Finished("download_corpus", raw, "source", raw, dict(d["source"])),
        Finished("fetch_tokenizer", f"{layout.data}/tokenizer/{TOKENIZER_META}", "given", f"{layout.data}/tokenizer",
                 tokenizer_given(config)),
        Finished("clean", clean, "given", clean,
                 clean_given(d["max_lines"], d["heldout_fraction"], d["sentence_splitter"], clean_stops(config))),
        Finished("shard", manifest, "config", manifest,
                 shard_config(d["max_len"], d["short_seq_prob"], d["seed"], d["dupe_factor"], d["num_shards"],
                              _recorded_form(layout))),
        Finished("init_model", f"{start}/tacl_start.json", "given", start,
                 {"model": config["model"], "init": start_model_init(config)}),
    ]
    again = (f"each starts again from the start model, its checkpoints set aside in "
             f"{layout.pretrain}/OBJECTIVE/superseded/")
    for o in config["pretrain"]["objectives"]:
        if o != "none":
            run, result = f"{layout.pretrain_run(o)}/run.json", pretrain_settings(config, o).result()
            jobs.append(Finished("pretrain_chunk", run, "result", layout.chunk_marker(o, 0), result, o, again))
    jobs += [Finished("prepare_task", layout.task_data(t), "source", layout.task_data(t), task_source(config, t), t)
             for t in ft["tasks"]]
    for r in expected_runs(config):
        hparams = setting_hparams(config, r["task"], r["setting"])
        given = finetune_given(task_source(config, r["task"]), hparams, ft["precision"], ft["preset"])
        label, folder = f"{r['model']}/{r['task']}/{r['setting']}/seed{r['seed']}", layout.run_dir(r)
        jobs.append(Finished("finetune", f"{folder}/{GIVEN}", "", f"{folder}/metrics.json", given, label))
    a = config["analysis"]
    given = {"sentences": a["similarity_sentences"], "seed": a["similarity_seed"],
             "max_len": a["similarity_max_len"], "version": RESULT_VERSIONS["analysis"]}
    for m in finetune_models(config):
        path = layout.similarity(m)
        jobs.append(Finished("similarity", path, "given", path, dict(given), m))
    return jobs


def rerun_lines(jobs: list[Finished]) -> list[str]:
    """One line per (rule, change): the finished jobs whose settings changed, counted."""
    groups: dict[tuple[str, tuple[str, ...], str], list[str]] = defaultdict(list)
    for job in jobs:
        if job.changes:
            groups[(job.rule, tuple(job.changes), job.then)].append(job.label)
    lines = []
    for (rule, changes, then), labels in groups.items():
        what = rule
        if any(labels):
            what += f" ({', '.join(labels)})" if len(labels) <= 4 else f" ({len(labels)} runs, e.g. {labels[0]})"
        lines.append(f"{what}: {'; '.join(changes)}" + (f" ({then})" if then else ""))
    return lines


def summary(jobs: list[Finished]) -> str | None:
    lines = rerun_lines(jobs)
    if not lines:
        return None
    return ("Finished work that this run does again, because the settings it was made with changed "
            "(and everything that depends on it):\n  " + "\n  ".join(lines) +
            "\nStop now (Ctrl-C) to keep it as it is; the config keys named above decide it.")


# Snakemake invocations that plan no jobs: no summary for them.
NO_JOBS = ("--lint", "--report", "--list-rules", "--list", "-l", "--list-target-rules", "--lt", "--summary", "-S",
           "--detailed-summary", "-D", "--dag", "--rulegraph", "--filegraph", "--d3dag", "--unlock",
           "--cleanup-metadata", "--cm", "--archive", "--delete-all-output", "--delete-temp-output",
           "--containerize", "--generate-unit-tests", "--print-compilation", "--version", "-v", "--help", "-h")


def plans_jobs(argv: list[str]) -> bool:
    """Whether a Snakemake command line runs or dry-runs jobs (and so wants the summary)."""
    return not any(a.split("=")[0] in NO_JOBS for a in argv[1:])
