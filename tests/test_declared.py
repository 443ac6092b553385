"""Tasks declared in the config (tacl.finetune.declared): each kind read from files the test writes (and from a
Hugging Face-style dataset folder), its bad declarations refused in one line naming the key, its scores
against loops, a fine-tune of each kind on a tiny model, and the whole workflow with one task of each kind."""

import json
import math
import re

import numpy as np
import pytest
import yaml

from conftest import REPO, demo_config, run_snakemake
from tacl.runtime.io import InputError


def qnli_rows(split: str, rows: int) -> list[tuple[str, str, str]]:
    lines = (REPO / "examples/demo/glue/QNLI" / f"{split}.tsv").read_text().splitlines()[1 : rows + 1]
    return [tuple(line.split("\t")[1:]) for line in lines]


def write_declared_fixture(root, rows: int = 40) -> dict:
    """Small files of each kind, made from the demo's QNLI sample, and their declarations: a classification TSV
    folder (train, dev, labelled test), regression JSON lines with a `part` field that `where` splits, token
    classification in CoNLL columns (capitalised words tagged as entities), extractive QA JSON lines (the answer:
    the sentence's longest word). Their figures mean nothing."""
    root.mkdir(parents=True, exist_ok=True)
    parts = {"train": qnli_rows("train", rows), "dev": qnli_rows("dev", rows // 2),
             "test": qnli_rows("train", 2 * rows)[rows : rows + rows // 2]}
    for split, found in parts.items():
        lines = ["question\tsentence\tlabel"] + ["\t".join(r) for r in found]
        (root / f"cls_{split}.tsv").write_text("\n".join(lines) + "\n")
    with open(root / "sts.jsonl", "w") as f:
        for split, found in parts.items():
            for i, (q, s, y) in enumerate(found):
                score = (4.0 if y == "entailment" else 1.0) + (i % 5) / 10
                f.write(json.dumps({"a": q, "b": s, "score": score, "part": split}) + "\n")
    for split, found in parts.items():
        blocks = []
        for _, s, _ in found:
            words = s.split()[:30]
            blocks.append("\n".join(f"{w} {'B-CAP' if w[:1].isupper() and k else 'O'}" for k, w in enumerate(words)))
        (root / f"ner_{split}.conll").write_text("\n\n".join(blocks) + "\n")
    for split, found in parts.items():
        with open(root / f"qa_{split}.jsonl", "w") as f:
            for i, (_, s, _) in enumerate(found):
                longest = max(s.split(), key=len)
                f.write(json.dumps({"qid": f"{split}{i}", "q": "Which is the longest word?", "ctx": s,
                                    "ans": {"text": [longest], "answer_start": [s.index(longest)]}}) + "\n")
    src = {"kind": "files", "data_dir": str(root)}
    per_split = {s: {"split": "sts.jsonl", "where": {"part": s}} for s in parts}
    return {
        "mine_cls": {"kind": "classification", "source": src, "metric": "macro_f1",
                     "fields": {"text": "question", "text_pair": "sentence", "label": "label"},
                     "splits": {s: f"cls_{s}.tsv" for s in parts}},
        "mine_sts": {"kind": "regression", "source": src, "metric": "spearman",
                     "fields": {"text": "a", "text_pair": "b", "label": "score"}, "splits": per_split},
        "mine_ner": {"kind": "token_classification", "source": src, "metric": "f1",
                     "fields": {"tokens": "tokens", "tags": "tags"}, "splits": {s: f"ner_{s}.conll" for s in parts}},
        "mine_qa": {"kind": "extractive_qa", "source": src, "metric": "f1",
                    "fields": {"question": "q", "context": "ctx", "answers": "ans", "id": "qid"},
                    "splits": {s: f"qa_{s}.jsonl" for s in parts}},
    }


@pytest.fixture(scope="module")
def decls(tmp_path_factory):
    return write_declared_fixture(tmp_path_factory.mktemp("declared"))


def named(name: str, decl: dict) -> dict:
    from tacl.finetune.declared import source_of

    return source_of(name, decl)


def test_each_kind_reads_its_files(decls):
    from tacl.finetune import declared

    cls = declared.check_data("mine_cls", named("mine_cls", decls["mine_cls"]))
    assert [len(cls[s]) for s in ("train", "dev", "test")] == [40, 20, 20]
    assert cls["train"][0].text_b and cls["train"][0].label in ("entailment", "not_entailment")
    sts = declared.check_data("mine_sts", named("mine_sts", decls["mine_sts"]))
    assert [len(sts[s]) for s in ("train", "dev", "test")] == [40, 20, 20]  # (one file, split by `where`)
    assert all(isinstance(e.label, float) for e in sts["dev"])
    ner = declared.check_data("mine_ner", named("mine_ner", decls["mine_ner"]))
    assert {t for _, tags in ner["train"] for t in tags} == {"O", "B-CAP"}
    qa = declared.check_data("mine_qa", named("mine_qa", decls["mine_qa"]))
    e = qa["dev"][0]
    assert e.context[e.answer_starts[0]:].startswith(e.answers[0]) and e.id == "dev0" and not e.is_impossible


def test_an_official_squad_file_reads_as_a_declared_qa_task():
    """A folder's official SQuAD JSON (the demo's v2.0 sample): its questions under the declared fields, those
    without an answer among them, the ids the file's."""
    from tacl.finetune import declared
    from tacl.finetune.squad import read_squad_json

    squad = REPO / "examples/demo/squad"
    decl = {"kind": "extractive_qa", "source": {"kind": "files", "data_dir": str(squad)}, "metric": "f1",
            "fields": {"question": "q", "context": "c", "answers": "a", "id": None},
            "splits": {"train": "train-v2.0.json", "dev": "dev-v2.0.json"}}
    dev = declared.check_data("squad_mine", named("squad_mine", decl))["dev"]
    assert dev == read_squad_json(str(squad / "dev-v2.0.json")) and declared.unanswerable(dev)


def test_class_ids_of_a_hugging_face_dataset_are_named(tmp_path):
    """A `datasets` folder (parquet, as the Hub serves them) whose labels and tags are ClassLabel ids: the
    declared task reads their names."""
    import datasets

    from tacl.finetune import declared

    names = ["neg", "pos"]
    features = datasets.Features({"text": datasets.Value("string"), "label": datasets.ClassLabel(names=names),
                                  "tags": datasets.Sequence(datasets.ClassLabel(names=["O", "B-X", "I-X"]))})
    for split in ("train", "validation"):
        ds = datasets.Dataset.from_dict({"text": ["a b", "c d", "e f"], "label": [0, 1, 1],
                                         "tags": [[0, 1], [1, 2], [0, 0]]}, features=features)
        ds.to_parquet(str(tmp_path / "hub" / "data" / f"{split}-00000-of-00001.parquet"))
    src = {"kind": "hf", "name": str(tmp_path / "hub")}
    cls = {"kind": "classification", "source": src, "metric": "accuracy",
           "fields": {"text": "text", "label": "label"}, "splits": {"train": "train", "dev": "validation"}}
    data = declared.check_data("t", named("t", cls))
    assert [e.label for e in data["train"]] == ["neg", "pos", "pos"]
    tok = {**cls, "kind": "token_classification", "metric": "f1", "fields": {"tokens": "text", "tags": "tags"}}
    rows, found, _ = declared.rows(named("t", tok), "train")
    assert found["tags"] == ["O", "B-X", "I-X"] and found["label"] == names


@pytest.mark.parametrize("change, says", [
    ({"metric": "bleu"}, "finetune.declared_tasks.mine_cls.metric: 'bleu' is not a metric of classification"),
    ({"fields": {"text": "question"}}, "finetune.declared_tasks.mine_cls.fields.label: missing"),
    ({"splits": {"train": "cls_train.tsv"}}, "finetune.declared_tasks.mine_cls.splits.dev: missing"),
    ({"splits": {"train": "cls_train.xlsx", "dev": "cls_dev.tsv"}}, "splits.train: 'cls_train.xlsx' is not a file"),
    ({"kind": "regression", "metric": "accuracy"}, "'accuracy' is not a metric of regression (pearson, spearman)"),
])
def test_a_bad_declaration_is_one_line_naming_the_key_before_anything_runs(decls, change, says):
    from tacl.experiment.config import finetune_errors

    cfg = demo_config_with({"mine_cls": {**decls["mine_cls"], **change}})
    problems = finetune_errors(cfg, {})
    assert len(problems) == 1 and says in problems[0], problems


def demo_config_with(tasks: dict, run: list[str] | None = None) -> dict:
    """The demo's config with `tasks` declared (and run: `run`, else all of them), schema-valid, its defaults
    filled in."""
    from snakemake.utils import validate

    from tacl.experiment.config import SCHEMA, config_errors, load_schema

    cfg = yaml.safe_load((REPO / "examples/demo/config.yaml").read_text())
    cfg["finetune"].update(declared_tasks=tasks, tasks=run if run is not None else list(tasks), sweep={},
                           start_from={})
    assert config_errors(cfg, load_schema(SCHEMA)) == []
    validate(cfg, str(SCHEMA), set_default=True)
    return cfg


def test_a_task_neither_built_in_nor_declared_and_a_built_in_name_are_refused(decls):
    from tacl.experiment.config import finetune_errors

    problems = finetune_errors(demo_config_with({"rte": decls["mine_cls"]}, ["rte", "mine_nli"]), {})
    assert any(p.startswith("finetune.tasks: mine_nli is neither a built-in task") for p in problems)
    assert any(p.startswith("finetune.declared_tasks.rte: rte is a built-in task") for p in problems)


@pytest.mark.parametrize("what, edit, says", [
    ("a dev label absent from train", lambda t: t.replace("\tnot_entailment\n", "\tcontradiction\n", 1),
     "finetune.declared_tasks.mine_cls.splits.dev: label(s) contradiction absent from train"),
    ("a field absent from the file", lambda t: t.replace("question\t", "query\t", 1), "no field 'question'"),
])
def test_bad_data_is_one_line_naming_the_key_or_the_file(tmp_path, what, edit, says):
    from tacl.finetune import declared

    decls = write_declared_fixture(tmp_path)
    dev = tmp_path / "cls_dev.tsv"
    dev.write_text(edit(dev.read_text()))
    with pytest.raises(InputError) as e:
        declared.check_data("mine_cls", named("mine_cls", decls["mine_cls"]))
    assert says in str(e.value) and "\n" not in str(e.value)


def test_question_ids_that_repeat_are_refused_naming_the_key(tmp_path):
    from tacl.finetune import declared

    decls = write_declared_fixture(tmp_path)
    dev = tmp_path / "qa_dev.jsonl"
    dev.write_text(dev.read_text().replace('"qid": "dev1"', '"qid": "dev0"'))
    with pytest.raises(InputError, match=r"^finetune\.declared_tasks\.mine_qa\.fields\.id: .*qa_dev\.jsonl: the id "
                                         r"'dev0' names 2 questions"):
        declared.check_data("mine_qa", named("mine_qa", decls["mine_qa"]))


def test_the_scores_against_loops():
    """Accuracy, macro F1 (over the classes on either side, as scikit-learn's average="macro"), F1 of the
    second class and Matthews' correlation, each from a plain loop over the confusion counts."""
    from tacl.finetune import declared

    rng = np.random.default_rng(0)
    refs, preds = rng.integers(0, 3, 200), rng.integers(0, 3, 200)
    preds[preds == 2] = 1  # (a class only on one side)
    got = declared.scores({"kind": "classification", "metric": "macro_f1"}, preds, refs)

    def f1(c):
        tp = sum(1 for r, p in zip(refs, preds) if r == c and p == c)
        fp = sum(1 for r, p in zip(refs, preds) if r != c and p == c)
        fn = sum(1 for r, p in zip(refs, preds) if r == c and p != c)
        return 0.0 if tp == 0 else 2 * tp / (2 * tp + fp + fn)

    classes = sorted(set(refs) | set(preds))
    assert got["accuracy"] == pytest.approx(sum(r == p for r, p in zip(refs, preds)) / 200)
    assert got["macro_f1"] == got["main"] == pytest.approx(sum(map(f1, classes)) / len(classes))
    k = len(classes)
    c = [[sum(1 for r, p in zip(refs, preds) if r == a and p == b) for b in classes] for a in classes]
    t = [sum(c[i]) for i in range(k)]
    q = [sum(c[i][j] for i in range(k)) for j in range(k)]
    n, diag = sum(t), sum(c[i][i] for i in range(k))
    mcc = (diag * n - sum(t[i] * q[i] for i in range(k))) / math.sqrt(
        (n * n - sum(x * x for x in q)) * (n * n - sum(x * x for x in t)))
    assert got["matthews"] == pytest.approx(mcc)
    two, truth = preds.clip(0, 1), refs.clip(0, 1)
    binary = declared.scores({"kind": "classification", "metric": "f1", "binary": True}, two, truth)
    tp = sum(1 for r, p in zip(truth, two) if r == p == 1)
    assert binary["f1"] == pytest.approx(2 * tp / (sum(two == 1) + sum(truth == 1)))


def test_chance_of_each_kind(decls):
    """The majority class, the mean score, the most common tag, no answer: scored like a fine-tune."""
    from tacl.finetune import declared

    decl = named("mine_cls", decls["mine_cls"])
    data = declared.check_data("mine_cls", decl)
    chance = declared.baseline("mine_cls", decl, data)
    labels = [e.label for e in data["train"]]
    majority = max(sorted(set(labels)), key=labels.count)
    assert chance["name"] == f"majority class of train ({majority})"
    dev = [e.label for e in data["dev"]]
    assert chance["dev"]["dev"]["accuracy"] == pytest.approx(dev.count(majority) / len(dev))
    assert set(chance["dev"]) == {"dev", "test"}
    decl = named("mine_ner", decls["mine_ner"])
    chance = declared.baseline("mine_ner", decl, declared.check_data("mine_ner", decl))
    assert chance["dev"]["dev"]["f1"] == 0.0 and 0 < chance["dev"]["dev"]["accuracy"] < 1
    decl = named("mine_qa", decls["mine_qa"])
    chance = declared.baseline("mine_qa", decl, declared.check_data("mine_qa", decl))
    assert chance["dev"]["dev"] == {"exact": 0.0, "f1": 0.0}


@pytest.mark.parametrize("task", ["mine_cls", "mine_sts", "mine_ner", "mine_qa"])
def test_a_fine_tune_of_each_kind(decls, demo_data, tmp_path, task):
    """One seed on the tiny start model: dev and the labelled test scored with the kind's metrics, the
    headline named in metrics.json (what selection reads), and selection picks it up."""
    from tacl.finetune.cli import _train
    from tacl.finetune.settings import FineTune
    from tacl.finetune.sweep import select_runs

    hparams = {"max_len": 48, "batch": 8, "epochs": 1, "eval_batch": 16}
    if task == "mine_qa":
        hparams.update(doc_stride=16, max_query_len=16)
    tune = FineTune(task=task, model=str(demo_data["start"]), source=named(task, decls[task]), hparams=hparams)
    out = tmp_path / "lr2e-5_b8_e1" / "seed0"
    result = _train(tune, 0, out)
    metric = decls[task]["metric"]
    assert result["headline"] == ["dev", metric] and result["kind"] == decls[task]["kind"]
    assert metric in result["dev"]["dev"] and metric in result["test"]["test"]
    assert result["dev"]["dev"]["examples"] == 20
    chosen = select_runs(task, [str(out / "metrics.json")])
    assert (chosen["split"], chosen["metric"], chosen["setting"]) == ("dev", metric, "lr2e-5_b8_e1")


@pytest.mark.slow
def test_the_workflow_runs_a_declared_task_of_each_kind(decls, tmp_path):
    """The demo's config with no pretraining (the start model's row only) and the four declared tasks: each is
    prepared, fine-tuned, selected and tabled, with its chance row, and a dry run after it has nothing to do."""
    cfg = demo_config(tmp_path)
    cfg["pretrain"]["objectives"] = ["none"]
    cfg["finetune"].update(declared_tasks=decls, tasks=list(decls), seeds_small=1, seeds_large=1,
                           hparams={"glue": {"max_len": 48, "batch": 8, "epochs": 1},
                                    "ner": {"max_len": 48, "batch": 8, "epochs": 1},
                                    "squad": {"max_len": 48, "doc_stride": 16, "max_query_len": 16, "batch": 8,
                                              "epochs": 1},
                                    "tasks": {}})
    cfg["finetune"]["contrastive"] = {}
    cfg["analysis"].update(similarity_sentences=20, embeddings={"enabled": False})
    run_snakemake(tmp_path / "w", cfg, "--cores", "2", timeout=900)
    results = tmp_path / "results"
    table = (results / "report" / "declared.csv").read_text()
    for task, decl in decls.items():
        record = json.loads((results / "finetune_data" / f"{task}.json").read_text())
        assert record["headline"] == ["dev", decl["metric"]] and record["baseline"]["dev"]["dev"]
        assert f"{task} ({decl['metric']}, dev)" in table and f"{task} ({decl['metric']}, test)" in table
    rows = [line.split(",")[0] for line in table.splitlines()[1:]]
    assert rows == ["none", "chance"]
    assert "mine_cls" in (results / "report" / "report.md").read_text()
    dry = run_snakemake(tmp_path / "w", cfg, "--cores", "2", "-n")
    assert "Nothing to be done" in dry.stdout + dry.stderr
    # a change to one declaration reruns that task's jobs and what reads them, nothing of the others
    cfg["finetune"]["declared_tasks"]["mine_cls"]["metric"] = "accuracy"
    dry = run_snakemake(tmp_path / "w", cfg, "--cores", "2", "-n")
    log = dry.stdout + dry.stderr
    jobs = {m.group(1): int(m.group(2)) for m in re.finditer(r"^(\w+)\s+(\d+)\s*$", log[log.index("Job stats:"):],
                                                             re.M)}
    assert jobs == {"prepare_task": 1, "finetune": 1, "select_setting": 1, "submissions": 1, "report": 1, "all": 1,
                    "total": 6}, jobs
    assert "task=mine_cls" in log and not any(f"task={t}" in log for t in ("mine_sts", "mine_ner", "mine_qa"))


def test_the_croatian_example_plans_and_dry_runs(tmp_path, monkeypatch):
    """examples/croatian (XLM-R base on Croatian Wikipedia, WikiANN hr and ParlaSent declared) given over
    config.yaml as a user gives it, with profiles/slurm, offline and a scheduler that does not answer: the plan
    counts XLM-R from its published config.json and says what it assumes of the declared tasks; one prepare job
    per declared task, one fine-tune per (model, task), and no GLUE or SQuAD job."""
    from conftest import silent_schedulers

    for k, v in {"HTTPS_PROXY": "http://127.0.0.1:9", "HTTP_PROXY": "http://127.0.0.1:9", "HF_HUB_OFFLINE": "1",
                 "TACL_SLURM_ACCOUNT": "p123", "TACL_SLURM_CPU_PARTITION": "cpu",
                 "TACL_SLURM_GPU_PARTITION": "gpu"}.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("PATH", silent_schedulers(tmp_path / "bin"))
    proc = run_snakemake(tmp_path, None, "--profile", str(REPO / "profiles/slurm"), "-n", "--configfile",
                         str(REPO / "config.yaml"), str(REPO / "examples/croatian/config.yaml"), "--config",
                         f"results_dir={tmp_path / 'results'}")
    log = proc.stdout + proc.stderr
    assert "(model (xlm-roberta-base): from xlm-roberta-base's published config.json): family xlm-roberta" in log
    assert "a declared task (wikiann_hr, parlasent_bcs) 10,000 training and 2,000 evaluated examples" in log
    assert "--stop-headings" in log  # (Croatian's closing sections, not English's)
    jobs = {m.group(1): int(m.group(2)) for m in re.finditer(r"^(\w+)\s+(\d+)\s*$", log[log.index("Job stats:"):],
                                                             re.M)}
    assert jobs["prepare_task"] == 2 and jobs["finetune"] == 3 * 2 and jobs["pretrain_chunk"] == 2
    assert "task=wikiann_hr" in log and "task=parlasent_bcs" in log and "task=qnli" not in log
    assert not (tmp_path / "results").exists(), "a dry run writes nothing"


def test_tags_that_are_not_iob2_keep_their_own_order():
    """A declared token task's tags need not be entities: part-of-speech tags are kept, sorted (IOB2 tags as
    CoNLL's: O first, B- before I- by type)."""
    from tacl.finetune.tokens import label_list

    assert label_list([(["a", "b"], ["NOUN", "DET"]), (["c"], ["VERB"])]) == ["DET", "NOUN", "VERB"]
    assert label_list([(["a", "b"], ["I-PER", "O"]), (["c"], ["B-LOC"])]) == ["O", "B-LOC", "I-LOC", "B-PER", "I-PER"]
