# Helpers shared by all .smk files: paths derived from the config, and nothing else.
import json
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


def tokenizer_name():
    return config["tokenizer"] or config["model"]


def data_outputs():
    return [f"{DATA}/shards/manifest.json", f"{DATA}/summary.json"]


def print_summary():
    path = f"{DATA}/summary.json"
    if os.path.exists(path):
        with open(path) as f:
            s = json.load(f)
        print(
            f"\nsummary ({R}): {s['documents']} documents, {s['sentences']} sentences, "
            f"{s['examples']} NSP examples, {s['tokens']} tokens in {s['shards']} shards"
        )
