"""Fine-tuning end to end on real samples: a small model learns QNLI; SQuAD and NER code paths run."""

import csv
import json

import pytest

from conftest import MINILM, REPO
from tacl.io import InputError

pytestmark = pytest.mark.slow
DEMO_GLUE = {"kind": "tsv", "data_dir": str(REPO / "examples/demo/glue")}


def test_small_model_learns_qnli_and_writes_a_submission(tmp_path):
    """all-MiniLM-L6-v2 (22M parameters, from PyPI) on the demo's QNLI sample (1200 train rows, 400 dev):
    dev accuracy clearly above the majority class after two epochs (about 2 minutes on 2 cores)."""
    from tacl.finetune.sequence import finetune_glue, load_examples

    out = tmp_path / "run"
    result = finetune_glue(MINILM, "qnli", DEMO_GLUE, {"max_len": 64, "batch": 16, "lr": 1e-4, "epochs": 2}, 0,
                           str(out))
    labels = [e.label for e in load_examples("qnli", "dev", DEMO_GLUE)]
    majority = max(labels.count(x) for x in set(labels)) / len(labels)
    acc = result["dev"]["dev"]["accuracy"]
    assert acc >= majority + 0.10, f"accuracy {acc:.3f} vs majority class {majority:.3f}"
    saved = json.loads((out / "metrics.json").read_text())
    assert saved["dev"]["dev"]["examples"] == 400 and saved["train"]["train_examples"] == 1200
    with open(out / "submission" / "QNLI.tsv") as f:
        rows = list(csv.reader(f, delimiter="\t"))
    assert rows[0] == ["index", "prediction"] and len(rows) == 201
    assert {r[1] for r in rows[1:]} <= {"entailment", "not_entailment"}


def test_squad_v2_runs_on_the_demo_sample(tmp_path, demo_data):
    from tacl.finetune.qa import finetune_squad

    source = {"kind": "json", "v2_0_train": str(REPO / "examples/demo/squad/train-v2.0.json"),
              "v2_0_dev": str(REPO / "examples/demo/squad/dev-v2.0.json")}
    result = finetune_squad(str(demo_data["start"]), "2.0", source,
                            {"max_len": 128, "doc_stride": 32, "max_query_len": 32, "batch": 8, "epochs": 1}, 0,
                            str(tmp_path))
    dev = result["dev"]["dev"]
    assert dev["examples"] == 16 and dev["features"] >= 16
    assert {"exact", "f1", "best_exact", "best_f1", "best_f1_thresh", "main"} <= set(dev)
    predictions = json.loads((tmp_path / "predictions.json").read_text())
    assert len(predictions) == 16
    # an unanswerable-only baseline scores the share of unanswerable questions; tuning can only do better
    assert dev["best_exact"] >= 100 * dev["NoAns_total"] / dev["total"] - 1e-9


def test_missing_glue_file_fails_before_the_model_is_built(tmp_path):
    from tacl.finetune.sequence import finetune_glue

    with pytest.raises(InputError, match=r"RTE/train\.tsv: GLUE file not found"):
        finetune_glue("no-such-model-dir/", "rte", {"kind": "tsv", "data_dir": str(tmp_path)}, {}, 0, str(tmp_path))
