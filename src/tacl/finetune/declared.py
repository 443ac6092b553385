"""Tasks declared in the config (`finetune.declared_tasks`): a user's own data set, fine-tuned and scored like
the built-in tasks, by its kind.

A declaration names its kind (classification, regression, token_classification, extractive_qa), its source
(a `datasets` name and config, or a folder of TSV, CSV, JSON, JSON-lines or CoNLL files), its fields, its
splits (train, dev, and a labelled test where it has one; each a split of the source or a file in the folder,
with an optional row filter `where`) and the metric its headline number is. Each kind runs through a built-in
family's fine-tune: classification and regression through GLUE's (tacl.finetune.sequence), token
classification through NER's (tacl.finetune.ner), extractive QA through SQuAD's (tacl.finetune.qa), with that
family's hyperparameters (`finetune.hparams`, then the task's own).

The workflow passes a fine-tune the declaration itself as its source (`source_of`), so that a change to it
reruns that task's jobs and nothing else. `errors` checks a declaration against the config alone (at
workflow start, with the rest of the config); `check_data` checks it against its data (the fields there, the
dev and test labels among train's), when the task's data is prepared on the login node, and at start for a
local folder. Every problem is one line naming the key. No heavy import at module level: the Snakefile
reads this module while it parses.
"""

from __future__ import annotations

import csv
import json
import math
from collections import Counter
from pathlib import Path
from typing import Any, Iterable

from tacl.runtime.io import InputError

# Each kind: the built-in family whose fine-tune runs it, its fields (required, then optional) and the
# metrics its fine-tune reports (the declared `metric` is one of them, the headline).
KINDS: dict[str, dict[str, Any]] = {
    "classification": {"family": "glue", "fields": (("text", "label"), ("text_pair",)),
                       "metrics": ("accuracy", "macro_f1", "f1", "matthews")},
    "regression": {"family": "glue", "fields": (("text", "label"), ("text_pair",)),
                   "metrics": ("pearson", "spearman")},
    "token_classification": {"family": "ner", "fields": (("tokens", "tags"), ()),
                             "metrics": ("f1", "precision", "recall", "accuracy")},
    "extractive_qa": {"family": "squad", "fields": (("question", "context", "answers"), ("id",)),
                      "metrics": ("f1", "exact")},
}
SPLITS = ("train", "dev", "test")  # train and dev are required; a test split is scored like dev
FILE_FORMATS = (".tsv", ".csv", ".json", ".jsonl", ".conll", ".txt")  # .conll/.txt: CoNLL columns
KEY = "finetune.declared_tasks"


def family(decl: dict[str, Any]) -> str:
    return KINDS[decl["kind"]]["family"]


def source_of(name: str, decl: dict[str, Any]) -> dict[str, Any]:
    """What the workflow gives a declared task's jobs as their source: the declaration, named."""
    return {"declared": name, **decl}


def is_declared(source: dict[str, Any]) -> bool:
    return "declared" in source


def headline(decl: dict[str, Any]) -> tuple[str, str]:
    """(split, metric) of the task's headline dev number in metrics.json."""
    return "dev", decl["metric"]


# -- the declaration against the config -----------------------------------------------------------------------


