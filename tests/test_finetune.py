"""Fine-tuning end to end on real samples: a small model learns SST-2; SQuAD and NER code paths run."""

import csv
import json
import os

import pytest
import torch

from conftest import MINILM, REPO, SHARED_DATA, needs_shared
from tacl.runtime.io import InputError

pytestmark = pytest.mark.slow


@needs_shared("glue", "SST-2")
def test_small_model_learns_sst2_and_writes_a_submission(tmp_path):
    """all-MiniLM-L6-v2 (22M parameters, from PyPI) on 800 real SST-2 training sentences (a seeded sample of
    ../shared/data, through the hparams every fine-tune job has): dev accuracy on 400 dev sentences clearly
    above the majority class after one epoch (about a minute on 2 cores); a submission file for a test split
    cut to its first 200 sentences (predicting all 1,821 would double the test's time)."""
    from tacl.finetune.sequence import finetune_glue, load_examples, subset
    from tacl.finetune.settings import FineTune

    glue_dir = tmp_path / "glue"
    (glue_dir / "SST-2").mkdir(parents=True)
    for split in ("train", "dev"):
        (glue_dir / "SST-2" / f"{split}.tsv").symlink_to(SHARED_DATA / "glue" / "SST-2" / f"{split}.tsv")
    test_rows = (SHARED_DATA / "glue" / "SST-2" / "test.tsv").read_text().splitlines(keepends=True)[:201]
    (glue_dir / "SST-2" / "test.tsv").write_text("".join(test_rows))
    source = {"kind": "tsv", "data_dir": str(glue_dir)}
    hparams = {"max_len": 64, "batch": 16, "lr": 1e-4, "epochs": 1, "max_train_examples": 800,
               "max_eval_examples": 400}
    out = tmp_path / "run"
    result = finetune_glue(FineTune(task="sst2", model=MINILM, source=source, hparams=hparams), 0, out)
    labels = [e.label for e in subset(load_examples("sst2", "dev", source), 400)]
    majority = max(labels.count(x) for x in set(labels)) / len(labels)
    acc = result["dev"]["dev"]["accuracy"]
    assert acc >= majority + 0.10, f"accuracy {acc:.3f} vs majority class {majority:.3f}"
    saved = json.loads((out / "metrics.json").read_text())
    assert saved["dev"]["dev"]["examples"] == 400 and saved["train"]["train_examples"] == 800
    with open(out / "submission" / "SST-2.tsv") as f:
        rows = list(csv.reader(f, delimiter="\t"))
    assert rows[0] == ["index", "prediction"] and len(rows) == 201
    assert {r[1] for r in rows[1:]} <= {"0", "1"}


def test_the_seed_decides_the_whole_run_head_included(tmp_path, demo_data):
    """A (model, task, seed) fine-tune repeats exactly, whatever the process did before it: the new task
    head is initialised from the seed, not from the global RNG's state."""
    import torch

    from tacl.finetune.sequence import finetune_glue
    from tacl.finetune.settings import FineTune

    source = {"kind": "tsv", "data_dir": str(REPO / "examples/demo/glue")}
    hparams = {"max_len": 32, "batch": 8, "epochs": 1, "max_train_examples": 32, "max_eval_examples": 16}
    tune = FineTune(task="qnli", model=str(demo_data["start"]), source=source, hparams=hparams)

    def run(seed: int, out: str) -> float:
        torch.rand(100)  # another state of the global RNG before every run
        return finetune_glue(tune, seed, tmp_path / out)["train"]["final_loss"]

    first = run(0, "a")
    assert run(0, "b") == first
    assert run(1, "c") != first


def test_squad_v2_runs_on_the_demo_sample(tmp_path, demo_data):
    from tacl.finetune.qa import finetune_squad
    from tacl.finetune.settings import FineTune

    source = {"kind": "json", "v2_0_train": str(REPO / "examples/demo/squad/train-v2.0.json"),
              "v2_0_dev": str(REPO / "examples/demo/squad/dev-v2.0.json")}
    hparams = {"max_len": 128, "doc_stride": 32, "max_query_len": 32, "batch": 8, "epochs": 1}
    result = finetune_squad(FineTune(task="squad_v2", model=str(demo_data["start"]), source=source, hparams=hparams),
                            0, tmp_path)
    dev = result["dev"]["dev"]
    assert dev["examples"] == 16 and dev["features"] >= 16
    assert result["device"]["device"] == "cpu" and result["device"]["torch"] == torch.__version__
    assert dev["main"] == dev["f1"] and dev["main_exact"] == dev["exact"], "the headline is threshold 0"
    assert result["preset"] == "standard" and result["hparams"]["warmup_ratio"] == 0.1
    assert {"exact", "f1", "best_exact", "best_f1", "best_f1_thresh", "main"} <= set(dev)
    predictions = json.loads((tmp_path / "predictions.json").read_text())
    assert len(predictions) == 16
    # an unanswerable-only baseline scores the share of unanswerable questions; tuning can only do better
    assert dev["best_exact"] >= 100 * dev["NoAns_total"] / dev["total"] - 1e-9


