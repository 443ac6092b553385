# Helpers shared by all .smk files: paths derived from the config, and nothing else.
import json
import math
import os
import shlex
import signal
import subprocess
import sys
from argparse import Namespace
from pathlib import Path

import yaml

from tacl import RESULT_VERSIONS, plan
from tacl.cluster.hooks import scheduler_of_profile
from tacl.config import start_model_shape
from tacl.device import computes_bf16
from tacl.finetune import GLUE_CLASSIFICATION, TASKS
from tacl.finetune.sweep import parse_setting, task_settings
from tacl.io import InputError
from tacl.objectives.registry import OBJECTIVE_PATTERN
from tacl.pretrain.chain import chunks_present, final_marker
from tacl.pretrain.settings import TrainSettings
from tacl.report.expected import RECORD as REPORT_RECORD
from tacl.workstation import machine_gpus

# Every job runs `python -m tacl` from this checkout's src/ (installed or not, venv or --sdm conda).
REPO = os.path.abspath(os.path.join(workflow.basedir, ".."))
SRC = os.path.join(REPO, "src")


def workstation_gpus():
    """config `gpus` (profiles/workstation: one machine with several GPUs, no scheduler): the GPUs the jobs
    share, found once here; Snakemake's `gpu` resource is their number, so that it starts no more GPU jobs
    than fit, and each job takes GPUs of its own (tacl.workstation). None without `gpus`."""
    try:
        gpus = machine_gpus(config["gpus"])
    except InputError as e:
        raise WorkflowError(str(e))
    if gpus is None:
        return None
    p = config["pretrain"]
    if workflow.is_main_process and scheduler_of_profile(workflow) is not None:
        raise WorkflowError(
            f"gpus: {config['gpus']} is for one machine without a scheduler (profiles/workstation); under "
            "SLURM or PBS the scheduler gives each job its GPUs: set gpus: null"
        )
    if p["nodes"] > 1 or p["launcher"] not in ("auto", "torchrun"):
        raise WorkflowError(
            "gpus: one machine runs one node's ranks with torchrun: pretrain.nodes must be 1 and "
            "pretrain.launcher auto or torchrun"
        )
    if p["ranks_per_node"] > len(gpus):
        raise WorkflowError(
            f"pretrain.ranks_per_node: {p['ranks_per_node']} ranks, one GPU each, but this machine's jobs "
            f"share {len(gpus)} GPU(s) ({','.join(gpus)}; config `gpus: {config['gpus']}`)"
        )
    if "gpu" not in workflow.global_resources:  # (--resources gpu=N given by hand stays)
        workflow.register_resource("gpu", len(gpus))
    return gpus


GPUS = workstation_gpus()
# (the prefix is formatted once more by Snakemake, hence the doubled braces)
shell.prefix(
    f"set -euo pipefail; export PYTHONPATH={SRC}${{{{PYTHONPATH:+:$PYTHONPATH}}}}; "
    + (f"export TACL_GPUS={','.join(GPUS)}; " if GPUS else "")
)
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
DATASETS_CACHE = f"{config['resources_dir']}/datasets"


def operational(value):
    """A parameter that never decides a rerun: an operational setting (tacl.pretrain.settings: where, how
    fast, how often a job logs or saves), which changes no result. Snakemake reruns a finished job when its
    parameters change, but leaves out of that comparison a parameter computed by a function of the job's
    `resources` (a value derived from how the job runs): this is one. The profiles leave Snakemake's `code`
    trigger out, so the text of a command does not count either."""
    return lambda wildcards, resources: value


def tokenizer_name():
    return config["tokenizer"] or config["model"]


def data_outputs():
    return [f"{DATA}/shards/manifest.json", f"{DATA}/summary.json"]


def model_outputs():
    return [f"{MODELS}/{o}.json" for o in config["pretrain"]["objectives"]]


