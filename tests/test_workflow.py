"""The DAG: dry run of the paper config, lint, a real run of the demo, and config validation."""

import json
import os
import re

import pytest
import yaml

from conftest import REPO, demo_config, run_snakemake
from tacl.config import config_errors, load_schema

SCHEMA = REPO / "workflow" / "schemas" / "config.schema.yaml"
NO_NETWORK = {"HTTPS_PROXY": "http://127.0.0.1:9", "HTTP_PROXY": "http://127.0.0.1:9", "HF_HUB_OFFLINE": "1"}


def job_counts(stdout: str) -> dict[str, int]:
    table = stdout[stdout.index("Job stats:"):]
    return {m.group(1): int(m.group(2)) for m in re.finditer(r"^(\w+)\s+(\d+)\s*$", table, re.M)}


def test_paper_config_dry_run_lists_the_jobs(tmp_path, monkeypatch):
    for k, v in NO_NETWORK.items():
        monkeypatch.setenv(k, v)
    cfg = yaml.safe_load((REPO / "config.yaml").read_text())
    cfg["results_dir"] = str(tmp_path / "results")
    proc = run_snakemake(tmp_path, cfg, "-n")
    counts = job_counts(proc.stdout)
    assert counts["download_corpus"] == 1 and counts["fetch_tokenizer"] == 1 and counts["clean"] == 1
    assert counts["shard"] == cfg["data"]["num_shards"] == 64
    assert counts["gather_shards"] == 1
    assert not (tmp_path / "results").exists(), "a dry run writes nothing"


def test_lint_is_clean(tmp_path):
    proc = run_snakemake(tmp_path, demo_config(tmp_path), "--lint")
    assert "Congratulations, your workflow is in a good condition!" in proc.stdout + proc.stderr


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


@pytest.mark.slow
def test_demo_data_stage_runs_and_reruns_as_nothing_to_do(tmp_path):
    cfg = demo_config(tmp_path)
    run_snakemake(tmp_path, cfg, "--cores", "2", "--until", "gather_shards")
    data = tmp_path / "results" / "data"
    summary = json.loads((data / "summary.json").read_text())
    assert summary["shards"] == 2 and summary["examples"] > 1000 and summary["documents"] > 200
    from tacl.data.shards import ShardSet

    assert len(ShardSet(data / "shards" / "manifest.json")) == summary["examples"]
    assert sorted(os.listdir(tmp_path / "results" / "logs" / "data")) == [
        "clean.log", "download_corpus.log", "fetch_tokenizer.log", "gather_shards.log",
        "shard-00000.log", "shard-00001.log"]
    again = run_snakemake(tmp_path, cfg, "--cores", "2", "--until", "gather_shards", "-n")
    assert "Nothing to be done" in again.stdout + again.stderr
