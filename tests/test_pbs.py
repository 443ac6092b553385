"""PBS Pro (profiles/pbs, src/tacl/cluster/pbs.py) without a PBS server: qsub command lines, job states and
the chunk deadline read from qstat output in PBS Pro's documented `qstat -f -F json` format, the CLI
through fake qsub/qstat commands, and a small DAG through Snakemake's cluster-generic executor with a fake
PBS that runs each job script on this machine. (No PBS server installs here; SLURM is the cluster tested
for real, tests/test_slurm.py.)"""

from __future__ import annotations

import json
import os
import stat
import time
from pathlib import Path

import pytest
import yaml

from conftest import REPO, demo_config, run_snakemake, run_tacl
from tacl.cluster.pbs import end_of, job_record, parse_walltime, pbs_time_left, qsub_command, status_of
from tacl.io import InputError


def qstat_json(job_id: str, state: str, exit_status: int | None = None, stime: str = "Tue Nov 24 10:00:00 2026",
               walltime: str = "23:30:00") -> str:
    """`qstat -x -f -F json JOBID` as PBS Pro prints it (abridged to the attributes a job always has)."""
    job = {
        "Job_Name": "tacl.pretrain_chunk", "Job_Owner": "user@login01.supek", "job_state": state,
        "queue": "gpu", "server": "pbs01", "Checkpoint": "u", "ctime": "Tue Nov 24 09:58:01 2026",
        "Error_Path": "login01:/home/user/tacl/results/pbs-logs/pretrain_chunk/",
        "exec_host": "gpu07/0*32", "Join_Path": "oe", "mtime": "Tue Nov 24 10:00:02 2026",
        "Resource_List": {"mem": "200000mb", "ncpus": 32, "ngpus": 4, "nodect": 1, "place": "free",
                          "select": "1:ncpus=32:mem=200000mb:ngpus=4", "walltime": walltime},
        "resources_used": {"cpupercent": 2400, "cput": "120:00:00", "mem": "80gb", "ncpus": 32,
                           "vmem": "90gb", "walltime": "05:00:00"},
        "stime": stime, "substate": 42, "Variable_List": {"PBS_O_WORKDIR": "/home/user/tacl"},
        "project": "_pbs_project_default", "run_count": 1,
    }
    if exit_status is not None:
        job["Exit_status"] = exit_status
        job["substate"] = 92
    return json.dumps({"timestamp": 1764000000, "pbs_version": "2022.1.1", "pbs_server": "pbs01",
                       "Jobs": {job_id: job}}, indent=4)


def test_qsub_command_for_a_pretraining_chunk():
    cmd = qsub_command("/home/u/.snakemake/tmp/snakejob.pretrain_chunk.7.sh", "gpu", 4, 32, 200000, 1410,
                       "pretrain_chunk", "results/pbs-logs/pretrain_chunk", project="p123")
    assert cmd == ["qsub", "-q", "gpu", "-l", "select=1:ncpus=32:mem=200000mb:ngpus=4", "-l", "walltime=23:30:00",
                   "-N", "tacl.pretrain_chunk", "-j", "oe", "-o", "results/pbs-logs/pretrain_chunk/", "-V",
                   "-P", "p123", "/home/u/.snakemake/tmp/snakejob.pretrain_chunk.7.sh"]
    cpu = qsub_command("job.sh", "cpu", 0, 16, 16000, 720, "clean", "logs")
    assert "select=1:ncpus=16:mem=16000mb" in cpu and "walltime=12:00:00" in cpu and "-P" not in cpu
    with pytest.raises(InputError, match="PBS queue '\\$\\{TACL_PBS_GPU_QUEUE\\}': set pbs_queue"):
        qsub_command("job.sh", "${TACL_PBS_GPU_QUEUE}", 4, 32, 1000, 60, "finetune", "logs")
    with pytest.raises(InputError, match="rule pretrain_chunk: 2 nodes asked for, but under PBS a job runs on one"):
        qsub_command("job.sh", "gpu", 4, 32, 1000, 60, "pretrain_chunk", "logs", nodes=2)


def test_job_states_from_qstat_json():
    jid = "4242.pbs01"
    state = {name: status_of(job_record(qstat_json(jid, *args), jid)) for name, args in {
        "queued": ("Q",), "running": ("R",), "held": ("H",), "exiting": ("E",),
        "done": ("F", 0), "failed": ("F", 1), "walltime": ("F", 271), "killed": ("F", -29)}.items()}
    assert state == {"queued": "running", "running": "running", "held": "running", "exiting": "running",
                     "done": "success", "failed": "failed", "walltime": "failed", "killed": "failed"}
    assert status_of(None) == "failed", "a job PBS no longer knows is not running"
    assert job_record(qstat_json("4242.pbs01.supek.srce.hr", "R"), "4242.pbs01")["job_state"] == "R"
    assert [parse_walltime(t) for t in ("23:30:00", "90:00", "3600", "100:00:00")] == [84600, 5400, 3600, 360000]


def fake_commands(bin_dir: Path, scripts: dict[str, str]) -> dict[str, str]:
    bin_dir.mkdir(parents=True, exist_ok=True)
    for name, body in scripts.items():
        path = bin_dir / name
        path.write_text("#!/usr/bin/env bash\n" + body)
        path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return {"PATH": f"{bin_dir}:{os.environ['PATH']}"}


