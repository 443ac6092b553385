"""SLURM helpers without a cluster: the preflight checks on `scontrol` output, and the submitit callable
(what it pickles, what `checkpoint()` resubmits, its input errors). tests/test_slurm.py runs both for real."""

from __future__ import annotations

import pickle

import pytest
import yaml

from tacl.cluster.preflight import JobRequest, parse_minutes, parse_partitions, problems
from tacl.cluster.submit import PretrainRun, run_from_config
from tacl.io import InputError

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
    assert [parse_minutes(t) for t in ("60", "01:30:00", "00:00:30", "2-01:00:00")] == [60, 90, 1, 2940]


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
