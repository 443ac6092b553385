"""SLURM helpers without a cluster: the preflight checks on `scontrol` output, and the submitit callable
(what it pickles, what `checkpoint()` resubmits, its input errors). tests/test_slurm.py runs both for real."""

from __future__ import annotations

import pickle
import re
import time

import pytest
import yaml

from tacl.cluster.preflight import JobRequest, parse_node_states, parse_partitions, problems
from tacl.runtime.scheduler import slurm_minutes, slurm_seconds
from tacl.cluster.submit import PretrainRun, run_from_config
from tacl.runtime.io import InputError

SCONTROL = (
    "PartitionName=cpu AllowGroups=ALL AllowAccounts=ALL Default=YES MaxTime=1-00:00:00 State=UP\n"
    "PartitionName=gpu AllowAccounts=p123,p456 Default=NO MaxTime=24:00:00 State=UP\n"
    "PartitionName=long AllowAccounts=ALL Default=NO MaxTime=UNLIMITED State=UP\n"
)


def request(rule="pretrain_chunk", partition="gpu", runtime=60, account="p123"):
    return JobRequest(rule, partition, runtime, account, "pretrain.chunk.runtime_minutes")


def test_scontrol_partitions_and_time_limits():
    parts = parse_partitions(SCONTROL)
    assert set(parts) == {"cpu", "gpu", "long"}
    assert parts["cpu"].max_minutes == 1440 and parts["cpu"].default and parts["cpu"].allow_accounts is None
    assert parts["gpu"].max_minutes == 1440 and parts["gpu"].allow_accounts == {"p123", "p456"}
    assert parts["long"].max_minutes is None
    assert [slurm_minutes(t) for t in ("60", "01:30:00", "00:00:30", "2-01:00:00", "2-01")] == [60, 90, 1, 2940, 2940]
    # squeue's %L (time left), as the trainer's deadline reads it
    assert [slurm_seconds(t) for t in ("1-02:03:04", "02:03:04", "03:04", "UNLIMITED", "INVALID")] == [
        93784, 7384, 184, None, None]


def test_preflight_names_rule_and_key():
    parts = parse_partitions(SCONTROL)
    assert problems([request(), request(partition=None), request(partition="long", runtime=10**6)], parts) == []
    [over] = problems([request(runtime=1441)], parts)
    assert over == ("rule pretrain_chunk: runtime 1441 min is over the 1440 min limit of partition 'gpu'; "
                    "lower pretrain.chunk.runtime_minutes")
    [acct] = problems([request(account="p999")], parts)
    assert "partition 'gpu' accepts only accounts p123, p456, not p999" in acct
    [missing] = problems([request(partition="a100")], parts)
    assert "partition 'a100' does not exist on this cluster (partitions: cpu, gpu, long)" in missing
    [placeholder] = problems([request(partition="cpu", account="${TACL_SLURM_ACCOUNT}")], parts)
    assert "slurm_account is '${TACL_SLURM_ACCOUNT}': export the variable" in placeholder


SINFO = ("gpu|gpu01|mixed\ngpu|gpu02|down*\ngpu|gpu03|drained\ngpu|gpu04|idle*\ngpu|gpu05|allocated\n"
         "gpu|gpu06|idle~\ncpu|cn01|idle\nlong|cn01|idle\n")


def test_preflight_counts_the_nodes_that_take_jobs():
    """Down, drained or not responding (`*`) nodes do not count: a job that needs them waits in the queue
    until they come back (a powered-down node, `~`, is started by SLURM and counts)."""
    parts, states = parse_partitions(SCONTROL), parse_node_states(SINFO)
    assert states["gpu"]["gpu02"] == "down*" and states["cpu"] == {"cn01": "idle"}

    def chunk(nodes: int) -> JobRequest:
        return JobRequest("pretrain_chunk", "gpu", 60, "p123", "k", nodes, "pretrain.nodes")

    assert problems([chunk(3), request(partition="cpu")], parts, states) == []
    [short] = problems([chunk(4)], parts, states)
    assert short == ("rule pretrain_chunk: asks for 4 nodes, partition 'gpu' has 3 that take jobs; not "
                     "answering or out of service: gpu02 (down*), gpu03 (drained), gpu04 (idle*). The job "
                     "would wait in the queue until enough come back (`sinfo -p gpu`); lower pretrain.nodes "
                     "or wait for the nodes")
    [few] = problems([chunk(7)], parts, states)
    assert few == "rule pretrain_chunk: asks for 7 nodes, partition 'gpu' has 6; lower pretrain.nodes"
    assert problems([chunk(0)], parts, states) == [] and problems([chunk(9)], parts, None) == []


