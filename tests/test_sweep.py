"""Fine-tuning sweeps: setting names, grids, the selection on dev (against a loop over a metrics tree)."""

import itertools
import json
import math
import random
import zipfile

import pytest

from tacl.finetune.sweep import (GRIDS, HEADLINE_DEV, number, parse_setting, select, select_runs,
                                 setting_hparams, setting_name, task_settings)
from tacl.runtime.io import InputError


@pytest.mark.parametrize("preset", ["reference", "standard"])
def test_names_read_back_exactly(preset):
    rng = random.Random(0)
    values = [3e-5, 2e-5, 5e-5, 1e-3, 1e-4, 2.5e-5, 1 / 3 * 1e-4, 0.06, 0.1, 0.0, 0.01, 0.2]
    for _ in range(300):
        v = {"lr": rng.choice(values[:7] + [0.5]), "batch": rng.choice([8, 16, 32]),
             "epochs": rng.choice([1, 2, 3, 2.5]), "warmup_ratio": rng.choice([0.0, 0.06, 0.1]),
             "weight_decay": rng.choice([0.0, 0.01, 0.1])}
        name = setting_name(v, preset)
        assert "/" not in name and " " not in name
        assert parse_setting(name, preset) == v, name
    assert setting_name({"lr": 3e-5, "batch": 32, "epochs": 3, "warmup_ratio": 0.0, "weight_decay": 0.0},
                        "reference") == "lr3e-5_b32_e3"
    assert setting_name({"lr": 2e-5, "batch": 32, "epochs": 3, "warmup_ratio": 0.06, "weight_decay": 0.01},
                        "standard") == "lr2e-5_b32_e3_wu0.06"
    assert [number(x) for x in (1e-3, 0.06, 3.0, 2.5e-5)] == ["1e-3", "0.06", "3", "2.5e-5"]
    with pytest.raises(InputError, match="not a fine-tuning setting name"):
        parse_setting("seed0", preset)


def test_grids_and_adding_a_value_renames_nothing():
    hparams = {"glue": {"max_len": 64, "lr": 1e-3, "batch": 16, "epochs": 1}, "tasks": {}}
    assert task_settings("qnli", "glue", hparams, {"grid": "reference"}, "standard") == ["lr1e-3_b16_e1"]
    bert = task_settings("rte", "glue", hparams, {"grid": "bert"}, "reference")
    assert bert == [f"lr{lr}_b32_e3" for lr in ("5e-5", "4e-5", "3e-5", "2e-5")]
    assert GRIDS["bert"]["glue"]["lr"] == [5e-5, 4e-5, 3e-5, 2e-5]
    assert task_settings("squad_v2", "squad", hparams, {"grid": "bert"}, "reference") == ["lr3e-5_b12_e2"]
    one = task_settings("qnli", "glue", hparams, {"tasks": {"qnli": {"lr": [1e-4]}}}, "standard")
    two = task_settings("qnli", "glue", hparams, {"tasks": {"qnli": {"lr": [1e-4, 3e-4]}}}, "standard")
    assert set(one) < set(two) and len(two) == 2
    grid = {"glue": {"lr": [1e-4, 2e-4], "warmup_ratio": [0.1, 0.06], "batch": None}}
    names = task_settings("qnli", "glue", hparams, grid, "standard")
    assert names == ["lr1e-4_b16_e1", "lr1e-4_b16_e1_wu0.06", "lr2e-4_b16_e1", "lr2e-4_b16_e1_wu0.06"]
    hp = setting_hparams("qnli", "glue", hparams, names[1], "standard")
    assert hp["lr"] == 1e-4 and hp["warmup_ratio"] == 0.06 and hp["weight_decay"] == 0.01 and hp["max_len"] == 64


