"""`tacl finetune glue`: one (model, GLUE task, seed) fine-tune; dev metrics as GLUE defines them and
test predictions in the GLUE server's submission format."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

from tacl.finetune import declared, glue
from tacl.finetune.common import (DEFAULT_HPARAMS, Run, hyperparameters, input_names, load_task_model, predict,
                                  train)
from tacl.finetune.contrastive import DEFAULTS as CONTRASTIVE_DEFAULTS
from tacl.finetune.contrastive import CONTRASTIVE_FORMS, contrastive_loss
from tacl.finetune.settings import FineTune
from tacl.runtime.hub import resolve_pretrained
from tacl.runtime.io import InputError, atomic_path, write_json_atomic


def load_examples(task: str, split: str, source: dict[str, Any]) -> list[glue.Example]:
    if declared.is_declared(source):
        return declared.sequence_examples(source, split)
    if source.get("kind", "tsv") == "hf":
        return glue.load_hf(task, split, source.get("cache_dir"))
    return glue.read_split(task, source["data_dir"], split)


def has_split(task: str, split: str, source: dict[str, Any]) -> bool:
    if declared.is_declared(source):
        return split in source["splits"]
    if source.get("kind", "tsv") == "hf":
        return True
    return (Path(source["data_dir"]) / glue.TASKS[task].dir_name / f"{split}.tsv").is_file()


def subset(examples: list, limit: int, seed: int = 0) -> list:
    """At most `limit` examples (0 = all), the same subset for every fine-tuning seed."""
    if not limit or len(examples) <= limit:
        return examples
    keep = np.sort(np.random.default_rng(seed).permutation(len(examples))[:limit])
    return [examples[i] for i in keep]


def encode(tokenizer: Any, task: str | glue.TaskSpec, examples: list[glue.Example], max_len: int
           ) -> list[dict[str, Any]]:
    spec = task if isinstance(task, glue.TaskSpec) else glue.TASKS[task]
    pairs = examples[0].text_b is not None if examples else False
    enc = tokenizer([e.text_a for e in examples], [e.text_b for e in examples] if pairs else None,
                    truncation=True, max_length=max_len, padding=False, return_attention_mask=True)
    rows = []
    for i, e in enumerate(examples):
        row = {k: enc[k][i] for k in input_names(tokenizer)}
        if e.label is not None:
            row["labels"] = label_id(spec, e.label)
        rows.append(row)
    return rows


def label_id(spec: glue.TaskSpec, label: str | float) -> int | float:
    """A label's class id in the task's classes (a score for regression)."""
    if spec.is_regression:
        return float(label)
    if label not in spec.labels:
        raise InputError(f"{spec.name}: label {label!r} is not one of {list(spec.labels)}")
    return spec.labels.index(label)  # type: ignore[arg-type]


def finetune_glue(tune: FineTune, seed: int, out_dir: str | Path) -> dict[str, Any]:
    """One seed of a GLUE fine-tune, in `out_dir`: trained (from its checkpoint there where it has one,
    `tune.checkpointing`, tacl.finetune.resume), scored on the dev splits, its test predictions written in
    the GLUE server's format, the fine-tuned encoder kept without its task head where `tune.save_model`
    asks (OUT/model, for another task to start from), and metrics.json written last."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    decl = tune.declaration
    spec = task_spec(tune.task, tune.contrastive) if decl is None else None
    model_dir = resolve_pretrained(tune.model)
    hp = hyperparameters({**DEFAULT_HPARAMS, **(CONTRASTIVE_DEFAULTS if tune.contrastive else {})}, tune.preset,
                         tune.hparams)
    started = time.time()
    # (a job that asked for a GPU and has none stops here)
    run = Run.detect(tune.precision, tune.device, tune.compile, tune.shapes)
    # all data first: a missing file fails before the model is built
    train_ex, dev, test = read_splits(tune.task, tune.data_source(), hp)
    if decl is not None:  # (a declared task: its classes from its declaration, its dataset or its training data)
        decl = declared.resolve(decl, {"train": train_ex})
        spec = declared.sequence_spec(tune.task, decl)
        if tune.contrastive:
            raise InputError(f"finetune.contrastive: {tune.task} is a declared task; contrastive fine-tuning runs "
                             "GLUE's classification tasks")

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = load_task_model(
        AutoModelForSequenceClassification, model_dir, seed, num_labels=spec.num_labels,
        problem_type="regression" if spec.is_regression else "single_label_classification")
    extra, weight = contrastive_term(tune.contrastive, hp)
    checkpoint = tune.checkpoint_at(out_dir)
    record = train(model, encode(tokenizer, spec, train_ex, hp["max_len"]), hp, seed, run,
                   tokenizer.pad_token_id, extra_loss=extra, task_weight=weight, checkpoint=checkpoint)

    def predictions(examples: list[glue.Example]) -> np.ndarray:
        (logits,) = predict(model, encode(tokenizer, spec, examples, hp["max_len"]), run,
                            tokenizer.pad_token_id, hp["eval_batch"], lambda o: (o.logits,), max_len=hp["max_len"],
                            checkpoint=checkpoint)
        logits = np.stack(logits)
        return logits[:, 0] if spec.is_regression else logits.argmax(-1)

    out = Path(out_dir)
    results = {split: dev_scores(spec, examples, predictions(examples), decl) for split, examples in dev.items()}
    if decl is None:
        submissions, scored = write_submissions(tune.task, test, predictions, out), {}
    else:  # (a declared task's test split is labelled: scored like dev)
        submissions = {}
        scored = {"test": {s: dev_scores(spec, ex, predictions(ex), decl) for s, ex in test.items()}} if test else {}
    if tune.save_model:
        save_encoder(model, tokenizer, out / "model")
    summary = {"task": tune.task, "family": "glue", "model": model_dir, "seed": seed, "preset": tune.preset,
               "contrastive": tune.contrastive, "start_from": tune.start_from, "hparams": hp,
               "dev": results, **scored, **(declared_record(decl) if decl else glue_record(spec)),
               "submission": submissions, "train": record, "device": run.describe(), "bf16": run.bf16,
               "wall_s": round(time.time() - started, 1)}
    write_json_atomic(out / "metrics.json", summary)
    return summary


