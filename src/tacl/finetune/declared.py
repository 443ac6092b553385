"""Tasks declared in the config (`finetune.declared_tasks`): a user's own data set, fine-tuned and scored like
the built-in tasks, by its kind.

A declaration names its kind (classification, regression, token_classification, extractive_qa), its source
(a `datasets` name and config, or a folder of TSV, CSV, JSON, JSON-lines or CoNLL files), its fields, its
splits (train, dev, and a labelled test where it has one; each a split of the source or a file in the folder,
with an optional row filter `where`) and the metric its headline number is (which must fit its labels: entity
F1 only for entity tags, `f1` only of a named class). Each kind runs through a built-in
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
import re
from collections import Counter
from pathlib import Path
from typing import Any, Iterable

from tacl.finetune.tokens import ENTITY_METRICS, TAG_METRICS
from tacl.runtime.io import InputError

# Each kind: the built-in family whose fine-tune runs it, its fields (required, then optional) and the
# metrics its fine-tune reports (the declared `metric` is one of them, the headline).
KINDS: dict[str, dict[str, Any]] = {
    "classification": {"family": "glue", "fields": (("text", "label"), ("text_pair",)),
                       "metrics": ("accuracy", "macro_f1", "f1", "matthews")},
    "regression": {"family": "glue", "fields": (("text", "label"), ("text_pair",)),
                   "metrics": ("pearson", "spearman")},
    "token_classification": {"family": "ner", "fields": (("tokens", "tags"), ()),
                             "metrics": ENTITY_METRICS + TAG_METRICS},  # (which fit: the tags say, `scoring`)
    "extractive_qa": {"family": "squad", "fields": (("question", "context", "answers"), ("id",)),
                      "metrics": ("f1", "exact")},
}
SPLITS = ("train", "dev", "test")  # train and dev are required; a test split is scored like dev
FILE_FORMATS = (".tsv", ".csv", ".json", ".jsonl", ".conll", ".txt")  # .conll/.txt: CoNLL columns
KEY = "finetune.declared_tasks"
# How each kind's results are computed, beside RESULT_VERSIONS["finetune"] (which every fine-tune carries, the
# built-in tasks' too): `source_of` puts a kind's number into the source of its tasks (none while it is 1), so that
# a change to one kind's scores reruns that kind's finished jobs and nothing else. 2: token classification scored
# by its tags (entities of their scheme in seqeval's strict mode, or token accuracy and macro F1 over tags);
# classification's classes in the dataset's ClassLabel order and `f1` of `positive_label`. That changes a
# classification task's results only where it reads a Hugging Face dataset (a folder's files have no ClassLabel)
# or its headline is `f1` (whose class is now named, or refused where text labels name none); accuracy, macro F1
# and Matthews' correlation do not depend on the classes' order. So only those carry it (`changed`).
VERSIONS = {"token_classification": 2, "classification": 2}


def family(decl: dict[str, Any]) -> str:
    return KINDS[decl["kind"]]["family"]


def source_of(name: str, decl: dict[str, Any]) -> dict[str, Any]:
    """What the workflow gives a declared task's jobs as their source: the declaration, named, with the version
    of its kind's scores where that is past 1 and changed its results (`VERSIONS`, `changed`)."""
    version = VERSIONS.get(decl["kind"], 1) if changed(decl) else 1
    return {"declared": name, **decl, **({"version": version} if version > 1 else {})}


def changed(decl: dict[str, Any]) -> bool:
    """Whether the last change of its kind's scores (`VERSIONS`) changed a declared task's results: every token
    task's; a classification task's read from a Hugging Face dataset (its ClassLabel's order) or headed by
    `f1` (of a named class); no other's."""
    if decl["kind"] == "classification":
        return decl["source"]["kind"] == "hf" or decl["metric"] == "f1"
    return decl["kind"] in VERSIONS


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
    labels, positive = decl.get("labels"), decl.get("positive_label")
    for field, given in (("labels", labels), ("positive_label", positive)):
        if given is not None and kind != "classification":
            out.append(f"{key}.{field}: only a classification task names its {field}")
    if kind == "classification" and labels is not None:
        if decl["metric"] == "f1" and len(labels) != 2:
            out.append(f"{key}.metric: f1 is the F1 of one of two classes; use macro_f1 for {len(labels)} labels")
        if positive is not None and str(positive) not in map(str, labels):
            out.append(f"{key}.positive_label: {str(positive)!r} is not one of the labels "
                       f"({', '.join(map(str, labels))})")
        elif positive is not None and len(labels) != 2:
            out.append(f"{key}.positive_label: names the class whose F1 `f1` is, of two classes; labels lists "
                       f"{len(labels)}")
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
        ds, names, where_from = _hf_split(decl, name)
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