def write_tree(root, task, scores):
    """finetune/MODEL/TASK/SETTING/seedN/metrics.json with the given headline scores."""
    split, metric = HEADLINE_DEV[task]
    paths = []
    for (setting, seed), score in scores.items():
        d = root / setting / f"seed{seed}"
        d.mkdir(parents=True)
        (d / "metrics.json").write_text(json.dumps({"task": task, "seed": seed, "dev": {split: {metric: score}}}))
        paths.append(str(d / "metrics.json"))
    return paths


def by_loops(scores):
    """The reference: the best mean, ties to the name that sorts first, best seed then lowest seed."""
    best = None
    for setting in sorted({s for s, _ in scores}):
        values = [v for (s, _), v in scores.items() if s == setting]
        mean = sum(values) / len(values)
        if best is None or round(mean, 9) > round(best[1], 9):
            best = (setting, mean)
    seeds = {seed: v for (s, seed), v in scores.items() if s == best[0]}
    top = max(seeds.values())
    return best[0], min(seed for seed, v in seeds.items() if v == top)


def test_selection_best_mean_deterministic_ties(tmp_path):
    rng = random.Random(1)
    settings = ["lr1e-4_b16_e1", "lr2e-5_b32_e3", "lr3e-5_b32_e3", "lr5e-5_b32_e3"]
    for trial in range(20):
        scores = {(s, seed): round(rng.uniform(0.5, 0.9), 2 if trial % 2 else 6)
                  for s, seed in itertools.product(settings, range(3))}
        paths = write_tree(tmp_path / f"t{trial}" / "rte", "rte", scores)
        chosen = select_runs("rte", sorted(paths, key=lambda _: rng.random()))
        assert (chosen["setting"], chosen["best_seed"]) == by_loops(scores), scores
    tie = {("lr5e-5_b32_e3", 0): 0.7, ("lr5e-5_b32_e3", 1): 0.6, ("lr2e-5_b32_e3", 0): 0.6, ("lr2e-5_b32_e3", 1): 0.7}
    for order in itertools.permutations(tie.items()):
        runs = [{"setting": s, "seed": seed, "score": v} for (s, seed), v in order]
        assert select("rte", runs)["setting"] == "lr2e-5_b32_e3"  # equal means: the name that sorts first
    runs = [{"setting": "a", "seed": 0, "score": math.nan}, {"setting": "b", "seed": 0, "score": 0.1}]
    assert select("mnli", runs)["setting"] == "b" and select("mnli", runs)["split"] == "dev_matched"


def test_submissions_come_from_the_selected_setting(tmp_path):
    from tacl.finetune.submissions import package

    root = tmp_path / "finetune" / "tacl" / "qnli"
    write_tree(root, "qnli", {("lr1e-4_b16_e1", 0): 0.6, ("lr1e-4_b16_e1", 1): 0.8, ("lr1e-3_b16_e1", 0): 0.5,
                              ("lr1e-3_b16_e1", 1): 0.5})
    for run in root.glob("*/seed*"):
        (run / "submission").mkdir()
        (run / "submission" / "QNLI.tsv").write_text(f"index\tprediction\n0\t{run.parent.name}/{run.name}\n")
    chosen = select_runs("qnli", [str(p) for p in root.glob("*/seed*/metrics.json")])
    (root / "selected.json").write_text(json.dumps(chosen))
    package([str(root / "selected.json")], str(tmp_path / "tacl.zip"))
    with zipfile.ZipFile(tmp_path / "tacl.zip") as z:
        assert sorted(z.namelist()) == ["QNLI.tsv", "selection.json"]
        assert z.read("QNLI.tsv").decode().endswith("lr1e-4_b16_e1/seed1\n")
        assert json.loads(z.read("selection.json"))[0]["files"] == ["QNLI.tsv"]


def test_selection_ranks_by_the_reports_headline_number():
    from tacl.report.tables import HEADLINE

    first = {}
    for _, task, split, metric, _ in HEADLINE:
        first.setdefault(task, (split, metric))  # (MNLI: matched first)
    assert first == HEADLINE_DEV
