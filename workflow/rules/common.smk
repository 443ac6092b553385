# Helpers shared by all .smk files: paths derived from the config, and nothing else.
import json
import math
import os
import shlex
import signal
import subprocess
import sys

from tacl.finetune.sweep import parse_setting, task_settings
from tacl.pretrain.settings import PARAMS_SECTION

# Every job runs `python -m tacl` from this checkout's src/ (installed or not, venv or --sdm conda).
REPO = os.path.abspath(os.path.join(workflow.basedir, ".."))
SRC = os.path.join(REPO, "src")
# (the prefix is formatted once more by Snakemake, hence the doubled braces)
shell.prefix(f"set -euo pipefail; export PYTHONPATH={SRC}${{{{PYTHONPATH:+:$PYTHONPATH}}}}; ")
# The software environment of every job with --sdm conda (a path relative to the repository root).
CONDA_ENV = os.path.join(REPO, config["conda_env"])

# SLURM's --signal=USR1@T reaches every process of a job step: the Snakemake process that runs the job
# inside the step, the shell, the launcher and the trainer. All but the trainer (which installs its own
# handler: save at the next step boundary) must survive it, so the signal is ignored here and that
# disposition is inherited by the job's processes.
signal.signal(signal.SIGUSR1, signal.SIG_IGN)

R = config["results_dir"]
DATA = f"{R}/data"
LOGS = f"{R}/logs"
BENCH = f"{R}/benchmarks"
SHARDS = [f"{k:05d}" for k in range(config["data"]["num_shards"])]
MODELS = f"{R}/models"
START = f"{MODELS}/start"
PRETRAIN = f"{R}/pretrain"
FINETUNE = f"{R}/finetune"
REPORT = f"{R}/report"
GLUE_TASKS = ["cola", "sst2", "mrpc", "stsb", "qqp", "mnli", "qnli", "rte", "wnli"]


def tokenizer_name():
    return config["tokenizer"] or config["model"]


def data_outputs():
    return [f"{DATA}/shards/manifest.json", f"{DATA}/summary.json"]


def model_outputs():
    return [f"{MODELS}/{o}.json" for o in config["pretrain"]["objectives"]]


def train_settings(objective):
    """The trainer's settings for one objective, as JSON (see tacl.pretrain.settings)."""
    p = config["pretrain"]
    keys = [
        "steps",
        "global_batch",
        "micro_batch",
        "lr",
        "warmup_ratio",
        "weight_decay",
        "adam_eps",
        "adam_betas",
        "grad_clip",
        "zero_stage",
        "precision",
        "seed",
        "log_every",
        "checkpoint_minutes",
        "keep_checkpoints",
        "pad_to_max_len",
        "group_by_length",
        "packing",
        "loader_workers",
        "compile",
    ]
    settings = {k: p[k] for k in keys}
    settings.update(
        objective=objective,
        max_len=config["data"]["max_len"],
        objective_params=p.get(PARAMS_SECTION.get(objective, objective), {}),
        device=config["device"],
    )
    return json.dumps(settings, sort_keys=True)


def launcher():
    p = config["pretrain"]
    if p["launcher"] == "auto":
        return "srun" if p["nodes"] > 1 else "torchrun"
    if p["launcher"] == "torchrun" and p["nodes"] > 1:
        raise WorkflowError(
            "pretrain.launcher: torchrun starts ranks on one node; use srun (SLURM) or mpiexec / pbsdsh"
            " (PBS) for pretrain.nodes > 1"
        )
    return p["launcher"]


def chunk_launch():
    """The command prefix and rank argument of a chunk: srun starts one task per rank, torchrun (via
    `--nproc`) forks the ranks of one node, `tacl pbs launch` one torchrun agent per node of a PBS job."""
    p = config["pretrain"]
    if launcher() == "srun":
        ranks = p["nodes"] * p["ranks_per_node"]
        return f"srun --ntasks={ranks} --ntasks-per-node={p['ranks_per_node']} --kill-on-bad-exit=1", ""
    if launcher() in ("mpiexec", "pbsdsh"):
        return (
            f"python -m tacl pbs launch --starter {launcher()} --nodes {p['nodes']}"
            f" --ranks-per-node {p['ranks_per_node']} --state-dir {R}/pbs-launch --",
            "",
        )
    return "", f"--nproc {p['ranks_per_node']}"


