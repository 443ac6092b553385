"""GLUE reading, metrics and submissions: fixture files in every task's layout, the real shared files,
metrics against hand arithmetic."""

from __future__ import annotations

import logging
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import SHARED_DATA, needs_shared
from tacl.finetune import glue
from tacl.finetune.glue import TASKS, Example
from tacl.runtime.io import InputError

GLUE_DATA = SHARED_DATA / "glue"


def write_tsv(path: Path, rows: list[list[str]], bom: bool = False) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    text = "".join("\t".join(row) + "\n" for row in rows)
    path.write_text(("\ufeff" if bom else "") + text, encoding="utf-8")
    return path


# ---------------------------------------------------------------- task table


def test_task_table():
    assert list(TASKS) == ["cola", "sst2", "mrpc", "stsb", "qqp", "mnli", "qnli", "rte", "wnli"]
    stsb, mnli = TASKS["stsb"], TASKS["mnli"]
    assert stsb.is_regression and stsb.num_labels == 1 and stsb.labels == ()
    assert mnli.labels == ("entailment", "neutral", "contradiction") and mnli.num_labels == 3
    assert TASKS["rte"].labels == TASKS["qnli"].labels == ("entailment", "not_entailment")
    assert mnli.dev_splits == ("dev_matched", "dev_mismatched")
    assert mnli.test_splits == ("test_matched", "test_mismatched")
    assert mnli.submission_files == {"test_matched": "MNLI-m.tsv", "test_mismatched": "MNLI-mm.tsv"}
    assert TASKS["sst2"].submission_files == {"test": "SST-2.tsv"} and TASKS["sst2"].dev_splits == ("dev",)
    assert [t.dir_name for t in TASKS.values()] == [
        "CoLA", "SST-2", "MRPC", "STS-B", "QQP", "MNLI", "QNLI", "RTE", "WNLI"]
    for spec in TASKS.values():
        assert spec.is_regression == (spec.name == "stsb")
        assert set(spec.submission_files) == set(spec.test_splits)


# ---------------------------------------------------------------- fixture files, one per layout


def test_cola_headerless_train_dev_and_test(tmp_path):
    d = tmp_path / "CoLA"
    friends = "Our friends won't buy this analysis, let alone the next one we propose."
    write_tsv(d / "train.tsv", [
        ["gj04", "1", "", friends],
        ["gj04", "0", "*", '"The more you eat, the fatter you get.'],  # quote never closed
        ["cj99", "1", "", 'It\'s "fine" she said'],
    ])
    write_tsv(d / "dev.tsv", [["clc95", "0", "*", 'Sue saw "him']])
    write_tsv(d / "test.tsv", [["index", "sentence"], ["0", "Bill whistled past the house."],
                               ["1", '"Unclosed quote test']])
    assert glue.read_split("cola", str(tmp_path), "train") == [
        Example("train-0", friends, None, "1"),
        Example("train-1", '"The more you eat, the fatter you get.', None, "0"),
        Example("train-2", 'It\'s "fine" she said', None, "1"),
    ]
    assert glue.read_split("cola", str(tmp_path), "dev") == [Example("dev-0", 'Sue saw "him', None, "0")]
    assert glue.read_split("cola", str(tmp_path), "test") == [
        Example("0", "Bill whistled past the house.", None, None),
        Example("1", '"Unclosed quote test', None, None),
    ]


def test_sst2(tmp_path):
    d = tmp_path / "SST-2"
    write_tsv(d / "dev.tsv", [["sentence", "label"], ["a charming journey . ", "1"], ['" bleak', "0"]])
    write_tsv(d / "test.tsv", [["index", "sentence"], ["0", "uneasy mishmash ."], ["1", "a poor imitation"]])
    assert glue.read_split("sst2", str(tmp_path), "dev") == [
        Example("dev-0", "a charming journey . ", None, "1"),
        Example("dev-1", '" bleak', None, "0"),
    ]
    assert glue.read_split("sst2", str(tmp_path), "test") == [
        Example("0", "uneasy mishmash .", None, None),
        Example("1", "a poor imitation", None, None),
    ]