def errors(name: str, decl: dict[str, Any], builtin: Iterable[str]) -> list[str]:
    """One line per problem of a declaration that the config alone shows (the schema has checked its shape)."""
    key, kind = f"{KEY}.{name}", decl["kind"]
    out = []
    if name in builtin:
        out.append(f"{key}: {name} is a built-in task; give the declared task another name")
    spec = KINDS[kind]
    if decl["metric"] not in spec["metrics"]:
        out.append(f"{key}.metric: {decl['metric']!r} is not a metric of {kind} ({', '.join(spec['metrics'])})")
    required, optional = spec["fields"]
    fields = decl.get("fields") or {}
    out += [f"{key}.fields.{f}: missing (a {kind} task names its {', '.join(required)} fields)"
            for f in required if not fields.get(f)]
    out += [f"{key}.fields.{f}: not a field of a {kind} task (its fields: {', '.join(required + optional)})"
            for f in fields if f not in required + optional]
    splits = decl.get("splits") or {}
    out += [f"{key}.splits.{s}: missing (train and dev are required)" for s in ("train", "dev") if s not in splits]
    source = decl["source"]
    if source["kind"] == "hf" and not source.get("name"):
        out.append(f"{key}.source.name: a Hugging Face source names its dataset")
    if source["kind"] == "files":
        if not source.get("data_dir"):
            out.append(f"{key}.source.data_dir: a files source names its folder")
        for split, spec_ in splits.items():
            file = split_name(spec_)
            if Path(file).suffix not in FILE_FORMATS:
                out.append(f"{key}.splits.{split}: {file!r} is not a file of a known format "
                           f"({', '.join(FILE_FORMATS)})")
    if decl.get("labels") is not None and kind != "classification":
        out.append(f"{key}.labels: only a classification task lists its labels")
    if decl["metric"] == "f1" and kind == "classification" and decl.get("labels") is not None \
            and len(decl["labels"]) != 2:
        out.append(f"{key}.metric: f1 is the F1 of the second of two labels; use macro_f1 for "
                   f"{len(decl['labels'])} labels")
    return out


def split_name(spec: str | dict[str, Any]) -> str:
    """The source's split (or the folder's file) a split of the task reads."""
    return spec if isinstance(spec, str) else spec["split"]


def local_files(decl: dict[str, Any]) -> list[tuple[str, str]]:
    """(the split's key, its file) of a files source; none for a Hugging Face source."""
    if decl["source"]["kind"] != "files" or not decl["source"].get("data_dir"):
        return []
    return [(f"splits.{s}", str(Path(decl["source"]["data_dir"], split_name(spec))))
            for s, spec in decl["splits"].items()]


# -- reading ---------------------------------------------------------------------------------------------------


def rows(decl: dict[str, Any], split: str) -> tuple[list[dict[str, Any]], dict[str, list[str]], str]:
    """A split's rows (dicts of field values) after its `where` filter, the class names of the fields that
    the source stores as class ids (a Hugging Face ClassLabel, alone or in a sequence), and where the rows
    came from (for messages)."""
    spec = decl["splits"][split]
    name, where = (spec, {}) if isinstance(spec, str) else (spec["split"], spec.get("where") or {})
    source = decl["source"]
    names: dict[str, list[str]] = {}
    if source["kind"] == "hf":
        import datasets

        from tacl.runtime.hub import from_hub

        cache = decl.get("cache_dir")
        where_from = f"{source['name']}{'/' + source['config'] if source.get('config') else ''} {name}"
        with from_hub(source["name"], "dataset", f"{KEY}.{decl.get('declared', '?')}.source (kind files)", cache):
            ds = datasets.load_dataset(source["name"], source.get("config"), split=name, cache_dir=cache)
        for field, feature in ds.features.items():
            inner = getattr(feature, "feature", feature)  # a Sequence of ClassLabel: its items' names
            if isinstance(inner, datasets.ClassLabel):
                names[field] = list(inner.names)
        found = [dict(r) for r in ds]
    else:
        path = Path(source["data_dir"], name)
        where_from = str(path)
        found = read_file(path, decl)
    missing = [f for f in where if found and f not in found[0]]
    if missing:
        raise InputError(f"{KEY}.{decl.get('declared', '?')}.splits.{split}.where: {where_from} has no field "
                         f"{', '.join(missing)}")
    keep = [r for r in found if all(_matches(r[f], v) for f, v in where.items())]
    return keep, names, where_from


def _matches(value: Any, wanted: Any) -> bool:
    return value in wanted if isinstance(wanted, list) else value == wanted


