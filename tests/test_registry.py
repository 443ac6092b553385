"""One place to add an objective or a task: tacl.objectives.registry and tacl.finetune.TASKS. The schema's
enums, the rules' wildcard constraints and the command line's choices hold exactly their names."""

import re
import subprocess
import sys

import pytest

from conftest import REPO, demo_config, run_snakemake
from tacl.cli import build_parser
from tacl.experiment.config import load_schema
from tacl.finetune import CONTRASTIVE_FORM_PATTERN, CONTRASTIVE_FORMS, GLUE_CLASSIFICATION, GLUE_TASKS, TASKS
from tacl.objectives.registry import (MODELS, NEGATIVES_GROUP, OBJECTIVE_PATTERN, OBJECTIVES, REGISTRY,
                                     objective_params)
from tacl.runtime.family import FAMILIES

SCHEMA = load_schema(REPO / "workflow" / "schemas" / "config.schema.yaml")
PRETRAIN = SCHEMA["properties"]["pretrain"]["properties"]
FINETUNE = SCHEMA["properties"]["finetune"]["properties"]


def test_the_schema_names_exactly_the_registered_objectives_and_tasks():
    assert PRETRAIN["objectives"]["items"]["enum"] == list(MODELS)
    assert FINETUNE["models"]["items"]["enum"] == list(MODELS)
    assert set(PRETRAIN["objectives"]["default"]) <= set(MODELS)
    families = SCHEMA["properties"]["model_init"]["properties"]["family"]
    assert families["enum"] == list(FAMILIES) and families["default"] == "bert"
    # every section an objective reads is in the schema, and every objective section of the schema is read
    sections = {name for name, sub in PRETRAIN.items() if sub.get("type") == "object"} - {"chunk"}
    assert sections == {s for o in REGISTRY.values() for s in o.sections}
    # (tasks are built-in or declared: the schema names the built-in ones in its description, in order)
    assert f"({', '.join(TASKS)})" in " ".join(FINETUNE["tasks"]["description"].split())
    assert set(FINETUNE["tasks"]["default"]) <= set(TASKS)
    assert FINETUNE["start_from"]["propertyNames"]["enum"] == list(GLUE_TASKS)
    assert FINETUNE["start_from"]["additionalProperties"]["enum"] == list(GLUE_TASKS)
    cluster = SCHEMA["properties"]["analysis"]["properties"]["embeddings"]["properties"]["cluster_task"]
    assert cluster["enum"] == list(GLUE_CLASSIFICATION)


def test_the_report_description_names_exactly_the_registered_objectives():
    """workflow/report/workflow.rst (a Jinja template of the config alone) names each model of
    pretrain.objectives from its own dict: the registry's names, no other."""
    text = (REPO / "workflow" / "report" / "workflow.rst").read_text()
    names = re.search(r"\{% set names = (\{.*?\}) %\}", text).group(1)
    assert list(re.findall(r'"(\w+)": "', names)) == list(MODELS)


def test_each_task_has_its_spec_and_headline_number():
    from tacl.finetune import glue
    from tacl.finetune.data import NER_TASKS, SQUAD_TASKS
    from tacl.finetune.sweep import HEADLINE_DEV
    from tacl.planning.estimates import TASK_SIZES
    from tacl.report.tables import HEADLINE

    by_family = {f: [t for t, family in TASKS.items() if family == f] for f in ("glue", "squad", "ner")}
    assert list(glue.TASKS) == by_family["glue"] == list(GLUE_TASKS)
    assert list(SQUAD_TASKS) == by_family["squad"] and list(NER_TASKS) == by_family["ner"]
    assert [t for t, spec in glue.TASKS.items() if not spec.is_regression] == list(GLUE_CLASSIFICATION)
    assert list(HEADLINE_DEV) == list(TASKS)
    assert list(TASK_SIZES) == list(TASKS)
    assert list(dict.fromkeys(task for _, task, *_ in HEADLINE)) == list(TASKS)


def option(*path: str):
    """An option of `tacl`, e.g. option("submit", "pretrain", "--objective")."""
    parser = build_parser()
    *commands, name = path
    for command in commands:
        parser = next(a for a in parser._actions if a.choices and command in a.choices).choices[command]
    return next(a for a in parser._actions if name in a.option_strings)


def choices(*path: str) -> list[str]:
    """The choices of an option of `tacl`, e.g. choices("submit", "pretrain", "--objective")."""
    return list(option(*path).choices)


def test_the_command_line_offers_exactly_the_registered_names():
    assert choices("submit", "pretrain", "--objective") == list(OBJECTIVES)
    # (a task is built in or declared in the config: the options name the built-in ones, a family's its own)
    assert f"({', '.join(TASKS)})" in option("finetune", "prepare", "--task").help
    for family, names in (("glue", GLUE_TASKS), ("squad", ["squad_v1", "squad_v2"]), ("ner", ["conll2003"])):
        assert option("finetune", family, "--task").help.startswith(f"one of {', '.join(names)}, or a task declared")
    assert choices("analysis", "embeddings-data", "--cluster-task") == list(GLUE_CLASSIFICATION)
    text = (REPO / "benchmarks" / "pretrain_step.py").read_text()
    assert re.search(r"from tacl.objectives.registry import .*\bOBJECTIVES\b", text) and "OBJECTIVES = (" not in text