def test_mrpc_with_byte_order_mark(tmp_path):
    d = tmp_path / "MRPC"
    header = ["Quality", "#1 ID", "#2 ID", "#1 String", "#2 String"]
    write_tsv(d / "train.tsv", [header,
                                ["1", "702876", "702977", "Amrozi accused his brother .", '" the witness'],
                                ["0", "2108705", "2108831", "Yucaipa owned it .", "Yucaipa bought it ."]],
              bom=True)
    write_tsv(d / "test.tsv", [["index", "#1 ID", "#2 ID", "#1 String", "#2 String"],
                               ["0", "1089874", "1089925", "PCCW 's officer .", "Current officer ."]])
    assert glue.read_split("mrpc", str(tmp_path), "train") == [
        Example("train-0", "Amrozi accused his brother .", '" the witness', "1"),
        Example("train-1", "Yucaipa owned it .", "Yucaipa bought it .", "0"),
    ]
    assert glue.read_split("mrpc", str(tmp_path), "test") == [
        Example("0", "PCCW 's officer .", "Current officer .", None)]


STSB_HEADER = "index genre filename year old_index source1 source2 sentence1 sentence2 score".split()


def test_stsb(tmp_path):
    d = tmp_path / "STS-B"
    write_tsv(d / "dev.tsv", [
        STSB_HEADER,
        ["0", "main-captions", "MSRvid", "2012test", "0000", "none", "none",
         "A man with a hard hat is dancing.", "A man wearing a hard hat is dancing.", "5.000"],
        ["1", "main-news", "headlines", "2013", "0007", "none", "none",
         '"Quoted start', "Other sentence.", "0.8"],
    ])
    write_tsv(d / "test.tsv", [
        STSB_HEADER[:9],
        ["0", "main-captions", "MSRvid", "2012test", "0024", "none", "none",
         "A girl is styling her hair.", "A girl is brushing her hair."],
    ])
    dev = glue.read_split("stsb", str(tmp_path), "dev")
    assert dev == [
        Example("dev-0", "A man with a hard hat is dancing.", "A man wearing a hard hat is dancing.", 5.0),
        Example("dev-1", '"Quoted start', "Other sentence.", 0.8),
    ]
    assert all(isinstance(e.label, float) for e in dev)
    assert glue.read_split("stsb", str(tmp_path), "test") == [
        Example("0", "A girl is styling her hair.", "A girl is brushing her hair.", None)]


QQP_HEADER = ["id", "qid1", "qid2", "question1", "question2", "is_duplicate"]


def test_qqp_skips_malformed_train_rows_with_warning(tmp_path, caplog):
    d = tmp_path / "QQP"
    write_tsv(d / "train.tsv", [
        QQP_HEADER,
        ["133273", "213221", "213222", "How is the life of a math student?", "Which level is enough?", "0"],
        ["201841", "303951", "174364", "How do I", "control my emotions?"],  # 5 columns
        ["402555", "536040", "536041", "How do I learn Python?", "Best way to learn Python?", "1"],
    ])
    write_tsv(d / "test.tsv", [["id", "question1", "question2"],
                               ["0", "Why do rockets look white?", "Why are rockets white?"]])
    with caplog.at_level(logging.WARNING):
        train = glue.read_split("qqp", str(tmp_path), "train")
    assert train == [
        Example("train-0", "How is the life of a math student?", "Which level is enough?", "0"),
        Example("train-1", "How do I learn Python?", "Best way to learn Python?", "1"),
    ]
    messages = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("skipped 1 malformed" in m and "train.tsv" in m for m in messages)
    assert glue.read_split("qqp", str(tmp_path), "test") == [
        Example("0", "Why do rockets look white?", "Why are rockets white?", None)]
    # dev is not forgiven
    write_tsv(d / "dev.tsv", [QQP_HEADER, ["1", "2", "3", "question one", "0"]])
    with pytest.raises(InputError, match=r"QQP/dev\.tsv:2: expected 6"):
        glue.read_split("qqp", str(tmp_path), "dev")


