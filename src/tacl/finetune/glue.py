"""GLUE tasks: read the GLUE TSV files (or the Hugging Face copy), score predictions, write submissions.

Both sources give the same `Example`s: label strings as in the GLUE TSVs ("0", "1", "entailment", ...),
floats for STS-B, None for test splits. Label ids index `TaskSpec.labels`, whose order matches the
Hugging Face `nyu-mll/glue` class ids.
"""

from __future__ import annotations

import csv
import logging
import math
import operator
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any, Mapping, Sequence

import numpy as np

from tacl.runtime.hub import from_hub
from tacl.runtime.io import InputError, atomic_path

log = logging.getLogger("tacl.finetune.glue")


@dataclass(frozen=True)
class Example:
    """One sentence (pair): guid is f"{split}-{i}" for labelled splits, the file's index/id for test."""

    guid: str
    text_a: str
    text_b: str | None
    label: str | float | None


@dataclass(frozen=True)
class TaskSpec:
    """What a GLUE task is: its folder, label strings in id order, splits and GLUE server file names."""

    name: str
    dir_name: str
    labels: tuple[str, ...]
    dev_splits: tuple[str, ...]
    test_splits: tuple[str, ...]
    submission_files: dict[str, str]
    main_metric: str  # "matthews", "accuracy", "f1_accuracy_mean" or "pearson_spearman_mean"

    @property
    def is_regression(self) -> bool:
        return not self.labels

    @property
    def num_labels(self) -> int:
        return 1 if self.is_regression else len(self.labels)

    @property
    def splits(self) -> tuple[str, ...]:
        """Every split name: train, the dev splits, the test splits."""
        return ("train", *self.dev_splits, *self.test_splits)


def _task(name: str, dir_name: str, labels: tuple[str, ...], main_metric: str) -> TaskSpec:
    return TaskSpec(name, dir_name, labels, ("dev",), ("test",), {"test": f"{dir_name}.tsv"}, main_metric)


_BINARY = ("0", "1")
_NLI2 = ("entailment", "not_entailment")

TASKS: dict[str, TaskSpec] = {
    "cola": _task("cola", "CoLA", _BINARY, "matthews"),
    "sst2": _task("sst2", "SST-2", _BINARY, "accuracy"),
    "mrpc": _task("mrpc", "MRPC", _BINARY, "f1_accuracy_mean"),
    "stsb": _task("stsb", "STS-B", (), "pearson_spearman_mean"),
    "qqp": _task("qqp", "QQP", _BINARY, "f1_accuracy_mean"),
    "mnli": TaskSpec(
        "mnli", "MNLI", ("entailment", "neutral", "contradiction"),
        ("dev_matched", "dev_mismatched"), ("test_matched", "test_mismatched"),
        {"test_matched": "MNLI-m.tsv", "test_mismatched": "MNLI-mm.tsv"}, "accuracy",
    ),
    "qnli": _task("qnli", "QNLI", _NLI2, "accuracy"),
    "rte": _task("rte", "RTE", _NLI2, "accuracy"),
    "wnli": _task("wnli", "WNLI", _BINARY, "accuracy"),
}


@dataclass(frozen=True)
class _Columns:
    """Header names of the fields in a task's TSV files (test files: index instead of label)."""

    text_a: str
    text_b: str | None
    label: str
    index: str


_COLUMNS: Mapping[str, _Columns] = MappingProxyType({
    "cola": _Columns("sentence", None, "label", "index"),
    "sst2": _Columns("sentence", None, "label", "index"),
    "mrpc": _Columns("#1 String", "#2 String", "Quality", "index"),
    "stsb": _Columns("sentence1", "sentence2", "score", "index"),
    "qqp": _Columns("question1", "question2", "is_duplicate", "id"),
    "mnli": _Columns("sentence1", "sentence2", "gold_label", "index"),
    "qnli": _Columns("question", "sentence", "label", "index"),
    "rte": _Columns("sentence1", "sentence2", "label", "index"),
    "wnli": _Columns("sentence1", "sentence2", "label", "index"),
})

# CoLA train/dev have no header line; these names stand in for one.
_COLA_HEADER = ("source", "label", "original_label", "sentence")

# Hugging Face `nyu-mll/glue` text fields and split names.
_HF_TEXT: Mapping[str, tuple[str, str | None]] = MappingProxyType({
    "cola": ("sentence", None), "sst2": ("sentence", None), "mrpc": ("sentence1", "sentence2"),
    "stsb": ("sentence1", "sentence2"), "qqp": ("question1", "question2"), "mnli": ("premise", "hypothesis"),
    "qnli": ("question", "sentence"), "rte": ("sentence1", "sentence2"), "wnli": ("sentence1", "sentence2"),
})


def get_task(task: str) -> TaskSpec:
    """The TaskSpec of `task`; an unknown name is an InputError."""
    try:
        return TASKS[task]
    except KeyError:
        raise InputError(f"unknown GLUE task {task!r}; expected one of {', '.join(TASKS)}") from None


def _check_split(spec: TaskSpec, split: str) -> None:
    if split not in spec.splits:
        raise InputError(f"{spec.name}: unknown split {split!r}; expected one of {', '.join(spec.splits)}")