def stamp(value):
    """A parameter as Snakemake compares it to decide a rerun: JSON with sorted keys (key order never counts)."""
    return json.dumps(value, sort_keys=True)


def pretrain_settings(objective):
    """The trainer's settings for one objective (tacl.pretrain.settings: result and operational keys)."""
    s = TrainSettings.from_config(config["pretrain"], objective, config["data"]["max_len"])
    s.device = config["device"]
    return s


def train_settings(objective):
    """What a pretraining run computes (its result settings): the chunks' parameter, compared for a rerun."""
    return stamp(pretrain_settings(objective).result())


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
    """Cluster resources of a chunk job, all from the config: one rank per GPU, `pretrain.ranks_per_node` GPUs
    on each of `pretrain.nodes` nodes (none with `device: cpu`), and the task geometry. torchrun: one task on
    one node with every rank's CPUs. srun: pretrain.ranks_per_node tasks on each node, each with
    pretrain.cpus_per_rank CPUs, and the job's command runs in the batch step (`mpi`), so that its own srun
    starts the ranks. Under PBS (torchrun, mpiexec, pbsdsh) cpus_per_task, gpu and mem_mb are per node. The
    runtime is sized to the work (tacl.plan), at most pretrain.chunk.runtime_minutes."""
    p = config["pretrain"]
    resources = {
        "runtime": chunk_runtime,
        "mem_mb": 32000,
        "nodes": p["nodes"],
        **gpu_resources("pretrain_chunk"),
    }
    if launcher() == "srun":
        resources.update(mpi="srun", cpus_per_task=p["cpus_per_rank"])
        if p["ranks_per_node"] > 1:
            resources["tasks_per_node"] = p["ranks_per_node"]
        else:  # (the plugin wants tasks_per_node > 1; tasks_per_gpu 0 keeps it from adding --ntasks-per-gpu)
            resources.update(tasks=p["nodes"], tasks_per_gpu=0)
    else:
        resources["cpus_per_task"] = p["cpus_per_rank"] * p["ranks_per_node"]
    return resources


def gpus_per_node(name):
    """GPUs a job of `name` uses on each node: one per pretraining rank, one for a fine-tune or an analysis,
    none with `device: cpu` or for a rule that does not use one."""
    if config["device"] == "cpu" or name not in ("pretrain_chunk", "finetune", "similarity"):
        return 0
    return config["pretrain"]["ranks_per_node"] if name == "pretrain_chunk" else 1


def scheduler_now():
    """slurm | pbs | None: what the jobs of this run are submitted to (a SLURM job's own Snakemake too)."""
    from tacl.cluster.hooks import scheduler

    return scheduler(workflow)


def gpu_resources(name):
    """The GPUs a job asks for, from the config (a profile that says otherwise is refused by the preflight):
    SLURM, GPUs per node as `gres` for a chunk (its nodes get the same) and `gpu` (sbatch --gpus) for a
    one-GPU job; PBS, `gpu` per node; otherwise `gpu`, what the job uses."""
    n = gpus_per_node(name)
    if not n:
        return {}
    if name != "pretrain_chunk":
        return {"gpu": n}
    return {
        "gres": lambda w: f"gpu:{n}" if scheduler_now() == "slurm" else None,
        "gpu": lambda w: None if scheduler_now() == "slurm" else n,
    }


# -- what the jobs will cost (tacl.plan): the start model's size, the GPU the runtimes are sized for ------

PLAN = config["plan"]
PLAN_GPU = plan.gpus_of(PLAN)[PLAN["gpu"]]
START_SHAPE = plan.shape_of(config, start_model_shape(config))


def model_shape(model):
    """The size of a fine-tuned model: the start model's, or an extra model's own."""
    base = model.split("+")[0]
    extra = config["finetune"]["extra_models"]
    if base in extra:
        return plan.shape_of(
            {"model": extra[base]}, start_model_shape({"model": extra[base], "model_init": {}})
        )
    return START_SHAPE


