"""Several nodes under PBS Pro: one torchrun agent per node, which rendezvous (c10d) at the first host of
$PBS_NODEFILE under the id $PBS_JOBID and start the node's ranks (pretrain.launcher: mpiexec | pbsdsh).

`tacl pbs launch --starter S --nodes N --ranks-per-node R --state-dir D -- COMMAND...` runs in the job
script on the job's first node. It writes the agents' description to D/<jobid>/agent.json and starts
`tacl pbs agent` on every node with

- `mpiexec -n N --ppn 1 ...` (Cray PALS, as on Supek), or
- `pbsdsh -- ...` (PBS Pro's own TM spawner: one task per $PBS_NODEFILE entry, i.e. one per node with the
  select's mpiprocs=1; PBS Pro's pbsdsh has no -u, that is Torque's).

Each agent changes to the launcher's directory and takes its environment (a task pbsdsh spawns starts in
$HOME with the job's qsub-time environment, without what the job script exported), keeps the variables
that belong to its own node, runs `torchrun --nnodes N --nproc-per-node R --rdzv-backend c10d
--rdzv-endpoint HOST0:PORT --rdzv-id JOBID --no-python COMMAND...` with its output in
D/<jobid>/agent-HOST-PID.log, and leaves its exit status beside it. The launcher then copies the agents'
logs to its own output (the rule's log) and fails unless all N agents exited 0 (pbsdsh itself exits 0
whatever its tasks did). SIGTERM and SIGINT (PBS at the walltime limit, qdel) are passed on to the
starter, which passes them to the agents and they to the ranks.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path

from tacl.runtime.io import InputError, read_json, write_json_atomic, write_text_atomic

STARTERS = ("mpiexec", "pbsdsh")
DEFAULT_PORT = 29400  # torchrun's c10d default; nodes are the job's own (place=scatter:excl)
# what belongs to each node or process, not to the job: never copied from the launcher to an agent
_OWN_VARS = {"CUDA_VISIBLE_DEVICES", "HOSTNAME", "HOST", "PWD", "OLDPWD", "SHLVL", "_", "TMPDIR",
             "PBS_TASKNUM", "PBS_NODENUM", "PBS_VNODENUM"}
_OWN_PREFIXES = ("BASH_FUNC_", "PALS_", "PMI_", "OMPI_", "SLURM_")


def nodefile_hosts(path: str | os.PathLike) -> list[str]:
    """The job's nodes, in $PBS_NODEFILE's order (one line per MPI process: a host may repeat)."""
    hosts: list[str] = []
    for line in Path(path).read_text().split():
        if line not in hosts:
            hosts.append(line)
    return hosts


def starter_command(starter: str, nodes: int, agent: list[str]) -> list[str]:
    if starter == "mpiexec":
        return ["mpiexec", "-n", str(nodes), "--ppn", "1", *agent]
    if starter == "pbsdsh":
        return ["pbsdsh", "--", *agent]
    raise InputError(f"pretrain.launcher: {starter!r} is not one of {', '.join(STARTERS)}")


def torchrun_command(nodes: int, ranks_per_node: int, endpoint: str, rdzv_id: str, command: list[str],
                     python: str = sys.executable) -> list[str]:
    return [python, "-m", "torch.distributed.run", "--nnodes", str(nodes), "--nproc-per-node", str(ranks_per_node),
            "--rdzv-backend", "c10d", "--rdzv-endpoint", endpoint, "--rdzv-id", rdzv_id, "--max-restarts", "0",
            "--no-python", *command]


def agent_env(environ: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in environ.items() if k not in _OWN_VARS and not k.startswith(_OWN_PREFIXES)}


def _tacl_command(*args: str) -> list[str]:
    """`python -m tacl ARGS` from this checkout's src/, installed or not (a pbsdsh task does not get the
    PYTHONPATH that the job script exported)."""
    src = str(Path(__file__).resolve().parents[2])
    path = os.pathsep.join(p for p in (src, os.environ.get("PYTHONPATH", "")) if p)
    return ["env", f"PYTHONPATH={path}", sys.executable, "-m", "tacl", *args]


def plan(starter: str, nodes: int, ranks_per_node: int, command: list[str], state_root: str, port: int,
         environ: dict[str, str]) -> tuple[list[str], dict, Path]:
    """(starter command line, the agents' description, the job's state directory) for this PBS job."""
    if starter not in STARTERS:
        raise InputError(f"pretrain.launcher: {starter!r} is not one of {', '.join(STARTERS)}")
    if not command:
        raise InputError("tacl pbs launch: no command after --")
    job_id, nodefile = environ.get("PBS_JOBID"), environ.get("PBS_NODEFILE")
    if not job_id or not nodefile:
        raise InputError("tacl pbs launch runs inside a PBS job ($PBS_JOBID and $PBS_NODEFILE are not set)")
    hosts = nodefile_hosts(nodefile)
    if len(hosts) != nodes:
        raise InputError(f"$PBS_NODEFILE ({nodefile}) lists {len(hosts)} node(s) ({', '.join(hosts)}) but "
                         f"pretrain.nodes is {nodes}: the job's select must ask for one chunk per node")
    state = Path(state_root).resolve() / job_id
    spec = {"cwd": os.getcwd(), "env": agent_env(environ), "state_dir": str(state),
            "launch_host": socket.gethostname(), "launch_gpus": environ.get("CUDA_VISIBLE_DEVICES"),
            "command": torchrun_command(nodes, ranks_per_node, f"{hosts[0]}:{port}", job_id, command)}
    agent = _tacl_command("pbs", "agent", str(state / "agent.json"))
    return starter_command(starter, nodes, agent), spec, state


def _run_forwarding(cmd: list[str], **kwargs) -> int:
    """Run cmd; SIGTERM and SIGINT that reach this process are passed on to it."""
    proc = subprocess.Popen(cmd, **kwargs)
    previous = {s: signal.signal(s, lambda signum, frame: proc.send_signal(signum))
                for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        return proc.wait()
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def launch(starter: str, nodes: int, ranks_per_node: int, command: list[str], state_root: str,
           port: int = DEFAULT_PORT, environ: dict[str, str] | None = None) -> int:
    """Start one agent per node and wait for them; 0 when every agent's torchrun exited 0."""
    environ = dict(os.environ if environ is None else environ)
    cmd, spec, state = plan(starter, nodes, ranks_per_node, command, state_root, port, environ)
    if shutil.which(cmd[0], path=environ.get("PATH")) is None:
        raise InputError(f"pretrain.launcher: {starter} is not on this job's PATH; load the module that has it, "
                         f"or set pretrain.launcher to {'pbsdsh' if starter == 'mpiexec' else 'mpiexec'}")
    if state.exists():  # (a job id the server used before: nothing of that job is wanted)
        shutil.rmtree(state)
    write_json_atomic(state / "agent.json", spec)
    print(f"tacl pbs launch: {' '.join(cmd)}\n  each agent: {' '.join(spec['command'])}", flush=True)
    code = _run_forwarding(cmd, env=environ)
    exits = {p.name[: -len(".exit")]: p.read_text().strip() for p in sorted(state.glob("agent-*.exit"))}
    for name in sorted(p.name[: -len(".log")] for p in state.glob("agent-*.log")):
        print(f"==> {name} (exit {exits.get(name, 'none')}) <==", flush=True)
        sys.stdout.write((state / f"{name}.log").read_text(errors="replace"))
    sys.stdout.flush()
    failed = {name: status for name, status in exits.items() if status != "0"}
    if len(exits) != nodes or failed or code != 0:
        print(f"tacl pbs launch: {len(exits)} of {nodes} agents reported, failed: {failed or 'none'}, "
              f"{starter} exited {code}", file=sys.stderr)
        return next((int(s) for s in failed.values() if s.lstrip("-").isdigit() and int(s) > 0), 1)
    return 0


def run_agent(spec_path: str) -> int:
    """One node's agent: the launcher's directory and environment (its own node's variables kept; a
    CUDA_VISIBLE_DEVICES that merely repeats the launcher's on another node is dropped: the job's nodes
    are its own), torchrun with its output in a log file, the exit status left beside it."""
    spec = read_json(spec_path)
    os.chdir(spec["cwd"])
    env = {**os.environ, **spec["env"]}
    host = socket.gethostname()
    if host != spec["launch_host"] and env.get("CUDA_VISIBLE_DEVICES") == spec["launch_gpus"]:
        env.pop("CUDA_VISIBLE_DEVICES", None)
    name = f"agent-{host}-{os.getpid()}"
    state = Path(spec["state_dir"])
    with open(state / f"{name}.log", "w") as log:
        code = _run_forwarding(spec["command"], env=env, stdout=log, stderr=subprocess.STDOUT)
    write_text_atomic(state / f"{name}.exit", f"{code}\n")
    return code
