"""benchmarks/gpu_check.sh and benchmarks/pretrain_step.py without a GPU: the check's config is a valid
experiment, the script parses and names its steps in one list, the benchmark's model FLOPs are those a FLOP
counter sees on each family's model, and a tiny run of another family than BERT measures MLM and TaCL. (The script's
whole control flow runs on a CPU with TACL_GPU_CHECK_CPU=1, a few minutes on 2 cores: by hand, not in CI.)"""

import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest
import torch
import yaml

from conftest import MINILM, REPO, SHARED_DATA, needs_shared
from tacl.experiment.config import checked_config, load_schema

SCHEMA = REPO / "workflow" / "schemas" / "config.schema.yaml"
SCRIPT = REPO / "benchmarks" / "gpu_check.sh"


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
    subprocess.run(["bash", "-n", str(SCRIPT)], check=True)


def test_the_steps_are_one_list():
    """The steps the script runs by default, the ones its summary expects, the ones its header documents (in
    their order) and the ones it runs are the same."""
    text = SCRIPT.read_text()
    default = re.search(r"^STEPS=\$\{TACL_CHECK_STEPS:-([\w,]+)\}$", text, re.M).group(1).split(",")
    summary = re.search(r'os.environ.get\("TACL_CHECK_STEPS"\) or "([\w,]+)"', text).group(1).split(",")
    documented = re.findall(r"^#   \d\. (\w+) ", text, re.M)
    run = set(re.findall(r"^\s*step (\w+) ", text, re.M))
    assert default == summary == documented and run == set(default)
    assert "families" in default


def test_a_step_with_no_time_left_in_the_budget_is_not_started(tmp_path):
    """TACL_CHECK_BUDGET_S: a step that would get under 30 s of what is left is not started; the summary names
    it, and the call exits 0 (the steps it started passed). (The control flow of the steps that run: by hand,
    with TACL_GPU_CHECK_CPU=1.)"""
    env = {**os.environ, "TACL_GPU_CHECK_CPU": "1", "TACL_CHECK_STEPS": "doctor", "TACL_CHECK_BUDGET_S": "1"}
    proc = subprocess.run(["bash", str(SCRIPT), str(tmp_path)], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (tmp_path / "steps.tsv").read_text() == "doctor\tbudget\t0\n"
    assert "doctor: not started" in proc.stderr and not (tmp_path / "logs" / "doctor.log").exists()
    summary = (tmp_path / "summary.txt").read_text()
    assert "1. doctor    no time left (TACL_CHECK_BUDGET_S), 0 s" in summary
    assert summary.rstrip().endswith("gpu_check: the steps it started passed; no time left for doctor "
                                     "(TACL_CHECK_BUDGET_S)")


def benchmark():
    if str(REPO / "benchmarks") not in sys.path:
        sys.path.insert(0, str(REPO / "benchmarks"))
    import pretrain_step

    return pretrain_step


@pytest.mark.parametrize("name", ["bert", "roberta", "electra", "modernbert"])
def test_model_flops_are_what_a_flop_counter_counts(name):
    """One MLM step's model FLOPs (forward and backward, the head on the masked positions) as the benchmark
    counts them for its MFU, against torch's FLOP counter on the family's model (eager attention, so that
    every matmul is seen): within 3% (biases and norms, which the count includes and the counter does not).
    ModernBERT's gated feed-forward counted as a plain one (2 x hidden x intermediate per layer) would be 11%
    short here. (DeBERTa is left out: its relative embeddings' projections, once per micro-batch and layer and
    not counted, are most of a model this small; at base size 7% of a forward over 4 x 256 tokens, 0.2% over
    128 x 256.)"""
    from torch.utils.flop_counter import FlopCounterMode

    from tacl.objectives.encoders import encoder, mlm_logits
    from tacl.pretrain.model import random_model
    from tacl.runtime.family import FAMILIES
    from tacl.runtime.hub import load_tokenizer

    torch.manual_seed(0)
    model = random_model(FAMILIES[name], {"layers": 3, "hidden": 128, "heads": 2, "intermediate": 192},
                         load_tokenizer(MINILM))
    model.set_attn_implementation("eager")
    ids = torch.randint(1000, 2000, (2, 40))
    masked = torch.arange(0, ids.numel(), 20)
    with FlopCounterMode(display=False) as counter:
        hidden = encoder(model)(input_ids=ids).last_hidden_state.flatten(0, 1)
        logits = mlm_logits(model, hidden.index_select(0, masked))
        torch.nn.functional.cross_entropy(logits, ids.flatten()[masked]).backward()
    counted = benchmark().model_flops(model.config, np.full(2, 40), len(masked), teacher=False)
    assert counted == pytest.approx(counter.get_total_flops(), rel=0.03)


@needs_shared("wikipedia")
def test_a_tiny_run_of_another_family_measures_mlm_and_tacl(tmp_path):
    """--tiny --family roberta: shards of whole sentences, a random RoBERTa whose vocabulary is roberta-base's,
    MLM and TaCL timed (one step each after the warm-up), the reference left out."""
    out = tmp_path / "roberta.json"
    proc = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "pretrain_step.py"), "--tiny", "--family", "roberta",
         "--files", "1", "--steps", "1", "--global-batch", "4", "--sentence-splitter", "regex",
         "--wikipedia", str(SHARED_DATA / "wikipedia"), "--json", str(out)],
        capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    record = json.loads(out.read_text())
    assert record["complete"] and not record["failed"]
    assert (record["family"], record["form"], record["control"]) == ("roberta", "sentences", "mlm")
    assert record["model"] == {"vocab": 50265, "tokenizer_vocab": 30522, "vocab_of": "roberta-base",
                               "sizes_of": None}
    assert set(record["results"]) == {"mlm", "tacl"}
    assert all(r["tokens_per_s"] > 0 and r["flops_per_step"] > 0 for r in record["results"].values())
    assert "the reference's way" in proc.stdout and "tacl reference" not in proc.stdout
