# Helpers shared by all .smk files: paths derived from the config, and nothing else.
import json
import math
import os

# Every job runs `python -m tacl` from this checkout's src/ (installed or not, venv or --sdm conda).
REPO = os.path.abspath(os.path.join(workflow.basedir, ".."))
SRC = os.path.join(REPO, "src")
# (the prefix is formatted once more by Snakemake, hence the doubled braces)
shell.prefix(f"set -euo pipefail; export PYTHONPATH={SRC}${{{{PYTHONPATH:+:$PYTHONPATH}}}}; ")
# The software environment of every job with --sdm conda (a path relative to the repository root).
CONDA_ENV = os.path.join(REPO, config["conda_env"])

R = config["results_dir"]
DATA = f"{R}/data"
LOGS = f"{R}/logs"
BENCH = f"{R}/benchmarks"
SHARDS = [f"{k:05d}" for k in range(config["data"]["num_shards"])]
MODELS = f"{R}/models"
START = f"{MODELS}/start"
PRETRAIN = f"{R}/pretrain"


def tokenizer_name():
    return config["tokenizer"] or config["model"]


def data_outputs():
    return [f"{DATA}/shards/manifest.json", f"{DATA}/summary.json"]


def model_outputs():
    return [f"{MODELS}/{o}.json" for o in config["pretrain"]["objectives"]]


def train_settings(objective):
    """The trainer's settings for one objective, as JSON (see tacl.pretrain.settings)."""
    p = config["pretrain"]
    keys = ["steps", "global_batch", "micro_batch", "lr", "warmup_ratio", "weight_decay", "adam_eps",
            "adam_betas", "grad_clip", "zero_stage", "precision", "seed", "log_every", "checkpoint_minutes",
            "keep_checkpoints", "pad_to_max_len"]
    settings = {k: p[k] for k in keys}
    settings.update(objective=objective, max_len=config["data"]["max_len"],
                    objective_params=p.get(objective, {}))
    return json.dumps(settings, sort_keys=True)


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


def print_summary():
    path = f"{DATA}/summary.json"
    if os.path.exists(path):
        with open(path) as f:
            s = json.load(f)
        print(
            f"\nsummary ({R}): {s['documents']} documents, {s['sentences']} sentences, "
            f"{s['examples']} NSP examples, {s['tokens']} tokens in {s['shards']} shards"
        )
