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
    for positive in (0, 1):  # (the F1 of the class named, whichever id it has)
        binary = declared.scores({"kind": "classification", "metric": "f1", "positive": positive}, two, truth)
        tp = sum(1 for r, p in zip(truth, two) if r == p == positive)
        assert binary["f1"] == binary["main"] == pytest.approx(2 * tp / (sum(two == positive) + sum(truth == positive)))
    assert "f1" not in declared.scores({"kind": "classification", "metric": "accuracy", "positive": None}, two, truth)


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


@pytest.mark.parametrize("task", ["mine_cls", "mine_sts", "mine_ner", "mine_qa", "mine_pos"])
def test_a_fine_tune_of_each_kind(decls, pos, demo_data, tmp_path, task):
    """One seed on the tiny start model: dev and the labelled test scored with the kind's metrics (a token
    task's by its tags, a classification task's F1 only of a named class), the headline named in metrics.json
    (what selection reads) with how it was scored, and selection picks it up."""
    from tacl.finetune.cli import _train
    from tacl.finetune.settings import FineTune
    from tacl.finetune.sweep import select_runs

    decl = pos if task == "mine_pos" else decls[task]
    hparams = {"max_len": 48, "batch": 8, "epochs": 1, "eval_batch": 16}
    if task == "mine_qa":
        hparams.update(doc_stride=16, max_query_len=16)
    tune = FineTune(task=task, model=str(demo_data["start"]), source=named(task, decl), hparams=hparams)
    out = tmp_path / "lr2e-5_b8_e1" / "seed0"
    result = _train(tune, 0, out)
    metric = decl["metric"]
    assert result["headline"] == ["dev", metric] and result["kind"] == decl["kind"]
    assert metric in result["dev"]["dev"] and result["dev"]["dev"]["main"] == result["dev"]["dev"][metric]
    if task == "mine_pos":  # (no test split)
        assert result["scoring"] == {"metrics": "tags"} and set(result["dev"]["dev"]) == {
            "token_accuracy", "tag_macro_f1", "main", "examples"}
        return
    assert metric in result["test"]["test"]
    assert result["dev"]["dev"]["examples"] == 20
    if task == "mine_ner":
        assert result["scoring"] == {"metrics": "entities", "scheme": "IOB2", "mode": "strict"}
    if task == "mine_cls":  # (text labels: their sorted order, and no class named for an F1)
        assert result["labels"] == ["entailment", "not_entailment"] and result["positive_label"] is None
        assert "f1" not in result["dev"]["dev"]
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


# -- token tasks scored by their tags --------------------------------------------------------------------------


@pytest.mark.parametrize("sequences, scheme, mode", [
    ([["B-PER", "I-PER", "O", "B-LOC"], ["B-MISC-X", "O"]], "IOB2", "strict"),
    ([["B-PER", "B-LOC"], ["B-PER"]], "IOB2", "strict"),  # (B- only: single-word entities)
    ([["I-PER", "I-PER", "B-PER", "O", "I-LOC"]], "IOB1", "strict"),  # (B- only between two of one type)
    ([["O", "I-PER"]], "IOB1", "strict"),  # (I- only)
    ([["S-PER", "O", "B-LOC", "I-LOC", "E-LOC"], ["B-X", "E-X", "S-X"]], "BIOES", "strict"),
    ([["O", "S-PER"]], "BIOES", "strict"),
    ([["O", "I-PER"], ["O", "B-LOC"]], "IOB2", "default"),  # (both conventions: an IOB2 set cut in an entity)
    ([["B-PER", "I-PER", "O"], ["I-LOC", "O"]], "IOB2", "default"),
    ([["B-LOC", "I-LOC", "O"]], "IOB2", "strict"),
    ([["B-LOC", "O", "E-LOC"]], "BIOES", "default"),  # (an entity opened and never closed)
    ([["I-LOC", "E-LOC"]], "BIOES", "default"),
    ([["NOUN", "VERB", "DET"], ["PROPN", "PUNCT", "X"]], None, None),  # part of speech
    ([["B-", "O"]], None, None),  # (a prefix with no type)
    ([["S-", "O"]], None, None),
    ([["B", "I", "O"]], None, None),
    ([["b-per", "O"]], None, None),
    ([["B_PER", "O"]], None, None),
    ([["-LRB-", "NN", "-NONE-"]], None, None),
    ([["O", "B-PER", "NOUN"]], None, None),  # (one tag that fits no scheme)
    ([["O", "O"]], None, None),  # (no entity to score)
    ([["L-PER", "U-LOC", "O"]], None, None),  # (BILOU is not among the schemes)
])
def test_the_tags_scheme_and_how_it_is_scored(sequences, scheme, mode):
    from tacl.finetune.tokens import scoring, tag_scheme

    assert tag_scheme(sequences) == scheme
    rule = scoring(sequences)
    assert rule == ({"metrics": "tags"} if scheme is None else {"metrics": "entities", "scheme": scheme, "mode": mode})