MNLI_TEST_HEADER = ("index promptID pairID genre sentence1_binary_parse sentence2_binary_parse "
                    "sentence1_parse sentence2_parse sentence1 sentence2").split()
MNLI_DEV_HEADER = MNLI_TEST_HEADER + ["label1", "label2", "label3", "label4", "label5", "gold_label"]


def mnli_row(i: int, premise: str, hypothesis: str, *labels: str) -> list[str]:
    return [str(i), str(1000 + i), f"{1000 + i}e", "fiction", "( ( x ) )", "( y )", "(ROOT x)", "(ROOT y)",
            premise, hypothesis, *labels]


def test_mnli_all_five_splits(tmp_path):
    d = tmp_path / "MNLI"
    write_tsv(d / "train.tsv", [
        MNLI_TEST_HEADER + ["label1", "gold_label"],
        mnli_row(0, "Conceptually cream skimming has two basic dimensions.",
                 "Product and geography are what make cream skimming work.", "neutral", "neutral"),
        mnli_row(1, '"you know during the season', "You lose the things.", "entailment", "entailment"),
    ])
    write_tsv(d / "dev_matched.tsv", [
        MNLI_DEV_HEADER,
        mnli_row(0, "The new rights are nice enough", "Everyone really likes them.",
                 "neutral", "entailment", "neutral", "neutral", "neutral", "neutral"),
        mnli_row(1, "This site includes a list.", "The Government does not do that.",
                 "entailment", "contradiction", "contradiction", "contradiction", "neutral", "contradiction"),
    ])
    write_tsv(d / "dev_mismatched.tsv", [
        MNLI_DEV_HEADER,
        mnli_row(0, "Your contribution helped.", "We are grateful.",
                 "neutral", "entailment", "entailment", "entailment", "entailment", "entailment"),
    ])
    for name in ("test_matched", "test_mismatched"):
        write_tsv(d / f"{name}.tsv", [MNLI_TEST_HEADER,
                                      mnli_row(9796, "Hierbas, ans seco.", f"{name} hyp."),
                                      mnli_row(9797, "The extent of the behavior.", "Uncertain.")])

    assert glue.read_split("mnli", str(tmp_path), "train") == [
        Example("train-0", "Conceptually cream skimming has two basic dimensions.",
                "Product and geography are what make cream skimming work.", "neutral"),
        Example("train-1", '"you know during the season', "You lose the things.", "entailment"),
    ]
    # the label is gold_label (the last column), not label1
    matched = glue.read_split("mnli", str(tmp_path), "dev_matched")
    assert [(e.guid, e.label) for e in matched] == [
        ("dev_matched-0", "neutral"), ("dev_matched-1", "contradiction")]
    assert glue.read_split("mnli", str(tmp_path), "dev_mismatched") == [
        Example("dev_mismatched-0", "Your contribution helped.", "We are grateful.", "entailment")]
    assert glue.read_split("mnli", str(tmp_path), "test_mismatched") == [
        Example("9796", "Hierbas, ans seco.", "test_mismatched hyp.", None),
        Example("9797", "The extent of the behavior.", "Uncertain.", None),
    ]
    assert glue.read_split("mnli", str(tmp_path), "test_matched")[0].text_b == "test_matched hyp."
    with pytest.raises(InputError, match="unknown split 'dev'"):
        glue.read_split("mnli", str(tmp_path), "dev")


