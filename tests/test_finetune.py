"""Fine-tuning end to end on real samples: a small model learns SST-2; SQuAD and NER code paths run."""

import csv
import json
import random
from pathlib import Path

import pytest

from conftest import MINILM, REPO, SHARED_DATA
from tacl.io import InputError

pytestmark = pytest.mark.slow


def sst2_sample(root: Path, train: int, dev: int, test: int) -> dict:
    """A GLUE-layout SST-2 folder with a seeded sample of the real training rows and the first dev/test rows."""
    src, out = SHARED_DATA / "glue" / "SST-2", root / "SST-2"
    out.mkdir(parents=True)
    for split, n in (("train", train), ("dev", dev), ("test", test)):
        header, *rows = (src / f"{split}.tsv").read_text().splitlines(keepends=True)
        if split == "train":
            rows = [rows[i] for i in sorted(random.Random(0).sample(range(len(rows)), n))]
        (out / f"{split}.tsv").write_text(header + "".join(rows[:n]))
    return {"kind": "tsv", "data_dir": str(root)}


def test_small_model_learns_sst2_and_writes_a_submission(tmp_path):
    """all-MiniLM-L6-v2 (22M parameters, from PyPI) on 800 real SST-2 training sentences: dev accuracy
    clearly above the majority class after one epoch (about a minute on 2 cores)."""
    from tacl.finetune.sequence import finetune_glue, load_examples

    source = sst2_sample(tmp_path / "glue", train=800, dev=400, test=200)
    out = tmp_path / "run"
    result = finetune_glue(MINILM, "sst2", source, {"max_len": 64, "batch": 16, "lr": 1e-4, "epochs": 1}, 0,
                           str(out))
    labels = [e.label for e in load_examples("sst2", "dev", source)]
    majority = max(labels.count(x) for x in set(labels)) / len(labels)
    acc = result["dev"]["dev"]["accuracy"]
    assert acc >= majority + 0.10, f"accuracy {acc:.3f} vs majority class {majority:.3f}"
    saved = json.loads((out / "metrics.json").read_text())
    assert saved["dev"]["dev"]["examples"] == 400 and saved["train"]["train_examples"] == 800
    with open(out / "submission" / "SST-2.tsv") as f:
        rows = list(csv.reader(f, delimiter="\t"))
    assert rows[0] == ["index", "prediction"] and len(rows) == 201
    assert {r[1] for r in rows[1:]} <= {"0", "1"}


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