def spans_to_tags(length: int, spans: list[tuple[int, int, str]], scheme: str) -> list[str]:
    """Entities [start, end) of a type, written in a scheme, one word at a time."""
    tags = ["O"] * length
    ends = {(e, t) for _, e, t in spans}
    for s, e, t in spans:
        for i in range(s, e):
            if scheme == "IOB2":
                tags[i] = f"{'B' if i == s else 'I'}-{t}"
            elif scheme == "IOB1":
                tags[i] = f"{'B' if i == s and (s, t) in ends else 'I'}-{t}"
            else:
                tags[i] = f"{'S' if e - s == 1 else 'B' if i == s else 'E' if i == e - 1 else 'I'}-{t}"
    return tags


def random_spans(rng, length: int) -> list[tuple[int, int, str]]:
    spans, i = [], 0
    while i < length:
        if rng.random() < 0.45:
            n = min(int(rng.integers(1, 4)), length - i)
            spans.append((i, i + n, str(rng.choice(["PER", "LOC"]))))
            i += n
        else:
            i += 1
    return spans


@pytest.mark.parametrize("scheme", ["IOB2", "IOB1", "BIOES"])
def test_entity_scores_of_each_scheme_against_sets_of_spans(scheme):
    """Random entities (adjacent ones of one type among them) written in each scheme, gold and predicted (some
    kept, some retyped, moved or new): the scheme is found, the sentences keep it (strict mode), and F1,
    precision and recall are those of the sets of (sentence, start, end, type), counted in a loop."""
    from tacl.finetune.tokens import scoring, token_scores

    rng = np.random.default_rng(1)
    gold_spans, pred_spans, gold, pred = [], [], [], []
    for k in range(60):
        length = int(rng.integers(3, 14))
        g = random_spans(rng, length)
        p = [(s, e, t if rng.random() < 0.8 else "ORG") for s, e, t in g if rng.random() < 0.7]
        extra = random_spans(rng, length)
        taken = {i for s, e, _ in p for i in range(s - 1, e + 1)}
        p += [sp for sp in extra if not any(i in taken for i in range(sp[0], sp[1])) and rng.random() < 0.3]
        p = sorted(p)
        p = [sp for j, sp in enumerate(p) if j == 0 or sp[0] >= p[j - 1][1]]  # (no overlap)
        gold_spans += [(k, *sp) for sp in g]
        pred_spans += [(k, *sp) for sp in p]
        gold.append(spans_to_tags(length, g, scheme))
        pred.append(spans_to_tags(length, p, scheme))
    rule = scoring(gold + pred)
    assert rule == {"metrics": "entities", "scheme": scheme, "mode": "strict"}
    got = token_scores(gold, pred, scoring(gold))
    hit = sum(1 for sp in pred_spans if sp in set(gold_spans))
    precision, recall = hit / len(pred_spans), hit / len(gold_spans)
    assert got["precision"] == pytest.approx(precision) and got["recall"] == pytest.approx(recall)
    assert got["f1"] == pytest.approx(2 * precision * recall / (precision + recall))
    words = [(a, b) for gs, ps in zip(gold, pred) for a, b in zip(gs, ps)]
    assert got["accuracy"] == pytest.approx(sum(a == b for a, b in words) / len(words))


