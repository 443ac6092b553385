"""PBS Pro (profiles/pbs, src/tacl/cluster/{pbs,scheduler,launch,preflight}.py) without a PBS server: qsub command
lines, the job script's exit file, job states from qstat output in PBS Pro's documented formats (`qstat -f -F
json`, and the text form `qstat -f` that stands in when PBS 2022 prints broken JSON), holds, jobs PBS no longer
knows, queue limits, the PBS preflight through Snakemake, two torchrun agents that rendezvous through the same
launcher code a multi-node job uses, and the demo's data stage through Snakemake's cluster-generic executor
with a stand-in PBS that runs each job on this machine. (No PBS server installs here; SLURM is the cluster
tested for real, tests/test_slurm.py.)"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from conftest import REPO, demo_config, run_snakemake, run_tacl
from tacl.runtime import scheduler as query
from tacl.cluster import launch
from tacl.cluster.pbs import exported_env, job_script, job_status, qsub_command, status_of
from tacl.cluster.preflight import PbsRequest, launcher_problem, parse_queues, pbs_problems
from tacl.runtime.scheduler import end_of, job_record, parse_qstat_text, parse_walltime, pbs_time_left
from tacl.runtime.io import InputError

# -- fixtures in PBS Pro's formats --------------------------------------------------------------------------

# a bash function as `module` leaves it and `qsub -V` copies it (OpenPBS #2541), and a value PBS 2022 prints
# as a JSON number (OpenPBS #1255)
BASH_FUNC = '() {  eval "$($LMOD_CMD bash "$@")" && eval $(${LMOD_SETTARG_CMD:-:} -s sh)\n}'


def qstat_job_dict(state: str, exit_status: int | None = None, stime: str = "Tue Nov 24 10:00:00 2026",
                   walltime: str = "23:30:00", hold: str = "n", comment: str | None = None) -> dict:
    """One job of `qstat -x -f -F json JOBID` as PBS Pro prints it (abridged)."""
    job = {
        "Job_Name": "tacl.pretrain_chunk", "Job_Owner": "user@login01.supek", "job_state": state,
        "queue": "gpu", "server": "pbs01", "Checkpoint": "u", "ctime": "Tue Nov 24 09:58:01 2026",
        "Error_Path": "login01:/home/user/tacl/results/pbs-logs/pretrain_chunk/",
        "exec_host": "gpu07/0*32", "Hold_Types": hold, "Join_Path": "oe", "mtime": "Tue Nov 24 10:00:02 2026",
        "Resource_List": {"mem": "200000mb", "ncpus": 32, "ngpus": 4, "nodect": 1, "place": "free",
                          "select": "1:ncpus=32:mem=200000mb:ngpus=4", "walltime": walltime},
        "resources_used": {"cpupercent": 2400, "cput": "120:00:00", "mem": "80gb", "ncpus": 32,
                           "vmem": "90gb", "walltime": "05:00:00"},
        "stime": stime, "substate": 42,
        "Variable_List": {"PBS_O_HOME": "/home/user", "PBS_O_WORKDIR": "/home/user/tacl", "VARS": "here"},
        "project": "_pbs_project_default", "run_count": 1,
    }
    if comment is not None:
        job["comment"] = comment
    if exit_status is not None:
        job["Exit_status"] = exit_status
        job["substate"] = 92
    return job


def qstat_json(job_id: str, *args, **kw) -> str:
    return json.dumps({"timestamp": 1764000000, "pbs_version": "2022.1.1", "pbs_server": "pbs01",
                       "Jobs": {job_id: qstat_job_dict(*args, **kw)}}, indent=4)


def broken_qstat_json(job_id: str, bug: str, *args, **kw) -> str:
    """What PBS Pro 2022 prints for a job whose Variable_List holds a bash function (#2541) or FOO=005 (#1255)."""
    text = qstat_json(job_id, *args, **kw)
    bad = '"BASH_FUNC_module%%": "' + BASH_FUNC + '"' if bug == "2541" else '"FOO": 005'
    return text.replace('"VARS": "here"', bad)


def qstat_text(job_id: str, state: str, exit_status: int | None, hold: str = "n", comment: str = "") -> str:
    """`qstat -x -f JOBID`: `name = value` lines, long values wrapped onto tab-indented lines, a function's
    newline printed as it is."""
    variables = ("PBS_O_HOME=/home/user,PBS_O_LANG=en_US.UTF-8,PBS_O_LOGNAME=user,PBS_O_PATH=/usr/bin:/bin,"
                 f"BASH_FUNC_module%%={BASH_FUNC},FOO=005,PBS_O_WORKDIR=/home/user/tacl,PBS_O_SYSTEM=Linux")
    wrapped = "\n\t".join(variables[i:i + 70] for i in range(0, len(variables), 70))
    lines = [f"Job Id: {job_id}", "    Job_Name = tacl.finetune", "    Job_Owner = user@login01.supek",
             "    resources_used.walltime = 01:02:03", f"    job_state = {state}", "    queue = gpu",
             "    ctime = Tue Nov 24 09:58:01 2026", f"    Hold_Types = {hold}",
             "    Resource_List.ngpus = 1", "    Resource_List.select = 1:ncpus=8:mem=48000mb:ngpus=1",
             "    Resource_List.walltime = 04:00:00", "    stime = Tue Nov 24 10:00:00 2026",
             f"    Variable_List = {wrapped}"]
    if comment:
        lines.append(f"    comment = {comment}")
    if exit_status is not None:
        lines.append(f"    Exit_status = {exit_status}")
    return "\n".join(lines + ["    run_count = 1", "    project = _pbs_project_default", ""])


QUEUES_JSON = json.dumps({"timestamp": 1764000000, "pbs_version": "2022.1.1", "pbs_server": "pbs01", "Queue": {
    "cpu": {"queue_type": "Execution", "total_jobs": 3, "resources_max": {"walltime": "48:00:00"},
            "resources_default": {"walltime": "01:00:00"}, "enabled": "True", "started": "True"},
    "gpu": {"queue_type": "Execution", "total_jobs": 12, "resources_max": {"ngpus": 8, "walltime": "24:00:00"},
            "resources_min": {"ngpus": 1}, "enabled": "True", "started": "True"},
    "gpu_test": {"queue_type": "Execution", "resources_max": {"walltime": "00:30:00"}, "enabled": "False",
                 "started": "True"}}}, indent=4)
QUEUES_TEXT = """Queue: cpu
    queue_type = Execution
    total_jobs = 3
    resources_max.walltime = 48:00:00
    enabled = True
    started = True

Queue: gpu
    queue_type = Execution
    total_jobs = 12
    state_count = Transit:0 Queued:4 Held:0 Waiting:0 Running:8 Exiting:0 Begun:0
    resources_max.ngpus = 8
    resources_max.walltime = 24:00:00
    resources_min.ngpus = 1
    enabled = True
    started = True
"""


def fake_commands(bin_dir: Path, scripts: dict[str, str]) -> dict[str, str]:
    bin_dir.mkdir(parents=True, exist_ok=True)
    for name, body in scripts.items():
        path = bin_dir / name
        path.write_text("#!/usr/bin/env bash\n" + body)
        path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return {"PATH": f"{bin_dir}:{os.environ['PATH']}"}


# -- submit -------------------------------------------------------------------------------------------------


def test_qsub_command_for_one_node_and_several():
    cmd = qsub_command("/home/u/.snakemake/tmp/snakejob.pretrain_chunk.7.sh", "gpu", 4, 32, 200000, 1410,
                       "pretrain_chunk", "results/pbs-logs/pretrain_chunk", project="p123")
    assert cmd == ["qsub", "-q", "gpu", "-l", "select=1:ncpus=32:mem=200000mb:ngpus=4", "-l", "walltime=23:30:00",
                   "-N", "tacl.pretrain_chunk", "-j", "oe", "-o", "results/pbs-logs/pretrain_chunk/", "-S",
                   "/bin/bash", "-V", "-P", "p123", "/home/u/.snakemake/tmp/snakejob.pretrain_chunk.7.sh"]
    two = qsub_command("job.sh", "gpu", 4, 32, 200000, 1410, "pretrain_chunk", "logs", nodes=2)
    assert two[:8] == ["qsub", "-q", "gpu", "-l", "select=2:ncpus=32:mem=200000mb:ngpus=4:mpiprocs=1", "-l",
                       "place=scatter:excl", "-l"], "one MPI process (a torchrun agent) per node, nodes of its own"
    cpu = qsub_command("job.sh", "cpu", 0, 16, 16000, 720, "clean", "logs")
    assert "select=1:ncpus=16:mem=16000mb" in cpu and "walltime=12:00:00" in cpu and "-P" not in cpu
    assert not any(a.startswith("place=") for a in cpu)
    with pytest.raises(InputError, match="PBS queue '\\$\\{TACL_PBS_GPU_QUEUE\\}': set pbs_queue"):
        qsub_command("job.sh", "${TACL_PBS_GPU_QUEUE}", 4, 32, 1000, 60, "finetune", "logs")
    with pytest.raises(InputError, match="rule pretrain_chunk: nodes 0"):
        qsub_command("job.sh", "gpu", 4, 32, 1000, 60, "pretrain_chunk", "logs", nodes=0)
    env = exported_env({"PATH": "/bin", "BASH_FUNC_module%%": BASH_FUNC, "BASH_FUNC_ml%%": "() { x\n}", "FOO": "005"})
    assert env == {"PATH": "/bin", "FOO": "005"}, "what -V copies holds no bash functions (OpenPBS #2541)"


def run_job_script(tmp_path: Path, body: str, require_gpu: bool = False, job_id: str = "4242.pbs01",
                   signal_after: float | None = None) -> Path:
    """The job script as PBS runs it: bash, started in $HOME (here: an empty directory), with $PBS_JOBID."""
    home = tmp_path / "home"
    home.mkdir(parents=True, exist_ok=True)
    script = tmp_path / "job.pbs"
    script.write_text(job_script("#!/bin/sh\n# properties = {}\n" + body, str(tmp_path / "exit"), require_gpu))
    proc = subprocess.Popen(["bash", str(script)], cwd=home, env={**os.environ, "PBS_JOBID": job_id},
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    if signal_after is not None:  # PBS signals the job's whole session
        time.sleep(signal_after)
        os.killpg(proc.pid, signal.SIGTERM)
    proc.communicate(timeout=30)
    return tmp_path / "exit"


def test_the_job_leaves_its_exit_status_atomically(tmp_path):
    exits = run_job_script(tmp_path, 'test "$TACL_REQUIRE_GPU" = 1 && exit 3 || exit 1\n', require_gpu=True)
    assert (exits / "4242.pbs01.exit").read_text() == "3\n", "exit status, and TACL_REQUIRE_GPU=1 when ngpus > 0"
    assert [p.name for p in exits.iterdir()] == ["4242.pbs01.exit"], "no temporary file left beside it"
    exits = run_job_script(tmp_path / "b", 'test -z "$TACL_REQUIRE_GPU" && exit 0 || exit 1\n')
    assert (exits / "4242.pbs01.exit").read_text() == "0\n"
    # SIGTERM (the walltime limit, qdel) once the running command stopped: 143, still written
    exits = run_job_script(tmp_path / "c", "sleep 30\n", signal_after=0.5)
    assert (exits / "4242.pbs01.exit").read_text() == "143\n"


# -- status -------------------------------------------------------------------------------------------------


def test_job_states_from_qstat_json_and_text():
    jid = "4242.pbs01"
    cases = {"queued": (("Q",), "running"), "running": (("R",), "running"), "exiting": (("E",), "running"),
             "user hold": (("H",), "running"), "done": (("F", 0), "success"), "failed": (("F", 1), "failed"),
             "qdel'd": (("F", 271), "failed"), "walltime": (("F", -29), "failed"), "subjob": (("X", 0), "success")}
    for name, (args, expected) in cases.items():
        hold = "u" if name == "user hold" else "n"
        assert status_of(job_record(qstat_json(jid, *args, hold=hold), jid)) == expected, name
    held = job_record(qstat_json(jid, "H", hold="s", comment="job held, too many failed attempts to run"), jid)
    assert status_of(held) == "failed", "a system hold never ends by itself"
    assert job_record(qstat_json("4242.pbs01.supek.srce.hr", "R"), "4242.pbs01")["job_state"] == "R"
    assert status_of(None) == "failed" and status_of(None, 0) == "success" and status_of(None, 2) == "failed"
    # the text form (qstat -x -f JOBID): wrapped values joined, dotted names nested as in the JSON
    record = parse_qstat_text(qstat_text(jid, "F", 0, comment="Job run at Tue Nov 24 at 10:00 on (gpu07)"))[jid]
    assert record["job_state"] == "F" and record["Exit_status"] == "0" and status_of(record) == "success"
    assert record["Resource_List"] == {"ngpus": "1", "select": "1:ncpus=8:mem=48000mb:ngpus=1", "walltime": "04:00:00"}
    assert "BASH_FUNC_module%%=() {  eval" in record["Variable_List"] and "},FOO=005,PBS_O_WORKDIR=/home/user/tacl,"\
        in record["Variable_List"], "a wrapped value is one value again"
    assert record["comment"] == "Job run at Tue Nov 24 at 10:00 on (gpu07)" and record["run_count"] == "1"
    assert end_of(record) == end_of(job_record(qstat_json(jid, "R", walltime="04:00:00"), jid))
    assert [parse_walltime(t) for t in ("23:30:00", "90:00", "3600", "100:00:00")] == [84600, 5400, 3600, 360000]
    for bug in ("2541", "1255"):
        with pytest.raises(json.JSONDecodeError):
            json.loads(broken_qstat_json(jid, bug, "F", 0))


QSTAT = """state={state}; args="$*"; echo "$args" >> "$state/qstat.calls"; id="${{@: -1}}"
if [ -f "$state/fail" ]; then echo "qstat: cannot connect to server pbs01 (errno=15010)" >&2; exit 1; fi
case "$args" in
  *-Qf*-F\\ json*) cat "$state/queues.json" ;;
  *-Qf*) cat "$state/queues.txt" ;;
  *-F\\ json*) [ -f "$state/$id.json" ] || {{ echo "qstat: Unknown Job Id $id" >&2; exit 153; }}
    cat "$state/$id.json" ;;
  *) [ -f "$state/$id.txt" ] || {{ echo "qstat: Unknown Job Id $id" >&2; exit 153; }}; cat "$state/$id.txt" ;;
esac
"""


@pytest.fixture
def pbs(tmp_path, monkeypatch):
    """A qstat that answers from files (JOBID.json / JOBID.txt), and a qdel that records what it deletes."""
    state = tmp_path / "pbs"
    state.mkdir()
    env = fake_commands(tmp_path / "bin", {"qstat": QSTAT.format(state=state),
                                           "qdel": f'echo "$@" >> "{state}/qdel.calls"\n'})
    monkeypatch.setenv("PATH", env["PATH"])
    return state


def test_status_when_pbs_no_longer_knows_the_job(pbs, tmp_path):
    """History off (PBS Pro's default) or past job_history_duration: `qstat -x` says Unknown Job Id (exit 153);
    the job's own exit file decides, and only a job that left none counts as failed."""
    exits, said = tmp_path / "exit", []
    exits.mkdir()
    (exits / "1001.pbs01.supek.srce.hr.exit").write_text("0\n")  # ($PBS_JOBID may spell the server out)
    (exits / "1002.pbs01.exit").write_text("1\n")
    assert job_status("1001.pbs01", str(exits), said.append) == "success"
    assert job_status("1002.pbs01", str(exits), said.append) == "failed"
    assert said == []
    assert job_status("1003.pbs01", str(exits), said.append) == "failed"
    assert said == [f"PBS job 1003.pbs01: qstat no longer knows it (job history off, or older than "
                    f"job_history_duration) and it left no exit status in {exits}: counted as failed"]
    # a job qstat still knows: qstat decides, not a leftover file
    (pbs / "1002.pbs01.json").write_text(qstat_json("1002.pbs01", "R"))
    assert job_status("1002.pbs01", str(exits), said.append) == "running"


def test_status_through_broken_json_falls_back_to_text(pbs, tmp_path):
    for n, bug in ((1, "2541"), (2, "1255")):
        jid = f"200{n}.pbs01"
        (pbs / f"{jid}.json").write_text(broken_qstat_json(jid, bug, "F", 0))
        (pbs / f"{jid}.txt").write_text(qstat_text(jid, "F", 0 if n == 1 else 2))
        assert job_status(jid, str(tmp_path), lambda s: None) == ("success" if n == 1 else "failed"), bug
    calls = (pbs / "qstat.calls").read_text().splitlines()
    assert calls == ["-x -f -F json 2001.pbs01", "-x -f 2001.pbs01", "-x -f -F json 2002.pbs01", "-x -f 2002.pbs01"]


def test_holds_and_comments(pbs, tmp_path):
    said = []
    jid = "3001.pbs01"
    insufficient = "Not Running: Insufficient amount of resource: ngpus"
    (pbs / f"{jid}.json").write_text(qstat_json(jid, "Q", comment=insufficient))
    assert job_status(jid, str(tmp_path), said.append) == "running"
    assert job_status(jid, str(tmp_path), said.append) == "running"
    assert said == ["PBS job 3001.pbs01 (tacl.pretrain_chunk, state Q): Not Running: Insufficient amount of "
                    "resource: ngpus"], "a comment is printed when it changes, not at every check"
    (pbs / f"{jid}.json").write_text(qstat_json(jid, "H", hold="u", comment="Job held by user on Tue Nov 24"))
    assert job_status(jid, str(tmp_path), said.append) == "running" and len(said) == 2
    assert not (pbs / "qdel.calls").exists(), "a user hold stays the user's"
    held = "job held, too many failed attempts to run"
    (pbs / f"{jid}.json").write_text(qstat_json(jid, "H", hold="s", comment=held))
    assert job_status(jid, str(tmp_path), said.append) == "failed"
    assert said[2] == "PBS job 3001.pbs01 (tacl.pretrain_chunk, state H): job held, too many failed attempts to run"
    assert said[3] == ("PBS job 3001.pbs01: held by the system (Hold_Types s), which never releases it by itself: "
                       "counted as failed and deleted (qdel)")
    assert (pbs / "qdel.calls").read_text() == "3001.pbs01\n"
    assert not (tmp_path / f"{jid}.comment").exists(), "a finished job's comment record is removed"


def test_a_failing_qstat_is_asked_three_times_and_not_waited_for_after_the_last(pbs, tmp_path, monkeypatch,
                                                                                   capsys):
    from tacl.cluster.pbs import status_main

    (pbs / "fail").touch()
    pauses = []
    monkeypatch.setattr(query, "_pause", pauses.append)
    assert status_main("4001.pbs01", str(tmp_path)) == 0
    out, err = capsys.readouterr()
    assert out == "running\n", "a status command that fails would stop the whole run"
    assert "qstat failed for 4001.pbs01 (1): qstat: cannot connect to server pbs01" in err
    assert pauses == [2.0, 4.0], "three tries, a pause between two, none after the last"
    assert len((pbs / "qstat.calls").read_text().splitlines()) == 3


def test_submit_and_status_commands(tmp_path):
    env = fake_commands(tmp_path / "bin", {
        "qsub": f'echo "$@" > "{tmp_path}/qsub.args"; env > "{tmp_path}/qsub.env"; cp "${{@: -1}}" "{tmp_path}/job"\n'
                'echo 4242.pbs01\n',
        "qstat": f'case "$*" in *4242*) cat "{tmp_path}/state.json" ;; '
                 '*) echo "qstat: Unknown Job Id ${@: -1}" >&2; exit 153 ;; esac\n'})
    env["BASH_FUNC_module%%"] = BASH_FUNC
    (tmp_path / "job.sh").write_text("#!/bin/sh\necho snakemake job\n")
    exits = str(tmp_path / "exit")
    proc = run_tacl("pbs", "submit", "--queue", "gpu", "--ngpus", "1", "--ncpus", "8", "--mem-mb", "48000",
                    "--runtime", "240", "--name", "finetune", "--log-dir", str(tmp_path / "logs"), "--exit-dir",
                    exits, "--project", "", str(tmp_path / "job.sh"), env=env)
    assert proc.stdout.strip() == "4242.pbs01"
    assert (tmp_path / "qsub.args").read_text().split() == [
        "-q", "gpu", "-l", "select=1:ncpus=8:mem=48000mb:ngpus=1", "-l", "walltime=04:00:00", "-N", "tacl.finetune",
        "-j", "oe", "-o", f"{tmp_path / 'logs'}/", "-S", "/bin/bash", "-V", f"{tmp_path / 'job.sh'}.pbs"]
    assert "BASH_FUNC_" not in (tmp_path / "qsub.env").read_text()
    job = (tmp_path / "job").read_text()
    assert job.endswith("#!/bin/sh\necho snakemake job\n") and "export TACL_REQUIRE_GPU=1" in job
    assert (tmp_path / "logs").is_dir()
    for state, expected in ((("R",), "running"), (("F", 0), "success"), (("F", 2), "failed")):
        (tmp_path / "state.json").write_text(qstat_json("4242.pbs01", *state))
        assert run_tacl("pbs", "status", "--exit-dir", exits, "4242.pbs01", env=env).stdout.strip() == expected
    assert run_tacl("pbs", "status", "--exit-dir", exits, "9999.pbs01", env=env).stdout.strip() == "failed"


def test_chunk_deadline_from_pbs(tmp_path, monkeypatch):
    """Inside a PBS job, the chunk's end time is the job's start time + walltime (qstat of $PBS_JOBID)."""
    from conftest import Clock
    from tacl.pretrain import deadline

    clock = Clock()  # (the time the modules see: the figures below are exact however busy the machine is)
    monkeypatch.setattr(query, "time", clock)
    monkeypatch.setattr(deadline, "time", clock)
    started = clock.now - 600
    (tmp_path / "qstat.json").write_text(qstat_json("77.pbs01", "R", stime=time.ctime(started), walltime="00:30:00"))
    env = fake_commands(tmp_path / "bin", {"qstat": f'cat "{tmp_path}/qstat.json"\n'})
    monkeypatch.setenv("PATH", env["PATH"])
    monkeypatch.setenv("PBS_JOBID", "77.pbs01")
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    left = pbs_time_left()
    assert left == 1200
    assert deadline.end_time(clock.now, None, 60) == started + 1800, "the earlier of PBS and runtime"
    assert end_of(json.loads(qstat_json("1", "R", stime=1764000000, walltime="01:00:00"))["Jobs"]["1"]) == 1764003600
    monkeypatch.delenv("PBS_JOBID")
    assert pbs_time_left() is None


# -- preflight ----------------------------------------------------------------------------------------------


def test_queue_limits_and_pbs_preflight_messages():
    queues = parse_queues(json.loads(QUEUES_JSON)["Queue"])
    assert parse_queues(parse_qstat_text(QUEUES_TEXT)) == {k: v for k, v in queues.items() if k != "gpu_test"}
    assert queues["gpu"].max_walltime == 86400 and queues["gpu"].max_ngpus == 8 and queues["gpu"].min_ngpus == 1
    assert not queues["gpu_test"].enabled

    def request(rule="pretrain_chunk", queue="gpu", runtime=1410, ngpus=4, nodes=1):
        return PbsRequest(rule, queue, runtime, "pretrain.chunk.runtime_minutes", ngpus, nodes)

    assert pbs_problems([request(), request(nodes=2), request("clean", "cpu", 720, 0)], queues, 4) == []
    assert pbs_problems([request(runtime=1500)], queues, 4) == [
        "rule pretrain_chunk: runtime 1500 min is over the 24:00:00 walltime limit of queue 'gpu' "
        "(resources_max.walltime); lower pretrain.chunk.runtime_minutes"]
    assert pbs_problems([request(nodes=3)], queues, 4) == [
        "rule pretrain_chunk: 12 GPU(s) asked for, over the 8 of queue 'gpu' (resources_max.ngpus); lower "
        "pretrain.ranks_per_node or pretrain.nodes"]
    assert pbs_problems([request()], queues, 2) == [
        "rule pretrain_chunk: the profile gives each of its 1 node(s) 4 GPU(s) (gpu under set-resources), but "
        "pretrain.ranks_per_node is 2 (one rank per GPU); make them agree"]
    [missing] = pbs_problems([request("shard", "short", 60, 0)], queues, 4)
    assert missing == ("rule shard: queue 'short' does not exist on this PBS server (queues: cpu, gpu, gpu_test); "
                       "set pbs_queue in the profile")
    [cpu_in_gpu_queue] = pbs_problems([request("export_model", "gpu", 60, 0)], queues, 4)
    assert ("queue 'gpu' takes jobs with at least 1 GPU(s) (resources_min.ngpus), the rule asks for 0"
            in cpu_in_gpu_queue)
    [disabled] = pbs_problems([request("finetune", "gpu_test", 10, 1)], queues, 4)
    assert disabled.startswith("rule finetune: queue 'gpu_test' does not take jobs (enabled = False)")
    [unset] = pbs_problems([request("finetune", "${TACL_PBS_GPU_QUEUE}", 10, 1)], None, 4)
    assert "pbs_queue is '${TACL_PBS_GPU_QUEUE}': export the variable" in unset
    assert launcher_problem("pbs", "srun", "auto") == (
        "rule pretrain_chunk: pretrain.launcher is auto (srun for pretrain.nodes > 1), which needs a SLURM job step; "
        "under PBS set pretrain.launcher to mpiexec (Cray PALS, as on Supek) or pbsdsh: one torchrun agent per node")
    assert launcher_problem("pbs", "mpiexec", "mpiexec") is None and launcher_problem("pbs", "torchrun", "auto") is None
    assert launcher_problem("slurm", "srun", "auto") is None
    assert launcher_problem("slurm", "torchrun", "torchrun") is None
    assert "under SLURM use srun" in launcher_problem("slurm", "pbsdsh", "pbsdsh")


def pbs_profile(tmp_path: Path, state: Path, queues: str = QUEUES_JSON, history: bool = True) -> dict[str, str]:
    """profiles/pbs with quick polling, and a stand-in PBS in PATH that runs each job here (as `qsub -V` would:
    in $HOME, its output in `-o DIR/`JOBID.OU, the job's exit status in PBS's records unless history is off)."""
    state.mkdir(parents=True, exist_ok=True)
    (state / "queues.json").write_text(queues)
    if not history:
        (state / "history-off").touch()
    env = fake_commands(tmp_path / "bin", {k: v.format(state=state) for k, v in STAND_IN_PBS.items()})
    env.update(TACL_PBS_CPU_QUEUE="cpu", TACL_PBS_GPU_QUEUE="gpu")
    profile = yaml.safe_load((REPO / "profiles/pbs/config.yaml").read_text())
    profile.update({"latency-wait": 5, "seconds-between-status-checks": 2, "max-status-checks-per-second": 10})
    (tmp_path / "profile").mkdir()
    (tmp_path / "profile" / "config.yaml").write_text(yaml.safe_dump(profile))
    return env


STAND_IN_PBS = {  # qsub starts the job script here, qstat reports its state, qstat -Qf the queues
    "qsub": """state={state}; mkdir -p "$state"; n=$(( $(ls "$state" | grep -c '\\.args$') + 1000 )); id="$n.fakepbs"
script="${{@: -1}}"; echo "$@" > "$state/$id.args"; env | grep -c '^BASH_FUNC_' > "$state/$id.bashfunc"
out=$(echo "$@" | sed -n 's/.* -o \\([^ ]*\\/\\) .*/\\1/p'); case "$out" in /*) ;; *) out="$PWD/$out" ;; esac
echo R > "$state/$id.state"
( cd "$HOME" && PBS_JOBID="$id" PBS_O_WORKDIR="$OLDPWD" PBS_ENVIRONMENT=PBS_BATCH bash "$script" > "$out$id.OU" 2>&1
  echo "F $?" > "$state/$id.state" ) &
echo "$id"
""",
    "qstat": """state={state}; id="${{@: -1}}"
case "$*" in *-Qf*) cat "$state/queues.json"; exit 0 ;; esac
[ -f "$state/$id.state" ] || {{ echo "qstat: Unknown Job Id $id" >&2; exit 153; }}
read s code < "$state/$id.state"
if [ "$s" = F ] && [ -f "$state/history-off" ]; then echo "qstat: Unknown Job Id $id" >&2; exit 153; fi
python3 -c "import json,sys; j={{'job_state': sys.argv[1]}}
sys.argv[2] and j.update(Exit_status=int(sys.argv[2]))
print(json.dumps({{'Jobs': {{sys.argv[3]: j}}}}))" "$s" "$code" "$id"
""",
    "qdel": "exit 0\n",
}


@contextlib.contextmanager
def with_env(env: dict[str, str]):
    """Set env for a block (Snakemake's subprocesses inherit os.environ)."""
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for k, v in old.items():
            os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)


@pytest.mark.slow
def test_pbs_preflight_stops_before_the_first_qsub(tmp_path):
    """Snakemake with the PBS profile and the demo config made wrong for Supek's queues: one line per problem,
    each naming the rule and the key, and no job submitted."""
    state = tmp_path / "pbs"
    env = pbs_profile(tmp_path, state)
    env["TACL_PBS_CPU_QUEUE"] = "short"
    # a profile from before commit ffb03ec (2026-11-25), which set the chunk's GPUs itself (the workflow sets
    # them now)
    profile = yaml.safe_load((tmp_path / "profile" / "config.yaml").read_text())
    profile["set-resources"]["pretrain_chunk"]["gpu"] = 4
    (tmp_path / "profile" / "config.yaml").write_text(yaml.safe_dump(profile))
    cfg = demo_config(tmp_path, **{"pretrain.nodes": 2, "pretrain.ranks_per_node": 2, "pretrain.global_batch": 16,
                                   "pretrain.chunk.runtime_minutes": 1500})
    # a dry run checks too: a queue variable left unset is named
    unset = os.environ.pop("TACL_PBS_GPU_QUEUE", None)
    try:
        with with_env({k: v for k, v in env.items() if k != "TACL_PBS_GPU_QUEUE"}):
            proc = run_snakemake(tmp_path, cfg, "--profile", str(tmp_path / "profile"), "-n", check=False,
                                 timeout=300)
    finally:
        if unset is not None:
            os.environ["TACL_PBS_GPU_QUEUE"] = unset
    assert proc.returncode != 0 and "PBS preflight: this dry run stops here." in proc.stderr, proc.stderr[-3000:]
    assert re.search(r"rules [\w, ]*\bfinetune\b[\w, ]*: pbs_queue is '\$\{TACL_PBS_GPU_QUEUE\}': export the variable",
                     proc.stderr), proc.stderr[-3000:]
    with with_env(env):
        proc = run_snakemake(tmp_path, cfg, "--profile", str(tmp_path / "profile"), check=False, timeout=300)
    assert proc.returncode != 0
    assert not list(state.glob("*.args")), "nothing submitted"
    err = proc.stderr
    assert "PBS preflight: nothing was submitted." in err, err[-3000:]
    for line in ("rule pretrain_chunk: pretrain.launcher is auto (srun for pretrain.nodes > 1), which needs a SLURM "
                 "job step; under PBS set pretrain.launcher to mpiexec",
                 "rule pretrain_chunk: the profile gives each of its 2 node(s) 4 GPU(s) (gpu under set-resources), "
                 "but pretrain.ranks_per_node is 2",
                 "rule pretrain_chunk: runtime 1500 min is over the 24:00:00 walltime limit of queue 'gpu' "
                 "(resources_max.walltime); lower pretrain.chunk.runtime_minutes",
                 "clean, shard, export_model: queue 'short' does not exist on this PBS server (queues: cpu, gpu, "
                 "gpu_test)"):
        assert line in err, (line, err[-3000:])


# -- several nodes ------------------------------------------------------------------------------------------


def test_agent_command_lines(tmp_path):
    nodefile = tmp_path / "nodes"
    nodefile.write_text("gpu07.supek\ngpu07.supek\ngpu12.supek\ngpu12.supek\n")  # (mpiprocs=2 would repeat hosts)
    assert launch.nodefile_hosts(nodefile) == ["gpu07.supek", "gpu12.supek"]
    environ = {"PBS_JOBID": "77.pbs01", "PBS_NODEFILE": str(nodefile), "PATH": "/venv/bin:/bin",
               "CUDA_VISIBLE_DEVICES": "GPU-8f6c2a31,GPU-1b0e77d2", "PBS_NODENUM": "0", "HF_HUB_OFFLINE": "1"}
    trainer = ["python", "-m", "tacl", "pretrain", "train", "--run-dir", "run"]
    cmd, spec, state = launch.plan("mpiexec", 2, 4, trainer, str(tmp_path / "launch"), 29400, environ)
    agent = ["env", f"PYTHONPATH={REPO / 'src'}" + (os.pathsep + os.environ["PYTHONPATH"]
                                                   if os.environ.get("PYTHONPATH") else ""),
             sys.executable, "-m", "tacl", "pbs", "agent", str(tmp_path / "launch" / "77.pbs01" / "agent.json")]
    assert cmd == ["mpiexec", "-n", "2", "--ppn", "1", *agent]
    assert launch.plan("pbsdsh", 2, 4, trainer, str(tmp_path / "launch"), 29400, environ)[0] == ["pbsdsh", "--", *agent]
    assert spec["command"] == [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "4",
                               "--rdzv-backend", "c10d", "--rdzv-endpoint", "gpu07.supek:29400", "--rdzv-id",
                               "77.pbs01", "--max-restarts", "0", "--no-python", *trainer]
    assert spec["env"] == {"PBS_JOBID": "77.pbs01", "PBS_NODEFILE": str(nodefile), "PATH": "/venv/bin:/bin",
                           "HF_HUB_OFFLINE": "1"}, "each node keeps its own GPUs and node number"
    assert spec["cwd"] == os.getcwd() and state == tmp_path / "launch" / "77.pbs01"
    with pytest.raises(InputError, match=r"lists 2 node\(s\) \(gpu07.supek, gpu12.supek\) but pretrain.nodes is 3"):
        launch.plan("mpiexec", 3, 4, trainer, str(tmp_path), 29400, environ)
    with pytest.raises(InputError, match="runs inside a PBS job"):
        launch.plan("pbsdsh", 2, 4, trainer, str(tmp_path), 29400, {})


# PBS Pro's pbsdsh as a job sees it: one task per $PBS_NODEFILE entry, started in $HOME with the job's qsub-time
# environment (none of what the job script exported), exit status 0 whatever the tasks did
PBSDSH = """[ "$1" = "--" ] && shift
i=0; pids=()
while read -r host; do
  ( cd "$HOME" && exec env -i HOME="$HOME" PATH=/usr/bin:/bin PBS_JOBID="$PBS_JOBID" PBS_NODENUM=$i "$@" ) &
  pids+=($!); i=$((i + 1))
done < "$PBS_NODEFILE"
for p in "${pids[@]}"; do wait "$p"; done
exit 0
"""


def test_an_agent_that_fails_fails_the_launch_although_pbsdsh_exits_0(tmp_path, monkeypatch, capfd):
    env = fake_commands(tmp_path / "bin", {"pbsdsh": PBSDSH})
    nodefile = tmp_path / "nodes"
    nodefile.write_text("node-a\nnode-b\n")
    monkeypatch.setattr(launch, "torchrun_command", lambda *a, **k: ["sh", "-c", 'echo "rank on $PBS_NODENUM"; '
                                                                     'test "$PBS_NODENUM" = 0 || exit 3'])
    environ = {**os.environ, **env, "PBS_JOBID": "88.pbs01", "PBS_NODEFILE": str(nodefile)}
    assert launch.launch("pbsdsh", 2, 1, ["true"], str(tmp_path / "launch"), 29400, environ) == 3
    out, err = capfd.readouterr()
    assert "(exit 0) <==\nrank on 0\n" in out and "(exit 3) <==\nrank on 1\n" in out
    assert "2 of 2 agents reported, failed: {" in err


@pytest.mark.slow
def test_two_agents_rendezvous_and_train_one_chunk_together(demo_data, tmp_path):
    """`tacl pbs launch` as a two-node chunk runs it, on this machine: pbsdsh (stand-in) starts an agent per
    $PBS_NODEFILE entry, the agents rendezvous (c10d, gloo) at the first entry under $PBS_JOBID, and the real
    trainer runs with two ranks, one per "node"."""
    from tacl.pretrain.distributed import free_port

    env = fake_commands(tmp_path / "bin", {"pbsdsh": PBSDSH})
    nodefile = tmp_path / "nodes"
    nodefile.write_text("localhost\n127.0.0.1\n")
    # two "nodes" on one host whose name resolves to loopback: gloo's interface is loopback, named as a user
    # names it where host names resolve to loopback (tacl.pretrain.distributed.configure_gloo)
    env.update(PBS_JOBID="99.pbs01", PBS_NODEFILE=str(nodefile), OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo")
    settings = {"objective": "mlm_nsp", "steps": 3, "global_batch": 8, "micro_batch": 4, "lr": 2e-3, "log_every": 1,
                "max_len": 64, "seed": 3, "loader_workers": 0}
    marker = tmp_path / "chunk-0.json"
    proc = run_tacl("pbs", "launch", "--starter", "pbsdsh", "--nodes", "2", "--ranks-per-node", "1", "--state-dir",
                    str(tmp_path / "launch"), "--port", str(free_port()), "--",
                    "python", "-m", "tacl", "pretrain", "train", "--run-dir", str(tmp_path / "run"), "--start-model",
                    str(demo_data["start"]), "--manifest", str(demo_data["manifest"]), "--settings",
                    json.dumps(settings), "--marker", str(marker), "--no-tensorboard", env=env, check=False,
                    cwd=tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    done = json.loads(marker.read_text())
    assert done["world_size"] == 2 and done["step"] == 3 and done["done"], done
    assert proc.stdout.count(" (exit 0) <==") == 2
    assert "--rdzv-endpoint localhost:" in proc.stdout and "--rdzv-id 99.pbs01" in proc.stdout


# -- the demo's data stage through cluster-generic ------------------------------------------------------------


@pytest.mark.slow
def test_data_stage_through_cluster_generic_and_a_stand_in_pbs(tmp_path):
    """The profile's submit, status and cancel commands as Snakemake's cluster-generic executor runs them: the
    demo's data stage, each job submitted with qsub (the stand-in runs it here, in $HOME, its output in the -o
    directory) and followed with qstat, which, with job history off as PBS Pro's default is, forgets every job
    once it finished: the jobs' exit files tell that they succeeded."""
    state = tmp_path / "pbs"
    env = pbs_profile(tmp_path, state, history=False)
    env["BASH_FUNC_module%%"] = BASH_FUNC
    cfg = demo_config(tmp_path, device="auto")  # (the GPU rules then ask the gpu queue for its least, 1 GPU)
    with with_env(env):
        summary = str(tmp_path / "results/data/summary.json")
        run_snakemake(tmp_path, cfg, "--profile", str(tmp_path / "profile"), summary, timeout=600)
    submitted = {p.name[: -len(".args")]: p.read_text().split() for p in state.glob("*.args")}
    rules = sorted(args[args.index("-N") + 1] for args in submitted.values())
    assert rules == ["tacl.clean", "tacl.shard", "tacl.shard"], rules
    clean = next(a for a in submitted.values() if "tacl.clean" in a)
    assert clean[:6] == ["-q", "cpu", "-l", "select=1:ncpus=16:mem=16000mb", "-l", "walltime=12:00:00"]
    for job_id, args in submitted.items():
        assert (state / f"{job_id}.state").read_text().split() == ["F", "0"]
        assert (state / f"{job_id}.bashfunc").read_text().strip() == "0", "no BASH_FUNC_* exported to the job"
        assert (tmp_path / "results/pbs-logs/exit" / f"{job_id}.exit").read_text() == "0\n"
        rule = args[args.index("-N") + 1].split(".")[1]
        assert (tmp_path / "results/pbs-logs" / rule / f"{job_id}.OU").is_file()
    assert json.loads((tmp_path / "results/data/summary.json").read_text())["shards"] == 2


def test_doctor_counts_gpus_given_as_uuids(monkeypatch):
    """PBS on Supek sets CUDA_VISIBLE_DEVICES to GPU UUIDs: `tacl doctor` counts them as GPUs, and says so when
    they name more GPUs than this node has (a UUID of another node's GPU)."""
    from tacl.runtime import device

    uuids = "GPU-8f6c2a31-5e0b-11ee-8c99-0242ac120002,GPU-1b0e77d2-5e0b-11ee-8c99-0242ac120002"
    assert device.visible_gpus(uuids) == uuids.split(",")
    assert device.visible_gpus("0, 1") == ["0", "1"] and device.visible_gpus(None) is None
    monkeypatch.setattr(device, "cuda_problem", lambda: None)
    monkeypatch.setattr(device, "device_info", lambda d=None: {"gpus": 2, "gpu": "NVIDIA A100-SXM4-40GB",
                                                               "bf16": True})
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", uuids)
    assert device.doctor()[1] == []
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", uuids + ",GPU-00000000-0000-0000-0000-000000000000")
    assert device.doctor()[1] == ["CUDA_VISIBLE_DEVICES names 3 GPU(s) but torch sees 2: an index or UUID there is "
                                  "not a GPU of this node (CUDA stops at the first it cannot find)"]