def chunk_resources():
    """SLURM resources of a chunk job: the task geometry comes from the config, so that the same profile
    (partition, GPUs per node as `gres: gpu:N`, memory, --signal) serves one node and several. torchrun:
    one task on one node with every rank's CPUs. srun: pretrain.ranks_per_node tasks on each node, each
    with pretrain.cpus_per_rank CPUs, and the job's command runs in the batch step (`mpi`), so that its own
    srun starts the ranks. Under PBS (torchrun, mpiexec, pbsdsh) cpus_per_task is per node, as the
    profile's gpu and mem_mb are."""
    p = config["pretrain"]
    resources = {"runtime": math.ceil(p["chunk"]["runtime_minutes"]), "mem_mb": 32000, "nodes": p["nodes"]}
    if launcher() == "srun":
        resources.update(mpi="srun", cpus_per_task=p["cpus_per_rank"])
        if p["ranks_per_node"] > 1:
            resources["tasks_per_node"] = p["ranks_per_node"]
        else:  # (the plugin wants tasks_per_node > 1; tasks_per_gpu 0 keeps it from adding --ntasks-per-gpu)
            resources.update(tasks=p["nodes"], tasks_per_gpu=0)
    else:
        resources["cpus_per_task"] = p["cpus_per_rank"] * p["ranks_per_node"]
    return resources


def chunk_step_cap():
    """The per-chunk step cap (pretrain.chunk.max_steps) as an argument of `tacl pretrain train`."""
    cap = config["pretrain"]["chunk"]["max_steps"]
    return f"--max-steps {cap}" if cap else ""


def chunk_marker(objective, k):
    return f"{PRETRAIN}/{objective}/chunk-{k}.json"


def previous_chunk(wildcards):
    k = int(wildcards.chunk)
    return [] if k == 0 else [chunk_marker(wildcards.objective, k - 1)]


def final_chunk(wildcards):
    """Follow the chain of chunks until one reports done: as many jobs as the work needs."""
    cap = config["pretrain"]["chunk"]["max_chunks"]
    for k in range(cap):
        marker = checkpoints.pretrain_chunk.get(objective=wildcards.objective, chunk=k).output[0]
        with open(marker) as f:
            if json.load(f)["done"]:
                return marker
    raise WorkflowError(
        f"pretraining {wildcards.objective}: not done after pretrain.chunk.max_chunks={cap} chunks "
        f"(see {chunk_marker(wildcards.objective, cap - 1)}); raise the cap or the chunk runtime"
    )


def pretrained_models():
    """The objectives whose exported models are fine-tuned and compared."""
    return config["finetune"]["models"] or config["pretrain"]["objectives"]


def extra_models():
    """finetune.extra_models: fine-tuned as they are, each its own row."""
    return list(config["finetune"]["extra_models"])


def finetune_models():
    return pretrained_models() + extra_models()


def contrastive_tasks():
    """The GLUE classification tasks of the contrastive fine-tunes (finetune.contrastive)."""
    c = config["finetune"]["contrastive"]
    if not c["forms"]:
        return []
    if c["tasks"] is None:
        return [t for t in config["finetune"]["tasks"] if t in GLUE_TASKS and t != "stsb"]
    bad = [t for t in c["tasks"] if t not in GLUE_TASKS or t == "stsb"]
    if bad:
        raise WorkflowError(
            f"finetune.contrastive.tasks: {', '.join(bad)}: contrastive fine-tuning needs a GLUE "
            "classification task (stsb is a regression task)"
        )
    return list(c["tasks"])