def test_tag_metrics_against_loops():
    """Token accuracy and the macro F1 over tags (each tag on either side; one never predicted right counts 0),
    from plain counts."""
    from tacl.finetune.tokens import tag_metrics

    rng = np.random.default_rng(2)
    tags = ["NOUN", "VERB", "DET", "ADJ", "PUNCT"]
    gold = [[str(t) for t in rng.choice(tags[:4], int(rng.integers(1, 9)))] for _ in range(50)]
    pred = [[str(t) if rng.random() < 0.6 else str(rng.choice(tags)) for t in s] for s in gold]
    got = tag_metrics(gold, pred)
    pairs = []
    for gs, ps in zip(gold, pred):
        for g, p in zip(gs, ps):
            pairs.append((g, p))
    f1 = []
    for tag in sorted({g for g, _ in pairs} | {p for _, p in pairs}):
        tp = sum(1 for g, p in pairs if g == tag and p == tag)
        fp = sum(1 for g, p in pairs if g != tag and p == tag)
        fn = sum(1 for g, p in pairs if g == tag and p != tag)
        f1.append(0.0 if tp == 0 else 2 * tp / (2 * tp + fp + fn))
    assert "PUNCT" in {p for _, p in pairs} and "PUNCT" not in {g for g, _ in pairs}  # (a tag only predicted)
    assert got == {"token_accuracy": pytest.approx(sum(g == p for g, p in pairs) / len(pairs)),
                   "tag_macro_f1": pytest.approx(sum(f1) / len(f1))}


def test_conll_keeps_seqeval_default_mode():
    """CoNLL-2003's scores stay seqeval's default mode (conlleval's reading, its published numbers'): an I- that
    opens an entity counts, where a declared IOB2 task's strict mode counts it wrong."""
    from seqeval.metrics import accuracy_score, f1_score, precision_score, recall_score

    from tacl.finetune.ner import finetune_ner  # noqa: F401  (the fine-tune that scores CoNLL with them)
    from tacl.finetune.tokens import CONLL_SCORING, entity_metrics, scoring, token_scores

    gold = [["B-PER", "I-PER", "O", "B-LOC"], ["B-ORG", "O", "I-MISC"]]
    pred = [["I-PER", "I-PER", "O", "B-LOC"], ["B-ORG", "B-MISC", "I-MISC"]]
    assert entity_metrics(gold, pred) == {"f1": f1_score(gold, pred), "precision": precision_score(gold, pred),
                                          "recall": recall_score(gold, pred), "accuracy": accuracy_score(gold, pred),
                                          "main": f1_score(gold, pred)}
    # gold PER, LOC, ORG, MISC (opened by I-); predicted PER (opened by I-), LOC, ORG, MISC (longer): 3 right
    assert entity_metrics(gold, pred)["f1"] == pytest.approx(3 / 4)
    assert CONLL_SCORING == {"metrics": "entities", "scheme": None, "mode": "default"}
    clean = [gold[0], ["B-ORG", "O", "B-MISC"]]
    strict = token_scores(clean, pred, scoring(clean))  # (IOB2, strict: PER opened by I- is no entity)
    assert strict["precision"] == pytest.approx(2 / 3) and strict["recall"] == pytest.approx(2 / 4)


def write_pos(root) -> dict:
    """Part-of-speech tags in CoNLL columns beside the fixture's other files, and their declaration (metric
    token_accuracy)."""
    for split, n in (("train", 30), ("dev", 12)):
        blocks = []
        for _, s, _ in qnli_rows("train" if split == "train" else "dev", n):
            words = s.split()[:20]
            blocks.append("\n".join(f"{w} {'PROPN' if w[:1].isupper() else 'PUNCT' if not w.isalnum() else 'NOUN'}"
                                    for w in words))
        (root / f"pos_{split}.conll").write_text("\n\n".join(blocks) + "\n")
    return {"kind": "token_classification", "source": {"kind": "files", "data_dir": str(root)},
            "metric": "token_accuracy", "fields": {"tokens": "tokens", "tags": "tags"},
            "splits": {s: f"pos_{s}.conll" for s in ("train", "dev")}}


@pytest.fixture(scope="module")
def pos(decls):
    from pathlib import Path

    return write_pos(Path(decls["mine_ner"]["source"]["data_dir"]))


