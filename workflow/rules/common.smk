# Helpers shared by all .smk files: paths derived from the config (tacl.runtime.layout), and the wiring of what the
# package works out from it (tacl.experiment.design, tacl.planning.sizing, tacl.planning.plan, tacl.experiment.reruns,
# tacl.cluster.handlers) into the rules and handlers. What needs Snakemake's `workflow` or `checkpoints` stays here;
# the rest is tested.
import os
import shlex
import signal
import sys
from argparse import Namespace
from functools import cache, partial
from pathlib import Path

from tacl import RESULT_VERSIONS
from tacl.cluster import handlers
from tacl.cluster.hooks import data_summary, preflight, scheduler, scheduler_of_profile
from tacl.cluster.workstation import machine_gpus
from tacl.experiment import design
from tacl.experiment.inputs import input_errors
from tacl.runtime.layout import Layout
from tacl.experiment.reruns import finished_jobs as finished_of, rerun_tags, summary as rerun_text
from tacl.objectives.registry import OBJECTIVE_PATTERN
from tacl.planning.plan import announce, plan_jobs, plan_text as plan_text_of
from tacl.planning.sizing import Sizing
from tacl.pretrain.chain import chunks_present, final_marker
from tacl.report.expected import RECORD as REPORT_RECORD, write_expected as write_expected_of
from tacl.runtime.io import InputError
from tacl.runtime.outputs import damaged, remove_damaged

# Every job runs `python -m tacl` from this checkout's src/ (installed or not, venv or --sdm conda).
REPO = os.path.abspath(os.path.join(workflow.basedir, ".."))
SRC = os.path.join(REPO, "src")


def at_edge(function, *args):
    """A package function's InputError (a config that asks for the impossible) as Snakemake's own error."""
    try:
        return function(*args)
    except InputError as e:
        raise WorkflowError(str(e))


def workstation_gpus():
    """config `gpus` (profiles/workstation: one machine with several GPUs, no scheduler): the GPUs the jobs
    share, found once here; Snakemake's `gpu` resource is their number, so that it starts no more GPU jobs
    than fit, and each job takes GPUs of its own (tacl.cluster.workstation). None without `gpus`."""
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

L = Layout.of(config)
R = L.results
# The last step of every rule's command: its outputs recorded (tacl.runtime.outputs), so that a later run
# finds one damaged since its job wrote it (`damaged_outputs`) and makes it again.
RECORD_OUTPUTS = f" && python -m tacl.runtime.outputs {shlex.quote(R)} {{output:q}} --inputs {{input:q}}"
DATA = L.data
LOGS = L.logs
BENCH = L.benchmarks
SHARDS = [f"{k:05d}" for k in range(config["data"]["num_shards"])]
MODELS = L.models
START = L.start
PRETRAIN = L.pretrain
FINETUNE = L.finetune
REPORT = L.report
PUBLISH = L.publish
DATASETS_CACHE = f"{config['resources_dir']}/datasets"

# the config's impossible requests (torchrun across nodes, contrastive fine-tunes of a regression task), first
at_edge(design.check, config)

# what the config lists (tacl.experiment.design) and where each job writes (tacl.runtime.layout), as the rules
# call them
stamp = design.stamp
launcher = partial(design.launcher, config)
chunk_launch = partial(design.chunk_launch, config, L)
chunk_operational = partial(design.chunk_operational, config, L)
gpus_per_node = partial(design.gpus_per_node, config)
extra_models = partial(design.extra_models, config)
finetune_models = partial(design.finetune_models, config)
contrastive_models = partial(design.contrastive_models, config)
embeddings_enabled = partial(design.embeddings_enabled, config)
embeddings_source = partial(design.embeddings_source, config)
embeddings_outputs = partial(handlers.embeddings_outputs, config, L)
task_family = partial(design.task_family, config)
task_source = partial(design.task_source, config)
task_seeds = partial(design.task_seeds, config)
settings_of = partial(design.settings_of, config)
setting_hparams = partial(design.setting_hparams, config)
tasks_of = partial(design.tasks_of, config)
keeps_weights = partial(design.keeps_weights, config)
model_tasks = partial(design.model_tasks, config)
chunk_marker = L.chunk_marker
setting_dir = L.setting_dir
seeds_marker = L.seeds_marker
selection_file = L.selection_file

# what the jobs will cost (tacl.planning.sizing): the start model's size, looked up once, and the plan's GPU
SIZING = Sizing.of(config, L)


def operational(value):
    """A parameter that never decides a rerun: an operational setting (tacl.pretrain.settings: where, how
    fast, how often a job logs or saves), which changes no result. Snakemake reruns a finished job when its
    parameters change, but leaves out of that comparison a parameter computed by a function of the job's
    `resources` (a value derived from how the job runs): this is one. The profiles leave Snakemake's `code`
    trigger out, so the text of a command does not count either."""
    return lambda wildcards, resources: value