def test_the_rules_constrain_objectives_to_the_registry():
    """Every `objective` wildcard constraint is the registry's pattern, which matches exactly its names."""
    rules = "".join(p.read_text() for p in (REPO / "workflow" / "rules").glob("*.smk"))
    blocks = re.findall(r"^    wildcard_constraints:\n((?:        .*\n)+)", rules, re.M)
    constraints = [c for block in blocks for c in re.findall(r"^\s+objective=(.+),$", block, re.M)]
    assert constraints == ["OBJECTIVE_PATTERN"] * 3  # (export_model, pretrain_chunk, publish_model)
    assert "from tacl.objectives.registry import OBJECTIVE_PATTERN" in (REPO / "workflow/rules/common.smk").read_text()
    assert [o for o in OBJECTIVES if re.fullmatch(OBJECTIVE_PATTERN, o)] == list(OBJECTIVES)
    assert not any(re.fullmatch(OBJECTIVE_PATTERN, o) for o in ("none", "minilm", "tacl_attn2", "coco"))


def test_the_contrastive_forms_are_named_once():
    """The schema's enum, the command line's choices and the rules' `model` constraints hold exactly
    tacl.finetune.CONTRASTIVE_FORMS, the forms tacl.finetune.contrastive computes."""
    from tacl.finetune import contrastive

    forms = FINETUNE["contrastive"]["properties"]["forms"]["items"]["enum"]
    assert forms == list(CONTRASTIVE_FORMS) == list(contrastive.CONTRASTIVE_FORMS)
    assert choices("finetune", "glue", "--contrastive") == list(CONTRASTIVE_FORMS)
    rules = (REPO / "workflow" / "rules" / "finetune.smk").read_text()
    assert "from tacl.finetune import CONTRASTIVE_FORM_PATTERN" in rules
    blocks = re.findall(r"^    wildcard_constraints:\n((?:        .*\n)+)", rules, re.M)
    constraints = [c for block in blocks for c in re.findall(r"^\s+model=(.+),$", block, re.M)]
    assert constraints == ["FINETUNED_MODEL_PATTERN"] * 2
    pattern = rf"[a-z][a-z0-9_]*(\+({CONTRASTIVE_FORM_PATTERN}))?"
    assert 'FINETUNED_MODEL_PATTERN = rf"[a-z][a-z0-9_]*(\\+({CONTRASTIVE_FORM_PATTERN}))?"' in rules
    assert [f for f in CONTRASTIVE_FORMS if re.fullmatch(pattern, f"tacl+{f}")] == list(CONTRASTIVE_FORMS)
    assert not any(re.fullmatch(pattern, m) for m in ("tacl+simclr", "tacl+kl+scl", "tacl+"))


def test_a_dry_run_plans_every_registered_objective_with_its_settings(tmp_path):
    """The rules, the settings and the config check take every objective of the registry (tacl_attn with the
    keys of both its sections)."""
    cfg = demo_config(tmp_path)
    cfg["pretrain"]["objectives"] = list(MODELS)
    cfg["pretrain"]["tacl_attn"] = {"power": 2.0}
    proc = run_snakemake(tmp_path, cfg, "-n", "-p")
    for objective in OBJECTIVES:
        assert f"--chunk 0 --marker {tmp_path}/results/pretrain/{objective}/chunk-0.json" in proc.stdout, objective
    assert ('"objective": "tacl_attn", "objective_params": {"layer": -1, "negatives": "real", "negatives_group": 4, '
            '"power": 2.0, "tau": 0.01, "teacher_train_mode": false, "weighting": "attention"}') in proc.stdout
    settings = objective_params({"tacl": {"tau": 0.05}, "tacl_attn": {"power": 2.0}}, "tacl_attn")
    assert settings == {"tau": 0.05, "power": 2.0, "negatives_group": NEGATIVES_GROUP}
    assert "negatives_group" not in objective_params({"negatives_group": 8}, "tacl"), "only the grouped objectives"


def test_the_negatives_group_default_is_the_registrys():
    assert PRETRAIN["negatives_group"]["default"] == NEGATIVES_GROUP


def test_the_registry_imports_no_torch():
    """The Snakefile reads the registries while it parses: they must stay light."""
    code = "import sys, tacl.objectives.registry, tacl.finetune; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={"PYTHONPATH": str(REPO / "src")})
    assert out.stdout.strip() == "False"


@pytest.mark.parametrize("name", OBJECTIVES)
def test_every_registered_objective_builds(name):
    from tacl.objectives import build_objective

    objective = build_objective(name, {})
    assert objective.name == name and isinstance(objective.needs_teacher, bool)
