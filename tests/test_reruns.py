"""What a change reruns: nothing for operational settings, key order or a project update that changes no
result; exactly the jobs whose outputs a result setting changes, with the reason printed before anything runs.
Tested as a user meets it: a finished small run, one change, a dry run under the profile's settings."""

from __future__ import annotations

import copy
import dataclasses
import json
import re
import shutil

import pytest

from conftest import REPO, run_snakemake
from tacl.runtime.io import changed_keys
from tacl.experiment.config import OPERATIONAL_CONFIG_KEYS, load_schema, schema_roles
from tacl.pretrain.settings import OPERATIONAL_KEYS, RESULT_KEYS, TrainSettings
from tacl.experiment.reruns import plans_jobs

PROFILE = str(REPO / "profiles" / "local")


def test_the_schema_says_per_key_what_the_code_says():
    """Every key of the schema is marked result or operational, and the operational ones are exactly the
    code's (tacl.experiment.config.OPERATIONAL_CONFIG_KEYS, built from tacl.pretrain.settings); every trainer setting
    is one or the other."""
    roles = schema_roles(load_schema(REPO / "workflow" / "schemas" / "config.schema.yaml"))
    assert set(roles.values()) == {"result", "operational"}, {k: v for k, v in roles.items() if v == "(none)"}
    assert {k for k, v in roles.items() if v == "operational"} == set(OPERATIONAL_CONFIG_KEYS)
    assert "pretrain.lr" in roles and roles["pretrain.lr"] == "result"
    fields = {f.name for f in dataclasses.fields(TrainSettings)}
    assert set(RESULT_KEYS) | set(OPERATIONAL_KEYS) == fields and not set(RESULT_KEYS) & set(OPERATIONAL_KEYS)
    s = TrainSettings("tacl", steps=10, global_batch=8, micro_batch=4)
    assert TrainSettings.from_parts(s.result(), s.operational()) == s


def test_bf16_runs_made_before_bf16_was_really_on_are_another_result_and_fp32_runs_are_not():
    """Runs labelled bf16 before the bf16 autocast really ran at ZeRO 0 (DeepSpeed switched it off on CUDA)
    computed in fp32: every bf16 run's result settings carry BF16_VERSION, so those train again; the fp32
    (CPU) runs' settings are what they were, key for key."""
    from tacl.pretrain.settings import BF16_VERSION

    before = {"objective", "steps", "global_batch", "lr", "warmup_ratio", "weight_decay", "adam_eps", "adam_betas",
              "grad_clip", "precision", "seed", "pad_to_max_len", "group_by_length", "max_len", "objective_params",
              "data_version"}
    for precision, device in (("auto", "cpu"), ("fp32", "cuda"), ("fp32", "auto")):
        assert set(TrainSettings("tacl", 10, 8, 4, precision=precision, device=device).result()) == before
    for precision, device in (("auto", "cuda"), ("auto", "auto"), ("bf16", "cpu")):
        result = TrainSettings("tacl", 10, 8, 4, precision=precision, device=device).result()
        assert set(result) == before | {"bf16_version"} and result["bf16_version"] == BF16_VERSION == 2
    assert "bf16_version" not in TrainSettings("tacl", 10, 8, 4, device="auto").result(bf16=False)


def test_changed_keys_and_when_a_summary_is_printed():
    from tacl.data.clean import clean_given

    # no cap, however the config spells it: the clean job is given `max_lines or None` (a finished demo's dry
    # run once announced "clean: max_lines None -> 0")
    assert clean_given(0, 0.05, "regex") == clean_given(None, 0.05, "regex")
    assert changed_keys({"lr": 1e-4, "tacl": {"tau": 0.01}, "betas": [0.9, 0.999]},
                        {"lr": 5e-5, "tacl": {"tau": 0.01}, "betas": (0.9, 0.999), "new": 1}) == [
        "lr 0.0001 -> 5e-05", "new (unset) -> 1"]
    assert changed_keys({"a": {"b": 1}}, {"a": {"b": 2}}) == ["a.b 1 -> 2"]
    assert plans_jobs(["snakemake", "--profile", "x", "-n"]) and not plans_jobs(["snakemake", "--lint"])
    assert not plans_jobs(["snakemake", "--report", "r.html"]) and not plans_jobs(["snakemake", "--unlock"])


