"""The workflow's logic as the package holds it (tacl.runtime.layout, tacl.experiment.design,
tacl.planning.sizing, tacl.planning.plan, tacl.experiment.reruns.finished_jobs, tacl.cluster.handlers), called on
the demo's config without Snakemake."""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path

import pytest
import yaml
from conftest import REPO, demo_config

from tacl.cluster import handlers
from tacl.experiment import design
from tacl.experiment.config import SCHEMA
from tacl.runtime.layout import Layout
from tacl.experiment.reruns import finished_jobs, rerun_tags
from tacl.planning.plan import plan_jobs, plan_text, planned_chunks
from tacl.planning.sizing import Sizing
from tacl.runtime.io import InputError


def filled(cfg: dict) -> dict:
    """The config with the schema's defaults, as the Snakefile fills them in."""
    from snakemake.utils import validate

    validate(cfg, str(SCHEMA), set_default=True)
    return cfg


def test_submit_and_the_workflow_name_the_same_files(tmp_path, monkeypatch):
    """`tacl submit pretrain` finds the start model and the shards where the workflow writes them (one
    Layout), trains in the run folder the chunks use, and takes results_dir and max_len from the schema."""
    from tacl.cluster.submit import run_from_config

    layout = Layout(str(tmp_path / "results"))
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({"results_dir": layout.results}))
    for path in (Path(layout.start) / "config.json", Path(layout.manifest)):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("{}")
    run = run_from_config(str(config), "tacl")
    assert (run.start_model, run.manifest) == (layout.start, layout.manifest)
    assert run.run_dir == layout.pretrain_run("tacl") == f"{layout.pretrain}/tacl/run"
    assert run.settings["max_len"] == 256
    assert Path(layout.chunk_marker("tacl", 3)).parent == Path(run.run_dir).parent
    monkeypatch.chdir(tmp_path)
    config.write_text(yaml.safe_dump({"data": {"max_len": 128}}))
    with pytest.raises(InputError, match=r"^results/paper/models/start/config.json: not found"):
        run_from_config(str(config), "tacl")
    assert Layout.of(filled(yaml.safe_load(config.read_text()))).results == "results/paper"


def test_the_report_reads_the_analyses_where_the_workflow_writes_them(tmp_path):
    from tacl.report.expected import report_inputs

    cfg = filled(demo_config(tmp_path))
    layout = Layout.of(cfg)
    wanted = {"version": 1, **handlers.expected_of(cfg, layout)}
    assert wanted["models"] == design.finetune_models(cfg) + ["mlm_nsp+scl"]
    assert "--embeddings-disabled" in handlers.report_args(cfg, layout).split()
    Path(layout.similarity("tacl")).parent.mkdir(parents=True)
    Path(layout.similarity("tacl")).write_text("{}")
    assert report_inputs(layout.results, wanted)["similarity"] == [layout.similarity("tacl")]
    assert f"--similarity {layout.similarity('tacl')} --embeddings" in handlers.report_args(cfg, layout)


def test_the_config_lists_models_tasks_settings_and_runs():
    cfg = filled(demo_config(Path("/x")))
    assert design.contrastive_models(cfg) == ["mlm_nsp+scl"]
    assert design.tasks_of(cfg, "mlm_nsp+scl") == ["qnli"]
    assert design.tasks_of(cfg, "tacl") == ["qnli", "squad_v2"]
    runs = design.expected_runs(cfg)
    pairs = design.model_tasks(cfg)
    assert len(pairs) == 2 * len(design.finetune_models(cfg)) + 1
    assert len(runs) == sum(len(design.settings_of(cfg, t)) * len(design.task_seeds(cfg, t)) for _, t in pairs)
    assert design.finetune_start(cfg, Layout("r"), "tacl+scl", "qnli") == {"model": "r/models/tacl"}
    cfg["finetune"]["start_from"] = {"qnli": "squad_v2"}
    selected = {"selected": "r/finetune/tacl/squad_v2/selected.json"}
    assert design.finetune_start(cfg, Layout("r"), "tacl", "qnli") == selected
    cfg["finetune"]["contrastive"]["tasks"] = ["stsb"]
    with pytest.raises(InputError, match="stsb is a regression task"):
        design.check(cfg)
    cfg["finetune"]["contrastive"]["models"] = ["bert"]
    with pytest.raises(InputError, match="finetune.contrastive.models: bert not among the fine-tuned models"):
        design.check(cfg)
    cfg["pretrain"].update(launcher="torchrun", nodes=2)
    with pytest.raises(InputError, match="torchrun starts ranks on one node"):
        design.check(cfg)


