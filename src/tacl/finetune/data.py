"""Where fine-tuning data comes from, and `tacl finetune prepare`: on the login node, fetch a task's
Hugging Face dataset into the cache (compute jobs then read it offline) or check the local files, and
record the split sizes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tacl.finetune import CONLL_FILES, SQUAD_TASKS, TASKS, declared
from tacl.runtime.io import InputError, write_json_atomic

NER_TASKS = ("conll2003",)


def family(task: str) -> str:
    if task not in TASKS:
        raise InputError(f"finetune.tasks: unknown task {task!r} (known: {', '.join(TASKS)})")
    return TASKS[task]


def prepare(task: str, source: dict[str, Any], out_json: str) -> dict[str, Any]:
    """Load every split once (filling the cache for HF sources); a missing file fails here, naming it. A
    declared task (its declaration as `source`) is checked against its data (tacl.finetune.declared: a metric
    that does not fit its labels is refused here, before any training), and its record says how it is scored
    (its classes and the class of its F1, or its tags' scoring)."""
    if declared.is_declared(source):
        resolved, data = declared.check(task, source)
        record = {"task": task, "family": declared.family(source), "source": source,
                  "splits": {s: len(found) for s, found in data.items()},
                  "baseline": declared.baseline(task, resolved, data),
                  "declared": {"kind": source["kind"], "metric": source["metric"], **declared.recorded(resolved)},
                  "headline": list(declared.headline(source))}
        write_json_atomic(out_json, record)
        return record
    fam = family(task)
    sizes: dict[str, int] = {}
    if fam == "glue":
        from tacl.finetune import glue
        from tacl.finetune.sequence import has_split, load_examples

        spec = glue.TASKS[task]
        for split in ("train", *spec.dev_splits, *spec.test_splits):
            if split in spec.test_splits and not has_split(task, split, source):
                continue  # test files are optional: without them no submission file is written
            sizes[split] = len(load_examples(task, split, source))
    elif fam == "squad":
        from tacl.finetune.qa import load_examples

        for split in ("train", "dev"):
            sizes[split] = len(load_examples(SQUAD_TASKS[task], split, source))
    else:
        from tacl.finetune.tokens import read_conll

        if not source.get("data_dir"):
            raise InputError("finetune.conll_source.data_dir: no CoNLL-2003 folder given")
        for split, name in CONLL_FILES.items():
            sizes[split] = len(read_conll(Path(source["data_dir"]) / name))
    empty = [s for s, n in sizes.items() if n == 0]
    if empty:
        raise InputError(f"finetune task {task}: empty split(s) {empty}")
    record = {"task": task, "family": fam, "source": source, "splits": sizes, "baseline": baseline(task, source)}
    write_json_atomic(out_json, record)
    return record


def local_files(task: str, source: dict[str, Any], splits: tuple[str, ...] | None = None
                ) -> list[tuple[str, str | None]]:
    """The files `prepare` reads for a task from a local source, as (the source's key that names them, the
    path, or None where that key is not set): GLUE's train and dev splits (or `splits`; test files are
    optional), SQuAD's train and dev JSON, CoNLL's three files, a declared task's files. None for a Hugging
    Face source."""
    if declared.is_declared(source):
        return declared.local_files(source)
    fam = family(task)
    if fam == "glue":
        if source.get("kind", "tsv") == "hf":
            return []
        from tacl.finetune import glue

        spec, root = glue.TASKS[task], source.get("data_dir")
        return [("data_dir", str(Path(root, spec.dir_name, f"{split}.tsv")) if root else None)
                for split in splits or ("train", *spec.dev_splits)]
    if fam == "squad":
        if source.get("kind", "hf") == "hf":
            return []
        keys = [f"v{SQUAD_TASKS[task].replace('.', '_')}_{split}" for split in splits or ("train", "dev")]
        return [(key, source.get(key)) for key in keys]
    root = source.get("data_dir")
    return [("data_dir", str(Path(root, name)) if root else None) for name in CONLL_FILES.values()]


def baseline(task: str, source: dict[str, Any]) -> dict[str, Any] | None:
    """Chance, from the task's own files, scored like a fine-tune: GLUE classification predicts the
    majority class of train for every dev example (ties: the first label), STS-B the mean train score (a
    constant has no correlation: 0, as the metrics define it); SQuAD 2.0 answers nothing (the share of
    unanswerable questions). None where chance scores 0 by definition (SQuAD 1.1, CoNLL-2003's entity F1)."""
    from collections import Counter

    fam = family(task)
    if fam == "glue":
        from tacl.finetune import glue
        from tacl.finetune.sequence import load_examples

        spec = glue.TASKS[task]
        labels = [e.label for e in load_examples(task, "train", source)]
        if spec.is_regression:
            constant, name = sum(map(float, labels)) / len(labels), "constant: the mean train score"
        else:
            counts = Counter(labels)
            constant = max(spec.labels, key=lambda label: counts[label])  # (max keeps the first of equals)
            name = f"majority class of train ({constant})"
            constant = glue.label_id(task, constant)
        dev = {}
        for split in spec.dev_splits:
            refs = [float(e.label) if spec.is_regression else glue.label_id(task, e.label)
                    for e in load_examples(task, split, source)]
            dev[split] = glue.metrics(task, [constant] * len(refs), refs)
        return {"name": name, "dev": dev}
    if task == "squad_v2":
        from tacl.finetune import squad
        from tacl.finetune.qa import load_examples as load_squad

        examples = load_squad(SQUAD_TASKS[task], "dev", source)
        scores = squad.evaluate(examples, {ex.id: "" for ex in examples}, version_2=True)
        return {"name": "no answer to any question", "dev": {"dev": {"exact": scores["exact"], "f1": scores["f1"]}}}
    return None
