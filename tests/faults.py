"""Faults at any moment: the small DAG run under a seeded schedule of faults, then checked against an
uninterrupted run of the same config.

The DAG is the workflow tests' smallest one with every kind of job (tests/conftest.small_dag_config: data, a
pretraining run in chunks, fine-tunes with two seeds side by side, similarity, sentence embeddings, report),
run as a user runs it: `snakemake --profile profiles/local` (or, with `--slurm`, the CI cluster's profile,
profiles/slurm-ci). A schedule of N faults draws, from its seed, N moments of the workflow's running time
(the clock runs while Snakemake runs: a fault's rework does not push the later moments out) and for each a
kind (FAULT_KINDS). At its moment a fault strikes a job that runs then, drawn among those that run (the next
to start where none runs): any rule, any phase of the job (starting, loading, training, predicting, writing,
exiting), as the moment falls. After each run of Snakemake that a fault ended, the user's own command runs
again, after the documented recovery steps only (DOCUMENTED: what the failed job's one-line message or
Snakemake's own says to do, nothing else), until a run ends without a fault.

The invariants, checked after every schedule (`check`):
- the last run ends with exit status 0, and every table, CSV and plot of the report is byte-identical to the
  uninterrupted run's;
- no seed or chunk was ever held by two processes at once: each lock's history (tacl.runtime.lock.HISTORY)
  against the processes this harness saw alive (a holder taken over while it still ran is a failure);
- no process and no temporary is left behind (no LOCK, no `.tmp-`/`.old-`/`.taking-`/`.new-` file, no seed
  checkpoint, no unfinished checkpoint save; no process of the run);
- each fault's first message is one line that says what happened and what to do: every `tacl: error:` and
  `tacl: stopped:` line of the jobs' logs says what to do, and no job's log holds a Python traceback.

Usage (`make faults` runs the long run): `python tests/faults.py --seed 1 --schedules 25 --faults 4`; each
schedule's seed is printed, and `--seed S --schedules 1` runs that schedule alone again. tests/test_faults.py
runs a short schedule in CI.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

TESTS = Path(__file__).resolve().parent
sys.path.insert(0, str(TESTS))

FAULT_KINDS = ("warning", "term", "kill_group", "kill_parent", "disk_full", "stale_lock", "damage")
# what each kind does, for the report
KIND_WORDS = {
    "warning": "the scheduler's warning: SIGUSR1 to every process of the job, SIGTERM after a grace, SIGKILL 5 s on",
    "term": "the time limit: SIGTERM to every process of the job, SIGKILL 5 s on",
    "kill_group": "SIGKILL to every process of the job at once",
    "kill_parent": "SIGKILL to the job's own process alone (its children live on)",
    "disk_full": "the results' file system fills up (freed once the run has ended)",
    "stale_lock": "a stale LOCK planted in a trainer's folder (a dead process of this host, or one on another host)",
    "damage": "a finished job's result file (one its outputs' record names) deleted or cut to half its size",
}
KILL_WAIT_S = 5.0  # SLURM's KillWait in the CI cluster: from SIGTERM to SIGKILL
POLL_S = 0.05
TRACEBACK = "Traceback (most recent call last)"
# the words of a message that says what to do
WHAT_TO_DO = re.compile(r"run(ning)? (the job |it |the same command )?again|delete|free |set |unlock|rerun", re.I)
TEMPORARY = re.compile(r"^\..+\.(tmp|old|new|taking)-")


@dataclasses.dataclass
class Fault:
    moment: float  # seconds of the workflow's running time
    kind: str
    draw: float  # a second number in [0, 1) for the kind's own choices (grace, variant, file)
    job: str = ""  # what it struck, once it has
    struck_at: float = 0.0
    outcome: str = ""


def draw_schedule(seed: int, faults: int, span_s: float) -> list[Fault]:
    """`faults` faults at moments drawn uniformly over the first `span_s` seconds of the workflow's running time,
    each of a kind drawn uniformly."""
    rng = random.Random(seed)
    moments = sorted(rng.uniform(0.0, span_s) for _ in range(faults))
    return [Fault(m, rng.choice(FAULT_KINDS), rng.random()) for m in moments]


# -- the processes of the run -------------------------------------------------------------------------------


def _stat(pid: int) -> tuple[int, int] | None:
    """(parent pid, start time in clock ticks) of a process, or None where it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return int(fields[1]), int(fields[19])
    except (OSError, IndexError, ValueError):
        return None


