"""The report on a fixture results tree: means, sample stds, GLUE average, missing runs, references."""

import json

import pandas as pd
import pytest

from tacl.report.tables import build_report, collect, summarise


def write_run(root, model, task, seed, family, dev, test=None):
    d = root / "finetune" / model / task / f"seed{seed}"
    d.mkdir(parents=True)
    m = {"task": task, "family": family, "seed": seed, "dev": dev}
    if test:
        m["test"] = test
    (d / "metrics.json").write_text(json.dumps(m))


@pytest.fixture
def tree(tmp_path):
    for seed, acc in enumerate([0.80, 0.84, 0.86]):
        write_run(tmp_path, "tacl", "rte", seed, "glue", {"dev": {"accuracy": acc, "main": acc, "examples": 277}})
    for seed, (f1, acc) in enumerate([(0.90, 0.86), (0.88, 0.84)]):
        write_run(tmp_path, "tacl", "mrpc", seed, "glue",
                  {"dev": {"f1": f1, "accuracy": acc, "main": (f1 + acc) / 2, "examples": 408}})
    write_run(tmp_path, "none", "rte", 0, "glue", {"dev": {"accuracy": 0.70, "main": 0.70}})
    write_run(tmp_path, "tacl", "mnli", 0, "glue", {"dev_matched": {"accuracy": 0.84, "main": 0.84},
                                                     "dev_mismatched": {"accuracy": 0.82, "main": 0.82}})
    write_run(tmp_path, "tacl", "squad_v2", 0, "squad", {"dev": {"exact": 70.0, "f1": 73.0, "main_exact": 71.0,
                                                               "main": 74.5, "best_f1_thresh": -1.2}})
    write_run(tmp_path, "tacl", "conll2003", 0, "ner", {"dev": {"f1": 0.95}}, {"test": {"f1": 0.91}})
    return tmp_path


def test_summary_mean_and_sample_std(tree):
    s = summarise(collect(tree))
    rte = s[(s.model == "tacl") & (s.task == "rte") & (s.metric == "accuracy")].iloc[0]
    assert rte["mean"] == pytest.approx(83.333333, rel=1e-6)
    # sample std of 80, 84, 86: mean 83.33; deviations -3.33, 0.67, 2.67; sum of squares 18.67; /2 -> 9.33
    assert rte["std"] == pytest.approx(9.333333 ** 0.5, rel=1e-6) and rte["n"] == 3
    assert not ((s.metric == "best_f1_thresh") | (s.metric == "examples")).any()


def test_tables_files_and_missing_runs(tree):
    expected = [{"model": m, "task": t, "seed": k} for m in ("none", "tacl") for t in ("rte", "mrpc")
                for k in range(3)]
    out = tree / "report"
    result = build_report(str(tree), ["none", "tacl"], ["rte", "mrpc", "mnli", "squad_v2", "conll2003"], expected,
                          [], str(out))
    assert set(result["missing"]) == {"none/rte/seed1", "none/rte/seed2", "none/mrpc/seed0", "none/mrpc/seed1",
                                      "none/mrpc/seed2", "tacl/mrpc/seed2"}
    glue = pd.read_csv(out / "glue_dev.csv").set_index("model")
    assert glue.loc["tacl", "RTE (acc)"] == "83.3 ± 3.1"
    assert glue.loc["tacl", "MRPC (F1/acc)"] == "89.0 ± 1.4 / 85.0 ± 1.4"
    assert glue.loc["none", "MRPC (F1/acc)"] == "- / -"
    # GLUE average over tasks with a result: RTE 83.33, MRPC mean(88, 86) = 87, MNLI mean(84, 82) = 83
    assert glue.loc["tacl", "GLUE avg"] == f"{(83.3333333 + 87.0 + 83.0) / 3:.1f} (3 tasks)"
    squad = pd.read_csv(out / "squad_dev.csv", dtype=str).set_index("model")
    assert squad.loc["tacl", "SQuAD 2.0 F1"] == "74.5" and squad.loc["BERT-base (TaCL paper)", "SQuAD 2.0 F1"] == "76.8"
    ner = pd.read_csv(out / "ner.csv").set_index("model")
    assert ner.loc["tacl", "CoNLL-2003 test F1"] == "91.0"
    for stem in ("glue_dev", "squad_dev", "glue_published", "status"):
        assert (out / f"{stem}.md").is_file() and (out / f"{stem}.tex").is_file()
    md = (out / "report.md").read_text()
    assert "Missing or failed (6)" in md and "Reproduction (2xA100; 130k steps)" in md
    assert (out / "glue_dev.png").stat().st_size > 1000