def test_the_plan_of_the_demo_config_without_snakemake(tmp_path):
    """plan_jobs lists the jobs a dry run of the demo would: one per (model, task, setting), one selection per
    (model, task), an analysis per model; a finished chunk counts as done until its settings change, or what
    it is made from (the shards, the start model) is to be made again."""
    cfg = filled(demo_config(tmp_path))
    layout = Layout.of(cfg)
    sizing = Sizing.of(cfg, layout)
    jobs = plan_jobs(sizing, set())
    count = Counter(j.rule for j in jobs)
    pairs = design.model_tasks(cfg)
    assert count["finetune"] == sum(len(design.settings_of(cfg, t)) for _, t in pairs)
    assert count["select_setting"] == len(pairs) and count["similarity"] == len(design.finetune_models(cfg))
    assert count["export_model"] == len(design.trained_objectives(cfg)) and count["all"] == 1
    assert not any(j.done for j in jobs) and {j.where for j in jobs} == {"login", "cpu"}
    marker = Path(layout.chunk_marker("tacl", 0))
    marker.parent.mkdir(parents=True)
    steps = cfg["pretrain"]["steps"]
    marker.write_text(json.dumps({"done": True, "step": steps, "steps_this_chunk": steps, "reason": "target"}))
    assert [c[0] for c in planned_chunks(sizing, "tacl", fresh=False)] == [str(marker)]
    chunks = [j for j in plan_jobs(sizing, set()) if j.rule == "pretrain_chunk" and j.key == "tacl"]
    assert len(chunks) == 2 and not any(j.done for j in chunks), "the data stage is to run: the chain again"
    data = [f"{layout.data}/{name}" for name in ("raw.json", "corpus.txt", "shards/shard-00000.bin",
                                                 "shards/shard-00001.bin", "shards/manifest.json")]
    for path in data + [f"{layout.data}/tokenizer/x", f"{layout.start}/x"]:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text("{}")
    chunks = [j for j in plan_jobs(sizing, set()) if j.rule == "pretrain_chunk" and j.key == "tacl"]
    assert [j.done for j in chunks] == [True]
    chunks = [j for j in plan_jobs(sizing, {"pretrain_chunk:tacl"}) if j.rule == "pretrain_chunk"]
    assert not any(j.done for j in chunks)
    text = plan_text(sizing, plan_jobs(sizing, set()))
    assert text.startswith("Plan of this run") and "device: cpu, so no job asks for a GPU" in text


def test_the_local_rules_are_those_the_rules_files_declare():
    """design.LOCAL_RULES (the plan's 'this machine' and the rules the scheduler's checks leave out) names
    exactly the rules that the workflow's files declare local, with `localrules:` or a rule's `localrule: True`
    (what Snakemake acts on), each a rule of the workflow; `all`, which runs no command, is not among them."""
    declared, rules = set(), {}
    for path in [REPO / "workflow" / "Snakefile", *sorted((REPO / "workflow" / "rules").glob("*.smk"))]:
        text = path.read_text()
        for block in re.findall(r"^localrules:\n((?:[ \t]+\w+,?[^\n]*\n)+)", text, re.M):
            declared |= set(re.findall(r"^[ \t]+(\w+)", block, re.M))
        for m in re.finditer(r"^(?:rule|checkpoint) (\w+):\n(.*?)(?=^\S|\Z)", text, re.M | re.S):
            rules[m.group(1)] = m.group(2)
            if re.search(r"^\s+localrule:\s*True", m.group(2), re.M):
                declared.add(m.group(1))
    local = design.LOCAL_RULES
    assert declared == local, (sorted(declared - local), sorted(local - declared))
    assert local <= set(rules) and "all" in rules and "all" not in local


def test_finished_jobs_follow_the_config(tmp_path):
    """A finished fine-tune made with another lr is a rerun tag; every expected run has its record."""
    cfg = filled(demo_config(tmp_path))
    layout = Layout.of(cfg)
    jobs = finished_jobs(cfg, layout)
    assert Counter(j.rule for j in jobs)["finetune"] == len(design.expected_runs(cfg))
    assert rerun_tags(jobs) == set()
    run = design.expected_runs(cfg)[0]
    job = next(j for j in jobs if j.rule == "finetune")
    Path(layout.run_dir(run)).mkdir(parents=True)
    Path(job.done).write_text("{}")
    Path(job.record).write_text(json.dumps({**job.current, "hparams": {**job.current["hparams"], "lr": 1.0}}))
    label = f"{run['model']}/{run['task']}/{run['setting']}/seed{run['seed']}"
    assert rerun_tags(finished_jobs(cfg, layout)) == {f"finetune:{label}"}