def _cmdline(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")[:-1]
    except OSError:
        return []


class Processes(threading.Thread):
    """The processes of the run (their command line names its folder), seen every POLL_S: when each was first and
    last seen alive, its parent and command line."""

    def __init__(self, marker: str):
        super().__init__(daemon=True)
        self.marker = marker
        self.seen: dict[tuple[int, int], dict] = {}  # (pid, start) -> {"cmd", "ppid", "first", "last"}
        self.lock = threading.Lock()
        self.stopped = threading.Event()

    def run(self) -> None:
        while not self.stopped.is_set():
            self.poll()
            time.sleep(POLL_S)

    def poll(self) -> None:
        now = time.time()
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit():
                continue
            pid = int(entry.name)
            stat = _stat(pid)
            if stat is None:
                continue
            key = (pid, stat[1])
            with self.lock:
                known = self.seen.get(key)
                if known is not None:
                    known["last"] = now
                    continue
            cmd = _cmdline(pid)
            if any(self.marker in a for a in cmd):
                with self.lock:
                    self.seen[key] = {"cmd": cmd, "ppid": stat[0], "first": now, "last": now}

    def alive(self) -> dict[int, dict]:
        """The run's processes alive now, by pid."""
        out = {}
        with self.lock:
            items = list(self.seen.items())
        for (pid, start), info in items:
            stat = _stat(pid)
            if stat is not None and stat[1] == start:
                out[pid] = info
        return out

    def jobs(self) -> dict[int, dict]:
        """The jobs running now: each `python -m tacl ...` process whose parent is not one (a job's own process,
        not a seed or a loader of it)."""
        alive = self.alive()
        return {pid: info for pid, info in alive.items() if _is_tacl(info["cmd"])
                and not (info["ppid"] in alive and _is_tacl(alive[info["ppid"]]["cmd"]))}

    def tree(self, top: int) -> list[int]:
        """A job's processes: its own, its descendants, and the shell that runs it (the profile's)."""
        alive = self.alive()
        members, todo = {top}, [top]
        while todo:
            parent = todo.pop()
            for pid, info in alive.items():
                if info["ppid"] == parent and pid not in members:
                    members.add(pid)
                    todo.append(pid)
        shell = alive.get(top, {}).get("ppid")
        if shell in alive and not _is_tacl(alive[shell]["cmd"]) and "snakemake" not in " ".join(alive[shell]["cmd"]):
            members.add(shell)
        return sorted(members)

    def lived(self, pid: int, pid_start: int | None) -> tuple[float, float] | None:
        """(first, last) time a process was seen alive, or None where it never was."""
        with self.lock:
            for (p, start), info in self.seen.items():
                if p == pid and (pid_start is None or start == pid_start):
                    return info["first"], info["last"]
        return None


def _is_tacl(cmd: list[str]) -> bool:
    return "-m" in cmd and "tacl" in cmd[cmd.index("-m") + 1:cmd.index("-m") + 2]


def job_name(cmd: list[str]) -> str:
    """'finetune glue', 'pretrain train': a job's stage and command."""
    i = cmd.index("-m") + 2
    return " ".join(cmd[i:i + 2])


def _send(pids: list[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


# -- one schedule -------------------------------------------------------------------------------------------


@dataclasses.dataclass
class Outcome:
    seed: int
    faults: list[Fault]
    runs: int = 0
    documented: list[str] = dataclasses.field(default_factory=list)  # the documented recovery steps taken
    problems: list[str] = dataclasses.field(default_factory=list)
    logs: list[str] = dataclasses.field(default_factory=list)  # each run's Snakemake output
    lost: dict[str, int] = dataclasses.field(default_factory=dict)  # training done twice (`work_lost`)
    seconds: float = 0.0


class Schedule:
    """One schedule's run of the small DAG in `root` (a fresh folder), with `faults`."""

    def __init__(self, root: Path, cfg: dict, faults: list[Fault], profile_args: list[str], seed: int,
                 small_fs: bool):
        self.root, self.cfg, self.faults = root, cfg, faults
        self.profile_args, self.small_fs = profile_args, small_fs
        self.results = root / "results"
        self.outcome = Outcome(seed, faults)
        self.procs = Processes(str(self.results))
        self.clock = 0.0  # the workflow's running time so far
        self.filler = root / "filler"

    def run(self) -> Outcome:
        from conftest import snakemake_command

        started = time.time()
        self.procs.start()
        pending = list(self.faults)
        try:
            for attempt in range(len(self.faults) + 4):
                cmd, env = snakemake_command(self.root, self.cfg, *self.profile_args, bound=1200)
                proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                out: list[str] = []
                reader = threading.Thread(target=lambda: out.extend(proc.stdout), daemon=True)
                reader.start()
                struck = self._strike(proc, pending)
                proc.wait()
                reader.join()
                self.outcome.runs += 1
                text = "".join(out)
                self.outcome.logs.append(text)
                if proc.returncode == 0 and not struck:
                    break
                if proc.returncode == 0 and not pending:
                    break
                self._recover(text, proc.returncode, struck)
            else:
                self.outcome.problems.append(f"the run did not end with exit status 0 after {self.outcome.runs} runs")
            self._wait_for_stragglers()
        finally:
            self.procs.poll()
            self.procs.stopped.set()
            self.outcome.seconds = time.time() - started
        return self.outcome

    def _strike(self, proc: subprocess.Popen, pending: list[Fault]) -> list[Fault]:
        """Run alongside Snakemake: each pending fault at its moment of the workflow's running time, on a job
        running then; returns the faults struck in this run."""
        struck: list[Fault] = []
        last = time.time()
        while proc.poll() is None:
            time.sleep(POLL_S)
            now = time.time()
            self.clock += now - last
            last = now
            if not pending or self.clock < pending[0].moment:
                continue
            fault = pending[0]
            jobs = self.procs.jobs()
            if not jobs and fault.kind not in ("disk_full", "damage", "stale_lock"):
                continue  # (none runs now: the next to start)
            pending.pop(0)
            rng = random.Random(fault.draw)
            top = rng.choice(sorted(jobs)) if jobs else None
            fault.job = job_name(jobs[top]["cmd"]) if top else "(between jobs)"
            fault.struck_at = self.clock
            threading.Thread(target=self._apply, args=(fault, top, rng), daemon=True).start()
            struck.append(fault)
        return struck

    def _apply(self, fault: Fault, top: int | None, rng: random.Random) -> None:
        kind = fault.kind
        if kind == "warning":
            tree = self.procs.tree(top)
            _send(tree, signal.SIGUSR1)
            time.sleep(rng.uniform(0.5, 8.0))  # (SLURM's --signal=USR1@600, scaled to jobs of seconds)
            _send(self.procs.tree(top) + tree, signal.SIGTERM)
            time.sleep(KILL_WAIT_S)
            _send(self.procs.tree(top) + tree, signal.SIGKILL)
        elif kind == "term":
            tree = self.procs.tree(top)
            _send(tree, signal.SIGTERM)
            time.sleep(KILL_WAIT_S)
            _send(self.procs.tree(top) + tree, signal.SIGKILL)
        elif kind == "kill_group":
            _send(self.procs.tree(top), signal.SIGKILL)
        elif kind == "kill_parent":
            _send([top], signal.SIGKILL)
        elif kind == "disk_full":
            if not self.small_fs:
                fault.outcome = "skipped (no small file system: not root)"
                return
            try:
                with open(self.filler, "wb") as f:
                    while True:
                        f.write(b"\0" * (1 << 20))
            except OSError:
                pass
        elif kind == "stale_lock":
            fault.outcome = self._plant_lock(rng)
        elif kind == "damage":
            fault.outcome = self._damage(rng)

    def _plant_lock(self, rng: random.Random) -> str:
        """A stale LOCK in a trainer's folder that no live process holds: a dead process of this host (taken over
        by the next trainer), or a process of another host (which no process can judge: the trainer refuses it,
        naming the file to delete). Only where a killed holder can have left one: in a trainer's folder whose job
        has not finished (a job writes its marker once every lock of its is released, and a job run again takes
        each of its locks, a finished seed's too)."""
        folders = [self.results / "pretrain" / "coco_lm" / "run"] * \
            (not (self.results / "models" / "coco_lm.json").exists())
        settings = [self.results / "finetune" / m / "qnli" / "lr1e-4_b16_e1"
                    for m in ("none", "coco_lm", "coco_lm+scl")]
        folders += [setting / f"seed{s}" for setting in settings if not (setting / "seeds.json").exists()
                    for s in (0, 1)]
        if not folders:
            return "nothing to plant (every trainer's job has finished)"
        folder = rng.choice(folders)
        folder.mkdir(parents=True, exist_ok=True)
        gone = subprocess.Popen([sys.executable, "-c", "pass"])
        gone.wait()
        owner = ({"host": os.uname().nodename, "pid": gone.pid, "since": "2026-11-28T00:00:00"} if rng.random() < 0.5
                 else {"host": "gpu-node-17", "pid": 4242, "since": "2026-11-28T00:00:00"})
        try:
            fd = os.open(folder / "LOCK", os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            return f"{folder}: held already (no stale lock planted)"
        try:
            os.write(fd, json.dumps(owner).encode())
        except OSError as e:  # (the disk is full: this harness's own file, not a fault to leave)
            (folder / "LOCK").unlink()
            return f"not planted ({e.strerror})"
        finally:
            os.close(fd)
        return f"{folder.relative_to(self.results)}: {owner['host']}"

    def _damage(self, rng: random.Random) -> str:
        """A finished job's result file (one its record names: tacl.runtime.outputs), deleted or cut short."""
        from tacl.runtime.outputs import RECORDS

        files = set()
        for rec in sorted((self.results / RECORDS).rglob("*.json")):
            try:
                entry = json.loads(rec.read_text())
            except (OSError, ValueError):
                continue
            for group in ("outputs", "also"):
                for out, names in entry.get(group, {}).items():
                    files.update(Path(out) if name == "." else Path(out) / name for name in names)
        files = sorted(p if p.is_absolute() else self.root / p for p in files)
        files = [p for p in files if p.is_file()]
        if not files:
            return "nothing written yet"
        path = rng.choice(files)
        if rng.random() < 0.5:
            path.unlink(missing_ok=True)
            return f"deleted {path.relative_to(self.results)}"
        size = path.stat().st_size
        with open(path, "rb+") as f:
            f.truncate(size // 2)
        return f"cut {path.relative_to(self.results)} from {size} to {size // 2} bytes"

    def _recover(self, text: str, code: int, struck: list[Fault]) -> None:
        """The documented recovery steps after a run that failed: what Snakemake's own message and each failed
        job's one line say to do (free space, unlock, delete a named file), and nothing else."""
        if self.filler.exists():
            self.filler.unlink()
            self.outcome.documented.append("free space (the disk filled up)")
        if "Directory cannot be locked" in text:
            from conftest import run_snakemake

            run_snakemake(self.root, self.cfg, "--unlock")
            self.outcome.documented.append("snakemake --unlock (Snakemake itself was killed)")
        for log in sorted((self.results / "logs").rglob("*.log")) if (self.results / "logs").is_dir() else []:
            for line in log.read_text(errors="replace").splitlines():
                m = re.search(r"tacl: error: (\S+): .*if that one is really gone, delete the file", line)
                if m and Path(m.group(1)).is_file():
                    Path(m.group(1)).unlink()
                    self.outcome.documented.append(f"delete {Path(m.group(1)).relative_to(self.results)} (its line "
                                                   "says so)")

    def _wait_for_stragglers(self, timeout: float = 60.0) -> None:
        """The run is over: wait for the run's processes to end (a seed saving after its job died), then name
        any left."""
        deadline = time.time() + timeout
        while self.procs.alive() and time.time() < deadline:
            time.sleep(0.2)
        for pid, info in self.procs.alive().items():
            self.outcome.problems.append(f"process {pid} left behind: {' '.join(info['cmd'])[:200]}")


# -- the invariants -----------------------------------------------------------------------------------------


REPORT_FILES = ("*.csv", "*.png", "*.tex")


def report_files(results: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for pattern in REPORT_FILES for p in sorted((results / "report").glob(pattern))}


def check(schedule: Schedule, reference: dict[str, bytes]) -> list[str]:
    """Every invariant of the module's docstring after `schedule` ran: the problems found (none: it held)."""
    results, problems = schedule.results, list(schedule.outcome.problems)
    got = report_files(results)
    if set(got) != set(reference):
        problems.append(f"report files differ: missing {sorted(set(reference) - set(got))}, extra "
                        f"{sorted(set(got) - set(reference))}")
    problems += [f"report/{name} differs from the uninterrupted run's" for name in sorted(set(got) & set(reference))
                 if got[name] != reference[name]]
    problems += held_twice(results, schedule.procs)
    for path in sorted(results.rglob("*")) if results.is_dir() else []:
        rel = path.relative_to(results)
        if path.name == "LOCK" or TEMPORARY.match(path.name) or (path.name == "checkpoint.pt" and "finetune" in
                                                                    rel.parts):
            problems.append(f"left behind: {rel}")
        if path.name == ".incoming" and any(path.iterdir()):
            problems.append(f"left behind: {rel} holds an unfinished save")
    for log in sorted((results / "logs").rglob("*.log")) if (results / "logs").is_dir() else []:
        text = log.read_text(errors="replace")
        if TRACEBACK in text:
            problems.append(f"{log.relative_to(results)}: a traceback, not one line")
        for line in text.splitlines():
            if re.search(r"tacl: (error|stopped): ", line) and not WHAT_TO_DO.search(line):
                problems.append(f"{log.relative_to(results)}: says what happened, not what to do: {line.strip()}")
    return problems


def held_twice(results: Path, procs: Processes) -> list[str]:
    """Each lock's history (tacl.runtime.lock.HISTORY): a holder acquiring it while the one before had neither
    released it nor ended (as this harness saw its process) held it with another at once."""
    problems = []
    for history in sorted(results.rglob("LOCK.log")):
        events = [json.loads(line) for line in history.read_text().splitlines() if line.strip()]
        holding: dict | None = None
        for event in events:
            if event["event"] == "released":
                if holding is not None and event["token"] == holding["token"]:
                    holding = None
                continue
            if holding is not None:
                lived = procs.lived(holding["pid"], holding.get("pid_start"))
                if lived is not None and lived[1] > event["time"] + POLL_S:
                    problems.append(f"{history.parent.relative_to(results)}: process {event['pid']} took the lock "
                                    f"while process {holding['pid']} still ran (seen {lived[1] - event['time']:.2f} s "
                                    "after)")
            holding = event
    return problems


def work_lost(results: Path) -> dict[str, int]:
    """Training done twice, in steps: for each pretraining run, the steps its metric lines had reached before a
    chunk resumed from an earlier step (a lower bound: lines come every pretrain.log_every steps); for each
    fine-tuning seed, the times it began training again (its lock taken once more, `LOCK.log`) and the
    checkpoints it resumed from (its metrics.json's `resumed_at`)."""
    lost = {"pretrain_steps_redone": 0, "seed_trainings_begun_again": 0, "seed_resumes": 0}
    for metrics in sorted(results.glob("pretrain/*/run/metrics.jsonl")):
        reached = 0
        for line in metrics.read_text().splitlines():
            m = json.loads(line)
            if m.get("event") == "chunk_start":
                lost["pretrain_steps_redone"] += max(0, reached - m["step"])
            else:
                reached = max(reached, m.get("step", 0))
    for history in sorted(results.glob("finetune/*/*/*/seed*/LOCK.log")):
        acquired = sum(json.loads(line)["event"] == "acquired" for line in history.read_text().splitlines())
        lost["seed_trainings_begun_again"] += max(0, acquired - 1)
        seed_metrics = history.parent / "metrics.json"
        if seed_metrics.is_file():
            lost["seed_resumes"] += len(json.loads(seed_metrics.read_text())["train"].get("resumed_at", []))
    return lost


# -- the long run -------------------------------------------------------------------------------------------


def small_fs(root: Path, size_mb: int) -> bool:
    """A tmpfs of `size_mb` at `root` (a full disk can then be made); False where this process may not mount."""
    if os.geteuid() != 0:
        return False
    root.mkdir(parents=True, exist_ok=True)
    return subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_mb}m", "tmpfs", str(root)],
                          capture_output=True).returncode == 0


def unmount(root: Path) -> None:
    subprocess.run(["umount", "-l", str(root)], capture_output=True)


def fault_config(root: Path) -> dict:
    """The small DAG's config (tests/conftest.small_dag_config) with its paths under `root`, and its two seeds
    side by side, each in its own process (`finetune.seeds_per_gpu`, an operational setting: the tables are
    those of the seeds one after the other)."""
    from conftest import small_dag_config

    cfg = small_dag_config(root)
    cfg["finetune"]["seeds_per_gpu"] = 2
    return cfg


def reference_run(where: Path, profile_args: list[str]) -> tuple[dict[str, bytes], float]:
    """The uninterrupted run: its report files and how long it ran."""
    from conftest import run_snakemake

    started = time.time()
    run_snakemake(where, fault_config(where), *profile_args, timeout=1200)
    return report_files(where / "results"), time.time() - started


def run_schedule(seed: int, faults: int, span_s: float, reference: dict[str, bytes], work: Path,
                 profile_args: list[str]) -> tuple[Outcome, list[str]]:
    root = work / f"schedule-{seed}"
    shutil.rmtree(root, ignore_errors=True)
    mounted = small_fs(root, 96)
    try:
        schedule = Schedule(root, fault_config(root), draw_schedule(seed, faults, span_s), profile_args, seed, mounted)
        schedule.run()
        problems = check(schedule, reference)
        schedule.outcome.lost = work_lost(root / "results")
        if problems and (root / "results" / "logs").is_dir():  # (the jobs' logs, kept beside the folder)
            shutil.copytree(root / "results" / "logs", work / f"schedule-{seed}.logs", dirs_exist_ok=True)
        return schedule.outcome, problems
    finally:
        if mounted:
            unmount(root)


def effective(fault: Fault) -> bool:
    """Whether a fault struck and did something: not drawn after the run had ended, not a damage with nothing
    written yet, a lock planted where one was held, or a full disk where no small file system could be made."""
    return bool(fault.job) and not fault.outcome.startswith(("nothing", "skipped", "not planted")) and \
        "held already" not in fault.outcome


def summary(outcomes: list[tuple[Outcome, list[str]]]) -> dict:
    """The figures of a long run: faults per kind and per job, survived, documented steps, problems."""
    by_kind: dict[str, int] = {}
    by_job: dict[str, int] = {}
    missed = 0
    for outcome, _ in outcomes:
        for f in outcome.faults:
            if not effective(f):
                missed += 1
                continue
            by_kind[f.kind] = by_kind.get(f.kind, 0) + 1
            by_job[f.job] = by_job.get(f.job, 0) + 1
    struck = sum(by_kind.values())
    failed = [o.seed for o, problems in outcomes if problems]
    lost: dict[str, int] = {}
    for outcome, _ in outcomes:
        for key, n in outcome.lost.items():
            lost[key] = lost.get(key, 0) + n
    return {"schedules": len(outcomes), "faults": struck, "missed": missed, "by_kind": by_kind, "by_job": by_job,
            "work_lost": lost,
            "schedules_with_problems": failed,
            "documented_steps": sum(len(o.documented) for o, _ in outcomes),
            "runs": sum(o.runs for o, _ in outcomes), "seconds": round(sum(o.seconds for o, _ in outcomes))}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=1, help="the first schedule's seed (the next ones count up)")
    parser.add_argument("--schedules", type=int, default=1)
    parser.add_argument("--faults", type=int, default=4, help="faults per schedule")
    parser.add_argument("--work", type=Path, default=None, help="where the runs go (default: a temporary folder)")
    parser.add_argument("--json", type=Path, default=None, help="write every outcome and the summary here")
    parser.add_argument("--keep", action="store_true", help="keep the schedules' folders")
    parser.add_argument("--slurm", action="store_true",
                        help="through the CI's SLURM cluster (profiles/slurm-ci; .ci/slurm.sh up starts it)")
    a = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    work = a.work or Path(tempfile.mkdtemp(prefix="tacl-faults-"))
    work.mkdir(parents=True, exist_ok=True)
    from conftest import REPO

    profile_args = (["--profile", str(REPO / "profiles" / "slurm-ci")] if a.slurm else
                    ["--profile", str(REPO / "profiles" / "local"), "--cores", "2"])
    reference, span = reference_run(work / "reference", profile_args)
    print(f"faults: the uninterrupted run took {span:.0f} s; {len(reference)} report files", flush=True)
    outcomes = []
    for seed in range(a.seed, a.seed + a.schedules):
        outcome, problems = run_schedule(seed, a.faults, span, reference, work, profile_args)
        outcomes.append((outcome, problems))
        for k, text in enumerate(outcome.logs):  # (beside the schedule's folder: a full disk cannot lose them)
            (work / f"schedule-{seed}.snakemake-{k}.log").write_text(text)
        struck = ", ".join(f"{f.kind} on {f.job or 'nothing'} at {f.struck_at:.1f} s"
                           + (f" ({f.outcome})" if f.outcome else "") for f in outcome.faults)
        print(f"faults: schedule {seed}: {struck}; {outcome.runs} runs, {len(outcome.documented)} documented "
              f"steps, work lost {json.dumps(outcome.lost)}, {outcome.seconds:.0f} s: "
              + ("HELD" if not problems else "FAILED: " + "; ".join(problems)), flush=True)
        if not a.keep and not problems:
            shutil.rmtree(work / f"schedule-{seed}", ignore_errors=True)
        figures = summary(outcomes)
        if a.json:  # (after every schedule: a long run stopped early keeps what it measured)
            from tacl.runtime.io import write_text_atomic

            write_text_atomic(a.json, json.dumps({"summary": figures, "schedules": [
                {"seed": o.seed, "faults": [dataclasses.asdict(f) for f in o.faults], "runs": o.runs,
                 "documented": o.documented, "problems": p, "lost": o.lost, "seconds": round(o.seconds)}
                for o, p in outcomes]}, indent=1))
    print("faults: " + json.dumps(figures), flush=True)
    return 1 if figures["schedules_with_problems"] else 0


if __name__ == "__main__":
    sys.exit(main())