@pytest.mark.parametrize("task, dir_name, header, labels", [
    ("qnli", "QNLI", ["index", "question", "sentence", "label"], ["entailment", "not_entailment"]),
    ("rte", "RTE", ["index", "sentence1", "sentence2", "label"], ["not_entailment", "entailment"]),
    ("wnli", "WNLI", ["index", "sentence1", "sentence2", "label"], ["1", "0"]),
])
def test_pair_tasks_with_index_column(tmp_path, task, dir_name, header, labels):
    d = tmp_path / dir_name
    write_tsv(d / "dev.tsv", [header,
                              ["0", "What came into force?", "The constitution came into force.", labels[0]],
                              ["1", '"Quote', "Second 'text'", labels[1]]])
    write_tsv(d / "test.tsv", [header[:3],
                               ["5", "Premise A.", "Hypothesis A."], ["7", "Premise B.", "Hyp B."]])
    assert glue.read_split(task, str(tmp_path), "dev") == [
        Example("dev-0", "What came into force?", "The constitution came into force.", labels[0]),
        Example("dev-1", '"Quote', "Second 'text'", labels[1]),
    ]
    assert glue.read_split(task, str(tmp_path), "test") == [
        Example("5", "Premise A.", "Hypothesis A.", None),
        Example("7", "Premise B.", "Hyp B.", None),
    ]


# ---------------------------------------------------------------- the real files


@pytest.mark.parametrize("task, dev_count, test_count", [
    ("sst2", 872, 1821), ("mrpc", 408, 1725), ("rte", 277, 3000), ("wnli", 71, 146), ("qnli", 5463, 5463)])
@needs_shared("glue")
def test_real_glue_files(task, dev_count, test_count):
    spec = TASKS[task]
    dev = glue.read_split(task, str(GLUE_DATA), "dev")
    assert len(dev) == dev_count
    assert {e.label for e in dev} == set(spec.labels)
    assert all(e.text_a and (e.text_b is None) == (task == "sst2") for e in dev)
    assert [e.guid for e in dev[:2]] == ["dev-0", "dev-1"]
    test = glue.read_split(task, str(GLUE_DATA), "test")
    assert len(test) == test_count
    assert all(e.label is None for e in test)
    assert [e.guid for e in test[:3]] == ["0", "1", "2"]
    assert len({e.guid for e in test}) == test_count


@needs_shared("glue", "MRPC")
def test_real_mrpc_first_row():
    first = glue.read_split("mrpc", str(GLUE_DATA), "dev")[0]
    assert first.label == "1"
    assert first.text_a.startswith("He said the foodservice pie business")
    assert first.text_b.startswith('" The foodservice pie business does not fit')


# ---------------------------------------------------------------- labels and the Hugging Face mapping


def test_label_id():
    assert glue.label_id("mnli", "entailment") == 0
    assert glue.label_id("mnli", "neutral") == 1
    assert glue.label_id("mnli", "contradiction") == 2
    assert glue.label_id("rte", "not_entailment") == 1
    assert glue.label_id("sst2", "1") == 1
    assert glue.label_id("stsb", 3.25) == 3.25
    with pytest.raises(InputError, match=r"rte.*'neutral'"):
        glue.label_id("rte", "neutral")
    with pytest.raises(InputError, match="unknown GLUE task"):
        glue.label_id("squad", "0")


def test_label_from_hf():
    assert [glue.label_from_hf("mnli", i) for i in (0, 1, 2)] == ["entailment", "neutral", "contradiction"]
    assert [glue.label_from_hf("qnli", i) for i in (0, 1)] == ["entailment", "not_entailment"]
    assert [glue.label_from_hf("rte", i) for i in (0, 1)] == ["entailment", "not_entailment"]
    for task in ("cola", "sst2", "mrpc", "qqp", "wnli"):
        assert [glue.label_from_hf(task, i) for i in (0, 1)] == ["0", "1"]
        assert glue.label_from_hf(task, -1) is None
    assert glue.label_from_hf("stsb", 4.4) == 4.4
    assert glue.label_from_hf("stsb", -1.0) is None
    with pytest.raises(InputError):
        glue.label_from_hf("rte", 2)
    # round trip: our ids are the Hugging Face ids
    for task, spec in TASKS.items():
        for i in range(len(spec.labels)):
            assert glue.label_id(task, glue.label_from_hf(task, i)) == i


def test_hf_split_names():
    ours = ("train", "dev", "dev_matched", "dev_mismatched", "test", "test_matched")
    assert [glue.hf_split(s) for s in ours] == [
        "train", "validation", "validation_matched", "validation_mismatched", "test", "test_matched"]


