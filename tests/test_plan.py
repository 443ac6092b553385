"""What a run will cost and what it asks for: the plan printed before anything runs, the runtimes sized to
the work, the seeds of a setting packed into one job, GPUs from the config, the scheduler's checks in a dry
run, and the checkpoints removed after an export."""

from __future__ import annotations

import json
import math
import os
import re
import signal
import subprocess
import sys
import time

import pytest
import yaml

from conftest import REPO, demo_config, run_snakemake, run_tacl, silent_schedulers
from tacl.experiment import design
from tacl.planning.estimates import BERT_BASE, Gpu, chunk_requests, finetune_minutes, pretrain_minutes, request
from tacl.runtime.shape import Shape

A100 = Gpu("A100 40 GB", 312, 0.3, 0.2)
PLAN = {"safety": 2.0, "startup_minutes": 5, "min_runtime_minutes": 15}
NO_NETWORK = {"HTTPS_PROXY": "http://127.0.0.1:9", "HTTP_PROXY": "http://127.0.0.1:9", "HF_HUB_OFFLINE": "1"}


def test_expected_minutes_by_hand():
    """BERT-base: 85,054,464 encoder parameters; a TaCL run of config.yaml's size on 4 A100s and five RTE
    seeds, against the count written out by hand (6 N + attention per trained token, 2 N + a third of the
    attention per forward-only one, the MLM head on 15% of the positions)."""
    bert = Shape(**BERT_BASE)
    n = 12 * (4 * 768 * 768 + 4 * 768 + 2 * 768 * 3072 + 3072 + 768 + 4 * 768)
    assert bert.encoder == n == 85_054_464
    seq, tokens = 176.0, 150_000 * 256 * 176
    per_token = (6 * n + 12 * 12 * 768 * seq) + 6 * (768 * 768 + 768 * 30522) * 0.15 + (2 * n + 4 * 12 * 768 * seq)
    pretrain = {"steps": 150_000, "global_batch": 256, "nodes": 1, "ranks_per_node": 4}
    assert pretrain_minutes("tacl", pretrain, bert, seq, A100) == pytest.approx(
        tokens * per_token / (4 * 312e12 * 0.3) / 60)
    # RTE's typical length under max_len 128: random batches (the default) carry 48% padding, grouped 9%
    for seq, grouped in ((min(128, 70 / (1 - 0.48)), False), (70 / (1 - 0.09), True)):
        work = 2490 * 3 * seq * (6 * n + 12 * 12 * 768 * seq) + (277 + 3000) * seq * (2 * n + 4 * 12 * 768 * seq)
        assert finetune_minutes("rte", {"max_len": 128, "epochs": 3, "group_by_length": grouped}, 5, bert,
                                A100) == pytest.approx(5 * work / (312e12 * 0.2) / 60)


# Tiny configs of every family, each key the counts read set away from the family's default somewhere
TINY = {"vocab_size": 101, "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 48,
        "max_position_embeddings": 64}
MODERN_IDS = {"pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2, "cls_token_id": 3, "sep_token_id": 4,
              "mask_token_id": 5}  # (ModernBERT's special tokens must lie inside its vocabulary)
FAMILY_CONFIGS = [
    ("bert", {"type_vocab_size": 3}),
    ("roberta", {"type_vocab_size": 1, "pad_token_id": 1}),
    ("xlm-roberta", {"type_vocab_size": 1, "tie_word_embeddings": False}),
    ("deberta-v2", {"type_vocab_size": 0}),
    ("deberta-v2", {"type_vocab_size": 0, "relative_attention": True, "position_buckets": 16, "pos_att_type": "p2c|c2p",
                    "position_biased_input": False, "share_att_key": True, "norm_rel_ebd": "layer_norm"}),
    ("deberta-v2", {"type_vocab_size": 2, "relative_attention": True, "pos_att_type": ["c2p"], "share_att_key": False,
                    "embedding_size": 24, "conv_kernel_size": 3}),
    ("electra", {"embedding_size": 16}),
    ("electra", {"embedding_size": 32, "tie_word_embeddings": False}),
    ("modernbert", MODERN_IDS),
    ("modernbert", {**MODERN_IDS, "attention_bias": True, "mlp_bias": True, "norm_bias": True, "classifier_bias": True,
                    "decoder_bias": False}),
]