def planned(root, cfg, *args, workflow=None) -> tuple[dict[str, int], str]:
    """A dry run under the local profile (its rerun triggers): jobs per rule, and what it printed."""
    extra = ["--snakefile", str(workflow / "Snakefile")] if workflow else []
    proc = run_snakemake(root, cfg, "--profile", PROFILE, "-n", *extra, *args)
    text = proc.stdout + proc.stderr
    if "Nothing to be done" in text:
        return {}, text
    table = text[text.index("Job stats:"):]
    counts = {m.group(1): int(m.group(2)) for m in re.finditer(r"^(\w+)\s+(\d+)\s*$", table, re.M)}
    counts.pop("total", None)
    return counts, text


def to_run(text: str) -> dict[str, str]:
    """The plan's 'to run' column, per rule (the plan printed before the dry run's jobs)."""
    table = text[text.index("Plan of this run"):text.index("  jobs:")]
    return {m.group(1): m.group(2) for m in re.finditer(r"^  (\w+) +\S+ +(\S+)", table, re.M) if m.group(1) != "rule"}


def reordered(d):
    """The same mapping with its keys in reverse order, all the way down."""
    return {k: reordered(d[k]) for k in reversed(list(d))} if isinstance(d, dict) else d


@pytest.fixture(scope="module")
def finished(small_dag_again):
    """The small DAG (tests/conftest.py: data, a COCO-LM run of two chunks on a RoBERTa, fine-tunes of it, of
    its contrastive form and of the start model, analysis, report), run to the end under the local profile."""
    return small_dag_again["dir"], small_dag_again["cfg"]


