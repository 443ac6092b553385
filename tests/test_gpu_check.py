"""benchmarks/gpu_check.sh without a GPU: its config is a valid experiment and the script parses. (Its whole
control flow runs on a CPU with TACL_GPU_CHECK_CPU=1, a few minutes on 2 cores: by hand, not in CI.)"""

import subprocess

import yaml

from conftest import REPO
from tacl.experiment.config import checked_config, load_schema

SCHEMA = REPO / "workflow" / "schemas" / "config.schema.yaml"


def test_the_gpu_check_config_is_a_valid_experiment():
    from snakemake.utils import validate

    cfg = yaml.safe_load((REPO / "examples" / "gpu" / "config.yaml").read_text())
    assert checked_config(cfg, load_schema(SCHEMA), lambda c: validate(c, str(SCHEMA), set_default=True)) == []
    assert cfg["device"] == "cuda" and cfg["data"]["sentence_splitter"] == "regex"
    assert cfg["pretrain"]["zero_stage"] == 0 and cfg["pretrain"]["precision"] == "bf16"
    assert cfg["pretrain"]["steps"] > cfg["pretrain"]["chunk"]["max_steps"], "two chunks: a resume on the GPU"
    paths = [*cfg["data"]["source"]["paths"], cfg["finetune"]["glue_source"]["data_dir"],
             *(v for k, v in cfg["finetune"]["squad_source"].items() if k != "kind" and v)]
    assert all(p.startswith("examples/") and list(REPO.glob(p)) for p in paths), "data that ships in examples/"


def test_the_script_parses():
    subprocess.run(["bash", "-n", str(REPO / "benchmarks" / "gpu_check.sh")], check=True)