def test_part_of_speech_tags_are_scored_by_tags_and_entity_f1_is_refused_at_prepare(pos, decls, tmp_path):
    """Tags that are not entities': prepare_task records token accuracy and macro F1 over tags (the chance row
    too, against a loop); entity F1 declared for them is refused there in one line naming the key and the
    tags; token accuracy declared for entity tags is refused the same way."""
    from tacl.finetune import declared
    from tacl.finetune.data import prepare

    record = prepare("mine_pos", named("mine_pos", pos), str(tmp_path / "pos.json"))
    assert record["declared"]["scoring"] == {"metrics": "tags"}
    train, dev = (declared.check_data("mine_pos", named("mine_pos", pos))[s] for s in ("train", "dev"))
    counts = {}
    for _, tags in train:
        for t in tags:
            counts[t] = counts.get(t, 0) + 1
    common = max(counts, key=counts.get)
    words = [t for _, tags in dev for t in tags]
    chance = record["baseline"]["dev"]["dev"]
    assert record["baseline"]["name"] == f"every word tagged {common} (train's most common tag)"
    assert set(chance) == {"token_accuracy", "tag_macro_f1"}
    assert chance["token_accuracy"] == pytest.approx(words.count(common) / len(words))
    right = words.count(common)
    assert chance["tag_macro_f1"] == pytest.approx(2 * right / (len(words) + right) / len(set(words)))
    with pytest.raises(InputError) as e:
        prepare("mine_pos", named("mine_pos", {**pos, "metric": "f1"}), str(tmp_path / "f1.json"))
    line = str(e.value)
    assert line.startswith("finetune.declared_tasks.mine_pos.metric: 'f1' scores entities") and "\n" not in line
    assert "3 tags seen: NOUN, PROPN, PUNCT" in line and line.endswith("Use token_accuracy, tag_macro_f1")
    assert not (tmp_path / "f1.json").exists()
    with pytest.raises(InputError, match=r"^finetune\.declared_tasks\.mine_ner\.metric: 'tag_macro_f1' scores tags "
                                         r"that are not entities, and these are entity tags \(entities, IOB2, "
                                         r"seqeval's strict mode\); 2 tags seen: B-CAP, O\. Use f1, precision, "
                                         r"recall, accuracy$"):
        declared.check_data("mine_ner", named("mine_ner", {**decls["mine_ner"], "metric": "tag_macro_f1"}))
    ner = prepare("mine_ner", named("mine_ner", decls["mine_ner"]), str(tmp_path / "ner.json"))
    assert ner["declared"]["scoring"] == {"metrics": "entities", "scheme": "IOB2", "mode": "strict"}


def test_a_mixed_tag_set_names_the_tags_that_fit_no_scheme_first(tmp_path):
    from tacl.finetune.declared import token_metric_error

    tags = {"O", "B-PER", "I-PER", "B-LOC", "I-LOC", "B-ORG", "I-ORG", "NOUN"}
    line = token_metric_error("finetune.declared_tasks.t", "f1", {"metrics": "tags"}, tags)
    assert "8 tags seen: NOUN, B-LOC, B-ORG, B-PER, I-LOC, I-ORG, ..." in line


# -- classes in the dataset's order, F1 of a named class --------------------------------------------------------


def write_pairs_dataset(root, names: list[str]) -> dict:
    """A `datasets` folder (parquet, as the Hub serves them) of sentence pairs whose label is a ClassLabel of
    `names`, and its declaration (metric f1)."""
    import datasets

    features = datasets.Features({"a": datasets.Value("string"), "b": datasets.Value("string"),
                                  "label": datasets.ClassLabel(names=names)})
    labels = {"train": [0, 1, 1, 0, 1], "validation": [1, 1, 0, 1]}
    for split, ids in labels.items():
        ds = datasets.Dataset.from_dict({"a": [f"q{i}" for i in ids], "b": ["p"] * len(ids), "label": ids},
                                        features=features)
        ds.to_parquet(str(root / "data" / f"{split}-00000-of-00001.parquet"))
    return {"kind": "classification", "source": {"kind": "hf", "name": str(root)}, "metric": "f1",
            "fields": {"text": "a", "text_pair": "b", "label": "label"},
            "splits": {"train": "train", "dev": "validation"}}


def test_a_datasets_class_order_gives_the_ids_and_the_class_of_f1(tmp_path):
    """ClassLabel names [not_duplicate, duplicate] (not sorted): ids in that order, F1 of class 1 (duplicate),
    in the chance row (against a loop) and in the preparation record; a declared positive_label chooses the
    other; one that is not a class is refused naming the key."""
    from tacl.finetune import declared
    from tacl.finetune.data import prepare

    decl = named("pairs", write_pairs_dataset(tmp_path / "hub", ["not_duplicate", "duplicate"]))
    record = prepare("pairs", decl, str(tmp_path / "pairs.json"))
    assert record["declared"]["labels"] == ["not_duplicate", "duplicate"]
    assert record["declared"]["positive_label"] == "duplicate"
    # chance: train's majority (duplicate, 3 of 5) for every dev pair; dev: duplicate, duplicate, not, duplicate
    assert record["baseline"]["name"] == "majority class of train (duplicate)"
    assert record["baseline"]["dev"]["dev"]["f1"] == pytest.approx(2 * 3 / (4 + 3))
    other = declared.with_classes({**decl, "positive_label": "not_duplicate"},
                                  declared.check_data("pairs", decl)["train"])
    assert other["classes"] == ["not_duplicate", "duplicate"] and other["positive"] == 0
    assert declared.scores(other, [1, 1, 1, 1], [1, 1, 0, 1])["f1"] == 0.0  # (no not_duplicate predicted)
    with pytest.raises(InputError, match=r"^finetune\.declared_tasks\.pairs\.positive_label: 'dup' is not one of "
                                         r"the classes \(not_duplicate, duplicate\)$"):
        prepare("pairs", {**decl, "positive_label": "dup"}, str(tmp_path / "dup.json"))