@pytest.mark.slow
def test_operational_settings_and_key_order_rerun_nothing(finished):
    root, cfg = finished
    assert planned(root, cfg)[0] == {}
    # (COCO-LM's micro-batch holds whole groups of negatives_group=4 sequences: 8 on one rank, 4 on each of two)
    for micro_batch, ranks in ((8, 1), (4, 2)):
        changed = copy.deepcopy(cfg)
        p = changed["pretrain"]
        p.update(log_every=3, keep_checkpoints=1, checkpoint_minutes=7, loader_workers=0, micro_batch=micro_batch,
                 compile=True, ranks_per_node=ranks, cpus_per_rank=2 // ranks)
        p["chunk"].update(runtime_minutes=20, margin_minutes=0.5, max_steps=None, max_chunks=5)
        changed["finetune"].update(runtime_minutes={"default": 10}, shapes="buckets", seeds_per_gpu=2)
        changed["data"]["clean_workers"] = 2
        changed.update(device="cpu", resources_dir=str(root / "elsewhere"),
                       tracking={"trackers": ["mlflow", "wandb"], "wandb": {"project": "p", "mode": "offline"},
                                 "mlflow": {"experiment": "e"}})
        counts, text = planned(root, reordered(changed))
        assert counts == {}, text[-3000:]
        assert "Finished work that this run does again" not in text
        assert {rule for rule, n in to_run(text).items() if n != "0"} == set(), text[-3000:]  # (`all`: nothing)


@pytest.mark.slow
def test_result_settings_rerun_exactly_what_they_change(finished):
    root, cfg = finished
    changed = copy.deepcopy(cfg)
    changed["pretrain"]["lr"] = cfg["pretrain"]["lr"] / 2
    counts, text = planned(root, changed)
    # the chain's first chunk (a dry run stops at the checkpoint rule; the chain's second follows it), the
    # export, the fine-tunes of the model and of its contrastive form, their selections and zips, the analysis
    # (the sentence embeddings' with it) and the report
    tuned = {"finetune": 2, "select_setting": 2, "submissions": 2}
    assert counts == {"pretrain_chunk": 1, "export_model": 1, **tuned, "similarity": 1, "similarity_plot": 1,
                      "report": 1, "all": 1}, text[-3000:]
    assert f"pretrain_chunk (coco_lm): lr {cfg['pretrain']['lr']} -> {cfg['pretrain']['lr'] / 2}" in text
    assert "each starts again from the start model" in text
    # the plan counts them to run too, with the whole chain (its two chunks of 6 steps)
    assert {rule: n for rule, n in to_run(text).items() if n != "0"} == {
        "pretrain_chunk": "2", "export_model": "1", **{rule: str(n) for rule, n in tuned.items()},
        "similarity": "1", "similarity_plot": "1", "report": "1", "all": "1"}, text[-3000:]

    changed = copy.deepcopy(cfg)
    changed["pretrain"]["coco_lm"] = {"tau": 0.5}
    counts, text = planned(root, changed)
    assert counts["pretrain_chunk"] == 1 and counts["finetune"] == 2
    assert "pretrain_chunk (coco_lm): objective_params.tau 1.0 -> 0.5" in text

    # a fine-tuning change that keeps the setting's name: the runs rerun (every model's: the start model's too)
    changed = copy.deepcopy(cfg)
    changed["finetune"]["hparams"]["glue"]["max_len"] = 32
    counts, text = planned(root, changed)
    every = {"finetune": 3, "select_setting": 3, "submissions": 3, "report": 1, "all": 1}
    assert counts == every, text[-3000:]
    assert "finetune (6 runs, e.g. none/qnli/" in text and "hparams.max_len 64 -> 32" in text

    changed = copy.deepcopy(cfg)  # a new learning rate is a new setting: new jobs, nothing rerun
    changed["finetune"]["hparams"]["glue"]["lr"] = 1e-3
    counts, text = planned(root, changed)
    assert counts == every, text[-3000:]
    assert "Finished work that this run does again" not in text

    changed = copy.deepcopy(cfg)  # English's stop headings given as a list: the same settings, nothing rerun
    changed["data"]["stop_headings"] = ["References", "External links", "Category:", "See also"]
    assert planned(root, changed)[0] == {}
    changed["data"].update(language="hr", stop_headings=None)  # Croatian's: the corpus is cleaned again
    counts, text = planned(root, changed)
    assert counts["download_corpus"] == 1 and counts["clean"] == 1 and counts["pretrain_chunk"] == 1, text[-3000:]
    assert "clean: stop_headings (unset) -> [Izvori, Vanjske poveznice, " in text, text[-3000:]

    changed = copy.deepcopy(cfg)  # a task added: its data, its fine-tunes (no contrastive form), its selections
    changed["finetune"]["tasks"] = ["qnli", "squad_v2"]
    counts, text = planned(root, changed)
    assert counts == {"prepare_task": 1, "finetune": 2, "select_setting": 2, "submissions": 2, "report": 1,
                      "all": 1}, text[-3000:]


@pytest.mark.slow
def test_a_project_update_that_changes_a_command_reruns_nothing(finished, tmp_path):
    """The workflow's rules with a harmless flag added to the pretraining and fine-tuning commands (what a
    project update does): nothing to do under the profile's rerun triggers; Snakemake's default triggers
    (code among them) would run the finished chunks and fine-tunes again."""
    root, cfg = finished
    workflow = tmp_path / "workflow"
    shutil.copytree(REPO / "workflow", workflow)
    (tmp_path / "src").symlink_to(REPO / "src")
    for rules, old, new in (("pretrain.smk", '" --marker {output}', '" --no-tensorboard --marker {output}'),
                            ("finetune.smk", '" --seeds {params.seeds}', '" --seeds {params.seeds}  ')):
        path = workflow / "rules" / rules
        text = path.read_text()
        assert old in text
        path.write_text(text.replace(old, new, 1))
    assert planned(root, cfg, workflow=workflow)[0] == {}
    counts, _ = planned(root, cfg, "--rerun-triggers", "mtime", "params", "input", "code", workflow=workflow)
    assert counts["pretrain_chunk"] == 1 and counts["finetune"] == 3


@pytest.mark.slow
def test_a_run_after_an_lr_change_finishes_and_its_model_differs(finished):
    """A real run after a result change, with no step by hand: the chain starts again from the start model
    (the earlier run set aside), and the exported model differs; what depends on it is then all that is left
    to run. (The run asks for the export alone: the jobs after it are those of the first run.)"""
    root, cfg = finished
    results = root / "results"
    before = (results / "models" / "coco_lm" / "model.safetensors").read_bytes()
    changed = copy.deepcopy(cfg)
    changed["pretrain"]["lr"] = cfg["pretrain"]["lr"] / 2
    run_snakemake(root, changed, "--profile", PROFILE, "--cores", "2", str(results / "models" / "coco_lm.json"))
    assert (results / "models" / "coco_lm" / "model.safetensors").read_bytes() != before
    (aside,) = (results / "pretrain" / "coco_lm" / "superseded").iterdir()
    assert json.loads((aside / "run.json").read_text())["result"]["lr"] == cfg["pretrain"]["lr"]
    assert json.loads((results / "pretrain" / "coco_lm" / "run" / "run.json").read_text())["result"]["lr"] == \
        cfg["pretrain"]["lr"] / 2
    assert planned(root, changed)[0] == {"finetune": 2, "select_setting": 2, "submissions": 2, "similarity": 1,
                                         "similarity_plot": 1, "report": 1, "all": 1}