def pretrain_seq():
    """The mean padded length of a pretraining sequence (the data stage's own, once it has run)."""
    summary = f"{DATA}/summary.json"
    mean, _ = plan.mean_length(
        config["data"]["max_len"], json.load(open(summary)) if os.path.exists(summary) else None
    )
    return plan.padded_length(mean, config["data"]["max_len"], config["pretrain"])


def chunk_expected(objective, chunk):
    """Expected minutes of the rest of a pretraining run from chunk `chunk` on: measured by the previous
    chunk where there is one, else estimated (tacl.plan)."""
    if chunk > 0 and os.path.exists(chunk_marker(objective, chunk - 1)):
        with open(chunk_marker(objective, chunk - 1)) as f:
            rest = plan.measured_rest_minutes(json.load(f))
        if rest is not None:
            return rest
    return plan.pretrain_minutes(objective, config["pretrain"], START_SHAPE, pretrain_seq(), PLAN_GPU)


def chunk_runtime(wildcards):
    """Minutes a chunk asks for: the rest of its run's work with the plan's safety factor and the chunk's
    margin, at most pretrain.chunk.runtime_minutes (the configured runtime itself with `device: cpu`)."""
    chunk = config["pretrain"]["chunk"]
    if config["device"] == "cpu":
        return math.ceil(chunk["runtime_minutes"])
    rest = chunk_expected(wildcards.objective, int(wildcards.chunk))
    return plan.request(rest, PLAN, cap=chunk["runtime_minutes"], extra=chunk["margin_minutes"])


def task_sizes(task):
    """A task's split sizes as prepare_task counted them, once it has run."""
    path = f"{R}/finetune_data/{task}.json"
    return json.load(open(path))["splits"] if os.path.exists(path) else None


def finetune_expected(model, task, setting):
    """Expected minutes of one fine-tuning job (every seed of a setting), without start-up."""
    hp = setting_hparams(task, setting)
    return plan.finetune_minutes(
        task, hp, len(task_seeds(task)), model_shape(model), PLAN_GPU, task_sizes(task)
    )


def finetune_runtime(wildcards):
    """Minutes a fine-tuning job asks for: finetune.runtime_minutes where it names the task (or has a
    default), else its seeds' expected work with the plan's safety factor (tacl.plan)."""
    explicit = config["finetune"]["runtime_minutes"]
    if wildcards.task in explicit or "default" in explicit or config["device"] == "cpu":
        return explicit.get(wildcards.task, explicit.get("default", 240))
    return plan.request(finetune_expected(wildcards.model, wildcards.task, wildcards.setting), PLAN)


def finetune_mem(wildcards):
    max_len = setting_hparams(wildcards.task, wildcards.setting).get("max_len", 128)
    return plan.finetune_mem_mb(wildcards.task, max_len, task_sizes(wildcards.task))


def similarity_expected():
    return plan.similarity_minutes(config["analysis"], START_SHAPE, PLAN_GPU)


def similarity_runtime(wildcards):
    return plan.request(similarity_expected(), PLAN)


def chunk_operational():
    """The operational settings of `tacl pretrain train` (logging, checkpoints, loader, compile, micro batch,
    ZeRO stage, device, the chunk's margin and step cap, ranks on the node) as arguments."""
    chunk = config["pretrain"]["chunk"]
    args = [
        "--operational",
        shlex.quote(stamp(pretrain_settings("").operational())),
        f"--margin-minutes {chunk['margin_minutes']}",
    ]
    if chunk["max_steps"]:
        args.append(f"--max-steps {chunk['max_steps']}")
    return " ".join(args + [chunk_launch()[1]]).strip()


def chunk_minutes(wildcards, resources):
    """The chunk's own time limit: what it asked the scheduler for, or less where the config's runtime is
    not a whole number of minutes (a test's 15-second chunks)."""
    return min(config["pretrain"]["chunk"]["runtime_minutes"], resources.runtime)