def test_chunk_log_names_each_end_time_and_its_source(monkeypatch):
    """What each rank logs at a chunk's start: the earliest end first, then the other sources."""
    from conftest import Clock
    from tacl.pretrain import deadline

    clock = Clock()
    monkeypatch.setattr(deadline, "time", clock)
    monkeypatch.setenv("SLURM_JOB_ID", "7")
    monkeypatch.setattr(deadline, "time_left", lambda: 100.0)
    ends = deadline.end_times(clock.now, None, 5)
    assert ends == {"runtime 5 min": clock.now + 300, "squeue, SLURM job 7": clock.now + 100}
    assert list(ends) == ["runtime 5 min", "squeue, SLURM job 7"]
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(clock.now + 100))
    assert deadline.describe(ends).startswith(f"ends {stamp} (squeue, SLURM job 7; runtime 5 min 20")
    assert deadline.end_time(clock.now, None, 5) == clock.now + 100
    monkeypatch.setattr(deadline, "time_left", lambda: None)
    none = "no end time (no scheduler limit, no runtime, no deadline)"
    assert deadline.describe(deadline.end_times(clock.now)) == none


def test_submitit_callable_pickles_and_resubmits_itself(tmp_path):
    run = PretrainRun(str(tmp_path / "run"), str(tmp_path / "start"), str(tmp_path / "manifest.json"),
                      {"objective": "tacl", "steps": 10}, nproc=2)
    run._child = object()  # (a running trainer is not part of what submitit pickles)
    copy = pickle.loads(pickle.dumps(run))
    assert copy._child is None and copy.__dict__ == {**run.__dict__, "_child": None}
    again = run.__class__.checkpoint(copy)  # no trainer running: nothing to signal, the same run requeued
    assert isinstance(again.function, PretrainRun) and again.function.__dict__ == copy.__dict__
    command = copy._command("marker.json")
    assert command[-2:] == ["--nproc", "2"] and "--marker" in command and str(tmp_path / "run") in command


def test_submit_without_prepared_data_names_the_missing_file(tmp_path):
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({"results_dir": str(tmp_path / "results")}))
    with pytest.raises(InputError, match=r"models/start/config.json: not found; run the workflow up to it first"):
        run_from_config(str(config), "tacl")
    config.write_text(yaml.safe_dump({"pretrian": {}}))
    with pytest.raises(InputError, match="pretrian"):
        run_from_config(str(config), "tacl")


# -- the profiles through snakemake-executor-plugin-slurm's own checks and sbatch line (no cluster needed) ------


def sbatch_preview(tmp_path, config: dict, profile: str, extra_profile: dict | None = None) -> dict:
    """Snakemake with the profile, up to the preflight, which writes each rule's sbatch line and stops."""
    import json
    import os

    from conftest import REPO, run_snakemake

    profile_dir = REPO / "profiles" / profile
    if extra_profile:
        merged = yaml.safe_load((profile_dir / "config.yaml").read_text())
        for rule, resources in extra_profile.items():
            merged["set-resources"].setdefault(rule, {}).update(resources)
        profile_dir = tmp_path / "profile"
        profile_dir.mkdir(parents=True)
        (profile_dir / "config.yaml").write_text(yaml.safe_dump(merged))
    out = tmp_path / "sbatch.json"
    env = {"TACL_SBATCH_PREVIEW": str(out), "TACL_SLURM_ACCOUNT": "p123", "TACL_SLURM_CPU_PARTITION": "cpu",
           "TACL_SLURM_GPU_PARTITION": "gpu"}
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        proc = run_snakemake(tmp_path, config, "--profile", str(profile_dir), check=False, timeout=300)
    finally:
        for k, v in old.items():
            os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)
    assert out.is_file(), proc.stderr[-3000:]
    assert "nothing was submitted" in proc.stderr
    return json.loads(out.read_text())