def task_spec(task: str, contrastive: str | None) -> glue.TaskSpec:
    """The GLUE task's spec, once the task and the contrastive form are known to go together (a form that
    exists, and a task with classes): refused before anything is read."""
    if task not in glue.TASKS:
        raise InputError(f"finetune task {task!r} is not a GLUE task ({', '.join(glue.TASKS)})")
    spec = glue.TASKS[task]
    if contrastive is not None:
        if contrastive not in CONTRASTIVE_FORMS:
            raise InputError(f"finetune.contrastive.forms: {contrastive!r} is not one of "
                             f"{', '.join(CONTRASTIVE_FORMS)}")
        if spec.is_regression:
            raise InputError(f"finetune.contrastive: {task} is a regression task; contrastive fine-tuning needs "
                             "classes (leave it out of finetune.contrastive.tasks)")
    return spec


def read_splits(task: str, source: dict[str, Any], hp: dict[str, Any]
                ) -> tuple[list[glue.Example], dict[str, list[glue.Example]], dict[str, list[glue.Example]]]:
    """The task's training examples, its dev splits' and its test splits' (those the source has), by split;
    training and dev cut to `max_train_examples` and `max_eval_examples` (`subset`). A declared task has one
    dev split and a labelled test split where it declares one (cut like dev)."""
    own = declared.is_declared(source)
    spec = None if own else glue.TASKS[task]
    dev_splits, test_splits = (("dev",), ("test",)) if spec is None else (spec.dev_splits, spec.test_splits)
    train_ex = subset(load_examples(task, "train", source), hp.get("max_train_examples", 0))
    dev = {s: subset(load_examples(task, s, source), hp.get("max_eval_examples", 0)) for s in dev_splits}
    test = {s: subset(load_examples(task, s, source), hp.get("max_eval_examples", 0) if own else 0)
            for s in test_splits if has_split(task, s, source)}
    if not train_ex:
        raise InputError(f"{task}: the training split is empty")
    return train_ex, dev, test


def contrastive_term(contrastive: str | None, hp: dict[str, Any]) -> tuple[Callable | None, float]:
    """The loss beside the task's (`train`'s `extra_loss`) and the task loss's weight: for contrastive
    fine-tuning, w * the form's loss on the last layer's [CLS] and 1 - w (w: `contrastive_weight`);
    otherwise none and 1."""
    if not contrastive:
        return None, 1.0

    def extra(model, batch, outputs):  # on the last layer's [CLS]
        return hp["contrastive_weight"] * contrastive_loss(contrastive, outputs.hidden_states[-1][:, 0],
                                                           batch["labels"], hp["contrastive_tau"])

    return extra, 1.0 - hp["contrastive_weight"]


def dev_scores(spec: glue.TaskSpec, examples: list[glue.Example], predicted: np.ndarray,
               decl: dict[str, Any] | None = None) -> dict[str, Any]:
    """The metrics of a split's predictions (GLUE's, or a declared task's kind's), and the split's size."""
    refs = [label_id(spec, e.label) for e in examples]
    found = glue.metrics(spec.name, predicted, refs) if decl is None else declared.scores(decl, predicted, refs)
    return {**found, "examples": len(examples)}


def declared_record(decl: dict[str, Any] | None) -> dict[str, Any]:
    """What a declared task's metrics.json adds: its kind, its headline (split, metric) and how it was scored
    (a resolved declaration's classes and the class of its F1, or its tags' scoring: declared.recorded)."""
    if decl is None:
        return {}
    return {"kind": decl["kind"], "headline": list(declared.headline(decl)), **declared.recorded(decl)}


def glue_record(spec: glue.TaskSpec) -> dict[str, Any]:
    """What a GLUE task's metrics.json adds: the class its F1 is of (MRPC's and QQP's class 1)."""
    positive = glue.positive_label(spec.name)
    return {"positive_label": positive} if positive is not None else {}


def write_submissions(task: str, test: dict[str, list[glue.Example]],
                      predictions: Callable[[list[glue.Example]], np.ndarray], out: Path) -> dict[str, str]:
    """Each test split's predictions in the GLUE server's format (OUT/submission/FILE); their paths, by split."""
    spec = glue.TASKS[task]
    submissions = {}
    for split, examples in test.items():
        path = out / "submission" / spec.submission_files[split]
        glue.write_submission(task, split, [e.guid for e in examples], predictions(examples), str(path))
        submissions[split] = str(path)
    return submissions


def save_encoder(model: Any, tokenizer: Any, path: Path) -> None:
    """The fine-tuned encoder without its task head, and the tokenizer, written whole to `path` (another
    task starts from it)."""
    with atomic_path(path) as tmp:
        model.base_model.save_pretrained(str(tmp))
        tokenizer.save_pretrained(str(tmp))