@pytest.mark.parametrize("labels, order, positive", [
    (["not_entailment", "entailment"], ("entailment", "not_entailment"), None),  # (text: sorted, no class 1)
    (["1", "0", "1"], ("0", "1"), "1"),
    (["2", "10", "1"], ("1", "2", "10"), None),  # (integers by value; three classes)
    (["2", "1"], ("1", "2"), "2"),  # (the larger of two integers)
    (["-1", "1"], ("-1", "1"), "1"),
    (["True", "False"], ("False", "True"), "True"),
    (["yes", "no"], ("no", "yes"), None),
])
def test_text_labels_take_a_documented_order(labels, order, positive):
    from tacl.finetune.declared import classes
    from tacl.finetune.glue import Example

    train = [Example(str(i), "t", None, label) for i, label in enumerate(labels)]
    decl = {"declared": "t", "kind": "classification", "metric": "accuracy"}
    assert classes(decl, train) == (order, positive)


def test_f1_of_text_labels_needs_a_named_class(decls):
    """The fixture's QNLI labels are text (entailment, not_entailment) in files: `f1` is refused in one line
    naming positive_label until it is declared; declared, it is the F1 of that class (against a loop), and the
    metrics leave f1 out where no class is named."""
    from tacl.finetune import declared

    decl = named("mine_cls", {**decls["mine_cls"], "metric": "f1"})
    with pytest.raises(InputError) as e:
        declared.check_data("mine_cls", decl)
    assert str(e.value) == ("finetune.declared_tasks.mine_cls.positive_label: f1 is the F1 of one class, and the "
                            "labels 'entailment' and 'not_entailment' are text with no class order (no ClassLabel, "
                            "no labels list): declare positive_label: not_entailment (or entailment)")
    resolved, data = declared.check("mine_cls", {**decl, "positive_label": "entailment"})
    assert resolved["classes"] == ["entailment", "not_entailment"] and resolved["positive"] == 0
    chance = declared.baseline("mine_cls", resolved, data)
    majority = chance["name"].split("(")[1][:-1]
    dev = [e.label for e in data["dev"]]
    hit = dev.count("entailment") if majority == "entailment" else 0
    said = len(dev) if majority == "entailment" else 0
    assert chance["dev"]["dev"]["f1"] == pytest.approx(2 * hit / (said + dev.count("entailment")))
    listed = declared.with_classes({**decl, "labels": ["not_entailment", "entailment"]}, data["train"])
    assert listed["classes"] == ["not_entailment", "entailment"] and declared.positive_label(listed) == "entailment"
    plain = declared.with_classes(named("mine_cls", decls["mine_cls"]), data["train"])
    assert plain["positive"] is None and "f1" not in declared.baseline("mine_cls", plain, data)["dev"]["dev"]


@pytest.mark.parametrize("change, says", [
    ({"positive_label": "entailment", "kind": "regression", "metric": "spearman"},
     "finetune.declared_tasks.mine_cls.positive_label: only a classification task names its positive_label"),
    ({"labels": ["entailment", "not_entailment"], "positive_label": "yes"},
     "finetune.declared_tasks.mine_cls.positive_label: 'yes' is not one of the labels (entailment, not_entailment)"),
    ({"labels": ["a", "b", "c"], "positive_label": "a"},
     "finetune.declared_tasks.mine_cls.positive_label: names the class whose F1 `f1` is, of two classes"),
])
def test_a_bad_positive_label_is_one_line_before_anything_runs(decls, change, says):
    from tacl.experiment.config import finetune_errors

    problems = finetune_errors(demo_config_with({"mine_cls": {**decls["mine_cls"], **change}}), {})
    assert len(problems) == 1 and problems[0].startswith(says), problems