def flags(line: str) -> dict[str, str]:
    import shlex

    out = {}
    for token in shlex.split(line)[1:]:
        if token.startswith("--"):
            key, _, value = token.partition("=")
            out[key] = value
    return out


@pytest.mark.slow
@pytest.mark.parametrize("nodes", [1, 2])
def test_paper_config_on_supek_profile_passes_the_slurm_plugin(tmp_path, nodes):
    from conftest import REPO

    cfg = yaml.safe_load((REPO / "config.yaml").read_text())
    cfg["pretrain"]["nodes"] = nodes
    preview = sbatch_preview(tmp_path, cfg, "slurm")
    assert preview["problems"] == []
    lines = preview["sbatch"]
    assert {"clean", "shard", "pretrain_chunk", "finetune", "similarity", "export_model"} <= set(lines)
    chunk = lines["pretrain_chunk"]
    f = flags(chunk)
    runtime = int(re.search(r" -t (\d+) ", chunk).group(1))
    assert 60 < runtime < 1410, "sized to the run's work, below pretrain.chunk.runtime_minutes"
    assert " -p gpu " in chunk and " -A p123 " in chunk and "--mem 200000" in chunk
    assert f["--gres"] == "gpu:4" and f["--nodes"] == str(nodes) and f["--signal"] == "USR1@600"
    assert "--gpus" not in f and "--ntasks-per-gpu" not in f
    if nodes == 1:  # one task; torchrun starts the 4 ranks
        assert f["--cpus-per-task"] == "32" and "--ntasks" not in f and "--ntasks-per-node" not in f
    else:  # one task per GPU on each node, srun starts them
        assert f["--ntasks-per-node"] == "4" and f["--cpus-per-task"] == "8"
    finetune = flags(lines["finetune"])
    assert finetune["--gpus"] == "1" and finetune["--cpus-per-task"] == "8" and "--nodes" not in finetune
    assert " -p cpu " in lines["clean"] and "--gpus" not in flags(lines["clean"])
    # every GPU job is warned ten minutes before its time limit (a fine-tune's seeds save; the analysis ignores it)
    gpu_jobs = {rule: flags(line) for rule, line in lines.items() if {"--gpus", "--gres"} & flags(line).keys()}
    assert set(gpu_jobs) == {"pretrain_chunk", "finetune", "similarity"}
    assert {rule: f.get("--signal") for rule, f in gpu_jobs.items()} == dict.fromkeys(gpu_jobs, "USR1@600")


@pytest.mark.slow
def test_ci_profile_passes_the_slurm_plugin_and_bad_resources_name_the_rule(tmp_path):
    from conftest import demo_config

    cfg = demo_config(tmp_path, **{"pretrain.launcher": "srun", "pretrain.ranks_per_node": 2})
    preview = sbatch_preview(tmp_path / "ci", cfg, "slurm-ci")
    assert preview["problems"] == []
    f = flags(preview["sbatch"]["pretrain_chunk"])
    assert f["--ntasks-per-node"] == "2" and f["--nodes"] == "1" and f["--cpus-per-task"] == "1"
    assert " -p ci " in preview["sbatch"]["pretrain_chunk"]
    # what the plugin 2.8 refuses in slurm_extra, a malformed GRES, GPUs per node that disagree with the ranks
    bad = sbatch_preview(tmp_path / "bad", cfg, "slurm-ci",
                         {"pretrain_chunk": {"slurm_extra": "'--gpus-per-node=4 --nodes=2'", "gres": "'gpu:4'"},
                          "finetune": {"gres": "'gpu 2'"}})
    assert len(bad["problems"]) == 3 and "finetune" not in bad["sbatch"], bad["problems"]
    assert bad["problems"][0].startswith("rule finetune (resource gres): Invalid GRES format: gpu 2")
    assert bad["problems"][1].startswith("rule pretrain_chunk (resource slurm_extra): The --number-of-nodes option "
                                         "is not allowed in the 'slurm_extra' parameter")
    assert bad["problems"][2] == ("rule pretrain_chunk: the profile gives each of its 1 node(s) 4 GPU(s) (gres "
                                  "gpu:4), but pretrain.ranks_per_node is 2 (one rank per GPU); make them agree")