def chunk_arguments(wildcards, resources):
    """A chunk's operational arguments (design.chunk_operational) and its run's trackers beyond TensorBoard
    (design.tracking_option, with the plan's cost of the run): a function of the job's resources, as
    `operational`'s, so that neither decides a rerun."""
    o = wildcards.objective
    tracking = design.tracking_option(config, L, lambda: SIZING.run_cost(o))
    return f"{chunk_operational()} {tracking}".strip()


def finetune_tracking(wildcards, resources):
    """A fine-tuning job's `--tracking` (design.tracking_option: each seed's run, with the plan's cost of a
    seed); operational as chunk_arguments."""
    w = wildcards
    cost = lambda: SIZING.run_cost(model=w.model, task=w.task, setting=w.setting)
    return design.tracking_option(config, L, cost, model=w.model, task=w.task, setting=w.setting)


tokenizer_name = partial(design.tokenizer_name, config)
start_family_given = partial(design.start_family_given, config)
tokenizer_options = partial(design.tokenizer_options, config)
clean_language_given = partial(design.clean_language_given, config)
clean_options = partial(design.clean_options, config)


def data_outputs():
    return [L.manifest, L.data_summary]


def model_outputs():
    return [L.model_summary(o) for o in config["pretrain"]["objectives"]]


def train_settings(objective):
    """What a pretraining run computes (its result settings): the chunks' parameter, compared for a rerun."""
    return stamp(design.pretrain_settings(config, objective).result())


def chunk_resources():
    """Cluster resources of a chunk job, all from the config: one rank per GPU, `pretrain.ranks_per_node` GPUs
    on each of `pretrain.nodes` nodes (none with `device: cpu`), and the task geometry. torchrun: one task on
    one node with every rank's CPUs. srun: pretrain.ranks_per_node tasks on each node, each with
    pretrain.cpus_per_rank CPUs, and the job's command runs in the batch step (`mpi`), so that its own srun
    starts the ranks. Under PBS (torchrun, mpiexec, pbsdsh) cpus_per_task, gpu and mem_mb are per node. The
    runtime is sized to the work (tacl.planning.sizing), at most pretrain.chunk.runtime_minutes."""
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


def scheduler_now():
    """slurm | pbs | None: what the jobs of this run are submitted to (a SLURM job's own Snakemake too)."""
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


def chunk_runtime(wildcards):
    return SIZING.chunk_runtime(wildcards.objective, int(wildcards.chunk))


def finetune_runtime(wildcards):
    return SIZING.finetune_runtime(wildcards.model, wildcards.task, wildcards.setting)


def finetune_mem(wildcards):
    return SIZING.finetune_mem(wildcards.task, wildcards.setting)


def similarity_runtime(wildcards):
    return SIZING.similarity_runtime()


def chunk_minutes(wildcards, resources):
    """The chunk's own time limit: what it asked the scheduler for, or less where the config's runtime is
    not a whole number of minutes (a test's 15-second chunks)."""
    return min(config["pretrain"]["chunk"]["runtime_minutes"], resources.runtime)


def previous_chunk(wildcards):
    k = int(wildcards.chunk)
    return [] if k == 0 else [chunk_marker(wildcards.objective, k - 1)]


# the chunks of each run there when this Snakemake started: followed whatever pretrain.chunk.max_chunks says
CHUNKS_AT_START = {o: chunks_present(lambda k, o=o: chunk_marker(o, k)) for o in config["pretrain"]["objectives"]}


def final_chunk(wildcards):
    """Follow the chain of chunks until one reports done: as many jobs as the work needs, at most
    pretrain.chunk.max_chunks of them started by this run of the workflow (tacl.pretrain.chain)."""
    o = wildcards.objective
    get = lambda k: checkpoints.pretrain_chunk.get(objective=o, chunk=k).output[0]
    cap = config["pretrain"]["chunk"]["max_chunks"]
    return at_edge(final_marker, o, get, CHUNKS_AT_START.get(o, 0), cap)


def embeddings_files():
    """The sentence-embedding evaluation's input and output of a similarity job, when it runs
    (analysis.embeddings.enabled)."""
    if not embeddings_enabled():
        return {}, {}
    return (
        {"embeddings_data": L.embeddings_data},
        {"embeddings": L.embeddings("{model}")},
    )


def embeddings_args(wildcards, input, output):
    if not embeddings_enabled():
        return ""
    return f"--embeddings-data {input.embeddings_data} --embeddings-out {output.embeddings}"


def finetune_outputs():
    return [seeds_marker(m, t, setting) for m, t in model_tasks() for setting in settings_of(t)]


def selection_inputs(wildcards):
    """Every setting's seeds of one (model, task): the selection reads them all."""
    return [seeds_marker(wildcards.model, wildcards.task, setting) for setting in settings_of(wildcards.task)]