def test_load_hf_with_a_fake_hub(monkeypatch):
    """load_hf against an in-memory dataset shaped like nyu-mll/glue (no network)."""
    import datasets

    calls = []

    def fake_load_dataset(path, name, split, cache_dir=None):
        calls.append((path, name, split, cache_dir))
        test = split.startswith("test")
        return datasets.Dataset.from_dict({"premise": ["P0", "P1"], "hypothesis": ["H0", "H1"],
                                           "label": [-1, -1] if test else [2, 0], "idx": [10, 11]})

    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    assert glue.load_hf("mnli", "dev_mismatched", cache_dir="/c") == [
        Example("dev_mismatched-0", "P0", "H0", "contradiction"),
        Example("dev_mismatched-1", "P1", "H1", "entailment"),
    ]
    assert calls[-1] == ("nyu-mll/glue", "mnli", "validation_mismatched", "/c")
    assert glue.load_hf("mnli", "test_matched") == [Example("10", "P0", "H0", None),
                                                    Example("11", "P1", "H1", None)]


# ---------------------------------------------------------------- metrics against hand arithmetic

# references and predictions with TP=3, TN=2, FP=1, FN=2 (positive class 1)
REFS = [1, 1, 1, 1, 1, 0, 0, 0]
PREDS = [1, 1, 1, 0, 0, 1, 0, 0]


def test_matthews_by_hand():
    tp, tn, fp, fn = 3, 2, 1, 2
    mcc = (tp * tn - fp * fn) / math.sqrt((tp + fp) * (tp + fn) * (tn + fp) * (tn + fn))  # 4 / sqrt(240)
    out = glue.metrics("cola", PREDS, REFS)
    assert set(out) == {"matthews", "main"}
    assert out["matthews"] == pytest.approx(mcc) and out["main"] == pytest.approx(mcc)
    assert type(out["matthews"]) is float
    # constant predictions: undefined, reported as 0
    assert glue.metrics("cola", [1] * 8, REFS)["matthews"] == 0.0


@pytest.mark.parametrize("task", ["mrpc", "qqp"])
def test_f1_accuracy_by_hand(task):
    tp, tn, fp, fn = 3, 2, 1, 2
    precision = tp / (tp + fp)  # 3/4
    recall = tp / (tp + fn)  # 3/5
    f1 = 2 * precision * recall / (precision + recall)  # 2/3
    accuracy = (tp + tn) / 8  # 5/8
    out = glue.metrics(task, PREDS, REFS)
    assert set(out) == {"f1", "accuracy", "main"}
    assert out["f1"] == pytest.approx(f1) and out["f1"] == pytest.approx(2 / 3)
    assert out["accuracy"] == pytest.approx(accuracy)
    assert out["main"] == pytest.approx((f1 + accuracy) / 2)
    assert all(type(v) is float for v in out.values())


@pytest.mark.parametrize("task", ["sst2", "qnli", "rte", "wnli", "mnli"])
def test_accuracy_by_hand(task):
    refs = [0, 1, 1, 0, 1] if task != "mnli" else [0, 1, 2, 2, 1]
    preds = [0, 1, 0, 0, 0] if task != "mnli" else [0, 2, 2, 1, 1]
    correct = sum(1 for p, r in zip(preds, refs) if p == r)  # 3 of 5
    out = glue.metrics(task, preds, refs)
    assert out == {"accuracy": pytest.approx(correct / 5), "main": pytest.approx(0.6)}


def pearson_by_hand(x: list[float], y: list[float]) -> float:
    n = len(x)
    mx = sum(x) / n
    my = sum(y) / n
    cov = sxx = syy = 0.0
    for a, b in zip(x, y):
        cov += (a - mx) * (b - my)
        sxx += (a - mx) ** 2
        syy += (b - my) ** 2
    return cov / math.sqrt(sxx * syy)