def test_hooks_know_the_scheduler_and_print_the_summary(tmp_path):
    """What the Snakefile's onstart and onsuccess call (tacl.cluster.hooks): which scheduler the run submits to,
    from the executor and its submit command, and the data summary line."""
    import json
    from types import SimpleNamespace as NS

    from tacl.cluster.hooks import data_summary, scheduler

    def workflow(plugin, submit_cmd=None):
        return NS(executor_plugin=plugin and NS(name=plugin), executor_settings=NS(submit_cmd=submit_cmd))

    assert scheduler(workflow("slurm")) == "slurm"
    assert scheduler(workflow("cluster-generic", "python -m tacl pbs submit --queue {resources.pbs_queue}")) == "pbs"
    assert scheduler(workflow("cluster-generic", "sbatch --parsable")) is None
    assert scheduler(workflow("local")) is None and scheduler(workflow(None)) is None
    path, manifest = tmp_path / "summary.json", tmp_path / "manifest.json"
    assert data_summary(str(path), str(manifest), "results/demo") is None
    path.write_text(json.dumps({"documents": 3, "sentences": 40, "examples": 12, "tokens": 900, "shards": 2}))
    manifest.write_text(json.dumps({"shards": []}))  # (NSP pairs: a manifest without a form, as before forms)
    assert data_summary(str(path), str(manifest), "results/demo") == (
        "summary (results/demo): 3 documents, 40 sentences, 12 NSP examples, 900 tokens in 2 shards")
    manifest.write_text(json.dumps({"shards": [], "form": "sentences"}))  # (a family without NSP: RoBERTa's form)
    assert data_summary(str(path), str(manifest), "results/demo") == (
        "summary (results/demo): 3 documents, 40 sentences, 12 sequences of whole sentences, 900 tokens in 2 shards")


def test_the_directory_option_is_read_in_one_place_and_its_absence_stops_the_run():
    """`workflow.overwrite_workdir` (Snakemake's --directory, which no public method gives) is read by
    tacl.cluster.hooks.directory_chosen alone; a workflow object without it (another Snakemake) stops the run
    with an error that names the attribute and the Snakemake version, not a silent guess; the local rules are
    the workflow's own constant, not Snakemake's private set."""
    from types import SimpleNamespace as NS

    from snakemake import __version__
    from snakemake.exceptions import WorkflowError

    from conftest import REPO
    from tacl.cluster.hooks import cluster_rules, directory_chosen

    assert directory_chosen(NS(overwrite_workdir=None)) is False
    assert directory_chosen(NS(overwrite_workdir="/some/where")) is True
    with pytest.raises(WorkflowError) as e:
        directory_chosen(NS(basedir="workflow"))
    assert f"Snakemake {__version__} keeps no `overwrite_workdir`" in str(e.value)
    used = {p: p.read_text() for p in [*REPO.glob("src/tacl/**/*.py"), *REPO.glob("workflow/**/*.smk"),
                                       REPO / "workflow" / "Snakefile"]}
    assert [str(p) for p, text in used.items() if "overwrite_workdir" in text] == [
        str(REPO / "src" / "tacl" / "cluster" / "hooks.py")]
    assert [str(p) for p, text in used.items() if re.search(r"\bworkflow\._", text)] == []
    rules = [NS(name=name, norun=name == "all") for name in ("all", "clean", "report", "finetune")]
    assert [r.name for r in cluster_rules(NS(rules=rules))] == ["clean", "finetune"]