def test_the_shape_of_each_family_counts_the_parameters_transformers_builds():
    """For a tiny config of every family (and variants of the keys that change the count: ELECTRA's and
    DeBERTa's narrower embeddings, DeBERTa's relative positions, ModernBERT's biases, untied projections),
    Shape's count equals the parameters of the masked-LM model transformers builds from it; BERT's start
    model (BertForPreTraining) adds the pooler and the NSP classifier. The defaults Shape takes for keys a
    config leaves out are transformers' config classes'."""
    from transformers import AutoConfig, AutoModelForMaskedLM, BertForPreTraining

    from tacl.runtime.shape import DEFAULTS

    for family, keys in FAMILY_CONFIGS:
        config = AutoConfig.for_model(family, **TINY, **keys)
        eager = {"attn_implementation": "eager"} if family == "deberta-v2" else {}  # (it has no SDPA)
        built = AutoModelForMaskedLM.from_config(config, **eager)
        shape = Shape.of_config(config.to_dict())
        assert shape.masked_lm == sum(p.numel() for p in built.parameters()), (family, keys)
        assert shape.total == shape.masked_lm or family == "bert"
    bert = AutoConfig.for_model("bert", **TINY)
    assert Shape.of_config(bert.to_dict()).total == sum(p.numel() for p in BertForPreTraining(bert).parameters())
    for family, defaults in DEFAULTS.items():
        config = AutoConfig.for_model(family)
        assert {k: getattr(config, k) for k in defaults if hasattr(config, k)} == {
            k: v for k, v in defaults.items() if hasattr(config, k)}, family
    assert Shape.of_config({"num_hidden_layers": 12, "hidden_size": 768, "intermediate_size": 3072}).total == (
        110_106_428)  # bert-base-uncased's BertForPreTraining


def test_the_mlm_head_computes_on_the_masked_share_of_the_family_or_the_config():
    """The MLM head (transform and vocabulary projection: XLM-R's 250k words make it a third of a step) counts
    6 FLOPs per weight on the masked positions only: pretrain.mlm_probability of them, else the family's rate
    (ModernBERT's 30%). The published configs give the plan the example models' sizes before a download."""
    from tacl.planning.estimates import masked_share, pretrain_flops_per_token
    from tacl.runtime.shape import PUBLISHED_CONFIGS

    xlmr = Shape.of_config(PUBLISHED_CONFIGS["xlm-roberta-base"])
    assert xlmr.head == 768 * 768 + 768 * 250002 and xlmr.encoder == Shape(**BERT_BASE).encoder
    seq = 176.0
    at = {p: pretrain_flops_per_token("mlm", xlmr, seq, {}, p) for p in (0.15, 0.4)}
    assert at[0.4] - at[0.15] == pytest.approx(6 * xlmr.head * 0.25)
    assert at[0.15] == pytest.approx(6 * xlmr.encoder + 12 * 12 * 768 * seq + 6 * xlmr.head * 0.15)
    modern = Shape.of_config(PUBLISHED_CONFIGS["answerdotai/ModernBERT-base"])
    assert masked_share({}, modern) == 0.30 and masked_share({"mlm_probability": 0.2}, modern) == 0.2
    assert masked_share({}, xlmr) == 0.15
    assert modern.encoder == 22 * (4 * 768 * 768 + 3 * 768 * 1152 + 2 * 768)  # (GLU: Wi is 768 x 2 x 1152)
    # DeBERTa-v3: the relative position terms (c2p, p2c: a score per relative position of 2 x 256) on top
    deberta = Shape.of_config(PUBLISHED_CONFIGS["microsoft/deberta-v3-base"])
    assert deberta.attention_flops(seq) == 12 * (4 * 768 * seq + 2 * 2 * 512 * 768)
    assert deberta.positions == 0 and deberta.type_vocab == 0 and deberta.relative == 512
    assert pretrain_minutes("mlm", {"steps": 10, "global_batch": 8, "nodes": 1, "ranks_per_node": 1,
                                    "mlm_probability": 0.4}, xlmr, seq, A100) == pytest.approx(
        10 * 8 * seq * at[0.4] / (312e12 * 0.3) / 60)


def test_requests_and_chunks():
    assert request(2.0, PLAN) == 15  # the floor
    assert request(100.0, PLAN) == 205 and request(100.0, PLAN, cap=120) == 120
    assert request(100.0, {**PLAN, "safety": 1.0}) == 130  # never within 20% of the expected time (x 1.25)
    chunk = {"runtime_minutes": 1410, "margin_minutes": 10, "max_chunks": 20, "max_steps": None}
    pretrain = {"steps": 1000, "chunk": chunk}
    assert chunk_requests(219.0, pretrain, PLAN, cpu=False) == [(5 + 10 + 438, 219.0, "target")]
    long = chunk_requests(1500.0, pretrain, PLAN, cpu=False)  # more than a chunk holds: the chain goes on
    assert [asked for asked, _, _ in long] == [1410, 5 + 10 + 2 * 105]
    assert sum(w for _, w, _ in long) == pytest.approx(1500.0) and long[0][1] == pytest.approx(1410 - 5 - 10)
    assert [ends for _, _, ends in long] == ["deadline", "target"]
    capped = chunk_requests(100.0, {"steps": 1000, "chunk": {**chunk, "max_steps": 250}}, PLAN, cpu=False)
    assert len(capped) == 4 and all(w == pytest.approx(25.0) for _, w, _ in capped)
    assert [ends for _, _, ends in capped] == ["max_steps"] * 3 + ["target"]