def test_stsb_correlations_by_hand():
    refs = [0.0, 1.5, 2.0, 4.0, 5.0]
    preds = [0.5, 1.0, 3.5, 3.0, 4.5]
    # ranks (1 = smallest): refs 1 2 3 4 5, preds 1 2 4 3 5; no ties, so
    # Spearman = 1 - 6 * sum(d^2) / (n (n^2 - 1)) = 1 - 6 * 2 / 120 = 0.9
    rank_refs = [1, 2, 3, 4, 5]
    rank_preds = [1, 2, 4, 3, 5]
    d2 = sum((a - b) ** 2 for a, b in zip(rank_refs, rank_preds))
    spearman = 1 - 6 * d2 / (5 * (5 ** 2 - 1))
    assert spearman == pytest.approx(0.9)
    pearson = pearson_by_hand(preds, refs)
    out = glue.metrics("stsb", preds, refs)
    assert set(out) == {"pearson", "spearman", "main"}
    assert out["pearson"] == pytest.approx(pearson)
    assert out["spearman"] == pytest.approx(spearman)
    assert out["main"] == pytest.approx((pearson + spearman) / 2)
    assert all(type(v) is float for v in out.values())
    # a constant prediction has no correlation: reported as 0, not NaN
    assert glue.metrics("stsb", [2.0] * 5, refs) == {"pearson": 0.0, "spearman": 0.0, "main": 0.0}


@pytest.mark.filterwarnings("ignore:A single label was found")
def test_matthews_and_f1_equal_scikit_learns_and_scoring_does_not_import_it():
    """numpy's Matthews (2 and 3 classes) and binary F1 against scikit-learn's, on random labels and the
    degenerate cases (one class on a side, no positive anywhere, a single example); the metrics of a fine-tune
    leave scikit-learn unimported (its import costs every fine-tuning job seconds)."""
    code = ("import sys; from tacl.finetune import glue; glue.metrics('cola', [0, 1], [1, 1]); "
            "glue.metrics('mrpc', [0, 1], [1, 1]); print('sklearn' in sys.modules)")
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True).stdout.strip() == "False"
    from sklearn.metrics import f1_score, matthews_corrcoef

    rng = np.random.default_rng(0)
    cases = [(rng.integers(0, k, n), rng.integers(0, k, n)) for k in (2, 3) for n in (1, 2, 7, 50, 333)]
    cases += [(np.ones(6, int), np.ones(6, int)), (np.zeros(6, int), np.zeros(6, int)),
              (np.array([0, 1, 0, 1]), np.ones(4, int)), (np.array([2, 2, 0]), np.array([2, 2, 0]))]
    for refs, preds in cases:
        assert glue.matthews(refs, preds) == pytest.approx(matthews_corrcoef(refs, preds), abs=1e-12), (refs, preds)
        if max(refs.max(), preds.max()) == 1:  # (binary, as MRPC and QQP are)
            for positive in (0, 1):
                expected = f1_score(refs, preds, labels=[0, 1], pos_label=positive, zero_division=0.0)
                assert glue.f1_binary(refs, preds, positive) == pytest.approx(expected), (refs, preds, positive)


def test_metrics_rejects_mismatched_lengths():
    with pytest.raises(ValueError):
        glue.metrics("sst2", [0, 1], [0])
    with pytest.raises(ValueError):
        glue.metrics("sst2", [], [])


# ---------------------------------------------------------------- submissions