def read_file(path: Path, decl: dict[str, Any]) -> list[dict[str, Any]]:
    """A file's records by its suffix: TSV and CSV with a header line, a JSON list of objects (or
    {"data": [...]}; an official SQuAD file for extractive QA), JSON lines, CoNLL columns (token ... tag,
    blank lines between sentences) as records of `tokens` and `tags` under the declared field names."""
    if not path.is_file():
        raise InputError(f"{path}: file not found")
    suffix = path.suffix
    if suffix in (".tsv", ".csv"):
        with open(path, encoding="utf-8-sig", newline="") as f:
            if suffix == ".tsv":
                return list(csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE))
            return list(csv.DictReader(f))
    if suffix in (".conll", ".txt"):
        from tacl.finetune.tokens import read_conll

        fields = decl["fields"]
        return [{fields["tokens"]: tokens, fields["tags"]: tags} for tokens, tags in read_conll(path)]
    try:
        if suffix == ".jsonl":
            with open(path, encoding="utf-8") as f:
                return [json.loads(line) for line in f if line.strip()]
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise InputError(f"{path}: not valid JSON ({e})") from None
    if isinstance(data, dict) and isinstance(data.get("data"), list):
        if data["data"] and isinstance(data["data"][0], dict) and "paragraphs" in data["data"][0]:
            return _squad_records(path, decl)
        data = data["data"]
    if not isinstance(data, list) or not all(isinstance(r, dict) for r in data):
        raise InputError(f"{path}: expected a JSON list of objects (or {{\"data\": [...]}})")
    return data


def _squad_records(path: Path, decl: dict[str, Any]) -> list[dict[str, Any]]:
    """An official SQuAD JSON file as flat records under the declared field names."""
    from tacl.finetune.squad import read_squad_json

    f = decl["fields"]
    return [{f["question"]: e.question, f["context"]: e.context, f.get("id") or "id": e.id,
             f["answers"]: {"text": list(e.answers), "answer_start": list(e.answer_starts)}}
            for e in read_squad_json(str(path))]


def _field(row: dict[str, Any], field: str, where: str, i: int) -> Any:
    if field not in row:
        raise InputError(f"{where}: no field {field!r} (row {i} has {', '.join(map(str, row)) or 'none'})")
    return row[field]


def _label_text(value: Any, names: list[str] | None) -> str:
    """A class as text: a class id's name where the source names its classes, else the value itself."""
    if names is not None and isinstance(value, int) and not isinstance(value, bool):
        if not 0 <= value < len(names):
            raise InputError(f"class id {value} out of range 0..{len(names) - 1}")
        return names[value]
    return str(value)


def sequence_examples(decl: dict[str, Any], split: str) -> list:
    """A classification or regression split as tacl.finetune.glue Examples: labels as text (classification,
    class ids named) or numbers (regression)."""
    from tacl.finetune.glue import Example

    found, names, where = rows(decl, split)
    f, regression = decl["fields"], decl["kind"] == "regression"
    out = []
    for i, r in enumerate(found):
        value = _field(r, f["label"], where, i)
        if value is None or value == "":
            raise InputError(f"{where}: row {i} has no {f['label']!r}")
        if regression:
            try:
                label: str | float = float(value)
            except (TypeError, ValueError):
                raise InputError(f"{where}: row {i}: {f['label']!r} {value!r} is not a number") from None
            if not math.isfinite(label):
                raise InputError(f"{where}: row {i}: {f['label']!r} {value!r} is not finite")
        else:
            label = _label_text(value, names.get(f["label"]))
        pair = str(_field(r, f["text_pair"], where, i)) if f.get("text_pair") else None
        out.append(Example(f"{split}-{i}", str(_field(r, f["text"], where, i)), pair, label))
    return out


def token_sentences(decl: dict[str, Any], split: str) -> list[tuple[list[str], list[str]]]:
    """A token classification split as (words, tags), tags as text (class ids named)."""
    found, names, where = rows(decl, split)
    f = decl["fields"]
    out = []
    for i, r in enumerate(found):
        tokens, tags = _field(r, f["tokens"], where, i), _field(r, f["tags"], where, i)
        if not isinstance(tokens, list) or not isinstance(tags, list) or len(tokens) != len(tags):
            raise InputError(f"{where}: row {i}: {f['tokens']!r} and {f['tags']!r} must be lists of one length")
        if tokens:
            out.append(([str(t) for t in tokens], [_label_text(t, names.get(f["tags"])) for t in tags]))
    return out