def test_chunk_deadline_from_pbs(tmp_path, monkeypatch):
    """Inside a PBS job, the chunk's end time is the job's start time + walltime (qstat of $PBS_JOBID)."""
    from tacl.pretrain.deadline import end_time

    started = time.time() - 600
    (tmp_path / "qstat.json").write_text(qstat_json("77.pbs01", "R", stime=time.ctime(started), walltime="00:30:00"))
    env = fake_commands(tmp_path / "bin", {"qstat": f'cat "{tmp_path}/qstat.json"\n'})
    monkeypatch.setenv("PATH", env["PATH"])
    monkeypatch.setenv("PBS_JOBID", "77.pbs01")
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    left = pbs_time_left()
    assert left == pytest.approx(1200, abs=5)
    assert end_time(time.time(), None, 60) == pytest.approx(started + 1800, abs=5), "the earlier of PBS and runtime"
    assert end_of(json.loads(qstat_json("1", "R", stime=1764000000, walltime="01:00:00"))["Jobs"]["1"]) == 1764003600
    monkeypatch.delenv("PBS_JOBID")
    assert pbs_time_left() is None


def test_submit_and_status_commands(tmp_path):
    env = fake_commands(tmp_path / "bin", {
        "qsub": f'echo "$@" > "{tmp_path}/qsub.args"\necho 4242.pbs01\n',
        "qstat": f'case "$*" in *4242*) cat "{tmp_path}/state.json" ;; '
                 '*) echo "qstat: Unknown Job Id $5" >&2; exit 153 ;; esac\n'})
    proc = run_tacl("pbs", "submit", "--queue", "gpu", "--ngpus", "1", "--ncpus", "8", "--mem-mb", "48000",
                    "--runtime", "240", "--name", "finetune", "--log-dir", str(tmp_path / "logs"), "--project", "",
                    "job.sh", env=env)
    assert proc.stdout.strip() == "4242.pbs01"
    assert (tmp_path / "qsub.args").read_text().split() == [
        "-q", "gpu", "-l", "select=1:ncpus=8:mem=48000mb:ngpus=1", "-l", "walltime=04:00:00", "-N", "tacl.finetune",
        "-j", "oe", "-o", f"{tmp_path / 'logs'}/", "-V", "job.sh"]
    assert (tmp_path / "logs").is_dir()
    for state, expected in ((("R",), "running"), (("F", 0), "success"), (("F", 2), "failed")):
        (tmp_path / "state.json").write_text(qstat_json("4242.pbs01", *state))
        assert run_tacl("pbs", "status", "4242.pbs01", env=env).stdout.strip() == expected
    assert run_tacl("pbs", "status", "9999.pbs01", env=env).stdout.strip() == "failed"


FAKE_PBS = {  # a PBS that runs each job script on this machine: qsub starts it, qstat reports its state
    "qsub": """state={state}; mkdir -p "$state"; n=$(( $(ls "$state" | wc -l) + 1000 )); id="$n.fakepbs"
script="${{@: -1}}"; echo "$@" > "$state/$id.args"; echo R > "$state/$id.state"
( PBS_JOBID="$id" bash "$script" > "$state/$id.log" 2>&1; echo "F $?" > "$state/$id.state" ) &
echo "$id"
""",
    "qstat": """state={state}; id="${{@: -1}}"; [ -f "$state/$id.state" ] || {{ echo "qstat: Unknown Job Id $id" >&2; exit 153; }}
read s code < "$state/$id.state"
python3 -c "import json,sys; j={{'job_state': sys.argv[1]}}; sys.argv[2] and j.update(Exit_status=int(sys.argv[2])); print(json.dumps({{'Jobs': {{sys.argv[3]: j}}}}))" "$s" "$code" "$id"
""",
    "qdel": "exit 0\n",
}


@pytest.mark.slow
def test_data_stage_through_cluster_generic_and_a_fake_pbs(tmp_path):
    """The profile's submit, status and cancel commands as Snakemake's cluster-generic executor runs them:
    the demo's data stage, each job submitted with qsub (the fake runs it here) and followed with qstat."""
    state = tmp_path / "pbs"
    env = fake_commands(tmp_path / "bin", {k: v.format(state=state) for k, v in FAKE_PBS.items()})
    env.update(TACL_PBS_CPU_QUEUE="cpu", TACL_PBS_GPU_QUEUE="gpu")
    profile = yaml.safe_load((REPO / "profiles/pbs/config.yaml").read_text())
    profile.update({"latency-wait": 5, "seconds-between-status-checks": 2})
    (tmp_path / "profile").mkdir()
    (tmp_path / "profile" / "config.yaml").write_text(yaml.safe_dump(profile))
    cfg = demo_config(tmp_path)
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        run_snakemake(tmp_path, cfg, "--profile", str(tmp_path / "profile"), str(tmp_path / "results/data/summary.json"),
                      timeout=600)
    finally:
        for k, v in old.items():
            os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)
    submitted = {p.name: p.read_text().split() for p in state.glob("*.args")}
    rules = sorted(args[args.index("-N") + 1] for args in submitted.values())
    assert rules == ["tacl.clean", "tacl.shard", "tacl.shard"], rules
    clean = next(a for a in submitted.values() if "tacl.clean" in a)
    assert clean[:6] == ["-q", "cpu", "-l", "select=1:ncpus=16:mem=16000mb", "-l", "walltime=12:00:00"]
    assert all((state / p.replace(".args", ".state")).read_text().split() == ["F", "0"] for p in submitted)
    assert json.loads((tmp_path / "results/data/summary.json").read_text())["shards"] == 2