def contrastive_models():
    """MODEL+FORM for every contrastively fine-tuned model and form: their own rows in the tables."""
    c = config["finetune"]["contrastive"]
    models = c["models"] or finetune_models()
    unknown = [m for m in models if m not in finetune_models()]
    if unknown:
        raise WorkflowError(
            f"finetune.contrastive.models: {', '.join(unknown)} not among the fine-tuned models"
        )
    return [f"{m}+{f}" for m in models for f in c["forms"]]


def embeddings_enabled():
    return config["analysis"]["embeddings"]["enabled"]


def embeddings_files():
    """The sentence-embedding evaluation's input and output of a similarity job, when it runs
    (analysis.embeddings.enabled)."""
    if not embeddings_enabled():
        return {}, {}
    return (
        {"embeddings_data": f"{R}/analysis/embeddings_data.json"},
        {"embeddings": f"{R}/analysis/embeddings/{{model}}.json"},
    )


def embeddings_outputs():
    """Every model's sentence-embedding results, when that evaluation runs."""
    if not embeddings_enabled():
        return []
    return [f"{R}/analysis/embeddings/{m}.json" for m in finetune_models()]


def embeddings_args(wildcards, input, output):
    if not embeddings_enabled():
        return ""
    return f"--embeddings-data {input.embeddings_data} --embeddings-out {output.embeddings}"


def embeddings_source():
    """The GLUE source of the sentence-embedding evaluation (analysis.embeddings.source, else the fine-tunes')."""
    source = dict(config["analysis"]["embeddings"]["source"] or config["finetune"]["glue_source"])
    source.setdefault("cache_dir", f"{config['resources_dir']}/datasets")
    return source


def task_family(task):
    if task in GLUE_TASKS:
        return "glue"
    return "squad" if task.startswith("squad") else "ner"


def task_source(task):
    family = task_family(task)
    ft = config["finetune"]
    if family == "glue":
        source = dict(ft["glue_source"])
    elif family == "squad":
        source = dict(ft["squad_source"])
    else:
        source = dict(ft["conll_source"])
    source.setdefault("cache_dir", f"{config['resources_dir']}/datasets")
    return source


def task_hparams(task):
    hp = config["finetune"]["hparams"]
    return {**hp[task_family(task)], **hp["tasks"].get(task, {})}


def task_runtime(task):
    runtimes = config["finetune"]["runtime_minutes"]
    return runtimes.get(task, runtimes.get("default", 240))


def task_seeds(task):
    ft = config["finetune"]
    return range(ft["seeds_large"] if task in ft["large_tasks"] else ft["seeds_small"])


def settings_of(task):
    """The task's fine-tuning settings (finetune.sweep), by name (tacl.finetune.sweep)."""
    ft = config["finetune"]
    return task_settings(task, task_family(task), ft["hparams"], ft["sweep"], ft["preset"])


def setting_hparams(task, setting):
    """One job's hparams: the config's for the task, the setting's values over them."""
    return {**task_hparams(task), **parse_setting(setting, config["finetune"]["preset"])}


def tasks_of(model):
    """The tasks a model is fine-tuned on: every task, or for MODEL+FORM the contrastive tasks."""
    return contrastive_tasks() if "+" in model else list(config["finetune"]["tasks"])


def model_tasks():
    """(model, task) of every fine-tune."""
    return [(m, t) for m in finetune_models() + contrastive_models() for t in tasks_of(m)]


def expected_runs():
    return [
        {"model": m, "task": t, "setting": setting, "seed": s}
        for m, t in model_tasks()
        for setting in settings_of(t)
        for s in task_seeds(t)
    ]


def run_dir(run):
    return f"{FINETUNE}/{run['model']}/{run['task']}/{run['setting']}/seed{run['seed']}"


def finetune_outputs():
    return [f"{run_dir(r)}/metrics.json" for r in expected_runs()]


def selection_file(model, task):
    return f"{FINETUNE}/{model}/{task}/selected.json"