def _hf_split(decl: dict[str, Any], name: str) -> tuple[Any, dict[str, list[str]], str]:
    """A Hugging Face source's split (a `datasets` Dataset, from the cache where the login node put it), the
    class names of its ClassLabel fields (alone or in a sequence) in the dataset's order, and its name."""
    import datasets

    from tacl.runtime.hub import from_hub

    source, cache = decl["source"], decl.get("cache_dir")
    where_from = f"{source['name']}{'/' + source['config'] if source.get('config') else ''} {name}"
    with from_hub(source["name"], "dataset", f"{KEY}.{decl.get('declared', '?')}.source (kind files)", cache):
        ds = datasets.load_dataset(source["name"], source.get("config"), split=name, cache_dir=cache)
    names = {}
    for field, feature in ds.features.items():
        inner = getattr(feature, "feature", feature)  # a Sequence of ClassLabel: its items' names
        if isinstance(inner, datasets.ClassLabel):
            names[field] = list(inner.names)
    return ds, names, where_from


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


def class_names(decl: dict[str, Any]) -> list[str] | None:
    """The dataset's own order of a classification task's classes: the names of its label field's ClassLabel
    (a Hugging Face dataset's, in the split train reads); None where the source has none (a folder's files, a
    dataset whose labels are text)."""
    if decl["source"]["kind"] != "hf":
        return None
    _, names, _ = _hf_split(decl, split_name(decl["splits"]["train"]))
    return names.get(decl["fields"]["label"])


def label_order(labels: Iterable[str]) -> tuple[tuple[str, ...], bool]:
    """Text labels with no order of their own (a folder's, a dataset's text field) in id order, and whether
    that order numbers them: integers by value (so that 0 and 1 are classes 0 and 1), false before true, then
    any other text sorted (an order that names no class 1)."""
    found = set(labels)
    if found and all(re.fullmatch(r"[+-]?\d+", x) for x in found):
        return tuple(sorted(found, key=int)), True
    if found and {x.lower() for x in found} <= {"false", "true"} and len(found) == len({x.lower() for x in found}):
        return tuple(sorted(found, key=lambda x: x.lower() == "true")), True
    return tuple(sorted(found)), False


def classes(decl: dict[str, Any], train: list, names: list[str] | None = None) -> tuple[tuple[str, ...], str | None]:
    """A classification task's classes in id order and the class its `f1` is the F1 of (None: no class is
    named, and no `f1` is scored). The order: the declaration's `labels`; else the dataset's (`names`, its
    ClassLabel's); else train's labels in `label_order`. The class of `f1`, of two: `positive_label` where
    declared, else class 1 of an order that numbers the classes (the declared labels' second, the
    ClassLabel's class 1, the larger of two integers, true); two text labels name none, and `f1` as the
    metric is then refused in one line naming `positive_label`."""
    key = f"{KEY}.{decl.get('declared', '?')}"
    if decl.get("labels") is not None:
        labels, numbered = tuple(str(label) for label in decl["labels"]), True
    elif names:
        labels, numbered = tuple(names), True
    else:
        labels, numbered = label_order(e.label for e in train)
    positive = decl.get("positive_label")
    if positive is not None:
        positive = str(positive)
        if positive not in labels:
            raise InputError(f"{key}.positive_label: {positive!r} is not one of the classes ({', '.join(labels)})")
        if len(labels) != 2:
            raise InputError(f"{key}.positive_label: names the class whose F1 `f1` is, of two classes; the task "
                             f"has {len(labels)} ({', '.join(labels)})")
    elif len(labels) == 2 and numbered:
        positive = labels[1]
    if decl["metric"] == "f1" and len(labels) != 2:
        raise InputError(f"{key}.metric: f1 is the F1 of one of two classes; the task has {len(labels)} "
                         f"({', '.join(labels)}): use macro_f1")
    if decl["metric"] == "f1" and positive is None:
        raise InputError(f"{key}.positive_label: f1 is the F1 of one class, and the labels {labels[0]!r} and "
                         f"{labels[1]!r} are text with no class order (no ClassLabel, no labels list): declare "
                         f"positive_label: {labels[1]} (or {labels[0]})")
    return labels, positive


