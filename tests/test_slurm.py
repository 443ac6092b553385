"""End to end through a real SLURM cluster (.ci/slurm.sh up starts one on this machine; skipped without).

Every run is bounded (`timeout -k`), so a hung status check fails the test instead of hanging CI. The
assertions read SLURM's own records (`scontrol show job`), not only Snakemake's output."""

from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest
import torch
import yaml

from conftest import REPO, demo_config, run_snakemake, run_tacl, start_snakemake
from tacl.pretrain import checkpoint
from tacl.pretrain.metrics import read_metrics
from tacl.pretrain.model import checkpoint_state_dict

PROFILE = REPO / "profiles" / "slurm-ci"


def slurm_up() -> bool:
    if shutil.which("sinfo") is None:
        return False
    try:
        out = subprocess.run(["sinfo", "-h", "-o", "%T"], capture_output=True, text=True, timeout=10)
    except subprocess.TimeoutExpired:
        return False
    return out.returncode == 0 and any(s in out.stdout for s in ("idle", "mix", "alloc"))


pytestmark = [pytest.mark.slurm, pytest.mark.slow,
              pytest.mark.skipif(not slurm_up(), reason="no SLURM cluster here (.ci/slurm.sh up starts one)")]


def jobs_in(workdir: Path) -> list[dict[str, str]]:
    """SLURM's record of every job started from `workdir` (the CI cluster keeps finished ones for an hour)."""
    out = subprocess.run(["scontrol", "show", "job", "-o"], capture_output=True, text=True, timeout=30).stdout
    jobs = [dict(re.findall(r"(\w+)=(\S*)", line)) for line in out.splitlines() if line.strip()]
    return [j for j in jobs if j.get("WorkDir") == str(workdir)]


def rule_of(job: dict[str, str]) -> str:
    """The plugin puts 'rule_<name>_wildcards_...' into the job's comment."""
    return re.match(r"rule_(.+?)(?:_wildcards_.*)?$", job["Comment"]).group(1)


def slurm(workdir, cfg, *args, timeout=600, check=True, profile=PROFILE):
    return run_snakemake(workdir, cfg, "--profile", str(profile), *args, timeout=timeout, check=check)


def weights(run_dir: Path) -> dict[str, torch.Tensor]:
    return checkpoint_state_dict(run_dir / "checkpoints", checkpoint.latest_tag(run_dir))


def reference_args(run_dir: Path, out: Path, nproc: int = 1) -> list[str]:
    """`tacl` arguments of the same run (settings from run.json) in one go, outside SLURM."""
    root = run_dir.parents[2]
    settings = json.loads((run_dir / "run.json").read_text())["settings"]
    return ["pretrain", "train", "--run-dir", str(out), "--start-model", str(root / "models" / "start"),
            "--manifest", str(root / "data" / "shards" / "manifest.json"), "--settings", json.dumps(settings),
            "--no-tensorboard", *(["--nproc", str(nproc)] if nproc > 1 else [])]


def uninterrupted(run_dir: Path, out: Path, threads: int, nproc: int = 1) -> dict[str, torch.Tensor]:
    """The same run in one go, with the jobs' thread count (CPU matrix products sum in another order with
    another number of threads)."""
    run_tacl(*reference_args(run_dir, out, nproc), timeout=600, env={"OMP_NUM_THREADS": str(threads)})
    return weights(out)