def selection_inputs(wildcards):
    """Every run of one (model, task): the selection reads them all."""
    return [
        f"{run_dir({'model': wildcards.model, 'task': wildcards.task, 'setting': setting, 'seed': s})}/metrics.json"
        for setting in settings_of(wildcards.task)
        for s in task_seeds(wildcards.task)
    ]


def start_source(task):
    """The task whose selected fine-tune starts this task's runs (finetune.start_from), or None."""
    return config["finetune"]["start_from"].get(task)


def finetune_start(wildcards):
    """What a fine-tune starts from: the exported model, or (finetune.start_from) the selection of the same
    model's source task, whose best run's weights the job then loads."""
    base = wildcards.model.split("+")[0]  # MODEL+FORM: a contrastive fine-tune of MODEL
    source = start_source(wildcards.task)
    if source is None:
        return {"model": f"{MODELS}/{base}"}
    return {"selected": selection_file(base, source)}


def start_args(wildcards, input):
    if "selected" in input.keys():
        return f"--start-selection {input.selected}"
    return f"--model {input.model}"


def keeps_weights(task):
    """The source tasks of finetune.start_from keep their fine-tuned weights."""
    return task in config["finetune"]["start_from"].values()


def report_outputs():
    zips = [f"{REPORT}/submissions/{m}.zip" for m in finetune_models() + contrastive_models()]
    return [f"{REPORT}/report.md", f"{REPORT}/self_similarity.png", *zips]


def report_args(wildcards=None, input=None):
    """Arguments of `tacl report`, shared by the rule and the onerror handler."""
    similarity = [f"{R}/analysis/similarity/{m}.json" for m in finetune_models()]
    args = [
        "--results",
        R,
        "--models",
        *finetune_models(),
        *contrastive_models(),
        "--tasks",
        *config["finetune"]["tasks"],
        "--expected",
        json.dumps(expected_runs()),
        "--similarity",
        *[p for p in similarity if os.path.exists(p)],
        "--embeddings",
        *[p for p in embeddings_outputs() if os.path.exists(p)],
        *([] if embeddings_enabled() else ["--embeddings-disabled"]),
        "--out",
        REPORT,
    ]
    if os.path.exists(f"{REPORT}/self_similarity.png"):
        args += ["--similarity-png", f"{REPORT}/self_similarity.png"]
    return " ".join(shlex.quote(str(a)) for a in args)


def partial_report():
    """After a failed job: tables from whatever has finished, so one failure never hides the rest."""
    if not any(os.path.exists(p) for p in finetune_outputs()):
        return
    cmd = f"{sys.executable} -m tacl report {report_args()}"
    env = dict(os.environ, PYTHONPATH=SRC + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run(cmd, shell=True, env=env, capture_output=True, text=True)
    if proc.returncode == 0:
        print(f"\nsome jobs failed; tables from the finished runs: {REPORT}/report.md")
    else:
        print(f"\nsome jobs failed, and the partial report failed too:\n{proc.stderr[-2000:]}")


def config_runtimes():
    """The rules whose runtime the config sets: (minutes, key), for the preflight's messages."""
    runtimes = {
        "pretrain_chunk": (
            math.ceil(config["pretrain"]["chunk"]["runtime_minutes"]),
            "pretrain.chunk.runtime_minutes",
        )
    }
    if config["finetune"]["tasks"]:
        longest = max(task_runtime(t) for t in config["finetune"]["tasks"])
        runtimes["finetune"] = (longest, "finetune.runtime_minutes")
    return runtimes


def cluster_preflight():
    """onstart: the checks of the scheduler in use, before the first submission (tacl.cluster.hooks)."""
    from tacl.cluster.hooks import preflight

    preflight(workflow, config["pretrain"], config_runtimes(), launcher())


def print_summary():
    from tacl.cluster.hooks import data_summary

    line = data_summary(f"{DATA}/summary.json", R)
    if line:
        print(f"\n{line}")