def test_a_fine_tune_keeps_time_to_save_every_seed_it_trains_at_once():
    """BERT-base's fine-tuning checkpoint (fp32 weights and AdamW's two moments: the 1.3 GB docs/finetuning.md
    names); the margin before a job's end: 30 s and every seed's save at 100 MB/s, or at the pace a save was
    measured where slower; the plan says it for config.yaml's jobs (5 seeds, 3 at once at most)."""
    from tacl.finetune import finetune_checkpoint_bytes, save_margin_s
    from tacl.planning.plan import stops_before_limit

    one = finetune_checkpoint_bytes(Shape(**BERT_BASE).total)
    assert 1.3e9 < one < 1.35e9
    assert save_margin_s(one, 4) == pytest.approx(30 + 4 * one / 100e6) and 82 < save_margin_s(one, 4) < 84
    assert save_margin_s(one, 1, measured_s=60.0) == 90.0 and save_margin_s(one, 2, measured_s=1.0) < 60

    class Sizing:  # (what stops_before_limit reads)
        config = yaml.safe_load((REPO / "config.yaml").read_text())
        shape = Shape(**BERT_BASE)

    line = stops_before_limit(Sizing(), 3)
    assert "a pretraining chunk 10 min (pretrain.chunk.margin_minutes)" in line
    assert "a fine-tune 70 s and a step and a half before it (3 seeds' checkpoints of 1.3 GB at 100 MB/s" in line


def test_a_fine_tune_asks_for_the_time_it_keeps_to_save(tmp_path):
    """The runtime a fine-tuning job asks for holds its save margin beside start-up and the safety factor's
    share, as a chunk's holds its margin: the job never plans to stop before its work is done."""
    from snakemake.utils import validate

    from tacl.experiment.config import SCHEMA
    from tacl.experiment.design import settings_of
    from tacl.runtime.layout import Layout
    from tacl.finetune import finetune_checkpoint_bytes, save_margin_s
    from tacl.planning.estimates import MIN_SAFETY
    from tacl.planning.sizing import Sizing

    config = yaml.safe_load((REPO / "config.yaml").read_text())
    validate(config, str(SCHEMA), set_default=True)
    sizing = Sizing.of(config, Layout(str(tmp_path)))
    plan = config["plan"]
    for task in ("rte", "mnli"):
        setting = settings_of(config, task)[0]
        expected = sizing.finetune_expected("tacl", task, setting)
        save = save_margin_s(finetune_checkpoint_bytes(sizing.shape.total), sizing.seeds_at_once(task)) / 60
        wanted = plan["startup_minutes"] + save + max(plan["safety"], MIN_SAFETY) * expected
        assert sizing.finetune_runtime("tacl", task, setting) == math.ceil(max(plan["min_runtime_minutes"], wanted))
        assert save > 1.0  # (BERT-base: over a minute for its seeds at once)


def test_the_plan_counts_chunks_that_end_on_their_deadline_as_at_least_and_changed_jobs_as_to_run():
    """A rule with chunks estimated to end on their deadline, still to run, counts "at least" (>=), and so do
    the jobs in all; chunks that end on their step count, or are done, count as they are. A job whose output
    is there but made with settings that changed (done False, as the workflow marks it) is to run."""
    from tacl.planning.estimates import Disk, Job, format_plan

    def table(jobs):
        text = format_plan(jobs, [], Disk({"x": 1e9}), [], {})
        rows = {m.group(1): m.group(2, 3) for m in re.finditer(r"^  (\w+) +(\S+) +(\S+)", text, re.M)}
        return rows, re.search(r"^  jobs: .*$", text, re.M).group(0), text

    def chunk(done, ends):
        return Job("pretrain_chunk", "gpu", 1, 60, 50.0, done, "tacl", 5.0, open_ended=ends == "deadline" and not done)

    rerun = Job("finetune", "gpu", 1, 20, 10.0, False, "tacl/rte", finetune=True)  # (its output there, lr changed)
    jobs = [chunk(True, "deadline"), chunk(False, "deadline"), chunk(False, "target"), rerun,
            Job("finetune", "gpu", 1, 20, 10.0, True, "none/rte", finetune=True), Job("all", "login")]
    rows, total, text = table(jobs)
    assert rows["pretrain_chunk"] == (">=3", ">=2") and rows["finetune"] == ("2", "1")
    assert total == "  jobs: at least 6 (5 with GPUs, 0 without, 1 on this machine; 4 to run)"
    assert ">=: pretraining chunks estimated to end on their deadline" in text
    rows, total, text = table([chunk(True, "deadline"), chunk(False, "max_steps"), chunk(False, "target")])
    assert rows["pretrain_chunk"] == ("3", "2") and total.startswith("  jobs: 3 (") and ">=" not in text


def dry_run_jobs(text: str) -> list[tuple[str, dict[str, str]]]:
    """(rule, resources) of every job a dry run lists."""
    jobs = []
    for block in re.split(r"\n(?=(?:local)?(?:rule|checkpoint) \w+:)", text):
        m = re.match(r"(?:local)?(?:rule|checkpoint) (\w+):", block)
        r = re.search(r"^\s+resources: (.*)$", block, re.M)
        if m and r:
            jobs.append((m.group(1), dict(kv.split("=", 1) for kv in r.group(1).split(", "))))
    return jobs