def read_split(task: str, data_dir: str, split: str) -> list[Example]:
    """Read `{data_dir}/{dir_name}/{split}.tsv` in the GLUE layout.

    Columns are found by header name (CoLA train/dev have no header: fixed positions). A row of the
    wrong width is an InputError naming file and line, except in QQP train, where such rows (known
    to exist in the GLUE copy) are skipped with a warning. Labels are checked against the task's.
    """
    spec = get_task(task)
    _check_split(spec, split)
    path = Path(data_dir) / spec.dir_name / f"{split}.tsv"
    if not path.is_file():
        raise InputError(f"{path}: GLUE file not found")
    labelled = split not in spec.test_splits
    cols = _COLUMNS[task]
    skip_bad_width = task == "qqp" and split == "train"
    examples: list[Example] = []
    skipped = 0
    # utf-8-sig: the GLUE MRPC train/dev files start with a byte order mark.
    with open(path, encoding="utf-8-sig", newline="") as f:
        reader = csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE)
        if task == "cola" and labelled:
            header: Sequence[str] = _COLA_HEADER
        else:
            header = next(reader, [])
            if not header:
                raise InputError(f"{path}: empty file, expected a header line")
        wanted = [cols.text_a, cols.text_b, cols.label if labelled else cols.index]
        missing = [name for name in wanted if name is not None and name not in header]
        if missing:
            raise InputError(f"{path}: header lacks column(s) {missing} (header: {list(header)})")
        a_pos = header.index(cols.text_a)
        b_pos = None if cols.text_b is None else header.index(cols.text_b)
        key_pos = header.index(cols.label if labelled else cols.index)
        width = len(header)
        for row in reader:
            if not row:  # blank line
                continue
            if len(row) != width:
                if skip_bad_width:
                    skipped += 1
                    continue
                raise InputError(
                    f"{path}:{reader.line_num}: expected {width} tab-separated columns, found {len(row)}"
                )
            text_b = None if b_pos is None else row[b_pos]
            if labelled:
                label = _parse_label(spec, row[key_pos], f"{path}:{reader.line_num}")
                examples.append(Example(f"{split}-{len(examples)}", row[a_pos], text_b, label))
            else:
                examples.append(Example(row[key_pos], row[a_pos], text_b, None))
    if skipped:
        log.warning("%s: skipped %d malformed row(s) (wrong number of columns)", path, skipped)
    return examples


def _parse_label(spec: TaskSpec, value: str, where: str) -> str | float:
    if spec.is_regression:
        try:
            score = float(value)
        except ValueError:
            raise InputError(f"{where}: score {value!r} is not a number") from None
        if not math.isfinite(score):
            raise InputError(f"{where}: score {value!r} is not finite")
        return score
    if value not in spec.labels:
        raise InputError(f"{where}: label {value!r} is not one of {list(spec.labels)}")
    return value


def hf_split(split: str) -> str:
    """Our split name -> the Hugging Face one: dev -> validation, dev_matched -> validation_matched, ..."""
    return "validation" + split[3:] if split.startswith("dev") else split


def label_from_hf(task: str, value: int | float) -> str | float | None:
    """A Hugging Face GLUE label (class id; -1 for test) -> our label string (float for STS-B, None if -1)."""
    spec = get_task(task)
    if value < 0:
        return None
    if spec.is_regression:
        return float(value)
    try:
        i = operator.index(value)
    except TypeError:
        raise InputError(f"{task}: Hugging Face label {value!r} is not a class id") from None
    if i >= len(spec.labels):
        raise InputError(f"{task}: Hugging Face label {value!r} out of range 0..{len(spec.labels) - 1}")
    return spec.labels[i]


def load_hf(task: str, split: str, cache_dir: str | None = None) -> list[Example]:
    """The same examples as `read_split`, from Hugging Face `nyu-mll/glue` (downloads unless cached)."""
    import datasets

    spec = get_task(task)
    _check_split(spec, split)
    with from_hub("nyu-mll/glue", "dataset", "`finetune.glue_source` or `analysis.embeddings.source` (kind tsv)",
                  cache_dir):
        ds = datasets.load_dataset("nyu-mll/glue", task, split=hf_split(split), cache_dir=cache_dir)
    a_name, b_name = _HF_TEXT[task]
    texts_a = list(ds[a_name])
    texts_b = list(ds[b_name]) if b_name is not None else [None] * len(texts_a)
    if split in spec.test_splits:
        return [Example(str(idx), a, b, None) for idx, a, b in zip(ds["idx"], texts_a, texts_b)]
    examples = []
    for i, (a, b, value) in enumerate(zip(texts_a, texts_b, ds["label"])):
        label = label_from_hf(task, value)
        if label is None:
            raise InputError(f"nyu-mll/glue {task} {hf_split(split)}: row {i} has no label")
        examples.append(Example(f"{split}-{i}", a, b, label))
    return examples


