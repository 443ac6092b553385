"""What one experiment holds, from its config alone: the models fine-tuned and compared, each task's settings
and seeds, every fine-tuning run expected, where each task's data comes from, how a pretraining chunk is
launched and which rules run on this machine. The workflow's rules, its plan, the rerun summary and the report
all list their jobs from here.

A config that asks for something impossible (a contrastive fine-tune of a regression task, torchrun across
nodes) raises InputError, which the workflow shows as its own error (`check`, at start, raises the first)."""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any, Callable

import yaml

from tacl.data.headings import StopRule, stop_rule
from tacl.data.download import tokenizer_given as given_to_tokenizer
from tacl.experiment.config import defaults_unlike
from tacl.runtime.layout import Layout
from tacl.finetune import GLUE_CLASSIFICATION, TASKS, declared
from tacl.finetune.sweep import parse_setting, task_settings
from tacl.pretrain.settings import TrainSettings
from tacl.runtime.io import InputError
from tacl.runtime.tracking import PACKAGES, job_spec


def stamp(value: Any) -> str:
    """A parameter as Snakemake compares it to decide a rerun: JSON with sorted keys (key order never counts)."""
    return json.dumps(value, sort_keys=True)


def check(config: dict[str, Any]) -> None:
    """Raise InputError for the first impossible request of the config, in the order the rules meet them."""
    launcher(config)
    if contrastive_models(config):
        contrastive_tasks(config)


# -- data --------------------------------------------------------------------------------------------------


def clean_stops(config: dict[str, Any]) -> StopRule:
    """The clean step's stop rule: `data.stop_headings` where given, else `data.language`'s built-in list, with
    the language's conjunctions (tacl.data.headings.stop_rule)."""
    d = config["data"]
    return stop_rule(d.get("language", "en"), d.get("stop_headings"))


def clean_language_given(config: dict[str, Any]) -> dict[str, Any]:
    """The stop rule among the clean and download jobs' parameters, which decide their rerun: empty where it is
    TaCL's (English's headings), so that the parameters of the jobs made before languages were recorded stay as
    they were (no rerun)."""
    return clean_stops(config).given()


def clean_options(config: dict[str, Any]) -> str:
    """The clean and download jobs' `--stop-headings` and `--stop-joiners` options: empty where the rule is
    TaCL's."""
    given = clean_language_given(config)
    if not given:
        return ""
    return "".join(f" --{key.replace('_', '-')} {shlex.quote(json.dumps(given[key], ensure_ascii=False))}"
                   for key in ("stop_headings", "stop_joiners"))


# -- pretraining -------------------------------------------------------------------------------------------


def tokenizer_name(config: dict[str, Any]) -> str:
    """The tokenizer the data stage saves: `tokenizer`, else the start model's own."""
    return config["tokenizer"] or config["model"]


def start_model_init(config: dict[str, Any]) -> dict[str, Any]:
    """`model_init` as the init_model job is given it: without `family` where it is bert, the family of every
    start model made before families were recorded, so that their jobs' parameters stay as they were (no
    rerun); init_model takes a missing family as bert."""
    return {k: v for k, v in config["model_init"].items() if (k, v) != ("family", "bert")}


def start_family_given(config: dict[str, Any]) -> dict[str, str]:
    """What decides the start model's family (tacl.runtime.family) beyond the tokenizer's name, among the
    tokenizer job's parameters, which decide its rerun and so the shards': a random start model's
    `model_init.family` where it is not bert, and the start model where it is not the tokenizer's name (a
    pretrained start model's family is its config's model_type). Empty where neither is needed, so that the
    parameters of the configs made before families were recorded stay as they were (no rerun)."""
    return {k: v for k, v in tokenizer_given(config).items() if k != "name" and v is not None}


def tokenizer_given(config: dict[str, Any]) -> dict[str, str | None]:
    """The tokenizer job's `given` (tacl.data.download.tokenizer_given) as the config decides it now."""
    init = config["model_init"]
    random_start = init.get("kind", "pretrained") == "random"
    return given_to_tokenizer(tokenizer_name(config), init.get("family") or "bert" if random_start else None,
                              None if random_start else config["model"])