def chunk_marker(objective, k):
    return f"{PRETRAIN}/{objective}/chunk-{k}.json"


def previous_chunk(wildcards):
    k = int(wildcards.chunk)
    return [] if k == 0 else [chunk_marker(wildcards.objective, k - 1)]


# the chunks of each run there when this Snakemake started: followed whatever pretrain.chunk.max_chunks says
CHUNKS_AT_START = {
    o: chunks_present(lambda k, o=o: chunk_marker(o, k)) for o in config["pretrain"]["objectives"]
}


def final_chunk(wildcards):
    """Follow the chain of chunks until one reports done: as many jobs as the work needs, at most
    pretrain.chunk.max_chunks of them started by this run of the workflow (tacl.pretrain.chain)."""
    o = wildcards.objective
    get = lambda k: checkpoints.pretrain_chunk.get(objective=o, chunk=k).output[0]
    try:
        return final_marker(o, get, CHUNKS_AT_START.get(o, 0), config["pretrain"]["chunk"]["max_chunks"])
    except InputError as e:
        raise WorkflowError(str(e))


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
        return [t for t in config["finetune"]["tasks"] if t in GLUE_CLASSIFICATION]
    bad = [t for t in c["tasks"] if t not in GLUE_CLASSIFICATION]
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
    return dict(config["analysis"]["embeddings"]["source"] or config["finetune"]["glue_source"])


def task_family(task):
    return TASKS[task]


def task_source(task):
    family = task_family(task)
    ft = config["finetune"]
    if family == "glue":
        source = dict(ft["glue_source"])
    elif family == "squad":
        source = dict(ft["squad_source"])
    else:
        source = dict(ft["conll_source"])
    return source


def task_hparams(task):
    hp = config["finetune"]["hparams"]
    return {**hp[task_family(task)], **hp["tasks"].get(task, {})}


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


def setting_dir(model, task, setting):
    return f"{FINETUNE}/{model}/{task}/{setting}"


def seeds_marker(model, task, setting):
    """The output of one fine-tuning job: every seed of a (model, task, setting), one after the other."""
    return f"{setting_dir(model, task, setting)}/seeds.json"


def finetune_outputs():
    return [seeds_marker(m, t, setting) for m, t in model_tasks() for setting in settings_of(t)]


def selection_file(model, task):
    return f"{FINETUNE}/{model}/{task}/selected.json"


def selection_inputs(wildcards):
    """Every setting's seeds of one (model, task): the selection reads them all."""
    return [seeds_marker(wildcards.model, wildcards.task, setting) for setting in settings_of(wildcards.task)]


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
    """The report rule's record (written by it alone), the plots and the submissions."""
    zips = [f"{REPORT}/submissions/{m}.zip" for m in finetune_models() + contrastive_models()]
    plots = [f"{REPORT}/self_similarity.png", f"{REPORT}/cls_cosine.png"]
    return [f"{REPORT}/report.md", f"{REPORT}/{REPORT_RECORD}", *plots, *zips]


def intermediate_outputs():
    """What the jobs between the exported models and the report write (each setting's fine-tunes, each
    selection, each model's analyses): asked for by `all` itself. Snakemake deletes a failed job's outputs
    and does not make a missing output again while what was built from it is up to date; asked for here, the
    same command runs a failed job again, and what depends on it after."""
    selections = [selection_file(m, t) for m, t in model_tasks()]
    similarity = [f"{R}/analysis/similarity/{m}.json" for m in finetune_models()]
    return finetune_outputs() + selections + similarity + embeddings_outputs()