def qa_examples(decl: dict[str, Any], split: str) -> list:
    """An extractive QA split as tacl.finetune.squad SquadExamples; answers as {"text": [...],
    "answer_start": [...]} (an empty list: no answer)."""
    from tacl.finetune.squad import SquadExample

    found, _, where = rows(decl, split)
    f = decl["fields"]
    out = []
    for i, r in enumerate(found):
        answers = _field(r, f["answers"], where, i)
        if not isinstance(answers, dict) or not isinstance(answers.get("text"), list) \
                or not isinstance(answers.get("answer_start"), list) \
                or len(answers["text"]) != len(answers["answer_start"]):
            raise InputError(f"{where}: row {i}: {f['answers']!r} must be {{\"text\": [...], "
                             "\"answer_start\": [...]}} of one length")
        context = str(_field(r, f["context"], where, i))
        for text, start in zip(answers["text"], answers["answer_start"]):
            if context[int(start):int(start) + len(text)] != text:
                raise InputError(f"{where}: row {i}: the answer {text!r} is not at {start} in its context")
        out.append(SquadExample(id=str(r.get(f.get("id") or "id", f"{split}-{i}")),
                                question=str(_field(r, f["question"], where, i)), context=context,
                                answers=tuple(map(str, answers["text"])),
                                answer_starts=tuple(int(s) for s in answers["answer_start"]),
                                is_impossible=not answers["text"]))
    repeated = [k for k, n in Counter(e.id for e in out).items() if n > 1]
    if repeated:
        raise InputError(f"{KEY}.{decl.get('declared', '?')}.fields.id: {where}: the id {repeated[0]!r} names "
                         f"{Counter(e.id for e in out)[repeated[0]]} questions; name a field that is unique, or "
                         "leave id out (the questions are then numbered)")
    return out


def examples(decl: dict[str, Any], split: str) -> list:
    """A split's examples in the form of its kind's family."""
    read = {"glue": sequence_examples, "ner": token_sentences, "squad": qa_examples}[family(decl)]
    return read(decl, split)


# -- labels, scores, chance ----------------------------------------------------------------------------------


def class_labels(decl: dict[str, Any], train: list) -> tuple[str, ...]:
    """A classification task's classes in id order: as declared (`labels`), else train's, sorted."""
    if decl.get("labels") is not None:
        return tuple(str(label) for label in decl["labels"])
    return tuple(sorted({e.label for e in train}))


def sequence_spec(name: str, decl: dict[str, Any], train: list):
    """The task as a tacl.finetune.glue TaskSpec: classes in id order (none for regression), one dev split,
    no submission files (a labelled test split is scored, `scored_test`)."""
    from tacl.finetune.glue import TaskSpec

    labels = class_labels(decl, train) if decl["kind"] == "classification" else ()
    return TaskSpec(name, name, labels, ("dev",), (), {}, decl["metric"])


def scores(decl: dict[str, Any], predictions: Any, references: Any) -> dict[str, float]:
    """Every metric of the task's kind on label ids (numbers for regression), as fractions, plus "main", the
    declared metric: accuracy, macro F1 (the mean F1 over the classes on either side, scikit-learn's
    average="macro"), F1 of the second class (two classes only) and Matthews' correlation; or Pearson and
    Spearman."""
    import numpy as np

    from tacl.finetune.glue import _correlations, f1_binary, matthews

    preds, refs = np.asarray(predictions), np.asarray(references)
    out: dict[str, float] = {}
    if decl["kind"] == "regression":
        out["pearson"], out["spearman"] = _correlations(preds.astype(np.float64), refs.astype(np.float64))
    else:
        classes = np.unique(np.concatenate([refs, preds]))
        out["accuracy"] = float(np.mean(preds == refs))
        out["macro_f1"] = float(np.mean([f1_binary(refs, preds, c) for c in classes]))
        out["matthews"] = matthews(refs, preds)
        if decl.get("binary"):
            out["f1"] = f1_binary(refs, preds, 1)
    out["main"] = out[decl["metric"]]
    return out