def tokenizer_options(config: dict[str, Any]) -> str:
    """The tokenizer job's options that name the start model's family: `--family` for a random start model,
    else `--start-model` (braces doubled: the rule's command is a format string)."""
    init = config["model_init"]
    if init.get("kind", "pretrained") == "random":
        option = f"--family {shlex.quote(init.get('family') or 'bert')}"
    else:
        option = f"--start-model {shlex.quote(config['model'])}"
    return option.replace("{", "{{").replace("}", "}}")


def trained_objectives(config: dict[str, Any]) -> list[str]:
    """The objectives that pretrain (all but `none`, the start model itself)."""
    return [o for o in config["pretrain"]["objectives"] if o != "none"]


def pretrain_settings(config: dict[str, Any], objective: str) -> TrainSettings:
    """The trainer's settings for one objective (tacl.pretrain.settings: result and operational keys)."""
    s = TrainSettings.from_config(config["pretrain"], objective, config["data"]["max_len"])
    s.device = config["device"]
    return s


def launcher(config: dict[str, Any]) -> str:
    """What starts a chunk's ranks: pretrain.launcher, `auto` being srun across nodes and torchrun on one."""
    p = config["pretrain"]
    if p["launcher"] == "auto":
        return "srun" if p["nodes"] > 1 else "torchrun"
    if p["launcher"] == "torchrun" and p["nodes"] > 1:
        raise InputError(
            "pretrain.launcher: torchrun starts ranks on one node; use srun (SLURM) or mpiexec / pbsdsh"
            " (PBS) for pretrain.nodes > 1"
        )
    return p["launcher"]


def chunk_launch(config: dict[str, Any], layout: Layout) -> tuple[str, str]:
    """The command prefix and rank argument of a chunk: srun starts one task per rank, torchrun (via
    `--nproc`) forks the ranks of one node, `tacl pbs launch` one torchrun agent per node of a PBS job."""
    p, starter = config["pretrain"], launcher(config)
    if starter == "srun":
        ranks = p["nodes"] * p["ranks_per_node"]
        return f"srun --ntasks={ranks} --ntasks-per-node={p['ranks_per_node']} --kill-on-bad-exit=1", ""
    if starter in ("mpiexec", "pbsdsh"):
        prefix = (f"python -m tacl pbs launch --starter {starter} --nodes {p['nodes']}"
                  f" --ranks-per-node {p['ranks_per_node']} --state-dir {layout.results}/pbs-launch --")
        return prefix, ""
    return "", f"--nproc {p['ranks_per_node']}"


def chunk_operational(config: dict[str, Any], layout: Layout) -> str:
    """The operational settings of `tacl pretrain train` (logging, checkpoints, loader, compile, micro batch,
    ZeRO stage, device, the chunk's margin and step cap, ranks on the node) as arguments."""
    chunk = config["pretrain"]["chunk"]
    args = [
        "--operational",
        shlex.quote(stamp(pretrain_settings(config, "").operational())),
        f"--margin-minutes {chunk['margin_minutes']}",
    ]
    if chunk["max_steps"]:
        args.append(f"--max-steps {chunk['max_steps']}")
    if "tensorboard" not in trackers(config):
        args.append("--no-tensorboard")
    return " ".join(args + [chunk_launch(config, layout)[1]]).strip()


def trackers(config: dict[str, Any]) -> list[str]:
    """tracking.trackers (TensorBoard alone where the config says nothing)."""
    return (config.get("tracking") or {}).get("trackers", ["tensorboard"])


def tracking_option(config: dict[str, Any], layout: Layout, cost: Callable[[], dict[str, Any]], **labels: Any
                    ) -> str:
    """`--tracking JSON` for a job whose run the config's trackers beyond TensorBoard follow (W&B, MLflow:
    tacl.runtime.tracking.job_spec, with the run's `labels` and the plan's cost of the run, `cost()`, asked
    only then); "" where there are none. Operational: the rules pass it where it decides no rerun."""
    if not any(name in PACKAGES for name in trackers(config)):
        return ""
    spec = job_spec(config["tracking"], layout.results, **labels, cost=cost())
    return f"--tracking {shlex.quote(stamp(spec))}"