def label_id(task: str, label: str | float) -> int | float:
    """Index of `label` in the task's labels; STS-B scores pass through as floats."""
    spec = get_task(task)
    if spec.is_regression:
        try:
            return float(label)
        except (TypeError, ValueError):
            raise InputError(f"{task}: label {label!r} is not a number") from None
    try:
        return spec.labels.index(label)  # type: ignore[arg-type]
    except ValueError:
        raise InputError(f"{task}: unknown label {label!r}; expected one of {list(spec.labels)}") from None


def _correlations(predictions: np.ndarray, references: np.ndarray) -> tuple[float, float]:
    """Pearson and Spearman; 0.0 where undefined (a constant side), as sklearn does for Matthews."""
    from scipy.stats import pearsonr, spearmanr

    if np.ptp(predictions) == 0 or np.ptp(references) == 0:
        return 0.0, 0.0
    return float(pearsonr(predictions, references)[0]), float(spearmanr(predictions, references)[0])


def matthews(references: np.ndarray, predictions: np.ndarray) -> float:
    """Matthews' correlation of label ids over any number of classes (Gorodkin's form, sklearn's
    `matthews_corrcoef`); 0.0 where undefined (a constant side)."""
    classes, ids = np.unique(np.concatenate([references, predictions]), return_inverse=True)
    confusion = np.zeros((len(classes), len(classes)), dtype=np.float64)
    np.add.at(confusion, (ids[:len(references)], ids[len(references):]), 1)
    true, predicted, total = confusion.sum(axis=1), confusion.sum(axis=0), confusion.sum()
    denominator = (total**2 - predicted @ predicted) * (total**2 - true @ true)
    return 0.0 if denominator == 0 else float((np.trace(confusion) * total - true @ predicted) / np.sqrt(denominator))


def f1_binary(references: np.ndarray, predictions: np.ndarray, positive: int) -> float:
    """F1 of the `positive` label (sklearn's `f1_score`, average="binary"); 0.0 with no positive on either
    side."""
    hit, said = references == positive, predictions == positive
    both, either = float(np.sum(hit & said)), float(np.sum(hit) + np.sum(said))
    return 0.0 if either == 0 else 2 * both / either


def positive_label(task: str) -> str | None:
    """The class a GLUE task's F1 is of: class 1 of MRPC and QQP (a paraphrase, a duplicate), as GLUE scores
    them; None for a task scored without F1."""
    return "1" if get_task(task).main_metric == "f1_accuracy_mean" else None


def metrics(task: str, predictions: Any, references: Any) -> dict[str, float]:
    """GLUE metrics of label ids (floats for STS-B) as fractions, plus "main", the task's GLUE score.
    (Matthews and F1 in numpy: scikit-learn's import alone costs a fine-tuning job seconds.)"""
    spec = get_task(task)
    preds, refs = np.asarray(predictions), np.asarray(references)
    if preds.ndim != 1 or preds.shape != refs.shape or preds.size == 0:
        raise ValueError(f"{task}: predictions {preds.shape} and references {refs.shape} must be equal, "
                         f"non-empty 1-d sequences")
    out: dict[str, float] = {}
    if spec.is_regression:
        out["pearson"], out["spearman"] = _correlations(preds.astype(np.float64), refs.astype(np.float64))
        out["main"] = (out["pearson"] + out["spearman"]) / 2
        return out
    if spec.main_metric == "matthews":
        out["matthews"] = out["main"] = matthews(refs, preds)
        return out
    out["accuracy"] = float(np.mean(preds == refs))
    if spec.main_metric == "f1_accuracy_mean":
        out["f1"] = f1_binary(refs, preds, spec.labels.index(positive_label(task)))
        out["main"] = (out["f1"] + out["accuracy"]) / 2
    else:
        out["main"] = out["accuracy"]
    return out


def _label_string(spec: TaskSpec, prediction: Any) -> str:
    try:
        i = operator.index(prediction)
    except TypeError:
        raise ValueError(f"{spec.name}: prediction {prediction!r} is not a label id") from None
    if not 0 <= i < len(spec.labels):
        raise ValueError(f"{spec.name}: prediction {i} out of range 0..{len(spec.labels) - 1}")
    return spec.labels[i]


def write_submission(task: str, split: str, guids: Sequence[str], predictions: Any, path: str) -> None:
    """Write a GLUE server TSV ("index\\tprediction"): label strings, or STS-B scores with 3 decimals.

    `guids` are the test examples' guids (the file's own index column) in file order; `predictions`
    are label ids (floats for STS-B). The file appears at `path` only once complete.
    """
    spec = get_task(task)
    if split not in spec.test_splits:
        raise InputError(f"{task}: {split!r} is not a test split; expected one of {list(spec.test_splits)}")
    preds = list(predictions)
    if len(preds) != len(guids):
        raise ValueError(f"{task} {split}: {len(guids)} guids but {len(preds)} predictions")
    lines = ["index\tprediction"]
    for guid, p in zip(guids, preds):
        value = f"{float(p):.3f}" if spec.is_regression else _label_string(spec, p)
        lines.append(f"{guid}\t{value}")
    with atomic_path(path) as tmp:
        tmp.write_text("\n".join(lines) + "\n", encoding="utf-8")