def with_classes(decl: dict[str, Any], labels: tuple[str, ...]) -> dict[str, Any]:
    """The declaration with what its scores need of its classes: whether there are two (F1 of the second)."""
    if decl["metric"] == "f1" and len(labels) != 2:
        raise InputError(f"{KEY}.{decl.get('declared', '?')}.metric: f1 is the F1 of the second of two labels; "
                         f"train has {len(labels)} ({', '.join(labels)}): use macro_f1")
    return {**decl, "binary": len(labels) == 2}


def check_data(name: str, decl: dict[str, Any]) -> dict[str, list]:
    """Every split's examples (the fields there, a train split with examples, the dev and test labels among
    train's, the declared labels all there), by split; one InputError naming the key otherwise."""
    key = f"{KEY}.{name}"
    data = {split: examples(decl, split) for split in SPLITS if split in decl["splits"]}
    for split, found in data.items():
        if not found:
            raise InputError(f"{key}.splits.{split}: no examples (after its `where`)")
    if decl["kind"] in ("classification", "token_classification"):
        seen = _labels(decl, data["train"])
        if decl.get("labels") is not None:
            unknown = sorted(seen - set(class_labels(decl, [])))
            if unknown:
                raise InputError(f"{key}.labels: train has {', '.join(unknown)}, not among the declared labels")
            seen = set(class_labels(decl, []))
        for split in ("dev", "test"):
            absent = sorted(_labels(decl, data.get(split, [])) - seen)
            if absent:
                raise InputError(f"{key}.splits.{split}: label(s) {', '.join(absent)} absent from train")
    return data


def _labels(decl: dict[str, Any], found: list) -> set[str]:
    if decl["kind"] == "token_classification":
        return {t for _, tags in found for t in tags}
    return {e.label for e in found}


def baseline(name: str, decl: dict[str, Any], data: dict[str, list]) -> dict[str, Any]:
    """Chance, scored like a fine-tune on the dev and test splits: classification predicts train's most
    common class (ties: the first in id order), regression train's mean (no correlation: 0), token
    classification tags every word with train's most common tag, extractive QA answers nothing."""
    train, scored = data["train"], {s: data[s] for s in ("dev", "test") if s in data}
    kind = decl["kind"]
    if kind == "regression":
        mean = sum(e.label for e in train) / len(train)
        return {"name": "constant: the mean train score",
                "dev": {s: scores(decl, [mean] * len(ex), [e.label for e in ex]) for s, ex in scored.items()}}
    if kind == "classification":
        labels = class_labels(decl, train)
        counts = Counter(e.label for e in train)
        majority = max(labels, key=lambda label: counts[label])
        decl = with_classes(decl, labels)
        return {"name": f"majority class of train ({majority})",
                "dev": {s: scores(decl, [labels.index(majority)] * len(ex), [labels.index(e.label) for e in ex])
                        for s, ex in scored.items()}}
    if kind == "token_classification":
        from tacl.finetune.tokens import entity_metrics

        common = Counter(t for _, tags in train for t in tags).most_common(1)[0][0]
        return {"name": f"every word tagged {common} (train's most common tag)",
                "dev": {s: entity_metrics([tags for _, tags in ex], [[common] * len(tags) for _, tags in ex])
                        for s, ex in scored.items()}}
    from tacl.finetune.squad import evaluate

    out, v2 = {}, any(unanswerable(ex) for ex in data.values())
    for s, ex in scored.items():
        result = evaluate(ex, {e.id: "" for e in ex}, version_2=v2)
        out[s] = {"exact": result["exact"], "f1": result["f1"]}
    return {"name": "no answer to any question", "dev": out}


def unanswerable(qa: list) -> bool:
    """Whether an extractive QA split holds questions without an answer (then scored as SQuAD 2.0 is, with
    the null answer: threshold 0 for the headline)."""
    return any(e.is_impossible for e in qa)