def small_config(tmp_path: Path, **pretrain) -> dict:
    cfg = demo_config(tmp_path)
    cfg["pretrain"].update({"objectives": ["none", "mlm_nsp"], "steps": 450, "checkpoint_minutes": 0.5, **pretrain})
    # chunks end on the wall clock alone (no step cap), 1 minute each; busy CI: more chunks
    cfg["pretrain"]["chunk"].update(runtime_minutes=1, margin_minutes=0.25, max_chunks=20, max_steps=None)
    # (one fine-tune per model, two models: the DAG through sbatch, not the demo's sweep, extra model and
    # contrastive rows, which test_workflow runs)
    cfg["finetune"].update(tasks=["qnli"], seeds_small=1, seeds_large=1, sweep={}, extra_models={},
                           contrastive={"forms": []})
    cfg["finetune"]["hparams"]["glue"].update(max_train_examples=100, max_eval_examples=100, epochs=1)
    cfg["finetune"]["runtime_minutes"] = {"default": 10}
    cfg["analysis"]["similarity_sentences"] = 50
    return cfg


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    """The data stage and the start model, through SLURM once per pytest run; the tests start from copies.
    (pytest-xdist workers share one build: the first to take the lock builds it, the others wait.)"""
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # this run's directory, above each worker's own
    workdir = root / "slurm_data"
    with open(root / "slurm_data.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (workdir / "built").is_file():
            shutil.rmtree(workdir, ignore_errors=True)
            workdir.mkdir()
            results = workdir / "results"
            slurm(workdir, small_config(workdir), str(results / "data" / "shards" / "manifest.json"),
                  str(results / "models" / "start"), timeout=600)
            (workdir / "built").touch()
    return workdir


def start_from(prepared: Path, workdir: Path) -> None:
    for part in ("data", "models/start"):
        shutil.copytree(prepared / "results" / part, workdir / "results" / part)


def test_demo_through_sbatch_and_one_minute_chunks(tmp_path, prepared):
    """The demo DAG on SLURM: every non-local job is an sbatch job; pretraining chunks get a 1-minute limit,
    each ends itself before it (COMPLETED, never TIMEOUT), the chain submits the next, and each chunk goes on
    from the step the one before saved, with the same number of threads, every step logged once. (That a
    chunk ended on its deadline resumes to the uninterrupted run's weights: test_pretrain.py's
    test_deadline_chunk_then_next_chunk_reaches_the_same_weights; through SLURM, after an scancel:
    test_scancel_then_rerun_resumes_two_srun_ranks.)"""
    cfg = small_config(tmp_path)
    start_from(prepared, tmp_path)
    started = time.time()
    slurm(tmp_path, cfg, timeout=900)
    elapsed = time.time() - started
    jobs = jobs_in(prepared) + jobs_in(tmp_path)
    rules = {rule_of(j) for j in jobs}
    assert rules == {"clean", "shard", "pretrain_chunk", "export_model", "finetune", "similarity"}, rules
    assert all(j["JobState"] == "COMPLETED" for j in jobs), [(rule_of(j), j["JobState"]) for j in jobs]
    chunks = sorted((j for j in jobs if rule_of(j) == "pretrain_chunk"), key=lambda j: int(j["JobId"]))
    assert len(chunks) >= 2 and all(j["TimeLimit"] == "00:01:00" for j in chunks)
    results = tmp_path / "results"
    paths = sorted((results / "pretrain" / "mlm_nsp").glob("chunk-*.json"), key=lambda p: int(p.stem.split("-")[1]))
    markers = [json.loads(p.read_text()) for p in paths]
    assert len(markers) == len(chunks) and markers[-1]["done"] and markers[-1]["step"] == 450
    assert all(m["reason"] == "deadline" for m in markers[:-1]), markers  # the profile sends no --signal
    assert (results / "report" / "report.md").is_file()
    for k, (before, marker) in enumerate(zip(markers, markers[1:]), start=1):
        log = (results / "logs" / "pretrain" / "mlm_nsp" / f"chunk-{k}.log").read_text()
        tag = f"step{before['step']:08d}"
        assert f"resumed from {tag} at step {before['step']} " in log and before["checkpoint"] == tag, log[-2000:]
        assert marker["steps_this_chunk"] == marker["step"] - before["step"]
    assert len({m["threads"] for m in markers}) == 1, markers
    steps = [m["step"] for m in read_metrics(results / "pretrain" / "mlm_nsp" / "run")]
    assert steps == sorted(set(steps)) and steps[-1] == 450, steps
    print(f"SLURM demo: {len(jobs)} jobs, {len(chunks)} chunks, {elapsed:.0f} s")


def test_scancel_then_rerun_resumes_two_srun_ranks(tmp_path, prepared):
    """Two ranks started by srun (gloo, CPU). The running chunk is cancelled with scancel; Snakemake
    reports the failed job; the same command again resumes from the last checkpoint (nothing lost
    beyond the checkpoint interval) and ends with the weights of an uninterrupted 2-rank run."""
    cfg = small_config(tmp_path, launcher="srun", ranks_per_node=2, steps=200, checkpoint_minutes=0.1)
    cfg["pretrain"]["objectives"] = ["mlm_nsp"]
    cfg["pretrain"]["chunk"].update(runtime_minutes=5)
    start_from(prepared, tmp_path)
    target = str(tmp_path / "results" / "models" / "mlm_nsp.json")
    run_dir = tmp_path / "results" / "pretrain" / "mlm_nsp" / "run"
    first = start_snakemake(tmp_path, cfg, "--profile", str(PROFILE), target, bound=600)
    try:
        deadline = time.time() + 400
        while checkpoint.latest_tag(run_dir) is None if run_dir.exists() else True:
            assert first.poll() is None, first.communicate()[1][-3000:]
            assert time.time() < deadline, "no checkpoint in time"
            time.sleep(0.5)
        time.sleep(3)
        running = [j for j in jobs_in(tmp_path) if rule_of(j) == "pretrain_chunk" and j["JobState"] == "RUNNING"]
        assert len(running) == 1 and running[0]["NumTasks"] == "2"
        saved_before = int(checkpoint.latest_tag(run_dir)[4:])
        subprocess.run(["scancel", running[0]["JobId"]], check=True, timeout=30)
        out, err = first.communicate(timeout=300)
    finally:
        if first.poll() is None:
            first.kill()
    assert first.returncode != 0
    assert "Error in rule pretrain_chunk" in out + err
    assert [j["JobState"] for j in jobs_in(tmp_path) if j["JobId"] == running[0]["JobId"]] == ["CANCELLED"]
    slurm(tmp_path, cfg, target, timeout=600)
    log = (tmp_path / "results" / "logs" / "pretrain" / "mlm_nsp" / "chunk-0.log").read_text()
    resumed = int(re.search(r"resumed from step(\d+) at step", log).group(1))
    assert resumed >= saved_before, "the rerun starts from the newest checkpoint"
    assert json.loads((tmp_path / "results" / "models" / "mlm_nsp.json").read_text())["steps"] == 200
    final = json.loads((tmp_path / "results" / "pretrain" / "mlm_nsp" / "chunk-0.json").read_text())
    reference = uninterrupted(run_dir, tmp_path / "reference", final["threads"], nproc=2)
    got = weights(run_dir)
    assert all(torch.equal(got[k], reference[k]) for k in reference), "2 srun ranks resume exactly"


def custom_profile(tmp_path: Path, **defaults) -> Path:
    profile = yaml.safe_load((PROFILE / "config.yaml").read_text())
    profile["default-resources"].update(defaults)
    d = tmp_path / "profile"
    d.mkdir()
    (d / "config.yaml").write_text(yaml.safe_dump(profile))
    return d


@pytest.mark.parametrize("case", ["runtime", "account", "placeholder"])
def test_preflight_stops_before_anything_is_submitted(tmp_path, case, monkeypatch):
    cfg = small_config(tmp_path)
    profile = PROFILE
    if case == "runtime":
        cfg["pretrain"]["chunk"]["runtime_minutes"] = 90
        expect = ("rule pretrain_chunk: runtime 90 min is over the 60 min limit of partition 'ci'; "
                  "lower pretrain.chunk.runtime_minutes")
    elif case == "account":
        profile = custom_profile(tmp_path, slurm_partition="ci-acct")
        expect = "partition 'ci-acct' accepts only accounts tacl, not (none); set slurm_account in the profile"
    else:
        monkeypatch.delenv("TACL_SLURM_ACCOUNT", raising=False)
        profile = custom_profile(tmp_path, slurm_account="'${TACL_SLURM_ACCOUNT}'")
        expect = "slurm_account is '${TACL_SLURM_ACCOUNT}': export the variable or write the account"
    proc = slurm(tmp_path, cfg, timeout=120, check=False, profile=profile)
    assert proc.returncode != 0
    assert "SLURM preflight: nothing was submitted." in proc.stderr and expect in proc.stderr, proc.stderr[-3000:]
    assert jobs_in(tmp_path) == []


def test_copied_data_is_not_rebuilt(tmp_path, prepared):
    """(what the tests above rely on) a run that starts from copies of the data and start model goes
    straight to pretraining."""
    start_from(prepared, tmp_path)
    dry = slurm(tmp_path, small_config(tmp_path), "-n", timeout=120)
    assert "rule clean:" not in dry.stdout and "rule shard:" not in dry.stdout
    assert "pretrain_chunk" in dry.stdout


def test_submitit_signal_checkpoint_requeue(tmp_path, prepared):
    """`tacl submit pretrain` (no Snakemake) of TACO: the job gets the signal SLURM sends before its time
    limit (sent here by the test once a checkpoint exists, so that the cycle does not depend on this machine's
    speed); the trainer saves, submitit requeues the same job, the new start resumes from that checkpoint
    and the run ends with the weights of an uninterrupted one, bit for bit (TACO's positives and negatives,
    drawn per group of the step, and its dropout resume exactly)."""
    cfg = small_config(tmp_path, steps=200, checkpoint_minutes=0.1)
    start_from(prepared, tmp_path)
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump(cfg))
    slurm_args = {"slurm_partition": "ci", "cpus_per_task": 1, "mem_gb": 3}
    proc = run_tacl("submit", "pretrain", "--config", str(config), "--objective", "taco", "--folder",
                    str(tmp_path / "submitit"), "--timeout-min", "10", "--slurm", json.dumps(slurm_args),
                    timeout=120, cwd=tmp_path)
    job_id = json.loads(proc.stdout.strip().splitlines()[-1])["job_id"]
    run_dir = tmp_path / "results" / "pretrain" / "taco" / "run"
    marker = run_dir / "submitit-marker.json"

    def wait_for(condition, what, limit=400):
        deadline = time.time() + limit
        while not condition():
            assert time.time() < deadline, f"{what}: not within {limit} s"
            time.sleep(0.5)

    wait_for(lambda: run_dir.exists() and checkpoint.latest_tag(run_dir) is not None, "first checkpoint")
    subprocess.run(["scancel", "--signal=USR2", job_id], check=True, timeout=30)
    wait_for(lambda: marker.is_file() and not json.loads(marker.read_text())["done"], "the save on the signal")
    saved = json.loads(marker.read_text())["step"]
    wait_for(lambda: [j["JobState"] for j in jobs_in(tmp_path) if j["JobId"] == job_id] == ["COMPLETED"],
             "the requeued job to complete")
    [job] = [j for j in jobs_in(tmp_path) if j["JobId"] == job_id]
    assert job["Restarts"] == "1", job
    result = json.loads(marker.read_text())
    assert result["done"] and result["step"] == 200
    log = "".join(p.read_text() for p in (tmp_path / "submitit").glob("*_log.err"))
    assert f"resumed from step{saved:08d}" in log
    reference = uninterrupted(run_dir, tmp_path / "reference", result["threads"])
    got = weights(run_dir)
    assert all(torch.equal(got[k], reference[k]) for k in reference)