def test_the_workflow_logic_imports_neither_snakemake_nor_torch():
    """The floor rule: what common.smk wires is plain package code (Snakemake's errors stay at the edge), and
    the results folder's layout imports nothing of the package (nor does its package, tacl.runtime)."""
    import subprocess
    import sys

    code = ("import sys, tacl.runtime.layout; layout = [m for m in sys.modules if m.startswith('tacl.')]; "
            "import tacl.planning.plan, tacl.experiment.reruns, tacl.cluster.handlers, tacl.cluster.submit; "
            "print(layout, 'snakemake' in sys.modules, 'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["['tacl.runtime',", "'tacl.runtime.layout']", "False", "False"]


def test_the_inputs_a_config_names_are_checked_for_the_jobs_still_to_run(tmp_path):
    """tacl.experiment.inputs on the demo's config: nothing to say as shipped; a corpus pattern, a GLUE folder, a SQuAD
    file and an extra model that are not there, one line each naming the key and the path; the inputs of jobs
    that are done are not needed again (the corpus once the data stage has run), those of jobs to run are."""
    from tacl.experiment.inputs import input_errors

    cfg = filled(demo_config(tmp_path))
    layout = Layout.of(cfg)

    def errors():
        return input_errors(cfg, plan_jobs(Sizing.of(cfg, layout), rerun_tags(finished_jobs(cfg, layout))))

    assert errors() == []
    cfg["data"]["source"]["paths"].append(str(tmp_path / "wiki_*"))
    cfg["finetune"]["glue_source"]["data_dir"] = "no-glue"
    cfg["finetune"]["squad_source"]["v2_0_dev"] = str(tmp_path / "dev-v2.0.json")
    cfg["finetune"]["extra_models"] = {"mini": str(tmp_path / "mini")}
    assert errors() == [
        f"data.source.paths: {tmp_path}/wiki_*: no file matches",
        f"finetune.glue_source.data_dir: no-glue: folder not found, for task qnli (relative to {Path.cwd()})",
        f"finetune.squad_source.v2_0_dev: {tmp_path}/dev-v2.0.json: not found, for task squad_v2",
        f"finetune.extra_models.mini: {tmp_path}/mini: model directory not found",
    ]
    cfg["finetune"]["squad_source"]["v2_0_dev"] = None
    assert "finetune.squad_source.v2_0_dev: not set, for task squad_v2" in errors()
    raw = Path(layout.data, "raw.json")
    raw.parent.mkdir(parents=True)
    raw.write_text(json.dumps({"source": cfg["data"]["source"]}))
    Path(layout.model("mini")).mkdir(parents=True)
    assert errors()[0].startswith("finetune.glue_source.data_dir: no-glue: folder not found")
    cfg["data"]["source"]["paths"] = [str(tmp_path / "other_*")]  # (download_corpus runs again)
    assert errors()[0] == f"data.source.paths: {tmp_path}/other_*: no file matches"


def test_a_change_of_the_start_models_family_reruns_the_tokenizer_job(tmp_path):
    """The tokenizer job's parameters name the family only where the tokenizer's name does not decide it (the
    demo's and the paper config's stay as they were); its record's `given` says what changed."""
    from tacl.data.download import tokenizer_given

    cfg = filled(demo_config(tmp_path))
    assert design.start_family_given(cfg) == {} and design.tokenizer_options(cfg) == "--family bert"
    layout = Layout.of(cfg)
    folder = Path(layout.data) / "tokenizer"
    folder.mkdir(parents=True)
    (folder / "tacl_tokenizer.json").write_text(json.dumps({"given": tokenizer_given(cfg["model"], "bert", None)}))
    assert rerun_tags(finished_jobs(cfg, layout)) == set()
    cfg["model_init"]["family"] = "roberta"
    assert design.start_family_given(cfg) == {"family": "roberta"}
    assert design.tokenizer_options(cfg) == "--family roberta"
    job = next(j for j in finished_jobs(cfg, layout) if j.rule == "fetch_tokenizer")
    assert job.changes == ["family None -> roberta"]
    cfg.update(model_init={"kind": "pretrained"}, model="roberta-base", tokenizer="other/tokenizer")
    assert design.start_family_given(cfg) == {"start_model": "roberta-base"}
    assert design.tokenizer_options(cfg) == "--start-model roberta-base"
    cfg["tokenizer"] = None
    assert design.start_family_given(cfg) == {}


def test_the_family_key_leaves_a_bert_start_models_parameters_as_they_were(tmp_path):
    """model_init.family (default bert) is not among the init_model job's parameters of a BERT start model,
    nor the shards' form among the shard job's: a run finished before families were recorded runs nothing
    again; another family is."""
    cfg = filled(demo_config(tmp_path))
    assert cfg["model_init"]["family"] == "bert"
    assert "family" not in design.start_model_init(cfg)
    assert design.start_model_init({"model_init": {**cfg["model_init"], "family": "roberta"}})["family"] == "roberta"
    layout = Layout.of(cfg)
    shard = next(j for j in finished_jobs(cfg, layout) if j.rule == "shard")
    assert "form" not in shard.current
    meta = Path(layout.data) / "tokenizer" / "tacl_tokenizer.json"
    meta.parent.mkdir(parents=True)
    meta.write_text(json.dumps({"family": "roberta"}))
    assert next(j for j in finished_jobs(cfg, layout) if j.rule == "shard").current["form"] == "sentences"