def finetune_start(wildcards):
    """What a fine-tune starts from: the exported model, or the selection of its finetune.start_from task."""
    return design.finetune_start(config, L, wildcards.model, wildcards.task)


def start_args(wildcards, input):
    if "selected" in input.keys():
        return f"--start-selection {input.selected}"
    return f"--model {input.model}"


def report_outputs():
    """The report rule's record (written by it alone), the plots and the submissions."""
    zips = [L.submissions(m) for m in finetune_models() + contrastive_models()]
    return [f"{REPORT}/report.md", f"{REPORT}/{REPORT_RECORD}", L.similarity_png, L.cls_png, *zips]


def intermediate_outputs():
    """What the jobs between the exported models and the report write (each setting's fine-tunes, each
    selection, each model's analyses): asked for by `all` itself. Snakemake deletes a failed job's outputs
    and does not make a missing output again while what was built from it is up to date; asked for here, the
    same command runs a failed job again, and what depends on it after."""
    selections = [selection_file(m, t) for m, t in model_tasks()]
    similarity = [L.similarity(m) for m in finetune_models()]
    return finetune_outputs() + selections + similarity + embeddings_outputs()


def chain_ends(wildcards):
    """The marker of each pretraining run's last chunk (final_chunk), asked for by `all` itself: a chunk that
    failed runs again even where an export of an earlier run of the chain is still there."""
    return [final_chunk(Namespace(objective=o)) for o in design.trained_objectives(config)]


def report_args(wildcards=None, input=None):
    """Arguments of `tacl report`, shared by the rule and the onerror handler (tacl.cluster.handlers)."""
    return handlers.report_args(config, L)


def write_expected():
    """onstart: what this results directory is to hold (RESULTS_DIR/expected.json), for `tacl report RESULTS_DIR`
    (tables from what has finished, at any time) and `tacl status`, which read files only."""
    write_expected_of(R, handlers.expected_of(config, L))


def damaged_outputs():
    """Before the plan: every output damaged since its job wrote it (tacl.runtime.outputs: a file of it
    missing, or of another size) is removed, one line each, and this run makes it again; a dry run only names
    them."""
    if workflow.dryrun:
        for paths, why in damaged(R):
            named = ", ".join(os.path.relpath(p, R) for p in paths)
            print(f"damaged since its job wrote it ({why}): {named}; a run makes it again", file=sys.stderr)
    else:
        remove_damaged(R, say=lambda line: print(line, file=sys.stderr))


def partial_report():
    """onerror: tables from whatever has finished, so one failure never hides the rest."""
    handlers.partial_report(config, L, SRC)


def cluster_preflight(dry_run=False):
    """The checks of the scheduler in use (tacl.cluster.hooks): onstart, before the first submission, and in
    a dry run (dry_run_checks)."""
    gpus = {name: gpus_per_node(name) for name in ("pretrain_chunk", "finetune", "similarity")}
    if dry_run:
        chunks = any(o != "none" for o in config["pretrain"]["objectives"])
    else:
        chunks = any(job.name == "pretrain_chunk" for job in workflow.dag.needrun_jobs())
    preflight(workflow, config["pretrain"], SIZING.config_runtimes(), launcher(), gpus, chunks, dry_run)


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


@cache
def finished_jobs():
    """The finished jobs and their recorded settings (tacl.experiment.reruns), made once: the plan and the rerun summary
    printed at start read each record once between them."""
    return finished_of(config, L)


@cache
def planned_jobs():
    """Every job of the experiment and whether it is to run (tacl.planning.plan), made once, for the plan and
    the inputs' check."""
    return plan_jobs(SIZING, rerun_tags(finished_jobs()))


def plan_text():
    """The plan printed before anything runs (tacl.planning.plan)."""
    return plan_text_of(SIZING, planned_jobs())


def print_plan():
    announce(plan_text())


def defaults_summary():
    """Before anything runs: the keys that took the schema's default where config.yaml (the paper's
    experiment) gives another value; with a file merged over config.yaml (no --replace-workflow-config), none.
    """
    announce(design.defaults_message(UNSET_KEYS, config, Path(workflow.basedir).parent / "config.yaml"))


def rerun_summary():
    """Before anything runs (dry runs too): the finished work this run does again, and why (tacl.experiment.reruns)."""
    announce(rerun_text(finished_jobs()))


def check_inputs():
    """Before any job (dry runs too), after the plan: the files and models the config names that a job still
    to run (planned_jobs) would not find (tacl.experiment.inputs), one line each, naming the key and the path."""
    missing = input_errors(config, planned_jobs())
    if missing:  # (without Snakemake's traceback)
        print("inputs not found (checked before any job ran):\n  " + "\n  ".join(missing), file=sys.stderr)
        sys.exit(1)


def print_summary():
    line = data_summary(L.data_summary, L.manifest, R)
    if line:
        print(f"\n{line}")
    handlers.track_report(config, L)  # (the report's tables to the trackers, once per report)