def test_squad_per_batch_padding_predicts_as_padding_to_max_len(demo_data):
    """Windows padded to their batch's longest row give the logits, and so the answers, of windows padded
    to max_len (the reference's layout), on the demo's SQuAD 2.0 dev sample."""
    import numpy as np
    from transformers import AutoModelForQuestionAnswering, AutoTokenizer

    from tacl.finetune import squad
    from tacl.finetune.common import Run, load_task_model, predict
    from tacl.finetune.qa import feature_rows

    examples = squad.read_squad_json(str(REPO / "examples/demo/squad/dev-v2.0.json"))
    tokenizer = AutoTokenizer.from_pretrained(str(demo_data["start"]))
    model = load_task_model(AutoModelForQuestionAnswering, str(demo_data["start"]), 0)
    features = squad.prepare_features(examples, tokenizer, max_len=128, doc_stride=32, max_query_len=32, train=False)
    rows = feature_rows(features, train=False)
    lengths = [len(r["input_ids"]) for r in rows]
    assert min(lengths) < max(lengths) <= 128, "the sample has windows of several lengths"
    full = [{k: v + [tokenizer.pad_token_id if k == "input_ids" else 0] * (128 - len(v)) for k, v in r.items()}
            for r in rows]
    run, outputs = Run(torch.device("cpu"), False), lambda o: (o.start_logits, o.end_logits)
    per_batch = predict(model, rows, run, tokenizer.pad_token_id, 8, outputs, per_token=True)
    padded = predict(model, full, run, tokenizer.pad_token_id, 8, outputs, per_token=True)
    for ours, reference in zip(per_batch, padded):
        for w, row in enumerate(ours):
            np.testing.assert_allclose(row, reference[w][: lengths[w]], rtol=1e-5, atol=1e-5)
    answers = [squad.postprocess(examples, features, *logits, version_2=True) for logits in (per_batch, padded)]
    assert answers[0][0] == answers[1][0]
    assert all(answers[0][1][k] == pytest.approx(answers[1][1][k], abs=1e-4) for k in answers[0][1])


def test_contrastive_fine_tune_runs_and_refuses_regression(tmp_path, demo_data):
    from tacl.finetune.sequence import finetune_glue
    from tacl.finetune.settings import FineTune

    source = {"kind": "tsv", "data_dir": str(REPO / "examples/demo/glue")}
    hp = {"max_train_examples": 64, "max_eval_examples": 32, "epochs": 1, "batch": 16}
    result = finetune_glue(FineTune(task="qnli", model=str(demo_data["start"]), source=source, hparams=hp,
                                    contrastive="scl"), 0, tmp_path / "scl")
    assert result["contrastive"] == "scl" and result["hparams"]["contrastive_weight"] == 0.9
    assert 0 <= result["dev"]["dev"]["accuracy"] <= 1 and result["train"]["final_loss"] > 0
    with pytest.raises(InputError, match="finetune.contrastive: stsb is a regression task"):
        finetune_glue(FineTune(task="stsb", model="no-model", source=source, contrastive="kl"), 0, tmp_path / "stsb")
    assert not (tmp_path / "stsb").exists()


def test_presets_then_the_configs_values():
    from tacl.finetune.common import DEFAULT_HPARAMS, hyperparameters

    reference = hyperparameters(DEFAULT_HPARAMS, "reference", {"lr": 3e-5})
    assert (reference["warmup_ratio"], reference["weight_decay"], reference["lr"]) == (0.0, 0.0, 3e-5)
    standard = hyperparameters(DEFAULT_HPARAMS, "standard", {"weight_decay": 0.1})
    assert (standard["warmup_ratio"], standard["weight_decay"]) == (0.1, 0.1)
    with pytest.raises(InputError, match="finetune.preset: 'paper' is not one of reference, standard"):
        hyperparameters(DEFAULT_HPARAMS, "paper", {})


def test_missing_glue_file_fails_before_the_model_is_built(tmp_path):
    from tacl.finetune.sequence import finetune_glue
    from tacl.finetune.settings import FineTune

    source = {"kind": "tsv", "data_dir": str(tmp_path)}
    with pytest.raises(InputError, match=r"RTE/train\.tsv: GLUE file not found"):
        finetune_glue(FineTune(task="rte", model="no-such-model-dir/", source=source), 0, tmp_path)


def test_a_seed_is_kept_only_if_its_files_read_back(tmp_path, caplog):
    """run_seeds with a stand-in trainer: a finished seed is kept; one whose metrics.json is damaged, or whose
    recorded submission file changed, is trained again with one log line saying why; the marker never
    records a file that does not parse."""
    from tacl.finetune.seeds import RESULT_FILES, run_seeds

    trained = []

    def train_one(seed, out):
        trained.append(seed)
        (out / "submission").mkdir(parents=True, exist_ok=True)
        (out / "submission" / "RTE.tsv").write_text("index\tprediction\n0\tentailment\n")
        (out / "metrics.json").write_text(json.dumps({"seed": seed, "dev": {"dev": {"accuracy": 0.5}}}))
        return {}

    given = {"hparams": {"lr": 1e-4}, "model_sha256": "x"}
    marker = tmp_path / "seeds.json"
    def run():
        return run_seeds([0, 1], lambda s: tmp_path / f"seed{s}", given, train_one, str(marker))

    run()
    recorded = json.loads((tmp_path / "seed0" / RESULT_FILES).read_text())["files"]
    assert trained == [0, 1] and recorded.keys() == {"metrics.json", "submission/RTE.tsv"}
    run()
    assert trained == [0, 1], "both kept"
    (tmp_path / "seed0" / "metrics.json").write_text('{"seed": 0, "dev": {"dev": {"accu')  # cut short
    (tmp_path / "seed1" / "submission" / "RTE.tsv").write_text("index\tprediction\n")
    caplog.clear()
    with caplog.at_level("WARNING", logger="tacl.finetune"):
        record = run()
    assert trained == [0, 1, 0, 1]
    lines = [r.getMessage() for r in caplog.records]
    damaged = "metrics.json is damaged (not valid JSON: Unterminated string"
    assert any(line.startswith("seed 0 (") and damaged in line and line.endswith("; trained again")
               for line in lines), lines
    assert any("submission/RTE.tsv differs from what results.json recorded (sha256); trained again" in line
               for line in lines), lines
    for path in record["runs"]:
        assert json.loads(open(path).read())["dev"]["dev"]["accuracy"] == 0.5
    # a trainer that leaves a metrics.json that does not parse fails the seed, and no marker names it
    marker.unlink()
    (tmp_path / "seed1" / "metrics.json").write_text("{")
    with pytest.raises(RuntimeError, match=r"fine-tuning seed\(s\) \[1\] failed"):
        run_seeds([0, 1], lambda s: tmp_path / f"seed{s}", given,
                  lambda seed, out: (out / "metrics.json").write_text("{"), str(marker))
    assert not marker.exists() and not (tmp_path / "seed1" / RESULT_FILES).exists()