def with_classes(decl: dict[str, Any], train: list, names: list[str] | None = None) -> dict[str, Any]:
    """The declaration with what its scores need of its classes (`classes`): `classes`, in id order, and
    `positive`, the id of the class `f1` is the F1 of (None: no `f1`). `names`: the dataset's ClassLabel
    names (`class_names`), read here where not given."""
    labels, positive = classes(decl, train, class_names(decl) if names is None else names)
    return {**decl, "classes": list(labels), "positive": None if positive is None else labels.index(positive)}


def sequence_spec(name: str, decl: dict[str, Any]):
    """The task as a tacl.finetune.glue TaskSpec: classes in id order (`with_classes`; none for regression),
    one dev split, no submission files (a labelled test split is scored, `scored_test`)."""
    from tacl.finetune.glue import TaskSpec

    labels = tuple(decl["classes"]) if decl["kind"] == "classification" else ()
    return TaskSpec(name, name, labels, ("dev",), (), {}, decl["metric"])


def scores(decl: dict[str, Any], predictions: Any, references: Any) -> dict[str, float]:
    """Every metric of the task's kind on label ids (numbers for regression), as fractions, plus "main", the
    declared metric: accuracy, macro F1 (the mean F1 over the classes on either side, scikit-learn's
    average="macro"), F1 of the class `positive` (`with_classes`; where one is named) and Matthews'
    correlation; or Pearson and Spearman."""
    import numpy as np

    from tacl.finetune.glue import _correlations, f1_binary, matthews

    preds, refs = np.asarray(predictions), np.asarray(references)
    out: dict[str, float] = {}
    if decl["kind"] == "regression":
        out["pearson"], out["spearman"] = _correlations(preds.astype(np.float64), refs.astype(np.float64))
    else:
        classes_seen = np.unique(np.concatenate([refs, preds]))
        out["accuracy"] = float(np.mean(preds == refs))
        out["macro_f1"] = float(np.mean([f1_binary(refs, preds, c) for c in classes_seen]))
        out["matthews"] = matthews(refs, preds)
        if decl.get("positive") is not None:
            out["f1"] = f1_binary(refs, preds, decl["positive"])
    out["main"] = out[decl["metric"]]
    return out


def positive_label(decl: dict[str, Any]) -> str | None:
    """The name of the class a resolved declaration's `f1` is of (`with_classes`), or None."""
    return None if decl.get("positive") is None else decl["classes"][decl["positive"]]


def check_data(name: str, decl: dict[str, Any]) -> dict[str, list]:
    """Every split's examples (`check`), by split; one InputError naming the key where they do not fit."""
    return check(name, decl)[1]


def check(name: str, decl: dict[str, Any]) -> tuple[dict[str, Any], dict[str, list]]:
    """The declaration resolved against its data (`resolve`: its classes, its tags' scoring, its metric fitting
    them) and every split's examples, by split, once the data is checked: the fields there, a train split with
    examples, the dev and test labels among train's, the declared labels all there. One InputError naming the
    key otherwise."""
    key = f"{KEY}.{name}"
    data = {split: examples(decl, split) for split in SPLITS if split in decl["splits"]}
    for split, found in data.items():
        if not found:
            raise InputError(f"{key}.splits.{split}: no examples (after its `where`)")
    if decl["kind"] in ("classification", "token_classification"):
        seen = _labels(decl, data["train"])
        if decl.get("labels") is not None:
            listed = {str(label) for label in decl["labels"]}
            unknown = sorted(seen - listed)
            if unknown:
                raise InputError(f"{key}.labels: train has {', '.join(unknown)}, not among the declared labels")
            seen = listed
        for split in ("dev", "test"):
            absent = sorted(_labels(decl, data.get(split, [])) - seen)
            if absent:
                raise InputError(f"{key}.splits.{split}: label(s) {', '.join(absent)} absent from train")
    return resolve(decl, data), data


def _labels(decl: dict[str, Any], found: list) -> set[str]:
    if decl["kind"] == "token_classification":
        return {t for _, tags in found for t in tags}
    return {e.label for e in found}