def read_lines(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").splitlines()


def test_submission_classification(tmp_path):
    path = tmp_path / "sub" / TASKS["rte"].submission_files["test"]
    glue.write_submission("rte", "test", ["0", "1", "2"], [1, 0, 1], str(path))
    assert path.name == "RTE.tsv"
    assert read_lines(path) == [
        "index\tprediction", "0\tnot_entailment", "1\tentailment", "2\tnot_entailment"]
    assert sorted(p.name for p in path.parent.iterdir()) == ["RTE.tsv"]  # no temporary left behind


def test_submission_keeps_test_file_order_and_index(tmp_path):
    d = tmp_path / "glue" / "WNLI"
    write_tsv(d / "test.tsv", [["index", "sentence1", "sentence2"],
                               ["3", "a", "b"], ["1", "c", "d"], ["2", "e", "f"]])
    test = glue.read_split("wnli", str(tmp_path / "glue"), "test")
    path = tmp_path / "WNLI.tsv"
    glue.write_submission("wnli", "test", [e.guid for e in test], [0, 1, 1], str(path))
    assert read_lines(path) == ["index\tprediction", "3\t0", "1\t1", "2\t1"]


def test_submission_stsb_three_decimals(tmp_path):
    path = tmp_path / "STS-B.tsv"
    glue.write_submission("stsb", "test", ["0", "1", "2", "3"], [3.14159, 0, 4.9996, 2.5], str(path))
    assert read_lines(path) == ["index\tprediction", "0\t3.142", "1\t0.000", "2\t5.000", "3\t2.500"]


def test_submission_mnli_two_files(tmp_path):
    spec = TASKS["mnli"]
    for split, preds in (("test_matched", [0, 1, 2]), ("test_mismatched", [2, 2, 0])):
        path = tmp_path / spec.submission_files[split]
        glue.write_submission("mnli", split, ["0", "1", "2"], preds, str(path))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["MNLI-m.tsv", "MNLI-mm.tsv"]
    assert read_lines(tmp_path / "MNLI-m.tsv") == [
        "index\tprediction", "0\tentailment", "1\tneutral", "2\tcontradiction"]
    assert read_lines(tmp_path / "MNLI-mm.tsv") == [
        "index\tprediction", "0\tcontradiction", "1\tcontradiction", "2\tentailment"]


def test_submission_rejects_bad_calls(tmp_path):
    path = tmp_path / "SST-2.tsv"
    with pytest.raises(ValueError, match="2 guids but 1"):
        glue.write_submission("sst2", "test", ["0", "1"], [1], str(path))
    with pytest.raises(ValueError, match="out of range"):
        glue.write_submission("sst2", "test", ["0"], [2], str(path))
    with pytest.raises(InputError, match="not a test split"):
        glue.write_submission("sst2", "dev", ["0"], [1], str(path))
    assert not path.exists()


# ---------------------------------------------------------------- bad input


def test_missing_file_names_it(tmp_path):
    with pytest.raises(InputError, match=r"SST-2/dev\.tsv: GLUE file not found"):
        glue.read_split("sst2", str(tmp_path), "dev")


def test_wrong_width_names_file_and_line(tmp_path):
    write_tsv(tmp_path / "RTE" / "dev.tsv", [["index", "sentence1", "sentence2", "label"],
                                             ["0", "a", "b", "entailment"],
                                             ["1", "a\tstray tab", "b", "entailment"]])
    with pytest.raises(InputError, match=r"RTE/dev\.tsv:3: expected 4 tab-separated columns, found 5"):
        glue.read_split("rte", str(tmp_path), "dev")
    write_tsv(tmp_path / "CoLA" / "train.tsv", [["gj04", "1", "only three"]])
    with pytest.raises(InputError, match=r"CoLA/train\.tsv:1: expected 4"):
        glue.read_split("cola", str(tmp_path), "train")


def test_bad_label_header_score_and_empty_file(tmp_path):
    write_tsv(tmp_path / "RTE" / "dev.tsv", [["index", "sentence1", "sentence2", "label"],
                                             ["0", "a", "b", "maybe"]])
    with pytest.raises(InputError, match=r"RTE/dev\.tsv:2: label 'maybe'"):
        glue.read_split("rte", str(tmp_path), "dev")
    write_tsv(tmp_path / "QNLI" / "dev.tsv", [["index", "sentence1", "sentence2", "label"],
                                              ["0", "a", "b", "entailment"]])
    with pytest.raises(InputError, match=r"QNLI/dev\.tsv: header lacks column"):
        glue.read_split("qnli", str(tmp_path), "dev")
    write_tsv(tmp_path / "STS-B" / "train.tsv", [STSB_HEADER,
                                                 ["0", "g", "f", "y", "o", "s", "s", "a", "b", "n/a"]])
    with pytest.raises(InputError, match=r"STS-B/train\.tsv:2: score 'n/a'"):
        glue.read_split("stsb", str(tmp_path), "train")
    (tmp_path / "SST-2").mkdir()
    (tmp_path / "SST-2" / "test.tsv").write_text("")
    with pytest.raises(InputError, match=r"SST-2/test\.tsv: empty file"):
        glue.read_split("sst2", str(tmp_path), "test")


# ---------------------------------------------------------------- fine-tuning batches


def padding(lengths, batches) -> float:
    return 1 - sum(int(lengths[b].sum()) for b in batches) / sum(len(b) * int(lengths[b].max()) for b in batches)


@pytest.mark.parametrize("n, batch", [(1000, 32), (3300, 32), (7, 32), (64, 32)])
def test_epoch_batches_see_every_row_once_in_a_seeded_order(n, batch):
    """Grouped or not: ceil(n / batch) batches, all full but one, every row once; the seed alone fixes
    them; ungrouped is the plain permutation cut into batches (the loop's order before grouping)."""
    import numpy as np

    from tacl.finetune.common import MEGABATCH, epoch_batches

    lengths = np.random.default_rng(1).integers(3, 129, n)
    for grouped in (False, True):
        batches = epoch_batches(lengths, batch, np.random.default_rng(5), grouped)
        sizes = sorted(len(b) for b in batches)
        assert len(batches) == -(-n // batch) and sizes[1:] == [batch] * (len(batches) - 1)
        assert sorted(np.concatenate(batches).tolist()) == list(range(n))
        again = epoch_batches(lengths, batch, np.random.default_rng(5), grouped)
        assert all(np.array_equal(a, b) for a, b in zip(batches, again))
        other = epoch_batches(lengths, batch, np.random.default_rng(6), grouped)
        assert n < 8 or not all(np.array_equal(a, b) for a, b in zip(batches, other))
    plain = np.random.default_rng(5).permutation(n)
    ungrouped = epoch_batches(lengths, batch, np.random.default_rng(5), False)
    assert np.array_equal(np.concatenate(ungrouped), plain)
    if n >= 1000:
        grouped = epoch_batches(lengths, batch, np.random.default_rng(5), True)
        assert padding(lengths, grouped) < 0.1 < 0.3 < padding(lengths, ungrouped)
        # each batch comes from one megabatch of the epoch's permutation, and the batches are shuffled:
        megabatch = {int(i): k // (batch * MEGABATCH) for k, i in enumerate(plain)}
        assert all(len({megabatch[int(i)] for i in b}) == 1 for b in grouped)
        firsts = [megabatch[int(b[0])] for b in grouped]
        assert n < batch * MEGABATCH or firsts != sorted(firsts)


@needs_shared("glue")
def test_grouped_batches_are_under_10_percent_padding_on_the_shared_glue_files(tokenizer):
    """The training rows of every shared GLUE task (QNLI: its dev file, the only one here) at max_len 128,
    batch 32, as `train` batches them: under 10% of the positions are padding grouped, over 30% random."""
    import numpy as np

    from tacl.finetune.common import epoch_batches
    from tacl.finetune.sequence import encode, load_examples

    source = {"kind": "tsv", "data_dir": str(GLUE_DATA)}
    measured = {}
    for task, split in (("sst2", "train"), ("mrpc", "train"), ("stsb", "train"), ("rte", "train"),
                        ("wnli", "train"), ("qnli", "dev")):
        rows = encode(tokenizer, task, load_examples(task, split, source), 128)
        lengths = np.array([len(r["input_ids"]) for r in rows])
        measured[task] = tuple(padding(lengths, epoch_batches(lengths, 32, np.random.default_rng(0), grouped))
                               for grouped in (True, False))
    assert all(grouped < 0.10 and random > 0.30 for grouped, random in measured.values()), measured