def test_a_seed_stopped_midway_resumes_to_the_uninterrupted_seeds_metrics(tmp_path, demo_data, monkeypatch,
                                                                          caplog):
    """A GLUE seed (tiny model, 24 rows, batch 8, 2 epochs: 6 steps, grouped batches) stopped by the step cap
    at step 2 (mid epoch 1, a save every step before it), then by SIGUSR1 at step 5 (mid epoch 2), then by
    SIGTERM after its last step while it predicts (its trained state saved), then by SIGUSR2 while it loads
    (nothing saved), then run to the end, through run_seeds as a job runs it: the same dev metrics, final
    loss, padding and fine-tuned weights as the seed trained in one go, bit for bit; the checkpoint is gone
    once the metrics are written. Before the last job, a checkpoint and a model left unfinished by a killed job
    on another node: removed by the last job, once it holds the seed's lock, saying so."""
    import signal

    from tacl.finetune import CHECKPOINT, Stopped, common
    from tacl.finetune.resume import Checkpointing
    from tacl.finetune.seeds import run_seeds
    from tacl.finetune.sequence import finetune_glue
    from tacl.finetune.settings import FineTune
    from tacl.runtime.io import size_text

    glue = tmp_path / "glue" / "QNLI"  # (train and dev only: no test predictions to make)
    glue.mkdir(parents=True)
    for split in ("train", "dev"):
        (glue / f"{split}.tsv").symlink_to(REPO / "examples/demo/glue/QNLI" / f"{split}.tsv")
    source = {"kind": "tsv", "data_dir": str(glue.parent)}
    hparams = {"max_len": 32, "batch": 8, "epochs": 2, "max_train_examples": 24, "max_eval_examples": 16,
               "group_by_length": True}

    def job(out, checkpointing):
        tune = FineTune(task="qnli", model=str(demo_data["start"]), source=source, hparams=hparams, save_model=True,
                        checkpointing=checkpointing)
        return run_seeds([0], lambda seed: out / f"seed{seed}", {"hparams": hparams},
                         lambda seed, folder: finetune_glue(tune, seed, folder))

    job(tmp_path / "once", None)
    stopped = tmp_path / "stopped"
    with pytest.raises(Stopped, match=r"stopped by step cap at step 2/6, saved in .*seed0/checkpoint\.pt"):
        job(stopped, Checkpointing(minutes=1e-9, stop_after=2))
    assert (stopped / "seed0" / CHECKPOINT).is_file() and not (stopped / "seed0" / "metrics.json").exists()
    steps = []
    step = common.train_step

    def signalled_step(*args, **kwargs):  # SIGUSR1 during the resumed job's 3rd step
        steps.append(1)
        if len(steps) == 3:
            os.kill(os.getpid(), signal.SIGUSR1)
        return step(*args, **kwargs)

    monkeypatch.setattr(common, "train_step", signalled_step)
    with pytest.raises(Stopped, match=r"stopped by SIGUSR1 at step 5/6"):
        job(stopped, Checkpointing(minutes=None))
    assert signal.getsignal(signal.SIGUSR1) == signal.SIG_DFL, "the handler is put back after training"
    monkeypatch.setattr(common, "train_step", step)
    # a signal after the last step, while the seed predicts: its trained state saved, then it stops
    batches = common.prediction_batches

    def signalled_batches(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGTERM)
        return batches(*args, **kwargs)

    monkeypatch.setattr(common, "prediction_batches", signalled_batches)
    with pytest.raises(Stopped, match=r"stopped by SIGTERM after training, while predicting; the trained state is "
                                      r"saved in .*checkpoint\.pt: running the job again predicts from it"):
        job(stopped, Checkpointing(minutes=None))
    monkeypatch.setattr(common, "prediction_batches", batches)
    assert torch.load(stopped / "seed0" / CHECKPOINT, weights_only=True)["step"] == 6
    # a signal while the next job loads: it stops before training, nothing saved (its checkpoint as it was)
    before = (stopped / "seed0" / CHECKPOINT).read_bytes()
    monkeypatch.setattr(common, "seed_everything", lambda seed: os.kill(os.getpid(), signal.SIGUSR2))
    with pytest.raises(Stopped, match=r"stopped by SIGUSR2 before training at step 6/6, its checkpoint \(.*\) kept "
                                      "as it was: running the job again trains this seed"):
        job(stopped, Checkpointing(minutes=None))
    monkeypatch.undo()
    assert (stopped / "seed0" / CHECKPOINT).read_bytes() == before
    # a job killed while it saved the checkpoint and wrote the model (on another node) left both unfinished:
    # the next job removes them once it holds the seed's lock, saying so, and resumes the seed
    seed = stopped / "seed0"
    saved = (seed / CHECKPOINT).read_bytes()
    (seed / f".{CHECKPOINT}.tmp-gpu-node-17-4242").write_bytes(saved[: len(saved) // 2])
    (seed / ".model.tmp-gpu-node-17-4242").mkdir()
    (seed / ".model.tmp-gpu-node-17-4242" / "config.json").write_text("{}")
    left = [(f".{CHECKPOINT}.tmp-gpu-node-17-4242", len(saved) // 2), (".model.tmp-gpu-node-17-4242", 2)]
    caplog.clear()
    with caplog.at_level("WARNING", logger="tacl.finetune"):
        job(stopped, Checkpointing(minutes=None))
    named = ", ".join(f"{p} ({size_text(n)})" for p, n in left)
    assert [m for m in caplog.messages if "removed" in m] == [
        f"{seed}: removed what killed jobs left unfinished: {named} ({size_text(sum(n for _, n in left))} in all)"]
    assert not any((seed / p).exists() for p, _ in left)
    folders = (tmp_path / "once" / "seed0", stopped / "seed0")
    once, resumed = (json.loads((d / "metrics.json").read_text()) for d in folders)
    assert resumed["train"]["resumed_at"] == [2, 5, 6] and once["train"]["resumed_at"] == []
    assert resumed["dev"] == once["dev"]
    for key in ("final_loss", "padding", "steps"):
        assert resumed["train"][key] == once["train"][key], key
    weights = [(d / "model" / "model.safetensors").read_bytes() for d in folders]
    assert weights[0] == weights[1]
    assert not (stopped / "seed0" / CHECKPOINT).exists()


def test_a_seed_is_trained_by_one_process_at_a_time(tmp_path, demo_data, caplog, capsys, monkeypatch):
    """A seed holds its lock while it trains. Another process holding it (a job started again while the first
    one runs): a second job waits (here a second) for it to end, then is refused in one line naming the seed's
    folder and the holder, and trains nothing; one that ends while it waits (a seed saving after its job's
    process died) leaves the seed to it. The command, where the holder is a live SLURM job on another node
    whose save is under way there (its temporary in the seed's folder): one line, exit status 2, and the save
    left as it is. Once squeue no longer lists that job, the next job takes the lock over, saying whose it
    was, removes what the gone job left and trains the seed."""
    import socket
    import subprocess
    import sys

    from tacl.cli import main
    from tacl.finetune import seeds
    from tacl.finetune.seeds import CHECKPOINT, LOCK, run_seeds

    given = {"hparams": {"lr": 1e-4}, "model_sha256": "x"}
    seed0 = tmp_path / "seed0"

    def hold(seconds):
        holder = subprocess.Popen([sys.executable, "-c", "import sys, time\nfrom tacl.finetune.seeds import "
                                   f"seed_lock\nlock = seed_lock(0, {str(seed0)!r}).acquire()\nprint('held', "
                                   f"flush=True)\ntime.sleep({seconds})\nlock.release()"], stdout=subprocess.PIPE,
                                  text=True)
        assert holder.stdout.readline() == "held\n"
        return holder

    monkeypatch.setattr(seeds, "SEED_LOCK_WAIT_S", 1.0)
    holder, trained = hold(60), []
    try:
        with caplog.at_level("INFO", logger="tacl.finetune"), pytest.raises(InputError) as refused:
            run_seeds([0], lambda s: seed0, given, lambda s, o: trained.append(s))
    finally:
        holder.kill()
        holder.wait()
    message = str(refused.value)
    assert message.startswith(f"{seed0 / LOCK}: seed 0 is being trained by another process, process {holder.pid} "
                              f"on host {socket.gethostname()} (since "), message
    assert ", still running: `ps -p " in message and "\n" not in message and trained == []
    assert "; waiting up to 1 s for it to end" in caplog.text
    # a holder of this host that ends while the job waits (a seed saving after its job's process died): trained
    (seed0 / LOCK).unlink(missing_ok=True)
    monkeypatch.setattr(seeds, "SEED_LOCK_WAIT_S", 60.0)
    holder = hold(1.5)
    run_seeds([0], lambda s: seed0, given, lambda s, o: (trained.append(s), (o / "metrics.json").write_text("{}")))
    holder.wait()
    assert trained == [0]
    for name in ("metrics.json", "given.json", "results.json"):
        (seed0 / name).unlink(missing_ok=True)

    # the command, against a live SLURM job's lock and save on another node (squeue: job 4242 runs)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "squeue").write_text(f"#!/bin/sh\ncat {tmp_path / 'state'}\n")
    (bin_dir / "squeue").chmod(0o755)
    (tmp_path / "state").write_text("RUNNING\n")
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    for var in ("SLURM_JOB_ID", "SLURM_RESTART_COUNT", "PBS_JOBID"):
        monkeypatch.delenv(var, raising=False)
    source = {"kind": "tsv", "data_dir": str(REPO / "examples/demo/glue")}
    out = tmp_path / "setting"
    argv = ["finetune", "glue", "--model", str(demo_data["start"]), "--task", "qnli", "--seeds", "0",
            "--source", json.dumps(source), "--hparams", json.dumps({"max_train_examples": 8, "batch": 4,
                                                                     "epochs": 1, "max_eval_examples": 8,
                                                                     "max_len": 32}),
            "--device", "cpu", "--out", str(out), "--marker", str(tmp_path / "seeds.json")]
    (out / "seed0").mkdir(parents=True)
    (out / "seed0" / LOCK).write_text(json.dumps({"host": "gpu-node-17", "pid": 12345, "slurm_job": "4242",
                                                  "since": "2026-11-27T10:00:00"}))
    saving = out / "seed0" / f".{CHECKPOINT}.tmp-gpu-node-17-12345"
    saving.write_bytes(b"x" * 3000)
    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith(f"tacl: error: {out / 'seed0' / LOCK}: seed 0 is being trained by another process, "
                              "SLURM job 4242 (host gpu-node-17, pid 12345"), err
    assert "`squeue -j 4242` shows it" in err[-1]
    assert sorted(p.name for p in (out / "seed0").iterdir()) == sorted([LOCK, saving.name])
    assert saving.read_bytes() == b"x" * 3000 and not (tmp_path / "seeds.json").exists()
    # the job is gone: the next job takes its lock over, saying so, removes its save and trains the seed
    (tmp_path / "state").write_text("COMPLETED\n")
    caplog.clear()
    with caplog.at_level("WARNING", logger="tacl.finetune"):
        assert main(argv) == 0
    assert (f"{out / 'seed0' / LOCK}: took over the stale lock of SLURM job 4242 (host gpu-node-17, pid 12345, "
            "since 2026-11-27T10:00:00): squeue shows it in state COMPLETED") in caplog.messages
    assert f"{out / 'seed0'}: removed what killed jobs left unfinished: {saving.name} (3.0 kB)" in caplog.text
    assert (out / "seed0" / "metrics.json").is_file() and not (out / "seed0" / LOCK).exists()
    assert not saving.exists()


def test_seeds_side_by_side_count_cores_and_command(tmp_path, monkeypatch):
    """finetune.seeds_per_gpu: auto is one on a CPU and on a GPU the fewest of what cores, memory and
    MAX_AUTO allow, spread evenly (the job's own decision with CUDA's answer faked: a 40 GiB GPU, 8 cores, the
    model's config.json and the family's batch and length), and one where NVML says the GPU's compute mode
    is Exclusive_Process (or nvidia-smi, without pynvml); the cores are cut into contiguous shares, pinned
    only where the affinity mask is the job's own (its size what SLURM or PBS gave the job); a seed's command
    is the job's own for that seed alone (every option of the job's command passed on: parsed back, the same
    namespace), saying how many seeds share the GPU."""
    import sys
    import types

    import tacl.runtime.device
    from tacl.cli import build_parser
    from tacl.finetune import side_by_side
    from tacl.finetune.cli import seed_command
    from tacl.finetune.side_by_side import (MAX_AUTO, JobCpus, Share, auto_count, core_shares, evenly, job_cpus,
                                            seed_memory_gib, seeds_at_once, shares)

    assert auto_count(5, None, 16, 3.0)[0] == 1
    base = {"hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12, "intermediate_size": 3072}
    one = seed_memory_gib(base, 32, 128)
    assert 3.5 < one < 5.5  # (110M parameters at 16 bytes, 1.7 GB of activations, the context)
    assert seed_memory_gib(base, 32, 256) > one + 1.5  # (activations: the length's square in attention)
    assert auto_count(5, 40.0, 8, one) == (3, f"auto: 8 CPU cores at 2 a seed, 40 GiB of GPU memory at 1.5 x "
                                              f"{one:.1f} GiB a seed, at most {MAX_AUTO}")  # 4 at most: 3 and 2
    assert auto_count(3, 80.0, 16, one)[0] == 3 and auto_count(8, 80.0, 64, one)[0] == MAX_AUTO
    assert auto_count(5, 40.0, 3, one)[0] == 1  # (3 cores: one seed's 2)
    assert auto_count(5, 10.0, 16, one)[0] == 1  # (10 GiB: one seed at 1.5x its estimate)
    assert [evenly(n, 4) for n in (1, 2, 4, 5, 7, 8, 9)] == [1, 2, 4, 3, 4, 4, 3]
    assert core_shares(list(range(8)), 3) == [[0, 1, 2], [3, 4, 5], [6, 7]]
    assert core_shares([2, 3], 3) == [[2], [3], [2]]
    (tmp_path / "config.json").write_text(json.dumps({**base, "vocab_size": 30522}))
    monkeypatch.setattr(tacl.runtime.device, "gpu_memory_gib", lambda device: 40.0 if device == "cuda:0" else None)
    monkeypatch.setattr(side_by_side, "job_cpus", lambda: JobCpus(8, list(range(8)), "8 CPUs"))
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))  # (no nvidia-smi but the stand-in below)
    monkeypatch.setitem(sys.modules, "pynvml", None)  # (import pynvml: ImportError, as on a node without it)
    count, why = seeds_at_once("auto", 5, "cuda:0", tmp_path, "glue", {"lr": 2e-5})
    assert count == 3 and why.startswith("auto: 8 CPU cores at 2 a seed, 40 GiB of GPU memory at 1.5 x 4.2 GiB")
    assert seeds_at_once("auto", 5, "cuda:0", tmp_path, "glue", {"batch": 128, "max_len": 512})[0] == 1
    assert seeds_at_once("auto", 5, "cpu", tmp_path, "glue", {})[0] == 1
    assert seeds_at_once("2", 1, "cuda:0", tmp_path, "glue", {}) == (1, "finetune.seeds_per_gpu: 2")
    # NVML's answer: Exclusive_Process (3), a second process could not open the GPU: one seed at a time
    modes = {"GPU-0a": 3, "GPU-1b": 0}
    nvml = types.SimpleNamespace(
        nvmlInit=lambda: None, nvmlShutdown=lambda: None, nvmlDeviceGetCount=lambda: len(modes),
        nvmlDeviceGetHandleByIndex=lambda i: list(modes)[i], nvmlDeviceGetUUID=lambda h: h,
        nvmlDeviceGetComputeMode=lambda h: modes[h])
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    monkeypatch.setattr(tacl.runtime.device, "_gpu_uuid", lambda device: {"cuda:0": "0a", "cuda:1": "1b"}[device])
    count, why = seeds_at_once("auto", 5, "cuda:0", tmp_path, "glue", {})
    assert count == 1 and why.startswith("auto: the GPU's compute mode is Exclusive_Process, where a second process")
    modes["GPU-1b"] = 3  # (the UUID not known: the mode every GPU of the node has)
    monkeypatch.setattr(tacl.runtime.device, "_gpu_uuid", lambda device: None)
    assert seeds_at_once("auto", 5, "cuda:0", tmp_path, "glue", {})[0] == 1
    monkeypatch.setitem(sys.modules, "pynvml", None)  # nvidia-smi instead: Default, as above
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "nvidia-smi").write_text("#!/bin/sh\necho 'GPU-0a, Default'\n")
    (tmp_path / "bin" / "nvidia-smi").chmod(0o755)
    assert tacl.runtime.device.gpu_compute_mode("cuda:0") == "Default"
    assert seeds_at_once("auto", 5, "cuda:0", tmp_path, "glue", {})[0] == 3
    # pinned only to the job's own cpuset: SLURM's or PBS's count on the node, or less than the machine
    assert job_cpus({"SLURM_JOB_ID": "7", "SLURM_CPUS_ON_NODE": "8"}, list(range(8, 16)), 64).cores == \
        list(range(8, 16))
    for environ in ({"SLURM_JOB_ID": "7", "SLURM_CPUS_PER_TASK": "8"}, {"PBS_JOBID": "7.pbs", "NCPUS": "8"}):
        assert job_cpus(environ, list(range(64)), 64) == JobCpus(8, None, job_cpus(environ, list(range(64)), 64).why)
    assert job_cpus({}, [4, 5], 64).cores == [4, 5] and job_cpus({}, list(range(64)), 64).cores is None
    assert shares(JobCpus(8, None, ""), 3) == [Share(3), Share(3), Share(2)]
    assert shares(JobCpus(4, [4, 5, 6, 7], ""), 2) == [Share(2, (4, 5)), Share(2, (6, 7))]

    parser = build_parser()
    for extra in ([], ["--contrastive", "scl", "--save-model", "--cache-dir", "/c"]):
        job = parser.parse_args(["finetune", "glue", "--model", "m", "--task", "rte", "--seeds", "0", "1", "--source",
                                 '{"kind": "hf"}', "--hparams", '{"lr": 1e-05}', "--precision", "bf16", "--preset",
                                 "reference", "--device", "cuda", "--compile", "true", "--shapes", "buckets",
                                 "--checkpoint-minutes", "0.5", "--out", "/r/lr1e-05", "--marker", "/r/seeds.json",
                                 "--seeds-per-gpu", "2", *extra])
        command = seed_command(job, 1, 2)
        assert command[1:3] == ["-m", "tacl"]
        seed = parser.parse_args(command[3:])
        expected = {**vars(job), "seed": 1, "seeds": None, "out": "/r/lr1e-05/seed1", "marker": None,
                    "seeds_per_gpu": "2"}
        assert vars(seed) == expected


def test_seeds_side_by_side_pass_signals_on_and_a_refused_or_failed_seed_is_named(tmp_path, capfd, caplog):
    """`run_side_by_side` with stand-in seed processes (Python that starts in milliseconds): two at a time,
    the third once a place is free; each one's lines in the job's log led by [seed N]; a seed that fails
    does not stop the others and the job fails naming it (one ended by a signal the job did not send: the
    signal named); one refused for bad input (exit status 2) makes the others save and stop (SIGTERM) and the
    job fails with its message; the job's SIGUSR1 reaches every running seed, and no seed starts after it."""
    import os
    import signal
    import sys
    import threading

    from tacl.finetune import Stopped
    from tacl.finetune.side_by_side import run_side_by_side

    seed_dir = lambda seed: tmp_path / f"seed{seed}"  # noqa: E731
    log = tmp_path / "events"

    def stand_in(behaviour, late: float = 0.0):
        """A seed's process: it catches the stop signals `late` seconds after it starts, and unblocks them (as
        tacl.runtime.signals.catch does: the job started it with them blocked)."""
        def command(seed):
            script = f"""
import os, signal, sys, time
from pathlib import Path
def note(what):
    with open({str(log)!r}, "a") as f:
        f.write(f"{{time.time():.3f}} {seed} {{what}}\\n")
def stop(signum, frame):
    note(signal.Signals(signum).name)
    sys.exit(3)
time.sleep({late})
for s in (signal.SIGTERM, signal.SIGUSR1):
    signal.signal(s, stop)
signal.pthread_sigmask(signal.SIG_UNBLOCK, (signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2))
note("start")
print("threads", os.environ["OMP_NUM_THREADS"], flush=True)
{behaviour(seed)}
"""
            return [sys.executable, "-c", script]

        return command

    def finish(seed):
        return (f"time.sleep({0.3 + 0.3 * seed})\nPath({str(seed_dir(seed))!r}).mkdir(exist_ok=True)\n"
                f"Path({str(seed_dir(seed) / 'metrics.json')!r}).write_text('{{}}')\nnote('done')"
                if seed != 1 else "print('Traceback: broken'); sys.exit(1)")

    with pytest.raises(RuntimeError, match=r"fine-tuning seed\(s\) \[1\] failed"):
        run_side_by_side([0, 1, 2], 2, stand_in(finish), seed_dir)
    events = [line.split() for line in log.read_text().splitlines()]
    starts = {int(seed): float(t) for t, seed, what in events if what == "start"}
    ends = {int(seed): float(t) for t, seed, what in events if what == "done"}
    assert sorted(starts) == [0, 1, 2] and sorted(ends) == [0, 2]
    assert starts[2] > min(ends[0], starts[1]), "the third starts once a place is free"
    err = capfd.readouterr().err
    assert "[seed 1] Traceback: broken" in err and "[seed 0] threads 1" in err  # (2 cores or more: 1 each)
    assert "seed 1 failed (exit status 1; its lines above say why)" in caplog.messages

    log.unlink()  # a seed killed from outside the job (here by itself): the signal named, not "its lines above"
    with pytest.raises(RuntimeError, match=r"fine-tuning seed\(s\) \[4\] failed"):
        run_side_by_side([4], 1, stand_in(lambda seed: "os.kill(os.getpid(), signal.SIGKILL)"), seed_dir)
    assert caplog.messages[-1].startswith("seed 4 failed: ended by SIGKILL, a signal this job did not send (from "
                                          "another process")

    log.unlink()
    refused = stand_in(lambda seed: "print('tacl: error: seed 0 is being trained by another process'); sys.exit(2)"
                       if seed == 0 else "time.sleep(60)")
    with pytest.raises(InputError, match=r"^seed 0: seed 0 is being trained by another process$"):
        run_side_by_side([0, 1, 2], 2, refused, seed_dir)
    assert sorted(line.split(" ", 1)[1] for line in log.read_text().splitlines()) == ["0 start", "1 SIGTERM",
                                                                                       "1 start"]
    log.unlink()
    # (the job's signal comes while the seeds still start, before they catch it: it waits for them)
    threading.Timer(1.5, os.kill, (os.getpid(), signal.SIGUSR1)).start()
    with pytest.raises(Stopped, match=r"^stopped by SIGUSR1: seed\(s\) \[3, 4, 5\] not finished"):
        run_side_by_side([3, 4, 5], 2, stand_in(lambda seed: "time.sleep(60)", late=3.0), seed_dir)
    # (each caught it once it caught the signals, 3 s in, before it noted its start: not killed meanwhile)
    assert sorted(line.split(" ", 1)[1] for line in log.read_text().splitlines()) == ["3 SIGUSR1", "4 SIGUSR1"]
    assert signal.getsignal(signal.SIGUSR1) == signal.SIG_DFL, "the job's handlers are put back"


def test_a_seed_that_cannot_open_the_gpu_names_its_compute_mode_and_fails_its_job(tmp_path, monkeypatch, capsys):
    """A seed's process whose GPU will not take it (CUDA's "busy or unavailable" when it opens the GPU; NVML
    says Exclusive_Process): one line naming the compute mode and finetune.seeds_per_gpu: 1, exit status 4,
    not 2 (a refused seed's), nothing written. A job of seeds side by side reads that exit status as such
    (stand-in seeds): the other seed saves and stops, and the job fails with the seed's line, exit status 4."""
    import signal
    import sys
    import types

    import torch

    import tacl.runtime.device
    from tacl.cli import main
    from tacl.finetune.side_by_side import run_side_by_side
    from tacl.runtime.device import EXIT_GPU_UNAVAILABLE, GpuUnavailable

    nvml = types.SimpleNamespace(nvmlInit=lambda: None, nvmlShutdown=lambda: None, nvmlDeviceGetCount=lambda: 1,
                                 nvmlDeviceGetHandleByIndex=lambda i: i, nvmlDeviceGetUUID=lambda h: "GPU-0a",
                                 nvmlDeviceGetComputeMode=lambda h: 3)
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setattr(tacl.runtime.device, "resolve_device", lambda requested, local_rank=0: torch.device("cuda", 0))

    def busy(device):
        raise RuntimeError("CUDA error: CUDA-capable device(s) is/are busy or unavailable\nCompile with ...")

    monkeypatch.setattr(tacl.runtime.device, "_create_context", busy)
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text("{}")
    argv = ["finetune", "glue", "--model", str(tmp_path / "model"), "--task", "rte", "--seed", "1", "--source",
            '{"kind": "hf"}', "--device", "cuda", "--seeds-per-gpu", "2", "--out", str(tmp_path / "seed1")]
    capsys.readouterr()
    assert main(argv) == EXIT_GPU_UNAVAILABLE != 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line == ("tacl: error: cannot open the GPU (cuda:0, CUDA_VISIBLE_DEVICES=(unset)): RuntimeError: CUDA "
                    "error: CUDA-capable device(s) is/are busy or unavailable; its compute mode is Exclusive_Process "
                    "(one process at a time, and another process holds it: `nvidia-smi` names it); this job trains "
                    "2 seeds at once, each in its own process: set finetune.seeds_per_gpu: 1 (--seeds-per-gpu 1) to "
                    "train them one after the other")
    assert not (tmp_path / "seed1").exists()

    ready, stopped = tmp_path / "ready", tmp_path / "stopped"

    def seed(s):  # seed 0 as above (once seed 1 trains); seed 1 trains until the job stops it
        script = (f"import os, time\nwhile not os.path.exists({str(ready)!r}): time.sleep(0.01)\n"
                  f"print({line!r}); raise SystemExit({EXIT_GPU_UNAVAILABLE})" if s == 0 else
                  "import signal, sys, time\n"
                  f"signal.signal(signal.SIGTERM, lambda *a: (open({str(stopped)!r}, 'w').write('saved'), "
                  "sys.exit(3)))\nsignal.pthread_sigmask(signal.SIG_UNBLOCK, (signal.SIGTERM,))\n"
                  f"open({str(ready)!r}, 'w').close()\ntime.sleep(60)")
        return [sys.executable, "-c", script]

    with pytest.raises(GpuUnavailable) as failed:
        run_side_by_side([0, 1], 2, seed, lambda s: tmp_path / f"seed{s}")
    assert str(failed.value) == f"seed 0: {line[len('tacl: error: '):]}" and failed.value.exit_status == 4
    assert stopped.read_text() == "saved" and signal.getsignal(signal.SIGTERM) == signal.SIG_DFL


# A seed's process (`tacl ARGS`) on a clock of its own, read by its deadline, its scheduler query and its loop:
# ten seconds per training step and none otherwise (start-up, saves, a busy machine).
SEED_CLOCK = """
import sys, time
from tacl.runtime import scheduler
from tacl.finetune import common
from tacl.pretrain import deadline

class Clock:
    now = 1_764_000_000.0
    def time(self):
        return self.now
    def __getattr__(self, name):
        return getattr(time, name)

clock = Clock()
scheduler.time = deadline.time = common.time = clock
real_step = common.train_step

def train_step(*args, **kwargs):
    clock.now += 10.0
    return real_step(*args, **kwargs)

common.train_step = train_step
from tacl.cli import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.parametrize("scheduler", ["SLURM", "PBS"])  # (not `slurm`: the name of the real cluster's tests)
def test_seeds_near_their_jobs_end_time_save_and_stop_before_it(tmp_path, demo_data, monkeypatch, capfd, caplog,
                                                                scheduler):
    """A job's end time 120 s after its seeds start, as the scheduler gives it (a stand-in squeue's time left
    under SLURM; under PBS, which sends no warning, a stand-in qstat's walltime and start time), each seed on a
    clock of 10 s a step. SLURM: two seeds side by side, each reading the end time itself in its own process;
    PBS: the seeds one after the other in the job's process. Each seed that trains, keeping 30 s and the saves
    of the seeds that train at once (tiny ones) and a step and a half, saves and stops at step 8 of 24 (80 s:
    8 x 10 + 15 > 120 - 30, 7 x 10 + 15 is not), 40 s before the end; the job stops (exit status 3), naming
    why, and no seed starts after it."""
    import re
    import sys

    from conftest import Clock
    from tacl.runtime import scheduler as queries
    from tacl.cli import main
    from tacl.finetune import cli, common
    from tacl.pretrain import deadline

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    if scheduler == "SLURM":
        monkeypatch.setenv("SLURM_JOB_ID", "7")
        (bin_dir / "squeue").write_text('#!/bin/sh\ncase "$*" in *%L*) echo 2:00;; *) echo RUNNING;; esac\n')
        (bin_dir / "squeue").chmod(0o755)
        source, at_once = "squeue, SLURM job 7", 2
        real = cli.seed_command
        monkeypatch.setattr(cli, "seed_command", lambda a, seed, n: [sys.executable, "-c", SEED_CLOCK,
                                                                     *real(a, seed, n)[3:]])
    else:
        monkeypatch.setenv("PBS_JOBID", "77.pbs01")
        record = {"Jobs": {"77.pbs01": {"job_state": "R", "stime": 1_764_000_000 - 600,
                                        "Resource_List": {"walltime": "00:12:00"}}}}
        (tmp_path / "qstat.json").write_text(json.dumps(record))
        (bin_dir / "qstat").write_text(f'#!/bin/sh\ncat "{tmp_path}/qstat.json"\n')
        (bin_dir / "qstat").chmod(0o755)
        source, at_once = "qstat, PBS job 77.pbs01", 1
        clock = Clock(1_764_000_000.0)  # (what SEED_CLOCK does in a seed's process, here in this one)
        for module in (queries, deadline, common):
            monkeypatch.setattr(module, "time", clock)
        step = common.train_step

        def train_step(*args, **kwargs):
            clock.now += 10.0
            return step(*args, **kwargs)

        monkeypatch.setattr(common, "train_step", train_step)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    hp = {"max_len": 32, "batch": 4, "lr": 1e-4, "epochs": 1, "max_train_examples": 96, "max_eval_examples": 16}
    out = tmp_path / "setting"
    capfd.readouterr()
    with caplog.at_level("INFO", logger="tacl.finetune"):
        assert main(["finetune", "glue", "--model", str(demo_data["start"]), "--task", "qnli", "--seeds", "0", "1",
                     "--source", json.dumps({"kind": "tsv", "data_dir": str(REPO / "examples/demo/glue")}),
                     "--hparams", json.dumps(hp), "--device", "cpu", "--seeds-per-gpu", str(at_once), "--out",
                     str(out), "--marker", str(tmp_path / "seeds.json")]) == 3
    err = capfd.readouterr().err
    stopped = ("stopped before the job's time limit at step 8/24, saved in {}: running the job again resumes this "
               "seed there")
    for seed in range(at_once):
        lines = [line for line in err.splitlines() if line.startswith(f"[seed {seed}] ")] if at_once > 1 else \
            caplog.messages  # (this process's own log)
        assert any("fine-tune: this job ends " in line and f"({source})" in line for line in lines), lines
        saves = "2 seeds' checkpoints of " if at_once > 1 else "its checkpoint of "
        assert any("saves and stops once a step and a half and 30 s are left before " in line and saves in line
                   for line in lines), lines
        assert (f"tacl: stopped: {stopped.format(out / f'seed{seed}' / 'checkpoint.pt')}" in lines[-1]
                if at_once > 1 else True), lines[-1]
        assert (out / f"seed{seed}" / "checkpoint.pt").is_file()
        assert not (out / f"seed{seed}" / "metrics.json").exists()
    if at_once > 1:
        assert re.search(r"^tacl: stopped: stopped with seed [01] \(stopped before the job's time limit at step "
                         r"8/24\): seed\(s\) \[0, 1\] not finished", err, re.M), err[-2000:]
    else:
        assert err.strip().splitlines()[-1] == f"tacl: stopped: {stopped.format(out / 'seed0' / 'checkpoint.pt')}"
        assert not (out / "seed1").exists()
    assert not (tmp_path / "seeds.json").exists()