def gpus_per_node(config: dict[str, Any], name: str) -> int:
    """GPUs a job of rule `name` uses on each node: one per pretraining rank, one for a fine-tune or an
    analysis, none with `device: cpu` or for a rule that does not use one."""
    if config["device"] == "cpu" or name not in ("pretrain_chunk", "finetune", "similarity"):
        return 0
    return config["pretrain"]["ranks_per_node"] if name == "pretrain_chunk" else 1


# The rules whose jobs run on the machine Snakemake runs on (under SLURM or PBS, the login node), never
# submitted: each rules file declares its own with `localrules:`, which is what Snakemake acts on, and
# tests/test_experiment.py keeps those declarations equal to this set. The plan's 'where' column and the
# scheduler's checks read it here: a dry run cannot say it (Snakemake's dry-run executor counts every rule as
# local), and Snakemake keeps the declared names in no public attribute. (`all`, which runs no command, is
# never submitted either; the plan and the checks count it apart.)
LOCAL_RULES = frozenset({
    "download_corpus", "fetch_tokenizer", "gather_shards",  # data.smk
    "init_model", "export_start", "extra_model",  # pretrain.smk
    "prepare_task", "select_setting", "submissions",  # finetune.smk
    "similarity_plot", "embeddings_data",  # analysis.smk
    "report", "publish_model",  # report.smk
})


# -- the models ---------------------------------------------------------------------------------------------


def pretrained_models(config: dict[str, Any]) -> list[str]:
    """The objectives whose exported models are fine-tuned and compared."""
    return config["finetune"]["models"] or config["pretrain"]["objectives"]


def extra_models(config: dict[str, Any]) -> list[str]:
    """finetune.extra_models: fine-tuned as they are, each its own row."""
    return list(config["finetune"]["extra_models"])


def finetune_models(config: dict[str, Any]) -> list[str]:
    return pretrained_models(config) + extra_models(config)


def contrastive_tasks(config: dict[str, Any]) -> list[str]:
    """The GLUE classification tasks of the contrastive fine-tunes (finetune.contrastive)."""
    c = config["finetune"]["contrastive"]
    if not c["forms"]:
        return []
    if c["tasks"] is None:
        return [t for t in config["finetune"]["tasks"] if t in GLUE_CLASSIFICATION]
    bad = [t for t in c["tasks"] if t not in GLUE_CLASSIFICATION]
    if bad:
        raise InputError(
            f"finetune.contrastive.tasks: {', '.join(bad)}: contrastive fine-tuning needs a GLUE "
            "classification task (stsb is a regression task)"
        )
    return list(c["tasks"])


def contrastive_models(config: dict[str, Any]) -> list[str]:
    """MODEL+FORM for every contrastively fine-tuned model and form: their own rows in the tables."""
    c = config["finetune"]["contrastive"]
    models = c["models"] or finetune_models(config)
    unknown = [m for m in models if m not in finetune_models(config)]
    if unknown:
        raise InputError(f"finetune.contrastive.models: {', '.join(unknown)} not among the fine-tuned models")
    return [f"{m}+{f}" for m in models for f in c["forms"]]


def tabled_models(config: dict[str, Any]) -> list[str]:
    """Every model with rows in the tables: the fine-tuned ones, then the contrastive fine-tunes."""
    return finetune_models(config) + contrastive_models(config)


def embeddings_enabled(config: dict[str, Any]) -> bool:
    return config["analysis"]["embeddings"]["enabled"]


def embeddings_source(config: dict[str, Any]) -> dict[str, Any]:
    """The GLUE source of the sentence-embedding evaluation (analysis.embeddings.source, else the fine-tunes')."""
    return dict(config["analysis"]["embeddings"]["source"] or config["finetune"]["glue_source"])


# -- the tasks ----------------------------------------------------------------------------------------------