@pytest.mark.slow
def test_the_plan_of_the_paper_config_adds_up(tmp_path, monkeypatch):
    """config.yaml's dry run: the plan's jobs per rule equal the job list, its GPU-hours asked for equal the
    sum over the listed jobs of runtime x GPUs, asked / expected is at most 3, and each small task takes
    one job per (model, task, setting), whatever its seeds."""
    for k, v in NO_NETWORK.items():
        monkeypatch.setenv(k, v)
    cfg = yaml.safe_load((REPO / "config.yaml").read_text())
    cfg["results_dir"] = str(tmp_path / "results")
    proc = run_snakemake(tmp_path, cfg, "-n")
    out = proc.stderr + proc.stdout
    plan = out[out.index("Plan of this run"):]
    rows = {m.group(1): (int(m.group(2)), m.group(3)) for m in re.finditer(
        r"^  (\w+)\s+(\d+)\s+\d+\s+([\d.]+)?", plan[:plan.index("  jobs:")], re.M)}
    stats = out[out.index("Job stats:"):]
    listed = {m.group(1): int(m.group(2)) for m in re.finditer(r"^(\w+)\s+(\d+)\s*$", stats, re.M)
              if m.group(1) != "total"}
    assert {rule: n for rule, (n, _) in rows.items()} == listed
    models, tasks = 4, len(cfg["finetune"]["tasks"])
    assert listed["finetune"] == models * tasks  # one job per (model, task, setting): 5 or 3 seeds inside

    asked: dict[str, float] = {}
    for rule, resources in dry_run_jobs(out):
        if "gpu" in resources:
            asked[rule] = asked.get(rule, 0.0) + int(resources["gpu"]) * int(resources["runtime"]) / 60
    for rule in ("pretrain_chunk", "finetune", "similarity"):
        assert float(rows[rule][1]) == pytest.approx(asked[rule], abs=0.05), rule
    m = re.search(r"GPU-hours requested: ([\d.]+) .*expected: ([\d.]+) on A100 40 GB.*requested / expected: "
                  r"([\d.]+)x", plan)
    requested, expected, ratio = (float(x) for x in m.groups())
    assert requested == pytest.approx(sum(asked.values()), abs=0.1)
    assert ratio <= 3.0 and requested / expected == pytest.approx(ratio, abs=0.05)
    assert "longest chain:" in plan and "disk at the peak:" in plan and "checkpoints (3 x 3)" in plan
    # the figures README.md and docs/clusters.md quote (tacl.planning.figures): this plan's
    from tacl.planning.figures import paper_plan

    jobs = re.search(r"^  jobs: (\d+) \((\d+) with GPUs", plan, re.M).groups()
    disk = re.search(r"^  disk at the peak: (\S+ [GM]B)", plan, re.M).group(1)
    assert paper_plan().startswith(f"{jobs[0]} jobs, {jobs[1]} of them on GPUs; {requested:.1f} GPU-hours asked for "
                                   f"against {expected:.1f} expected on A100 40 GB (")
    assert paper_plan().endswith(f"; {disk} of disk at the peak")
    assert "From the schema's defaults" not in out, "config.yaml's own values: nothing taken from the defaults"


@pytest.mark.slow
def test_a_profile_gpu_count_and_an_unset_variable_fail_a_dry_run(tmp_path, monkeypatch):
    """The chunk's GPUs follow pretrain.ranks_per_node; a profile that gives it others is named in a dry run,
    beside the config key, as is a SLURM variable left unset."""
    for k, v in {**NO_NETWORK, "TACL_SLURM_ACCOUNT": "p123", "TACL_SLURM_GPU_PARTITION": "gpu"}.items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("TACL_SLURM_CPU_PARTITION", raising=False)
    profile = yaml.safe_load((REPO / "profiles" / "slurm" / "config.yaml").read_text())
    profile["set-resources"]["pretrain_chunk"]["gres"] = "'gpu:4'"
    (tmp_path / "profile").mkdir()
    (tmp_path / "profile" / "config.yaml").write_text(yaml.safe_dump(profile))
    cfg = yaml.safe_load((REPO / "config.yaml").read_text())
    cfg["results_dir"] = str(tmp_path / "results")
    cfg["pretrain"]["ranks_per_node"] = 1
    proc = run_snakemake(tmp_path, cfg, "--profile", str(tmp_path / "profile"), "-n", check=False)
    assert proc.returncode != 0 and "SLURM preflight: this dry run stops here." in proc.stderr, proc.stderr[-3000:]
    assert ("rule pretrain_chunk: the profile gives each of its 1 node(s) 4 GPU(s) (gres gpu:4), but "
            "pretrain.ranks_per_node is 1 (one rank per GPU); make them agree") in proc.stderr
    assert ("rules clean, shard, export_model: slurm_partition is '${TACL_SLURM_CPU_PARTITION}': export the "
            "variable") in proc.stderr


