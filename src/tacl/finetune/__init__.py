"""Fine-tuning and evaluation: GLUE, SQuAD, CoNLL-2003 NER."""

from __future__ import annotations

from typing import Any

from tacl import RESULT_VERSIONS

# The one list of fine-tuning tasks, with their family, in the order the tables show them. The workflow
# (tacl.experiment.design) and the command line's choices come from it; the schema's enums,
# each family's specs (glue.TASKS, SQUAD_TASKS, data.NER_TASKS) and each task's headline number
# (sweep.HEADLINE_DEV) are checked equal to it (tests/test_registry.py). No heavy import here: the
# Snakefile reads it while it parses.
TASKS = {"cola": "glue", "sst2": "glue", "mrpc": "glue", "stsb": "glue", "qqp": "glue", "mnli": "glue",
         "qnli": "glue", "rte": "glue", "wnli": "glue", "squad_v1": "squad", "squad_v2": "squad",
         "conll2003": "ner"}
GLUE_TASKS = tuple(t for t, family in TASKS.items() if family == "glue")
GLUE_REGRESSION = ("stsb",)  # the GLUE task with a score, not a class (no contrastive fine-tuning, no clustering)
GLUE_CLASSIFICATION = tuple(t for t in GLUE_TASKS if t not in GLUE_REGRESSION)
# SQuAD's tasks and the version of each (tacl.finetune.data and the SQuAD fine-tune, tacl.finetune.qa, read it:
# here, not in tacl.finetune.data, which imports tacl.finetune.qa to prepare a task)
SQUAD_TASKS = {"squad_v1": "1.1", "squad_v2": "2.0"}
# CoNLL-2003's files in `finetune.conll_source.data_dir`, by split (tacl.finetune.ner reads them)
CONLL_FILES = {"train": "train.txt", "dev": "valid.txt", "test": "test.txt"}
# The forms of contrastive fine-tuning (tacl.finetune.contrastive computes them), each a model's own rows,
# MODEL+FORM: the command line's choices and the rules' wildcard constraint (finetune.smk) come from here; the
# schema's enum is checked equal to it (tests/test_registry.py). Here, not in tacl.finetune.contrastive, which
# imports torch: the rules read it while Snakemake parses.
CONTRASTIVE_FORMS = ("kl", "scl")
CONTRASTIVE_FORM_PATTERN = "|".join(CONTRASTIVE_FORMS)

# What a fine-tuning preset fixes (`finetune.preset`); a task family's defaults and the config's hparams go
# around it (tacl.finetune.common.hyperparameters). reference: what the TaCL reference passed, i.e. the Hugging
# Face Trainer's defaults (no warmup, no weight decay, linear decay, AdamW eps 1e-8, clipping at 1.0).
# standard: 10% warmup and weight decay 0.01.
PRESETS = {"reference": {"warmup_ratio": 0.0, "weight_decay": 0.0},
           "standard": {"warmup_ratio": 0.1, "weight_decay": 0.01}}

# Each task family's hyperparameters, before the preset and the config's values go over them (kept here,
# free of heavy imports, so that the workflow can name sweep settings by their effective values).
_SEQUENCE = {"max_len": 128, "batch": 32, "lr": 2e-5, "epochs": 3, "grad_clip": 1.0, "eval_batch": 64,
             "group_by_length": False}  # (off: see tacl.finetune.common, length grouping)
FAMILY_HPARAMS = {
    "glue": _SEQUENCE,
    "squad": {"max_len": 384, "doc_stride": 128, "max_query_len": 64, "batch": 12, "lr": 3e-5, "epochs": 2,
              "grad_clip": 1.0, "eval_batch": 64, "n_best": 20, "max_answer_len": 30, "group_by_length": False},
    "ner": {**_SEQUENCE, "max_len": 256, "lr": 5e-5, "supervised_tacl": False, "tacl_tau": 0.1, "tacl_weight": 1.0},
}

# Beside a run's metrics.json: the settings the run was given, as the workflow passes them (tacl.experiment.reruns
# compares them with what the config gives now).
GIVEN = "given.json"
# In a seed's folder while it trains: its checkpoint (tacl.finetune.resume), gone once its metrics are written
CHECKPOINT = "checkpoint.pt"
# In a fine-tuning job's folder (the setting's; the seed's with --seed): which job runs it, for `tacl status`
JOB = "job.json"
EXIT_STOPPED = 3  # the exit status of a fine-tuning job stopped after saving its checkpoint (run it again)


class Stopped(RuntimeError):
    """A seed's training stopped after saving its checkpoint (a signal, or the step cap of a test): the job
    ends there, not done, and its next run resumes the seed (tacl.finetune.resume)."""


def finetune_given(source: dict[str, Any], hparams: dict[str, Any], precision: str, preset: str) -> dict[str, Any]:
    return {"source": source, "hparams": hparams, "precision": precision, "preset": preset,
            "version": RESULT_VERSIONS["finetune"]}


# What a fine-tune keeps in hand before its job's time limit (tacl.finetune.common.train): it saves and stops
# when one more step and a half, plus `save_margin_s`, would run past the job's end time. The margin holds the
# checkpoints of every seed of the job that trains at once (side by side they save at the same moment, on the
# same disk), each written at SAVE_BYTES_PER_S (or as slowly as the seed's own saves went, if slower), and
# STOP_SLACK_S. Here, free of heavy imports, for the plan printed before a run too (tacl.planning.plan).
SAVE_BYTES_PER_S = 100e6  # a busy shared file system's write rate to one job, conservatively (Lustre or GPFS
#                           give a node several times this when quiet, a local disk far more)
STOP_SLACK_S = 30.0  # the processes' exits, and the end time's precision (squeue and qstat answer in seconds)


def finetune_checkpoint_bytes(params: float) -> float:
    """A fine-tuning seed's checkpoint: its fp32 weights and AdamW's two fp32 moments, 12 bytes a parameter
    (BERT-base with its head, 110M parameters: 1.3 GB)."""
    return 12.0 * params


def save_margin_s(checkpoint_bytes: float, at_once: int, measured_s: float = 0.0) -> float:
    """Seconds a fine-tune keeps before its job's end to save and stop: `at_once` seeds' checkpoints, each
    taking the longer of `checkpoint_bytes` at SAVE_BYTES_PER_S and the longest save measured (`measured_s`),
    one after the other (seeds side by side save at the same moment and share the disk), and STOP_SLACK_S.
    BERT-base, 4 seeds at once: 4 x 13 s + 30 s, about 1.4 minutes."""
    return STOP_SLACK_S + at_once * max(checkpoint_bytes / SAVE_BYTES_PER_S, measured_s)