def task_family(config: dict[str, Any], task: str) -> str:
    """The family whose fine-tune runs a task: a built-in task's, or a declared task's kind's
    (tacl.finetune.declared)."""
    decl = config["finetune"]["declared_tasks"].get(task)
    return declared.family(decl) if decl is not None else TASKS[task]


def task_source(config: dict[str, Any], task: str) -> dict[str, Any]:
    """Where a task's data comes from: the config's source of its family (GLUE, SQuAD, CoNLL), or a declared
    task's declaration."""
    ft = config["finetune"]
    if task in ft["declared_tasks"]:
        return declared.source_of(task, ft["declared_tasks"][task])
    family = task_family(config, task)
    if family == "glue":
        return dict(ft["glue_source"])
    if family == "squad":
        return dict(ft["squad_source"])
    return dict(ft["conll_source"])


def task_hparams(config: dict[str, Any], task: str) -> dict[str, Any]:
    hp = config["finetune"]["hparams"]
    return {**hp[task_family(config, task)], **hp["tasks"].get(task, {})}


def task_seeds(config: dict[str, Any], task: str) -> range:
    ft = config["finetune"]
    return range(ft["seeds_large"] if task in ft["large_tasks"] else ft["seeds_small"])


def settings_of(config: dict[str, Any], task: str) -> list[str]:
    """The task's fine-tuning settings (finetune.sweep), by name (tacl.finetune.sweep)."""
    ft = config["finetune"]
    return task_settings(task, task_family(config, task), ft["hparams"], ft["sweep"], ft["preset"])


def setting_hparams(config: dict[str, Any], task: str, setting: str) -> dict[str, Any]:
    """One job's hparams: the config's for the task, the setting's values over them."""
    return {**task_hparams(config, task), **parse_setting(setting, config["finetune"]["preset"])}


def tasks_of(config: dict[str, Any], model: str) -> list[str]:
    """The tasks a model is fine-tuned on: every task, or for MODEL+FORM the contrastive tasks."""
    return contrastive_tasks(config) if "+" in model else list(config["finetune"]["tasks"])


def model_tasks(config: dict[str, Any]) -> list[tuple[str, str]]:
    """(model, task) of every fine-tune."""
    return [(m, t) for m in tabled_models(config) for t in tasks_of(config, m)]


def expected_runs(config: dict[str, Any]) -> list[dict[str, Any]]:
    """Every fine-tuning run (model, task, setting, seed) the experiment holds once it has finished."""
    return [
        {"model": m, "task": t, "setting": setting, "seed": s}
        for m, t in model_tasks(config)
        for setting in settings_of(config, t)
        for s in task_seeds(config, t)
    ]


def start_source(config: dict[str, Any], task: str) -> str | None:
    """The task whose selected fine-tune starts this task's runs (finetune.start_from), or None."""
    return config["finetune"]["start_from"].get(task)


def keeps_weights(config: dict[str, Any], task: str) -> bool:
    """The source tasks of finetune.start_from keep their fine-tuned weights."""
    return task in config["finetune"]["start_from"].values()


def finetune_start(config: dict[str, Any], layout: Layout, model: str, task: str) -> dict[str, str]:
    """What a fine-tune starts from: the exported model, or (finetune.start_from) the selection of the same
    model's source task, whose best run's weights the job then loads."""
    base = model.split("+")[0]  # MODEL+FORM: a contrastive fine-tune of MODEL
    source = start_source(config, task)
    if source is None:
        return {"model": layout.model(base)}
    return {"selected": layout.selection_file(base, source)}


# -- the config itself --------------------------------------------------------------------------------------


def defaults_message(unset: list[str], config: dict[str, Any], paper: Path) -> str | None:
    """The keys that took the schema's default where `paper` (config.yaml, the paper's experiment) gives
    another value, as one message; None where there are none or no such file."""
    lines = defaults_unlike(unset, config, yaml.safe_load(paper.read_text())) if paper.is_file() else []
    if not lines:
        return None
    return (
        f"From the schema's defaults, unlike config.yaml (no config file sets them; a file given without "
        f"--replace-workflow-config is merged over config.yaml and keeps its values): {'; '.join(lines)}"
    )