def finished_by_hand(root, cfg: dict) -> None:
    """Every output a dry run of `cfg` lists, made by hand with one modification time (a folder where the
    path has no suffix; each pretraining run done in one chunk; the task sizes the plan reads): the demo as
    Snakemake sees it once it has finished, in seconds (without Snakemake's metadata: a change reruns what
    its new or missing outputs make it rerun)."""
    listed = run_snakemake(root, cfg, "-n").stdout
    steps = cfg["pretrain"]["steps"]
    for output in (o for m in re.finditer(r"^    output: (.*)$", listed, re.M) for o in m.group(1).split(", ")):
        path = root / output
        if path.suffix == "":
            path.mkdir(parents=True, exist_ok=True)
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        text = {}
        if re.search(r"/chunk-\d+\.json$", output):
            text = {"done": True, "step": steps, "steps": steps, "steps_this_chunk": steps, "reason": "target"}
        elif "/finetune_data/" in output:
            text = {"splits": {"train": 100, "dev": 50}}
        path.write_text(json.dumps(text))
    for path in (root / "results").rglob("*"):
        os.utime(path, (1.7e9, 1.7e9))


def plan_and_jobs(proc) -> tuple[dict[str, int], dict[str, int]]:
    """(jobs to run per rule, by the plan) and (per rule, by Snakemake's job stats) of a dry run, rules with
    none left out."""
    plan = proc.stderr[proc.stderr.index("Plan of this run"):]
    rows = {m.group(1): int(m.group(2)) for m in re.finditer(r"^  (\w+) +\d+ +(\d+)", plan, re.M)}
    stats = proc.stdout[proc.stdout.index("Job stats:"):] if "Job stats:" in proc.stdout else ""
    listed = {m.group(1): int(m.group(2)) for m in re.finditer(r"^(\w+)\s+(\d+)\s*$", stats, re.M)}
    return {r: n for r, n in rows.items() if n}, {r: n for r, n in listed.items() if r != "total"}


@pytest.mark.slow
def test_the_plans_to_run_are_the_jobs_snakemake_runs(tmp_path):
    """The demo's config (its sweep and extra model too), finished: nothing to run, by the plan and by
    Snakemake. After a fine-tuning learning rate changes (SQuAD's: a new setting), and after a model's export
    is lost, the plan's 'to run' per rule equals the jobs Snakemake runs: every job downstream included (the
    selections, the submissions, the analyses, the report and `all`)."""
    cfg = demo_config(tmp_path)
    shipped = yaml.safe_load((REPO / "examples/demo/config.yaml").read_text())["finetune"]
    cfg["finetune"].update(extra_models=shipped["extra_models"], sweep=shipped["sweep"])
    finished_by_hand(tmp_path, cfg)
    proc = run_snakemake(tmp_path, cfg, "-n")
    assert "Nothing to be done" in proc.stdout + proc.stderr and plan_and_jobs(proc) == ({}, {})
    cfg["finetune"]["hparams"]["squad"]["lr"] *= 3
    planned, listed = plan_and_jobs(run_snakemake(tmp_path, cfg, "-n"))
    models = len(design.finetune_models(cfg))  # (every model but mlm_nsp+scl fine-tunes SQuAD)
    assert planned == listed == {"finetune": models, "select_setting": models, "submissions": models, "report": 1,
                                 "all": 1}
    (tmp_path / "results/models/tacl.json").unlink()
    planned, listed = plan_and_jobs(run_snakemake(tmp_path, cfg, "-n"))
    assert planned == listed and listed["export_model"] == 1 and listed["similarity"] == 1, (planned, listed)


def finetune_args(demo_data, out, *seeds, hparams=None):
    source = json.dumps({"kind": "tsv", "data_dir": str(REPO / "examples/demo/glue")})
    hp = json.dumps(hparams or {"max_len": 32, "batch": 8, "lr": 1e-4, "epochs": 1, "max_train_examples": 24,
                                "max_eval_examples": 16})
    return ["finetune", "glue", "--model", str(demo_data["start"]), "--task", "qnli", "--source", source,
            "--hparams", hp, "--out", str(out), *seeds]


def signal_pending(pid: int, sig: int) -> bool:
    """Whether `sig` waits to be delivered to process `pid` (a stopped one: /proc's ShdPnd)."""
    status = dict(line.split(":\t", 1) for line in open(f"/proc/{pid}/status").read().splitlines() if ":\t" in line)
    return bool(int(status["ShdPnd"], 16) >> (sig - 1) & 1)


def process_state(pid: int) -> str:
    """/proc's state letter of a process (R, S, T, Z: ended, not yet reaped), or 'gone'."""
    try:
        return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "gone"