def resolve(decl: dict[str, Any], data: dict[str, list]) -> dict[str, Any]:
    """The declaration with what its scores need of its data (once; a resolved one is returned as it is): a
    classification task's classes and the class of its `f1` (`with_classes`, from train), a token task's
    scoring (tacl.finetune.tokens.scoring, from every split's tags) with its metric checked against it
    (`token_metric_error`)."""
    if decl["kind"] == "classification" and "classes" not in decl:
        return with_classes(decl, data["train"])
    if decl["kind"] == "token_classification" and "scoring" not in decl:
        from tacl.finetune.tokens import scoring

        rule = scoring([tags for found in data.values() for _, tags in found])
        problem = token_metric_error(f"{KEY}.{decl.get('declared', '?')}", decl["metric"], rule,
                                     {t for found in data.values() for _, tags in found for t in tags})
        if problem:
            raise InputError(problem)
        return {**decl, "scoring": rule}
    return decl


def token_metric_error(key: str, metric: str, rule: dict[str, Any], tags: set[str]) -> str | None:
    """One line where a token task's metric does not fit its tags' scoring (entity metrics for tags that are
    not entities', or tag metrics for entity tags), naming the key and a few of the tags seen, those that are
    not entity tags first, with their count; None where it fits."""
    from tacl.finetune.tokens import describe, entity_tag, metrics_of

    fits = metrics_of(rule)
    if metric in fits:
        return None
    seen = sorted(tags, key=lambda t: (t == "O" or entity_tag(t) is not None, t))
    shown = ", ".join(seen[:6]) + (", ..." if len(seen) > 6 else "")
    what = ("scores entities, and these tags are not all entity tags (IOB1, IOB2 or BIOES: 'O' and PREFIX-TYPE, "
            "B-PER say)" if rule["metrics"] == "tags" else
            f"scores tags that are not entities, and these are entity tags ({describe(rule)})")
    return f"{key}.metric: {metric!r} {what}; {len(seen)} tags seen: {shown}. Use {', '.join(fits)}"


def baseline(name: str, decl: dict[str, Any], data: dict[str, list]) -> dict[str, Any]:
    """Chance, scored like a fine-tune on the dev and test splits (with the declaration's classes or its tags'
    scoring, `resolve`): classification predicts train's most common class (ties: the first in id order),
    regression train's mean (no correlation: 0), token classification tags every word with train's most common
    tag, extractive QA answers nothing."""
    train, scored = data["train"], {s: data[s] for s in ("dev", "test") if s in data}
    kind = decl["kind"]
    decl = resolve(decl, data)
    if kind == "regression":
        mean = sum(e.label for e in train) / len(train)
        return {"name": "constant: the mean train score",
                "dev": {s: scores(decl, [mean] * len(ex), [e.label for e in ex]) for s, ex in scored.items()}}
    if kind == "classification":
        labels = decl["classes"]
        counts = Counter(e.label for e in train)
        majority = max(labels, key=lambda label: counts[label])
        return {"name": f"majority class of train ({majority})",
                "dev": {s: scores(decl, [labels.index(majority)] * len(ex), [labels.index(e.label) for e in ex])
                        for s, ex in scored.items()}}
    if kind == "token_classification":
        from tacl.finetune.tokens import token_scores

        common = Counter(t for _, tags in train for t in tags).most_common(1)[0][0]
        return {"name": f"every word tagged {common} (train's most common tag)",
                "dev": {s: token_scores([tags for _, tags in ex], [[common] * len(tags) for _, tags in ex],
                                        decl["scoring"])
                        for s, ex in scored.items()}}
    from tacl.finetune.squad import evaluate

    out, v2 = {}, any(unanswerable(ex) for ex in data.values())
    for s, ex in scored.items():
        result = evaluate(ex, {e.id: "" for e in ex}, version_2=v2)
        out[s] = {"exact": result["exact"], "f1": result["f1"]}
    return {"name": "no answer to any question", "dev": out}


def recorded(decl: dict[str, Any]) -> dict[str, Any]:
    """What a resolved declaration (`resolve`) adds to the task's records (its preparation record and every
    run's metrics.json): a classification task's classes in id order and the class its `f1` is of (null: none,
    and no `f1`), a token task's scoring."""
    if decl["kind"] == "classification":
        return {"labels": list(decl["classes"]), "positive_label": positive_label(decl)}
    if decl["kind"] == "token_classification":
        return {"scoring": decl["scoring"]}
    return {}


def unanswerable(qa: list) -> bool:
    """Whether an extractive QA split holds questions without an answer (then scored as SQuAD 2.0 is, with
    the null answer: threshold 0 for the headline)."""
    return any(e.is_impossible for e in qa)
