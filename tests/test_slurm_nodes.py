"""End to end on a real two-node SLURM cluster (.ci/slurm-nodes.sh up starts one on this machine: node01 and
node02, each in a network namespace of its own, joined by a veth pair; skipped without it, and under CI=true
that skip fails).

Snakemake runs where the jobs are submitted from (node01's network namespace, with that cluster's
SLURM_CONF), through the SLURM executor plugin and profiles/slurm-ci, as a user on a login node would. The
ranks of a chunk run in the nodes' namespaces: each sees its node's host name and reaches the other only
over the link between the nodes. The data and the start model are test_slurm's (built once per pytest run
on the single-node cluster, which .ci/run keeps up beside this one). Every run is bounded (`timeout -k`).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from conftest import REPO, snakemake_command
from tacl.pretrain import checkpoint
from test_slurm import prepared, reference_args, rule_of, small_config, start_from, weights  # noqa: F401

PROFILE = REPO / "profiles" / "slurm-ci"
CLUSTER_FILE = Path(os.environ.get("TACL_SLURM_NODES_RUN", "/run/tacl-slurm-nodes")) / "cluster.json"
NODES = ("node01", "node02")


def login_command(cluster: dict, *cmd: str) -> list[str]:
    """`cmd` where jobs are submitted from: node01's network namespace, this cluster's SLURM_CONF."""
    netns, conf = cluster["login_netns"], cluster["conf"]
    return ["nsenter", f"--net=/run/netns/{netns}", "env", f"SLURM_CONF={conf}", *cmd]


def two_nodes() -> dict | None:
    """The cluster's description (.ci/slurm-nodes.sh writes it once both nodes are up), if both are idle."""
    if not CLUSTER_FILE.is_file():
        return None
    cluster = json.loads(CLUSTER_FILE.read_text())
    try:
        out = subprocess.run(login_command(cluster, "sinfo", "-h", "-N", "-o", "%N %t"), capture_output=True,
                             text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    idle = out.returncode == 0 and sorted(out.stdout.split()) == sorted([*NODES, "idle", "idle"])
    return cluster if idle else None


CLUSTER = two_nodes()
pytestmark = [pytest.mark.slurm, pytest.mark.slow,
              pytest.mark.skipif(CLUSTER is None, reason=f"no two-node SLURM cluster here ({CLUSTER_FILE} "
                                 "absent, or its nodes not idle): .ci/slurm-nodes.sh up starts one")]


def login(*cmd: str, timeout: int = 30, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(login_command(CLUSTER, *cmd), capture_output=True, text=True, timeout=timeout,
                          check=check)


def all_jobs() -> list[dict[str, str]]:
    """SLURM's record of every job the two-node cluster knows (finished ones for an hour)."""
    lines = login("scontrol", "show", "job", "-o").stdout.splitlines()
    return [dict(re.findall(r"(\w+)=(\S*)", line)) for line in lines if "JobId=" in line]


def jobs_in(workdir: Path, after: int = 0) -> list[dict[str, str]]:
    """The jobs started from `workdir` whose id is above `after` (a folder of an earlier test run may have
    had the same name)."""
    return [j for j in all_jobs() if j.get("WorkDir") == str(workdir) and int(j["JobId"]) > after]


def chunk_jobs(workdir: Path, after: int) -> list[dict[str, str]]:
    chunks = [j for j in jobs_in(workdir, after) if rule_of(j) == "pretrain_chunk"]
    return sorted(chunks, key=lambda j: int(j["JobId"]))


def newest_job() -> int:
    return max((int(j["JobId"]) for j in all_jobs()), default=0)


@pytest.fixture
def jobs_cancelled_at_the_end():
    """The id above which this test's jobs are; any of them still queued or running at the end is cancelled
    (a failed test leaves nothing running on the cluster)."""
    before = newest_job()
    yield before
    left = [j["JobId"] for j in all_jobs()
            if int(j["JobId"]) > before and j["JobState"] in ("PENDING", "RUNNING")]
    if left:
        login("scancel", *left)


def snakemake(workdir: Path, cfg: dict, *args: str, bound: int = 300, **env: str) -> subprocess.Popen:
    """Snakemake on the two-node cluster in the background (output in workdir/snakemake-N.out). One thread
    per rank in every geometry (torchrun would set 1, srun leaves torch all cores), so that the weights can
    be compared bit for bit."""
    cmd, environ = snakemake_command(workdir, cfg, "--profile", str(PROFILE), *args, bound=bound)
    environ.update(OMP_NUM_THREADS="1", **env)
    output = workdir / f"snakemake-{len(list(workdir.glob('snakemake-*.out')))}.out"
    with open(output, "w") as out:
        proc = subprocess.Popen(login_command(CLUSTER, *cmd), env=environ, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)
    proc.output = output  # type: ignore[attr-defined]
    return proc


def finish(proc: subprocess.Popen, timeout: int = 330) -> tuple[int, str]:
    """Wait for Snakemake (killed with its jobs' submitters after `timeout`): exit code and output."""
    try:
        proc.wait(timeout=timeout)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, 9)
            proc.wait()
    return proc.returncode, proc.output.read_text()  # type: ignore[attr-defined]


def link_bytes() -> int:
    """Bytes node01 has sent over its link to node02."""
    out = subprocess.run(["ip", "-n", CLUSTER["nodes"]["node01"]["netns"], "-s", "-j", "link", "show", "dev",
                          CLUSTER["ifname"]], capture_output=True, text=True, timeout=10, check=True).stdout
    return json.loads(out)[0]["stats64"]["tx"]["bytes"]


def rank_lines(log: str, job_id: str) -> dict[int, tuple[str, str]]:
    """{rank: (host, end time)} from each rank's start line of a chunk (end time as squeue gave it)."""
    found = re.findall(rf"rank (\d+) of \d+ on (\S+): ends (\S+) \(squeue, SLURM job {job_id}[;)]", log)
    return {int(rank): (host, end) for rank, host, end in found}


def slurm_time(text: str) -> float:
    return time.mktime(time.strptime(text, "%Y-%m-%dT%H:%M:%S"))


def wait_for(condition, what: str, limit: float, proc: subprocess.Popen | None = None) -> None:
    deadline = time.time() + limit
    while not condition():
        assert proc is None or proc.poll() is None, f"{what}: Snakemake ended first ({proc.returncode})"
        assert time.time() < deadline, f"{what}: not within {limit} s"
        time.sleep(0.2)


def start_reference(run_dir: Path, out: Path) -> subprocess.Popen:
    """The same run in one go, 2 ranks (torchrun), one thread each, outside SLURM, in the background."""
    env = dict(os.environ, OMP_NUM_THREADS="1", PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}")
    cmd = [sys.executable, "-m", "tacl", *reference_args(run_dir, out, nproc=2)]
    with open(out.parent / "reference.log", "w") as log:
        return subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def node02_silent_stops_the_run(workdir: Path, prepared: Path) -> None:  # noqa: F811 (a path, not the fixture)
    """node02's slurmd stopped: once SLURM knows that the node does not answer, a 2-node chunk would wait in
    the queue for ever; the run stops before submitting anything, with one message naming the node and the
    key. (node02 is started again afterwards, whatever happens.)"""
    cfg = small_config(workdir, nodes=2, ranks_per_node=1)
    cfg["pretrain"]["objectives"] = ["mlm_nsp"]
    start_from(prepared, workdir)
    state = lambda: login("sinfo", "-h", "-N", "-n", "node02", "-o", "%T").stdout.strip()  # noqa: E731
    script, before = CLUSTER["script"], newest_job()
    subprocess.run([script, "stop-slurmd", "node02"], check=True, timeout=60, capture_output=True)
    try:
        wait_for(lambda: state().endswith("*"), "SLURM to mark node02 as not responding", 60)
        target = workdir / "results" / "pretrain" / "mlm_nsp" / "chunk-0.json"
        code, out = finish(snakemake(workdir, cfg, str(target), bound=120), 150)
    finally:
        subprocess.run([script, "start-slurmd", "node02"], check=True, timeout=90, capture_output=True)
    assert code != 0
    assert "SLURM preflight: nothing was submitted." in out, out[-3000:]
    assert re.search(r"rule pretrain_chunk: asks for 2 nodes, partition 'ci' has 1 that take jobs; not "
                     r"answering or out of service: node02 \((idle|down)\*\)\. .*lower pretrain\.nodes",
                     out), out[-3000:]
    assert jobs_in(workdir, before) == []


def test_two_nodes_cancel_resume_on_other_geometries_and_a_silent_node(tmp_path, prepared,  # noqa: F811
                                                                       jobs_cancelled_at_the_end):
    """The pretraining chunk with pretrain.nodes: 2 through the SLURM plugin: an sbatch job of 2 nodes in
    which srun starts one rank per node, which meet over the link between the nodes (gloo, CPU, a DeepSpeed
    engine at ZeRO 1), each rank with its end time from squeue on its own node; each rank writes its own
    part of the checkpoints. scancel stops the job mid-chunk; the rerun resumes on ONE node with 2 ranks
    (torchrun) for a few steps, the next on 2 nodes with 1 rank each to the end; the weights equal those of
    an uninterrupted 2-rank run, bit for bit. Meanwhile the uninterrupted run trains, and a node that stops
    answering is shown to stop a run with one message (node02_silent_stops_the_run)."""
    steps = 100
    cfg = small_config(tmp_path, steps=steps, checkpoint_minutes=0.02, zero_stage=1, nodes=2,
                       ranks_per_node=1)
    cfg["pretrain"]["objectives"] = ["mlm_nsp"]
    cfg["pretrain"]["chunk"].update(runtime_minutes=5)
    start_from(prepared, tmp_path)
    results = tmp_path / "results"
    run_dir, logs = results / "pretrain" / "mlm_nsp" / "run", results / "logs" / "pretrain" / "mlm_nsp"
    marker = lambda k: results / "pretrain" / "mlm_nsp" / f"chunk-{k}.json"  # noqa: E731
    sent, before = link_bytes(), jobs_cancelled_at_the_end

    # 1. two nodes, one rank each (gloo told the one interface name both nodes have), cancelled mid-chunk
    first = snakemake(tmp_path, cfg, str(marker(0)), GLOO_SOCKET_IFNAME=CLUSTER["ifname"])
    reference = None
    try:
        wait_for(lambda: run_dir.exists() and checkpoint.latest_tag(run_dir) is not None,
                 "a first checkpoint", 240, first)
        [job] = chunk_jobs(tmp_path, before)
        login("scancel", job["JobId"])
        saved = int(checkpoint.latest_tag(run_dir)[4:])
        # meanwhile (Snakemake notices the cancelled job at its next status check): the uninterrupted
        # run, and, once the job has left both nodes, a node that does not answer
        reference = start_reference(run_dir, tmp_path / "reference")
        wait_for(lambda: login("sinfo", "-h", "-N", "-o", "%t").stdout.split() == ["idle", "idle"],
                 "the cancelled job to leave the nodes", 60)
        node02_silent_stops_the_run(tmp_path / "silent-node", prepared)
        code, out = finish(first, 150)
        assert code != 0 and "Error in rule pretrain_chunk" in out, out[-3000:]
        assert reference.wait(timeout=300) == 0, (tmp_path / "reference.log").read_text()[-3000:]
    finally:
        for proc in (first, reference):
            if proc is not None and proc.poll() is None:
                os.killpg(proc.pid, 9)
    assert (job["JobState"], job["NumNodes"], job["NumTasks"], job["NodeList"], job["BatchHost"],
            job["TimeLimit"]) == ("RUNNING", "2", "2", "node[01-02]", "node01", "00:05:00"), job
    assert [j["JobState"] for j in chunk_jobs(tmp_path, before)] == ["CANCELLED"]
    log = (logs / "chunk-0.log").read_text()
    ranks = rank_lines(log, job["JobId"])
    assert {r: host for r, (host, _) in ranks.items()} == {0: "node01", 1: "node02"}, log[-3000:]
    for host, end in ranks.values():  # each node asked squeue, and got the job's end time as SLURM has it
        assert abs(slurm_time(end) - slurm_time(job["EndTime"])) <= 2, (host, end, job["EndTime"])
    tag = checkpoint.latest_tag(run_dir)
    written = {p.name for p in (run_dir / "checkpoints" / tag).iterdir()}  # rank 0: the model, each its part
    parts = {"mp_rank_00_model_states.pt", "zero_pp_rank_0_mp_rank_00_optim_states.pt",
             "zero_pp_rank_1_mp_rank_00_optim_states.pt", "rng_rank00000.pt", "rng_rank00001.pt"}
    assert written == parts | {"manifest.json"}, written
    # (the manifest, written by rank 0 once every rank had saved, covers the other node's files too)
    assert checkpoint.damage(run_dir / "checkpoints" / tag) == [] and set(
        json.loads((run_dir / "checkpoints" / tag / "manifest.json").read_text())["files"]) == parts
    gradient_bytes = 4 * sum(t.numel() for t in weights(run_dir).values())
    assert link_bytes() - sent > saved * gradient_bytes / 2, "each step's gradients crossed the link"

    # 2. one node, two ranks (torchrun): resumes from the newest checkpoint, 20 steps
    one = {**cfg, "pretrain": {**cfg["pretrain"], "nodes": 1, "ranks_per_node": 2,
                               "chunk": {**cfg["pretrain"]["chunk"], "max_steps": 20}}}
    code, out = finish(snakemake(tmp_path, one, str(marker(0))))
    assert code == 0, out[-4000:]
    [_, job] = chunk_jobs(tmp_path, before)
    assert (job["JobState"], job["NumNodes"]) == ("COMPLETED", "1"), job
    log = (logs / "chunk-0.log").read_text()
    resumed = int(re.search(r"resumed from step(\d+) at step \d+ \(written by 2 rank\(s\), now 2\)",
                            log).group(1))
    assert resumed >= saved, "the rerun starts from the newest checkpoint"
    assert {host for host, _ in rank_lines(log, job["JobId"]).values()} == {job["NodeList"]}
    middle = json.loads(marker(0).read_text())
    assert (middle["reason"], middle["step"], middle["world_size"]) == ("max_steps", resumed + 20, 2)

    # 3. two nodes again, one rank each, to the end (the geometry is no reason to rerun the finished chunk)
    code, out = finish(snakemake(tmp_path, cfg, str(marker(1))))
    assert code == 0, out[-4000:]
    [_, _, job] = chunk_jobs(tmp_path, before)
    assert (job["JobState"], job["NumNodes"], job["NodeList"]) == ("COMPLETED", "2", "node[01-02]"), job
    log = (logs / "chunk-1.log").read_text()
    step = middle["step"]
    assert f"resumed from step{step:08d} at step {step} (written by 2 rank(s), now 2)" in log
    assert {r: host for r, (host, _) in rank_lines(log, job["JobId"]).items()} == {0: "node01", 1: "node02"}
    final = json.loads(marker(1).read_text())
    assert final["done"] and final["step"] == steps and final["world_size"] == 2
    assert middle["threads"] == final["threads"] == 1, "the reference ran with 1 thread per rank"
    expected, got = weights(tmp_path / "reference"), weights(run_dir)
    assert all(torch.equal(got[k], expected[k]) for k in expected), "resumed across geometries exactly"