@pytest.mark.slow
def test_seeds_one_after_the_other_or_side_by_side_resume_per_seed_and_agree(demo_data, tmp_path):
    """Seeds 0 and 1 of a setting in one job, one after the other, killed once seed 0 has finished: run again,
    it keeps seed 0 and trains seed 1 only.

    The same seeds side by side (`--seeds-per-gpu 2`, finetune.seeds_per_gpu), each in its own process (the
    command of a job of that seed alone) on its share of the cores: SIGTERM to the job while both train (each
    caught, with SIGSTOP, once it has saved a checkpoint, and let go once the job has passed the signal on): each
    seed saves at its next step and stops, the job says so in one line, exit status 3, no marker. Run again, both
    go on from their checkpoints; killed outright this time (kill -9 of the job's process alone, each seed
    caught once it has saved again), its seeds end with it (Linux's parent-death signal: each saves and stops
    within seconds, not training on as an orphan). Run once more, both go on from their checkpoints and the
    marker lists both. Each seed's metrics (its dev scores and final loss, bit for bit) equal those of the seed
    trained in the job one after the other, uninterrupted."""
    hp = {"max_len": 32, "batch": 4, "lr": 1e-4, "epochs": 1, "max_train_examples": 96, "max_eval_examples": 16}
    root, marker = tmp_path / "setting", tmp_path / "setting" / "seeds.json"
    sequential = finetune_args(demo_data, root, "--seeds", "0", "1", "--marker", str(marker), hparams=hp)
    first = subprocess.Popen([sys.executable, "-m", "tacl", *sequential, "--seeds-per-gpu", "1"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    try:
        deadline = time.time() + 300
        while not (root / "seed0" / "metrics.json").is_file():
            assert first.poll() is None, first.communicate()[1][-3000:]
            assert time.time() < deadline
            time.sleep(0.05)
    finally:
        os.killpg(first.pid, signal.SIGKILL)
        first.wait()
    assert not marker.exists() and not (root / "seed1" / "metrics.json").exists()
    seed0 = (root / "seed0" / "metrics.json").read_bytes()
    proc = run_tacl(*sequential, "--seeds-per-gpu", "1")
    assert "seed 0: done before with these settings and this start model" in proc.stderr
    assert (root / "seed0" / "metrics.json").read_bytes() == seed0, "seed 0 was not trained again"
    record = json.loads(marker.read_text())
    assert record["runs"] == [str(root / f"seed{s}" / "metrics.json") for s in (0, 1)]
    assert len(set(record["metrics_sha256"])) == 2, "each seed's metrics hashed into the marker"
    given = json.loads((root / "seed1" / "given.json").read_text())
    assert given["hparams"]["max_train_examples"] == 96 and len(given["model_sha256"]) == 32

    side, marker = tmp_path / "side", tmp_path / "side" / "seeds.json"
    args = [*finetune_args(demo_data, side, "--seeds", "0", "1", "--marker", str(marker), hparams=hp),
            "--checkpoint-minutes", "1e-9", "--seeds-per-gpu", "2"]  # (a checkpoint at every step)
    job = subprocess.Popen([sys.executable, "-m", "tacl", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           text=True, start_new_session=True)
    held = {}
    try:
        deadline = time.time() + 300
        while len(held) < 2:
            assert job.poll() is None and time.time() < deadline, job.communicate()[1][-3000:]
            for seed in {0, 1} - held.keys():
                folder = side / f"seed{seed}"
                if (folder / "checkpoint.pt").is_file():  # (its process holds the seed's lock: its pid)
                    held[seed] = json.loads((folder / "LOCK").read_text())["pid"]
                    os.kill(held[seed], signal.SIGSTOP)
            time.sleep(0.01)
        job.send_signal(signal.SIGTERM)
        while not all(signal_pending(pid, signal.SIGTERM) for pid in held.values()):
            assert time.time() < deadline
            time.sleep(0.05)
    finally:
        for pid in held.values():
            os.kill(pid, signal.SIGCONT)
        out, err = job.communicate(timeout=300)
    assert job.returncode == 3, err[-3000:]
    assert err.strip().splitlines()[-1] == (
        "tacl: stopped: stopped by SIGTERM: seed(s) [0, 1] not finished; running the job again goes on with them, "
        "each from its checkpoint where it has one")
    for seed in (0, 1):
        # (no scheduler here, and the affinity mask is the whole machine: not pinned, threads only)
        assert re.search(rf"seed {seed}: started, process {held[seed]} with \d+ threads?, nothing pinned", err)
        assert re.search(rf"\[seed {seed}\] .*stopped by SIGTERM at step \d+/24", err), err[-3000:]
        assert (side / f"seed{seed}" / "checkpoint.pt").is_file()
        assert not (side / f"seed{seed}" / "metrics.json").exists()
    assert not marker.exists()
    # run again, and this time the job's process killed outright (kill -9 of it alone) once each seed has saved
    # again: SIGTERM waits for each seed (Linux's parent-death signal); let go, each saves at its next step and
    # its process ends within seconds, the seed not finished
    saved = {seed: (side / f"seed{seed}" / "checkpoint.pt").stat().st_mtime_ns for seed in (0, 1)}
    job = subprocess.Popen([sys.executable, "-m", "tacl", *args], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                           text=True, start_new_session=True)
    held, pending = {}, {}
    try:
        while len(held) < 2:
            assert job.poll() is None and time.time() < deadline, job.communicate()[1][-3000:]
            for seed in {0, 1} - held.keys():
                folder = side / f"seed{seed}"
                if (folder / "checkpoint.pt").stat().st_mtime_ns != saved[seed]:
                    held[seed] = json.loads((folder / "LOCK").read_text())["pid"]
                    os.kill(held[seed], signal.SIGSTOP)
            time.sleep(0.01)
        job.kill()
        job.wait()  # (its children's parent-death signals are sent before it can be waited for)
        pending = {seed: signal_pending(pid, signal.SIGTERM) for seed, pid in held.items()}
    finally:
        job.kill()
        for pid in held.values():  # (let go; killed where nothing would end them)
            os.kill(pid, signal.SIGCONT if pending and all(pending.values()) else signal.SIGKILL)
    assert pending == {0: True, 1: True}, "SIGTERM waits for each seed once its job is gone"
    ends = time.time() + 60
    while any(process_state(pid) not in ("Z", "gone") for pid in held.values()):
        assert time.time() < ends, {pid: process_state(pid) for pid in held.values()}
        time.sleep(0.05)
    for seed in (0, 1):
        assert (side / f"seed{seed}" / "checkpoint.pt").stat().st_mtime_ns != saved[seed]
        assert not (side / f"seed{seed}" / "metrics.json").exists(), f"seed {seed} trained on without its job"
    again = run_tacl(*args)
    for seed in (0, 1):
        assert re.search(rf"\[seed {seed}\] .*fine-tune: resumed from .*seed{seed}/checkpoint.pt at step", again.stderr)
    assert json.loads(marker.read_text())["runs"] == [str(side / f"seed{s}" / "metrics.json") for s in (0, 1)]
    for seed in (0, 1):
        got, want = (json.loads((d / f"seed{seed}" / "metrics.json").read_text()) for d in (side, root))
        assert len(got["train"]["resumed_at"]) == 2 and not want["train"]["resumed_at"]
        assert got["dev"] == want["dev"], seed
        for key in ("final_loss", "padding", "steps"):
            assert got["train"][key] == want["train"][key], (seed, key)


@pytest.mark.slow
def test_checkpoints_removed_after_export_and_a_rerun_that_needs_them_says_so(demo_data, tmp_path):
    run, models = tmp_path / "run", tmp_path / "models"
    settings = json.dumps({"objective": "mlm_nsp", "steps": 2, "global_batch": 8, "micro_batch": 4, "lr": 1e-3,
                           "max_len": 64, "loader_workers": 0})
    train = ["pretrain", "train", "--run-dir", str(run), "--start-model", str(demo_data["start"]), "--manifest",
             str(demo_data["manifest"]), "--settings", settings, "--no-tensorboard"]
    run_tacl(*train, "--marker", str(tmp_path / "chunk-0.json"))
    export = ["pretrain", "export", "--start-model", str(demo_data["start"]), "--run-dir", str(run), "--marker",
              str(tmp_path / "chunk-0.json"), "--out", str(models / "mlm_nsp"), "--summary", str(models / "s.json")]
    run_tacl(*export, "--remove-checkpoints")
    assert (models / "mlm_nsp" / "config.json").is_file() and not (run / "checkpoints").exists()
    note = json.loads((run / "checkpoints-removed.json").read_text())
    assert note["step"] == 2 and note["export"] == str(models / "mlm_nsp")
    for args in (train, export):
        proc = run_tacl(*args, check=False)
        assert proc.returncode == 2 and "its checkpoints were removed after the model was exported" in proc.stderr


def test_tacl_plan_passes_snakemakes_arguments(tmp_path, monkeypatch, capsys):
    """Snakemake's arguments after the dry run's own (a target may come first); a config file that is not
    YAML is named with its line before Snakemake starts."""
    from tacl import cli
    from tacl.planning.cli import configfiles

    seen = []
    monkeypatch.setattr(subprocess, "run", lambda cmd, **kw: seen.append(cmd) or subprocess.CompletedProcess(cmd, 0,
                                                                                                          "", ""))
    assert cli.main(["plan", "--profile", "slurm", "--configfile", "my.yaml"]) == 0
    assert seen[0][-5:] == ["--dry-run", "--profile", "slurm", "--configfile", "my.yaml"]
    assert configfiles(["a", "--configfile", "x.yaml", "y.yaml", "-n", "--configfiles=z.yaml"]) == [
        "x.yaml", "y.yaml", "z.yaml"]
    bad = tmp_path / "my.yaml"
    bad.write_text("results_dir: results/x\npretrain:\n  lr: [1.0e-4\n  steps: 10\n")
    assert cli.main(["plan", "--configfile", str(bad)]) == 1 and len(seen) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"{bad}, line 4, column 8: not valid YAML: ") and "from line 3" in err


@pytest.mark.slow
def test_tacl_plan_prints_the_plan_alone_and_names_each_unset_variable_once(tmp_path, monkeypatch):
    """`tacl plan --profile profiles/slurm` on the demo's config: the plan table and its assumptions, none of
    Snakemake's job blocks; with the profile's variables unset, each is named once, with the rules that use
    it, and the plan still comes first."""
    config = tmp_path / "demo.yaml"
    config.write_text(yaml.safe_dump(demo_config(tmp_path)))
    args = ["plan", "--profile", str(REPO / "profiles/slurm"), "--directory", str(tmp_path), "--snakefile",
            str(REPO / "workflow/Snakefile"), "--configfile", str(config), "--replace-workflow-config"]
    slurm = {"TACL_SLURM_ACCOUNT": "p123", "TACL_SLURM_CPU_PARTITION": "cpu", "TACL_SLURM_GPU_PARTITION": "gpu"}
    monkeypatch.setenv("PATH", silent_schedulers(tmp_path / "bin"))  # not CI's test cluster, whose partitions differ
    proc = run_tacl(*args, env=slurm)
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("Plan of this run") and "  assumed: device: cpu, so no job asks for a GPU" in proc.stdout
    said = ("Plan of this run", "  ", "From the schema's defaults", "SLURM preflight: partitions not checked")
    assert all(line.startswith(said) for line in lines)
    blocks = re.findall(r"^(?:local)?(?:rule|checkpoint) \w+:$", proc.stdout + proc.stderr, re.M)
    assert len(lines) < 40 and blocks == [] and "Job stats" not in proc.stdout + proc.stderr
    for name in slurm:
        monkeypatch.delenv(name, raising=False)
    proc = run_tacl(*args, check=False)
    assert proc.returncode == 1 and proc.stdout.startswith("Plan of this run"), proc.stderr[-3000:]
    assert "SLURM preflight: this dry run stops here." in proc.stderr
    named = {name: [line for line in proc.stderr.splitlines() if name in line] for name in slurm}
    assert all(len(found) == 1 for found in named.values()), named
    assert named["TACL_SLURM_ACCOUNT"][0].startswith(
        "  rules clean, shard, pretrain_chunk, export_model, finetune, similarity: slurm_account is ")
    assert named["TACL_SLURM_GPU_PARTITION"][0].startswith("  rules pretrain_chunk, finetune, similarity: ")


def test_keys_left_to_the_schema_defaults_that_config_yaml_sets_otherwise_are_named():
    """A variant given with --replace-workflow-config loses config.yaml's values: the start summary names the
    keys whose schema default then differs from config.yaml's value (and only those)."""
    from snakemake.utils import validate

    from tacl.experiment.config import defaults_unlike, load_schema, unset_keys

    schema_path = REPO / "workflow/schemas/config.schema.yaml"
    paper = yaml.safe_load((REPO / "config.yaml").read_text())
    variant = yaml.safe_load((REPO / "config.yaml").read_text())
    del variant["device"], variant["finetune"]["preset"], variant["pretrain"]["lr"]
    variant["pretrain"]["steps"] = 10
    unset = unset_keys(variant, load_schema(schema_path))
    assert {"device", "finetune.preset", "pretrain.lr"} <= set(unset) and "pretrain.steps" not in unset
    validate(variant, str(schema_path), set_default=True)
    lr = variant["pretrain"]["lr"]
    expected = ['device "auto" (config.yaml: "cuda")', f'pretrain.lr {lr} (config.yaml: {paper["pretrain"]["lr"]})',
                'finetune.preset "standard" (config.yaml: "reference")']
    assert defaults_unlike(unset, variant, paper) == expected[:1] + ([] if lr == paper["pretrain"]["lr"] else
                                                                      expected[1:2]) + expected[2:]
    assert defaults_unlike(unset_keys(paper, load_schema(schema_path)), paper, paper) == []


def test_corpus_tokens_before_the_data_stage_follow_the_local_files_and_the_cap():
    from tacl.planning.estimates import corpus_tokens

    files = {"kind": "wikiextractor", "paths": [str(REPO / "examples/demo/wikipedia/wiki_*")]}
    size = sum(p.stat().st_size for p in (REPO / "examples/demo/wikipedia").glob("wiki_*"))
    assert corpus_tokens(0, files) == size / 4.5 and corpus_tokens(100, files) == 3000
    assert corpus_tokens(0, {"kind": "hf"}) == 30 * 20_000_000 and corpus_tokens(10, None) == 300


def test_the_plan_says_how_many_times_pretraining_passes_over_the_shards():
    """Once the data stage has counted the shards' sequences: steps x global batch over them (a small
    Wikipedia makes it many passes, and the plan says what gives fewer); nothing before, or with nothing to
    pretrain."""
    from tacl.planning.estimates import pretraining_passes

    pretrain = {"objectives": ["none", "tacl"], "steps": 150000, "global_batch": 256}
    text = pretraining_passes(pretrain, {"examples": 1_600_000, "tokens": 2e8})
    assert text.startswith("pretraining: 150,000 steps x 256 sequences = 38.4 M sequences, 24 passes over the "
                           "shards' 1,600,000 (each pass masks them anew; fewer pretrain.steps")
    assert "anew" not in pretraining_passes(pretrain, {"examples": 40_000_000})
    assert pretraining_passes(pretrain, None) is None
    assert pretraining_passes({**pretrain, "objectives": ["none"]}, {"examples": 10}) is None