def test_glue_f1_stays_class_1_and_is_recorded():
    """MRPC's and QQP's F1 is of class 1, as GLUE scores it (against a loop), and metrics.json says so."""
    from tacl.finetune import glue
    from tacl.finetune.sequence import glue_record

    rng = np.random.default_rng(3)
    refs, preds = rng.integers(0, 2, 300), rng.integers(0, 2, 300)
    tp = sum(1 for r, p in zip(refs, preds) if r == p == 1)
    for task in ("mrpc", "qqp"):
        got = glue.metrics(task, preds, refs)
        assert got["f1"] == pytest.approx(2 * tp / (sum(refs == 1) + sum(preds == 1)))
        assert got["main"] == pytest.approx((got["f1"] + float(np.mean(refs == preds))) / 2)
        assert glue_record(glue.TASKS[task]) == {"positive_label": "1"}
    assert glue_record(glue.TASKS["rte"]) == {} and "f1" not in glue.metrics("rte", preds, refs)


def test_only_the_declared_kinds_whose_scores_changed_carry_a_version(decls, pos):
    """A built-in task's source and RESULT_VERSIONS["finetune"] stay as they were (finished GLUE, SQuAD and
    CoNLL runs are not rerun); token tasks, and classification from a Hugging Face dataset or headed by f1,
    carry version 2; classification from files headed by another metric, regression and QA none."""
    from tacl import RESULT_VERSIONS
    from tacl.experiment.design import task_source
    from tacl.finetune.declared import source_of

    assert RESULT_VERSIONS["finetune"] == 1
    cfg = demo_config_with({**decls, "mine_pos": pos})
    for task in ("qnli", "squad_v2", "conll2003"):
        assert "version" not in task_source(cfg, task)
    versions = {t: task_source(cfg, t).get("version") for t in cfg["finetune"]["declared_tasks"]}
    assert versions == {"mine_cls": None, "mine_sts": None, "mine_ner": 2, "mine_qa": None, "mine_pos": 2}
    hf = {**decls["mine_cls"], "source": {"kind": "hf", "name": "someone/pairs"}}
    assert source_of("pairs", hf)["version"] == 2
    assert source_of("pairs", {**decls["mine_cls"], "metric": "f1"})["version"] == 2


def test_the_tables_name_the_class_of_f1():
    """The declared table's column, the differences' row and the settings' table say whose F1 it is."""
    import pandas as pd

    from tacl.report.tables import (LONG_COLUMNS, declared_headline_rows, declared_headlines, declared_table,
                                    f1_classes, selections, summarise, sweep_table)

    records = {"pairs": {"family": "glue", "splits": {"train": 5, "dev": 4}, "headline": ["dev", "f1"],
                         "declared": {"kind": "classification", "metric": "f1", "labels": ["no", "yes"],
                                      "positive_label": "yes"}},
               "pos": {"family": "ner", "splits": {"train": 5, "dev": 4}, "headline": ["dev", "token_accuracy"],
                       "declared": {"kind": "token_classification", "metric": "token_accuracy",
                                    "scoring": {"metrics": "tags"}}}}
    long = pd.DataFrame([{"model": "none", "task": t, "setting": "lr2e-5_b8_e1", "family": "glue", "preset": "standard",
                          "start": "", "seed": 0, "split": "dev", "metric": m, "value": 50.0}
                         for t, m in (("pairs", "f1"), ("pos", "token_accuracy"), ("mrpc", "f1"))],
                        columns=LONG_COLUMNS)
    chance = {"pairs": {"name": "majority", "dev": {"dev": {"f1": 0.5}}}}
    table = declared_table(summarise(long), long, ["none"], records, chance)
    assert list(table.columns[3:]) == ["pairs (f1 of yes, dev)", "pos (token_accuracy, dev)"]
    assert table.iloc[1]["pairs (f1 of yes, dev)"] == "50.0"  # (the chance row)
    assert [r[0] for r in declared_headline_rows(records)] == ["pairs (f1 of yes)", "pos"]
    sweep = sweep_table(long, selections(long, declared_headlines(records)), f1_classes(records))
    assert dict(zip(sweep.task, sweep.dev)) == {"mrpc": "dev f1 of 1", "pairs": "dev f1 of yes",
                                                "pos": "dev token_accuracy"}