def chain_ends(wildcards):
    """The marker of each pretraining run's last chunk (final_chunk), asked for by `all` itself: a chunk that
    failed runs again even where an export of an earlier run of the chain is still there."""
    trained = [o for o in config["pretrain"]["objectives"] if o != "none"]
    return [final_chunk(Namespace(objective=o)) for o in trained]


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
    if os.path.exists(f"{REPORT}/cls_cosine.png"):
        args += ["--cls-png", f"{REPORT}/cls_cosine.png"]
    return " ".join(shlex.quote(str(a)) for a in args)


def write_expected():
    """onstart: what this results directory is to hold (RESULTS_DIR/expected.json), for `tacl report RESULTS_DIR`
    (tables from what has finished, at any time) and `tacl status`, which read files only."""
    from tacl.report.expected import write_expected as write

    write(
        R,
        {
            "results_dir": R,
            "objectives": config["pretrain"]["objectives"],
            "models": finetune_models() + contrastive_models(),
            "analysed_models": finetune_models(),
            "tasks": config["finetune"]["tasks"],
            "expected": expected_runs(),
            "embeddings_enabled": embeddings_enabled(),
        },
    )


def partial_report():
    """After a failed job: tables from whatever has finished, so one failure never hides the rest."""
    if not any(os.path.exists(f"{run_dir(r)}/metrics.json") for r in expected_runs()):
        return
    cmd = f"{sys.executable} -m tacl report {report_args()}"
    env = dict(os.environ, PYTHONPATH=SRC + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run(cmd, shell=True, env=env, capture_output=True, text=True)
    if proc.returncode == 0:
        print(f"\nsome jobs failed; tables from the finished runs: {REPORT}/report.md")
    else:
        print(f"\nsome jobs failed, and the partial report failed too:\n{proc.stderr[-2000:]}")


def config_runtimes():
    """The rules whose runtime the config sets: (the longest minutes, key), for the preflight's messages."""
    runtimes = {
        "pretrain_chunk": (
            math.ceil(config["pretrain"]["chunk"]["runtime_minutes"]),
            "pretrain.chunk.runtime_minutes",
        )
    }
    jobs = [(m, t, setting) for m, t in model_tasks() for setting in settings_of(t)]
    if jobs:
        longest = max(finetune_runtime(Namespace(model=m, task=t, setting=s)) for m, t, s in jobs)
        runtimes["finetune"] = (longest, "finetune.runtime_minutes (or plan.safety)")
    return runtimes


def cluster_preflight(dry_run=False):
    """The checks of the scheduler in use (tacl.cluster.hooks): onstart, before the first submission, and in
    a dry run (dry_run_checks)."""
    from tacl.cluster.hooks import preflight

    gpus = {name: gpus_per_node(name) for name in ("pretrain_chunk", "finetune", "similarity")}
    if dry_run:
        chunks = any(o != "none" for o in config["pretrain"]["objectives"])
    else:
        chunks = any(job.name == "pretrain_chunk" for job in workflow.dag.needrun_jobs())
    preflight(workflow, config["pretrain"], config_runtimes(), launcher(), gpus, chunks, dry_run)


_DRY_RUN_CHECKED = []


def dry_run_checks(wildcards):
    """An input function of `all` that adds no input: Snakemake evaluates it while it builds the DAG, dry
    runs too, once the executor is known, where no onstart handler runs. In a dry run of the main process,
    the scheduler's checks run here (once)."""
    if workflow.dryrun and workflow.is_main_process and not _DRY_RUN_CHECKED:
        _DRY_RUN_CHECKED.append(True)
        try:
            cluster_preflight(dry_run=True)
        except WorkflowError as e:  # (raised here, Snakemake would wrap it in a traceback of this function)
            print(e, file=sys.stderr)
            sys.exit(1)
    return []


def planned_chunks(objective, fresh):
    """The chunks of one pretraining run as the plan counts them: (marker, minutes asked for, expected GPU
    work, what ends it), first those there already (none when `fresh`: the run starts again), then the rest
    of the work as estimated (tacl.plan.chunk_requests), from the speed the last of them measured."""
    p, cpu = config["pretrain"], config["device"] == "cpu"
    minutes = plan.pretrain_minutes(objective, p, START_SHAPE, pretrain_seq(), PLAN_GPU)
    present = 0 if fresh else chunks_present(lambda k: chunk_marker(objective, k))
    chunks, step = [], 0
    for k in range(present):
        with open(chunk_marker(objective, k)) as f:
            marker = json.load(f)
        asked = chunk_runtime(Namespace(objective=objective, chunk=k))
        work = minutes * marker.get("steps_this_chunk", 0) / p["steps"]
        chunks.append((chunk_marker(objective, k), asked, work, marker.get("reason")))
        step = marker["step"]
        if marker["done"]:
            return chunks
    rest = chunk_expected(objective, present) if present else minutes
    left = {**p, "steps": max(1, p["steps"] - step)}
    estimated = plan.chunk_requests(rest, left, PLAN, cpu)
    return chunks + [(chunk_marker(objective, k), *c) for k, c in enumerate(estimated, start=present)]


def plan_jobs():
    """Every job of the whole experiment (tacl.plan.Job), with what it asks for and is expected to take: the
    same functions as the rules' resources. Pretraining chunks: those there, then as many as the rest of the
    work needs as estimated. A job is to run where its output is not there, or where it or a job it depends
    on was made with settings that changed (tacl.reruns, as the rerun summary says)."""
    from tacl.reruns import rerun_tags

    local, start = set(workflow._localrules), PLAN["startup_minutes"]
    changed = rerun_tags(finished_jobs())

    def job(
        name, output, gpus=0, requested=0, compute=0.0, key="", finetune=False, needs=(), open_ended=False
    ):
        where = "login" if name in local else ("gpu" if gpus else "cpu")
        overhead = start if gpus else 0.0
        done = os.path.exists(output) and not changed & set(needs)
        return plan.Job(
            name, where, gpus, requested, compute, done, key, overhead, finetune, open_ended and not done
        )

    # what each job's output is made from: the finished jobs (their rerun tags) it depends on
    p = config["pretrain"]
    trained = [o for o in p["objectives"] if o != "none"]
    data, init = {"clean:", "shard:"}, {"init_model:"}

    def model_needs(model):
        base = model.split("+")[0]
        if base in trained:
            return data | init | {f"pretrain_chunk:{base}"}
        return init if base == "none" else set()

    def setting_needs(m, t, setting):
        source = start_source(t)
        before = selection_needs(m.split("+")[0], source) if source else set()
        seeds = {f"finetune:{m}/{t}/{setting}/seed{s}" for s in task_seeds(t)}
        return model_needs(m) | before | seeds

    def selection_needs(m, t):
        return set().union(*(setting_needs(m, t, setting) for setting in settings_of(t)))

    def similarity_needs(m):
        return model_needs(m) | {"clean:", f"similarity:{m}"}

    jobs = [job("download_corpus", f"{DATA}/raw.json"), job("fetch_tokenizer", f"{DATA}/tokenizer")]
    jobs += [job("clean", f"{DATA}/corpus.txt", needs={"clean:"})]
    jobs += [job("shard", f"{DATA}/shards/shard-{k}.bin", needs=data) for k in SHARDS]
    jobs += [job("gather_shards", f"{DATA}/shards/manifest.json", needs=data)]
    jobs += [job("init_model", START, needs=init)]
    if "none" in p["objectives"]:
        jobs.append(job("export_start", f"{MODELS}/none.json", needs=init))
    jobs += [job("extra_model", f"{MODELS}/{m}") for m in extra_models()]
    gpus = gpus_per_node("pretrain_chunk") * p["nodes"]
    for o in trained:
        needs = model_needs(o)
        for marker, asked, work, ends in planned_chunks(o, fresh=bool(changed & needs)):
            open_ended = ends == "deadline"
            jobs.append(
                job("pretrain_chunk", marker, gpus, asked, work, o, needs=needs, open_ended=open_ended)
            )
        jobs.append(job("export_model", f"{MODELS}/{o}.json", needs=needs))
    jobs += [job("prepare_task", f"{R}/finetune_data/{t}.json") for t in config["finetune"]["tasks"]]
    gpu = gpus_per_node("finetune")
    for m, t in model_tasks():
        for setting in settings_of(t):
            asked = finetune_runtime(Namespace(model=m, task=t, setting=setting))
            work = finetune_expected(m, t, setting)
            needs = setting_needs(m, t, setting)
            jobs.append(
                job("finetune", seeds_marker(m, t, setting), gpu, asked, work, f"{m}/{t}", True, needs)
            )
        jobs.append(job("select_setting", selection_file(m, t), needs=selection_needs(m, t)))
    for m in finetune_models() + contrastive_models():
        needs = set().union(*(selection_needs(m, t) for t in tasks_of(m)))
        jobs.append(job("submissions", f"{REPORT}/submissions/{m}.zip", needs=needs))
    if embeddings_enabled():
        jobs.append(job("embeddings_data", f"{R}/analysis/embeddings_data.json"))
    for m in finetune_models():
        path = f"{R}/analysis/similarity/{m}.json"
        asked, work = similarity_runtime(None), similarity_expected()
        gpu = gpus_per_node("similarity")
        jobs.append(job("similarity", path, gpu, asked, work, m, True, similarity_needs(m)))
    analysed = set().union(*(similarity_needs(m) for m in finetune_models()))
    tuned = set().union(*(selection_needs(m, t) for m, t in model_tasks()))
    jobs.append(job("similarity_plot", f"{REPORT}/self_similarity.png", needs=analysed))
    jobs.append(job("report", f"{REPORT}/{REPORT_RECORD}", needs=analysed | tuned))
    jobs.append(plan.Job("all", "login"))
    return jobs


def plan_text():
    """The plan printed before anything runs (tacl.plan.format_plan)."""
    jobs = plan_jobs()
    chain = plan.longest_chain(jobs, config["finetune"]["start_from"])
    shape, p = START_SHAPE, config["pretrain"]
    trained = [o for o in p["objectives"] if o != "none"]
    summary = f"{DATA}/summary.json"
    data = json.load(open(summary)) if os.path.exists(summary) else None
    bf16 = computes_bf16(p["precision"], config["device"])
    kept = sum(len(task_seeds(src)) for src in set(config["finetune"]["start_from"].values()))
    disk = plan.disk_at_peak(
        shape,
        data["tokens"] if data else plan.corpus_tokens(config["data"]["max_lines"], config["data"]["source"]),
        len(trained),
        p["keep_checkpoints"],
        bf16,
        p["zero_stage"],
        len(finetune_models()),
        kept * len(finetune_models()),
    )
    _, seq_source = plan.mean_length(config["data"]["max_len"], data)
    assumptions = [f"start model ({shape.source}): {shape.encoder / 1e6:.3g} M encoder parameters"]
    if config["device"] == "cpu":
        assumptions.append("device: cpu, so no job asks for a GPU and the runtimes are the configured ones")
        return plan.format_plan(jobs, chain, disk, assumptions, {})
    assumptions += [
        f"runtimes sized for {PLAN_GPU.name}: start-up {PLAN['startup_minutes']} min + {PLAN['safety']} x the "
        f"expected minutes, at least {PLAN['min_runtime_minutes']} (plan.*); explicit finetune.runtime_minutes win",
        f"pretraining sequences {pretrain_seq():.0f} tokens padded ({seq_source}); fine-tuning: published task "
        "sizes and typical lengths (tacl.plan.TASK_SIZES) until prepare_task has counted the splits",
    ]
    assumptions += [
        f"{gpu.name}: {gpu.peak_tflops:g} TFLOP/s peak, MFU {gpu.pretrain_mfu:g} pretraining / "
        f"{gpu.finetune_mfu:g} fine-tuning (plan.gpus; {gpu.source})"
        for gpu in plan.gpus_of(PLAN).values()
    ]
    expected = {
        k: (plan.expected_gpu_hours(jobs, PLAN_GPU, g), g.name) for k, g in plan.gpus_of(PLAN).items()
    }
    return plan.format_plan(jobs, chain, disk, assumptions, expected)


def print_plan():
    print(plan_text(), file=sys.stderr)


def finished_jobs():
    """The finished jobs that keep the settings they ran with, beside what the config gives them now."""
    from tacl.data.build import shard_config
    from tacl.data.clean import clean_given
    from tacl.finetune import GIVEN, finetune_given
    from tacl.reruns import Finished

    d, ft = config["data"], config["finetune"]
    jobs = [
        Finished(
            "clean",
            f"{DATA}/clean.json",
            "given",
            f"{DATA}/clean.json",
            clean_given(d["max_lines"], d["heldout_fraction"], d["sentence_splitter"]),
        ),
        Finished(
            "shard",
            f"{DATA}/shards/manifest.json",
            "config",
            f"{DATA}/shards/manifest.json",
            shard_config(d["max_len"], d["short_seq_prob"], d["seed"], d["dupe_factor"], d["num_shards"]),
        ),
        Finished(
            "init_model",
            f"{START}/tacl_start.json",
            "given",
            START,
            {"model": config["model"], "init": config["model_init"]},
        ),
    ]
    again = f"each starts again from the start model, its checkpoints set aside in {PRETRAIN}/OBJECTIVE/superseded/"
    for o in config["pretrain"]["objectives"]:
        if o != "none":
            run, result = f"{PRETRAIN}/{o}/run/run.json", pretrain_settings(o).result()
            jobs.append(Finished("pretrain_chunk", run, "result", chunk_marker(o, 0), result, o, again))
    for r in expected_runs():
        given = finetune_given(
            task_source(r["task"]), setting_hparams(r["task"], r["setting"]), ft["precision"], ft["preset"]
        )
        label = f"{r['model']}/{r['task']}/{r['setting']}/seed{r['seed']}"
        jobs.append(
            Finished("finetune", f"{run_dir(r)}/{GIVEN}", "", f"{run_dir(r)}/metrics.json", given, label)
        )
    a = config["analysis"]
    for m in finetune_models():
        path = f"{R}/analysis/similarity/{m}.json"
        given = {
            "sentences": a["similarity_sentences"],
            "seed": a["similarity_seed"],
            "max_len": a["similarity_max_len"],
            "version": RESULT_VERSIONS["analysis"],
        }
        jobs.append(Finished("similarity", path, "given", path, given, m))
    return jobs


def defaults_summary():
    """Before anything runs: the keys that took the schema's default where config.yaml (the paper's
    experiment) gives another value; with a file merged over config.yaml (no --replace-workflow-config), none.
    """
    from tacl.config import defaults_unlike

    paper = Path(workflow.basedir).parent / "config.yaml"
    lines = defaults_unlike(UNSET_KEYS, config, yaml.safe_load(paper.read_text())) if paper.is_file() else []
    if lines:
        print(
            f"From the schema's defaults, unlike config.yaml (no config file sets them; a file given without "
            f"--replace-workflow-config is merged over config.yaml and keeps its values): {'; '.join(lines)}",
            file=sys.stderr,
        )


def rerun_summary():
    """Before anything runs (dry runs too): the finished work this run does again, and why (tacl.reruns)."""
    from tacl.reruns import summary

    text = summary(finished_jobs())
    if text:
        print(text, file=sys.stderr)


def print_summary():
    from tacl.cluster.hooks import data_summary

    line = data_summary(f"{DATA}/summary.json", R)
    if line:
        print(f"\n{line}")
