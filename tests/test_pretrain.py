"""Pretraining: exact resume, deadline-aware chunks, signals, kills, locks, 2 ranks, export."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from conftest import run_params, run_tacl
from tacl.pretrain import checkpoint
from tacl.pretrain.metrics import read_events, read_metrics
from tacl.pretrain.model import checkpoint_state_dict
from tacl.pretrain.settings import TrainSettings
from tacl.runtime.io import InputError, disk_bytes, read_json, size_text
from tacl.runtime.lock import RunLock

pytestmark = pytest.mark.slow

LOSS_KEYS = ("loss", "mlm", "nsp", "tacl", "taco", "aux_mlm", "clm", "scl")


def settings(objective="tacl", steps=12, micro=4, **kw) -> str:
    s = {"objective": objective, "steps": steps, "global_batch": 8, "micro_batch": micro, "lr": 2e-3,
         "log_every": 1, "checkpoint_minutes": 1000, "seed": 3, "max_len": 64,
         "loader_workers": 2,  # batches built in worker processes, as on a GPU node
         "objective_params": run_params(objective)}
    s.update(kw)
    return json.dumps(s)


def train(demo_data, run_dir, s, *extra, check=True, nproc=1, **kw):
    args = ["pretrain", "train", "--run-dir", str(run_dir), "--start-model", str(demo_data["start"]),
            "--manifest", str(demo_data["manifest"]), "--settings", s, "--no-tensorboard", *extra]
    if nproc > 1:
        args += ["--nproc", str(nproc)]
    return run_tacl(*args, check=check, **kw)


def final_weights(run_dir) -> dict[str, torch.Tensor]:
    return checkpoint_state_dict(Path(run_dir) / "checkpoints", checkpoint.latest_tag(run_dir))


def losses(run_dir) -> list[tuple]:
    return [(m["step"], *(m.get(k) for k in LOSS_KEYS)) for m in read_metrics(run_dir)]


def assert_same_losses(run_dir, reference_dir, steps: int) -> None:
    """Both runs logged `steps` steps, the same ones, with the same losses within rel 1e-5."""
    got, ref = losses(run_dir), losses(reference_dir)
    assert len(got) == len(ref) == steps
    for a, b in zip(got, ref):
        assert a[0] == b[0]
        assert [x for x in a[1:] if x is not None] == pytest.approx([x for x in b[1:] if x is not None], rel=1e-5)


def assert_same_weights(a, b, exact=True, atol=1e-5):
    assert a.keys() == b.keys()
    for k in a:
        if exact:
            assert torch.equal(a[k], b[k]), k
        else:
            torch.testing.assert_close(a[k], b[k], rtol=1e-4, atol=atol, msg=k)


class References(dict):
    """Uninterrupted 1-rank runs, accumulation 2, by objective (12 steps) or (objective, steps), each trained
    when a test first asks for it (so that `-k tacl_attn` trains only its own), shared by the tests that ask."""

    def __init__(self, demo_data, tmp_path_factory):
        super().__init__()
        self.demo_data, self.tmp_path_factory = demo_data, tmp_path_factory

    def __missing__(self, key: str | tuple[str, int]):
        objective, steps = key if isinstance(key, tuple) else (key, 12)
        run = self.tmp_path_factory.mktemp(f"ref_{objective}_{steps}")
        train(self.demo_data, run, settings(objective, steps=steps))
        self[key] = run
        return run


@pytest.fixture(scope="module")
def reference(demo_data, tmp_path_factory):
    return References(demo_data, tmp_path_factory)


def leave_killed_saves(run: Path) -> list[tuple[str, int]]:
    """What chunks killed inside their writes leave in `run` (its latest checkpoint is step 5): a save killed in
    `.incoming/` after its model file appeared (cut short) and one after its RNG file appeared, a universal
    conversion killed halfway, and run.json cut short under its temporary name by another host's process.
    Returns each path (relative to `run`) with its bytes."""
    root = run / "checkpoints"
    model, rng = (root / "step00000005" / name for name in ("mp_rank_00_model_states.pt", "rng_rank00000.pt"))
    for tag, files in (("step00000006", [model]), ("step00000007", [model, rng])):
        (root / ".incoming" / tag).mkdir(parents=True)
        for file in files:
            (root / ".incoming" / tag / file.name).write_bytes(file.read_bytes()[: file.stat().st_size * 2 // 3])
    universal = root / "step00000005" / "universal" / "step00000005.incoming"
    (universal / "zero").mkdir(parents=True)
    (universal / "zero" / "optimizer_state.pt").write_bytes(b"x" * 3000)
    (run / ".run.json.tmp-gpu-node-17-4242").write_text((run / "run.json").read_text()[:100])
    left = [root / ".incoming" / "step00000006", root / ".incoming" / "step00000007", universal,
            run / ".run.json.tmp-gpu-node-17-4242"]
    return [(str(p.relative_to(run)), disk_bytes(p)) for p in left]


def removed_line(run: Path, left: list[tuple[str, int]]) -> str:
    """The chunk's warning that names what it removed."""
    return (f"{run}: removed what killed saves and writes left unfinished: "
            + ", ".join(f"{p} ({size_text(n)})" for p, n in left) + f" ({size_text(sum(n for _, n in left))} in all)")


def test_resume_is_bit_exact(demo_data, reference, tmp_path):
    """tacl in three chunk jobs: the student with its MLM and NSP heads, the optimizer, the data's position and
    the frozen teacher (loaded again from the start model) resume; what mlm_nsp, tacl_batch and tacl_attn (the
    same teacher, other weights on its outputs) carry is that. COCO-LM's auxiliary model, copy head and draws,
    BERT's and every other family's: tests/test_families.py's test_every_family_resumes_bit_exact. TACO's
    resume, bit for bit: the SLURM tests (test_slurm.py's submitit requeue); over a resume on another number of
    ranks and micro-batch: test_another_micro_batch_and_number_of_ranks_train_the_same_run. Between the first
    two chunks, saves killed inside `.incoming/` (and a conversion and a write killed halfway) are left behind:
    the second chunk removes them, saying so in one line with their sizes, and the run stays exact."""
    objective, run = "tacl", tmp_path / "run"
    markers = []
    for chunk, max_steps in enumerate([5, 4, 100]):
        marker = tmp_path / f"chunk-{chunk}.json"
        left = leave_killed_saves(run) if chunk == 1 else []
        proc = train(demo_data, run, settings(objective), "--max-steps", str(max_steps), "--marker", str(marker),
                     "--chunk", str(chunk))
        if left:
            (line,) = [x for x in proc.stderr.splitlines() if "left unfinished" in x]
            assert "WARNING" in line and line.endswith(removed_line(run, left)), line
            assert not any((run / p).exists() for p, _ in left) and (run / "run.json").is_file()
        markers.append(json.loads(marker.read_text()))
    assert [m["step"] for m in markers] == [5, 9, 12]
    assert [m["done"] for m in markers] == [False, False, True]
    ref = losses(reference[objective])
    assert len(ref) == 12 and all(r[1] is not None for r in ref)
    assert losses(run) == ref, "every logged loss equals the uninterrupted run's, bit for bit"
    assert_same_weights(final_weights(run), final_weights(reference[objective]))
    starts = read_events(run)
    assert [e["step"] for e in starts] == [0, 5, 9] and all(e["event"] == "chunk_start" for e in starts)
    for record in starts + markers:
        assert record["device"]["device"] == "cpu" and record["device"]["torch"] == torch.__version__


# `tacl ARGS` with the trainer on a clock of its own: a second per optimizer step and none otherwise (start-up,
# saves, a busy machine), for its deadline, its step times and its marker's wall time.
STEP_CLOCK = """
import sys, time
from tacl.pretrain import deadline, trainer

class Clock:
    now = 1_764_000_000.0
    def time(self):
        return self.now
    def __getattr__(self, name):
        return getattr(time, name)

clock = Clock()
trainer.time = deadline.time = clock
real_step = trainer.optimizer_step

def optimizer_step(*args, **kwargs):
    clock.now += 1.0
    return real_step(*args, **kwargs)

trainer.optimizer_step = optimizer_step
from tacl.cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_deadline_chunk_then_next_chunk_reaches_the_same_weights(demo_data, reference, tmp_path):
    """A chunk with a deadline 30 s after it starts and a 3-second margin, on the step clock (a second per
    step): step 26 is the last whose end plus 1.5 steps and a save still fit (26 + 1.5 > 30 - 3), so it
    saves there and ends itself, 4 s before the deadline; the next chunk goes on to the uninterrupted
    run's weights."""
    s = settings("mlm_nsp", steps=60, log_every=10)
    run = tmp_path / "run"
    args = ["pretrain", "train", "--run-dir", str(run), "--start-model", str(demo_data["start"]), "--manifest",
            str(demo_data["manifest"]), "--settings", s, "--no-tensorboard", "--deadline", "1764000030",
            "--margin-minutes", "0.05", "--marker", str(tmp_path / "c0.json")]
    proc = subprocess.run([sys.executable, "-c", STEP_CLOCK, *args], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    first = json.loads((tmp_path / "c0.json").read_text())
    assert (first["done"], first["reason"], first["step"], first["wall_s"]) == (False, "deadline", 26, 26.0)
    assert checkpoint.latest_tag(run) == checkpoint.tag_for(26)
    train(demo_data, run, s, "--marker", str(tmp_path / "c1.json"))
    second = json.loads((tmp_path / "c1.json").read_text())
    assert second["done"] and second["step"] == 60 and second["steps_this_chunk"] == 60 - 26
    assert_same_weights(final_weights(run), final_weights(reference["mlm_nsp", 60]))


def test_sigusr1_mid_accumulation_saves_at_the_step_boundary(demo_data, tmp_path):
    """accumulation 4 (micro 2): the signal lands inside an accumulation cycle; the chunk finishes that
    optimizer step, saves, exits 0, and the resumed run matches the uninterrupted one exactly. (The chunk is
    stopped (SIGSTOP) once it has logged 6 steps, and the signal waits for it there: the chunk has most of its
    steps still to do when the signal arrives, however fast the machine.)"""
    s = settings("tacl", steps=20, micro=2, log_every=1)
    uninterrupted = tmp_path / "uninterrupted"
    train(demo_data, uninterrupted, s)
    run = tmp_path / "run"
    args = [sys.executable, "-m", "tacl", "pretrain", "train", "--run-dir", str(run), "--start-model",
            str(demo_data["start"]), "--manifest", str(demo_data["manifest"]), "--settings", s,
            "--no-tensorboard", "--marker", str(tmp_path / "c0.json")]
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    metrics = run / "metrics.jsonl"

    def logged() -> list[int]:  # the steps of the metric lines written whole (the writer may be mid-line)
        whole = metrics.read_text().split("\n")[:-1] if metrics.is_file() else []
        return [json.loads(line)["step"] for line in whole if '"event"' not in line]

    while len(logged()) < 6:
        assert proc.poll() is None, proc.stderr.read()
        time.sleep(0.02)
    proc.send_signal(signal.SIGSTOP)
    last = max(logged())  # (the chunk is in the step after it, or between the two)
    proc.send_signal(signal.SIGUSR1)
    proc.send_signal(signal.SIGCONT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    first = json.loads((tmp_path / "c0.json").read_text())
    assert first["reason"] == "signal" and not first["done"] and last <= first["step"] <= last + 1 < 20
    assert checkpoint.latest_tag(run) == checkpoint.tag_for(first["step"])
    train(demo_data, run, s)
    assert losses(run) == losses(uninterrupted)
    assert_same_weights(final_weights(run), final_weights(uninterrupted))


def test_sigkill_leaves_the_previous_checkpoint_loadable(demo_data, reference, tmp_path):
    """Saving after every step, killed with SIGKILL at several moments (often mid-save): `latest` always
    names a complete checkpoint, and the run still finishes with the uninterrupted run's weights."""
    s = settings("mlm_nsp", steps=60, log_every=10, checkpoint_minutes=0)
    run = tmp_path / "run"
    for kill_after in (4, 6, 7.5):
        proc = subprocess.Popen([sys.executable, "-m", "tacl", "pretrain", "train", "--run-dir", str(run),
                                 "--start-model", str(demo_data["start"]), "--manifest", str(demo_data["manifest"]),
                                 "--settings", s, "--no-tensorboard"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(kill_after)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        tag = checkpoint.latest_tag(run)  # raises if `latest` named an incomplete checkpoint
        if tag is not None:
            final_state = checkpoint_state_dict(run / "checkpoints", tag)
            assert final_state
    train(demo_data, run, s)
    assert_same_weights(final_weights(run), final_weights(reference["mlm_nsp", 60]))
    assert list((run / "checkpoints" / ".incoming").iterdir()) == [], "what the kills left unfinished is gone"


def test_damaged_checkpoints_are_set_aside_and_the_run_resumes_exactly(demo_data, reference, tmp_path):
    """Saving after every step, keeping 3: the latest checkpoint's model file and the one before's RNG file
    truncated, the resume sets both aside (one warning naming them) and goes on from the newest intact one,
    reaching the uninterrupted run's losses and weights bit for bit. With no intact checkpoint left: one error
    naming the files, and nothing moved."""
    from tacl.pretrain.identity import manifests_after

    s = settings("tacl", objective_params={}, checkpoint_minutes=0, keep_checkpoints=3)  # (the reference's result)
    run = tmp_path / "run"
    root = run / "checkpoints"

    def truncate(tag: str, name: str) -> str:
        path = root / tag / name
        size = path.stat().st_size
        with open(path, "r+b") as f:
            f.truncate(size // 2)
        return f"{root / tag}: {name}: {size // 2} bytes, {size} when saved"

    train(demo_data, run, s, "--max-steps", "9")
    model = truncate("step00000009", "mp_rank_00_model_states.pt")
    rng = truncate("step00000008", "rng_rank00000.pt")
    proc = train(demo_data, run, s)
    (line,) = [x for x in proc.stderr.splitlines() if "damaged checkpoint(s) set aside" in x]
    assert "WARNING" in line and f"({model}; {rng})" in line and f"resuming from {root / 'step00000007'}," in line
    assert "resumed from step00000007 at step 7" in proc.stderr
    assert sorted(p.name[:12] for p in root.glob("step*.damaged-*")) == ["step00000008", "step00000009"]
    assert (next(root.glob("step00000009.damaged-*")) / "mp_rank_00_model_states.pt").is_file()  # kept as it was
    assert checkpoint.latest_tag(run) == "step00000012"
    assert losses(run) == losses(reference["tacl"]), "every logged loss equals the uninterrupted run's, bit for bit"
    assert_same_weights(final_weights(run), final_weights(reference["tacl"]))

    damaged = [truncate("step00000012", "mp_rank_00_model_states.pt"), truncate("step00000011", "rng_rank00000.pt"),
               f"{root / 'step00000010'}: manifest.json: missing"]
    (root / "step00000010" / checkpoint.MANIFEST).unlink()  # (this version wrote it: it must have one)
    with pytest.raises(InputError) as e:
        checkpoint.resume_tag(run, manifests_after(run))
    assert str(e.value).startswith(f"{run}: no intact checkpoint to resume from ({'; '.join(damaged)}). ")
    assert "\n" not in str(e.value) and f"move {root} away" in str(e.value)
    assert checkpoint.latest_tag(run) == "step00000012" and (root / "step00000010").is_dir()  # nothing moved


def test_checkpoints_without_a_manifest(tmp_path, caplog):
    """A checkpoint from before manifests (at or before run.json's `checkpoint_manifests_after`, or the latest
    where run.json does not say) resumes unverified, saying so; a later one without its manifest, or with an
    unreadable one, is damaged."""
    from tacl.pretrain.distributed import DistEnv
    from tacl.pretrain.identity import manifests_after

    class Engine:
        def save_checkpoint(self, root, tag, client_state, save_latest):
            (Path(root) / tag).mkdir(parents=True)
            (Path(root) / tag / "mp_rank_00_model_states.pt").write_bytes(tag.encode())

    env = DistEnv(0, 1, 0, torch.device("cpu"))
    root = checkpoint.checkpoint_dir(tmp_path)
    for step in (4, 8):
        checkpoint.save(Engine(), tmp_path, step, {}, env, keep=2)
    assert json.loads((root / "step00000008" / checkpoint.MANIFEST).read_text())["files"].keys() == {
        "mp_rank_00_model_states.pt", "rng_rank00000.pt"}
    assert manifests_after(tmp_path) == 8  # no run.json: a run from before f4f50ea, up to its latest checkpoint
    (tmp_path / "run.json").write_text(json.dumps({"checkpoint_manifests_after": 4}))
    assert manifests_after(tmp_path) == 4
    for step in (4, 8):
        (root / checkpoint.tag_for(step) / checkpoint.MANIFEST).unlink()
    with caplog.at_level("INFO", logger="tacl.pretrain"):
        assert checkpoint.resume_tag(tmp_path, manifests_after=8) == "step00000008"
    assert "step00000008 was written before checkpoints had a manifest: it cannot be verified" in caplog.text
    caplog.clear()
    (root / "step00000004" / checkpoint.MANIFEST).write_text("{not json")
    with caplog.at_level("INFO", logger="tacl.pretrain"):
        with pytest.raises(InputError, match=r"step00000008: manifest.json: missing; .*step00000004: manifest.json: "
                                             r"unreadable \(Expecting"):
            checkpoint.resume_tag(tmp_path, manifests_after=4)
    assert checkpoint.latest_tag(tmp_path) == "step00000008"  # nothing moved
    checkpoint.write_manifest(root / "step00000004")
    with caplog.at_level("INFO", logger="tacl.pretrain"):
        assert checkpoint.resume_tag(tmp_path, manifests_after=4) == "step00000004"
    (warning,) = [r for r in caplog.records if r.levelname == "WARNING"]
    assert "step00000008: manifest.json: missing" in warning.getMessage()
    assert checkpoint.latest_tag(tmp_path) == "step00000004" and len(list(root.glob("step00000008.damaged-*"))) == 1


def test_failed_save_keeps_latest(tmp_path):
    class Engine:
        def save_checkpoint(self, root, tag, client_state, save_latest):
            (Path(root) / tag).mkdir(parents=True)
            (Path(root) / tag / "half_written.pt").write_bytes(b"x")
            raise OSError("disk full")

    from tacl.pretrain.distributed import DistEnv

    root = tmp_path / "checkpoints"
    (root / "step00000010").mkdir(parents=True)
    (root / "latest").write_text("step00000010\n")
    env = DistEnv(0, 1, 0, torch.device("cpu"))
    with pytest.raises(OSError):
        checkpoint.save(Engine(), tmp_path, 20, {}, env, keep=2)
    assert checkpoint.latest_tag(tmp_path) == "step00000010"
    assert not (root / "step00000020").exists()


@pytest.mark.parametrize("recorded", [True, False], ids=["device-recorded", "older-checkpoint"])
def test_resume_on_fewer_visible_gpus_restores_this_ranks_cuda_rng(tmp_path, monkeypatch, caplog, recorded):
    """4 ranks saved under torchrun with 4 GPUs visible to each; now srun shows each task only its own GPU:
    rank 2 (local rank 2) restores the state of the GPU it trained on (saved GPU 2) on its GPU 0."""
    import random

    from tacl.pretrain.distributed import DistEnv

    cuda_states = [torch.full((16,), i, dtype=torch.uint8) for i in range(4)]
    tag = checkpoint.tag_for(10)
    (tmp_path / "checkpoints" / tag).mkdir(parents=True)
    for rank in range(4):
        random.seed(rank)
        state = checkpoint.rng_state()
        state["cuda"] = cuda_states
        if recorded:
            state["cuda_device"] = rank
        torch.save(state, tmp_path / "checkpoints" / tag / f"rng_rank{rank:05d}.pt")
    restored = []

    def set_all(states):
        for i, s in enumerate(states):  # torch's own loop, which fails on a GPU this process does not see
            if i >= torch.cuda.device_count():
                raise IndexError("list index out of range")
            restored.append((s, i))

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "set_rng_state_all", set_all)
    monkeypatch.setattr(torch.cuda, "set_rng_state", lambda s, device="cuda": restored.append((s, device)))

    class Engine:
        optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1)

        def load_checkpoint(self, root, tag, **kw):
            return root, {"step": 10}

    random.seed(99)
    with caplog.at_level("INFO", logger="tacl.pretrain"):
        checkpoint.load(Engine(), tmp_path, tag, DistEnv(2, 4, 2, torch.device("cpu")))
    assert len(restored) == 1 and restored[0][1] == 0 and torch.equal(restored[0][0], cuda_states[2])
    assert random.random() == random.Random(2).random()  # rank 2's own file was read
    assert "states of 4 GPUs, this process sees 1: restored saved GPU 2's state on GPU 0" in caplog.text
    restored.clear()
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)  # as many GPUs as saved: all restored, as before
    saved = torch.load(tmp_path / "checkpoints" / tag / "rng_rank00002.pt", weights_only=False)
    checkpoint.set_rng_state(saved, 2)
    assert [i for _, i in restored] == [0, 1, 2, 3]


def test_locked_run_directory_refuses_a_second_trainer(demo_data, tmp_path):
    """A live holder's lock stops a second trainer, which leaves the holder's save in `.incoming/` alone; once
    the holder is gone, the next trainer takes the lock over and removes that save (now left unfinished)."""
    run = tmp_path / "run"
    saving = run / "checkpoints" / ".incoming" / "step00000001"
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        saving.mkdir(parents=True)
        (saving / "mp_rank_00_model_states.pt").write_bytes(b"x" * 5000)
        (run / "LOCK").write_text(json.dumps({"host": os.uname().nodename, "pid": holder.pid}))
        proc = train(demo_data, run, settings("mlm_nsp", steps=2), check=False)
        assert proc.returncode == 2
        assert f"{run / 'LOCK'}: run directory is locked by another trainer" in proc.stderr
        assert (saving / "mp_rank_00_model_states.pt").read_bytes() == b"x" * 5000 and "removed" not in proc.stderr
        assert not (run / "checkpoints" / "latest").exists()
    finally:
        holder.kill()
        holder.wait()
    # the holder is gone: its lock is stale and the next trainer takes it over, saying so
    proc = train(demo_data, run, settings("mlm_nsp", steps=2))
    assert f"{run / 'LOCK'}: took over the stale lock of process {holder.pid} on host " in proc.stderr
    assert not (run / "LOCK").exists()
    assert removed_line(run, [("checkpoints/.incoming/step00000001", 5000)]) in proc.stderr
    assert not saving.exists() and checkpoint.latest_tag(run) == "step00000002"


def test_run_lock_unit(tmp_path):
    with RunLock(tmp_path):
        with pytest.raises(InputError, match="locked by another trainer"):
            RunLock(tmp_path).acquire()
    with RunLock(tmp_path):
        pass


def _stand_in(bin_dir: Path, name: str, script: str) -> None:
    path = bin_dir / name
    path.write_text("#!/bin/sh\n" + script)
    path.chmod(0o755)


def test_stale_locks_of_gone_scheduler_jobs_are_taken_over(tmp_path, monkeypatch, caplog):
    """A lock from another host names a SLURM or PBS job: taken over once its scheduler no longer runs it
    (qstat forgot it, squeue shows it finished or no longer lists it); a live job's lock stops the second
    trainer naming the job and the command that shows it. Each lock taken over is one warning naming the lock
    file, its holder and why (also a dead process on this host, and the job's own earlier run)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    # squeue: 111 runs, 222 completed (within MinJobAge), anything else forgotten
    _stand_in(bin_dir, "squeue", 'case "$3" in 111) echo RUNNING;; 222) echo COMPLETED;; '
              '*) echo "slurm_load_jobs error: Invalid job id specified" >&2; exit 1;; esac\n')
    # qstat: 77.pbs01 runs, anything else unknown (job history off)
    _stand_in(bin_dir, "qstat", 'for a; do last=$a; done\ncase "$last" in 77.pbs01) '
              'echo \'{"Jobs": {"77.pbs01": {"job_state": "R"}}}\';; '
              '*) echo "qstat: Unknown Job Id $last" >&2; exit 153;; esac\n')
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    for var in ("SLURM_JOB_ID", "PBS_JOBID"):
        monkeypatch.delenv(var, raising=False)

    def lock_of(name: str, **job) -> Path:
        run = tmp_path / name
        run.mkdir()
        (run / "LOCK").write_text(json.dumps({"host": "gpu-node-17", "pid": 4242, "since": "2026-11-20T10:00:00",
                                              **job}))
        return run

    def taken_over(run: Path) -> str:
        """Take the lock of `run` over (its holder is gone); the one warning line that says so."""
        caplog.clear()
        with caplog.at_level("INFO", logger="tacl.pretrain"), RunLock(run):
            assert json.loads((run / "LOCK").read_text())["pid"] == os.getpid()
        assert not (run / "LOCK").exists()
        (record,) = caplog.records
        assert record.levelname == "WARNING"
        return record.getMessage()

    for name, job, why in [("slurm_done", {"slurm_job": "222"}, "squeue shows it in state COMPLETED"),
                           ("slurm_gone", {"slurm_job": "333"}, "squeue no longer lists it"),
                           ("pbs_gone", {"pbs_job": "78.pbs01"}, "qstat no longer lists it")]:
        run = lock_of(name, **job)
        scheduler, job_id = next(iter(job.items()))
        assert taken_over(run) == (f"{run / 'LOCK'}: took over the stale lock of {scheduler[:-4].upper()} job "
                                   f"{job_id} (host gpu-node-17, pid 4242, since 2026-11-20T10:00:00): {why}")
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    run = tmp_path / "pid_gone"
    run.mkdir()
    (run / "LOCK").write_text(json.dumps({"host": os.uname().nodename, "pid": gone.pid, "since": "2026-11-20"}))
    assert taken_over(run).endswith(f"process {gone.pid} on host {os.uname().nodename} (since 2026-11-20): it no "
                                    "longer runs")
    with pytest.raises(InputError) as e:
        RunLock(lock_of("slurm_live", slurm_job="111")).acquire()
    assert "SLURM job 111 (host gpu-node-17, pid 4242" in str(e.value) and "`squeue -j 111` shows it" in str(e.value)
    with pytest.raises(InputError) as e:
        RunLock(lock_of("pbs_live", pbs_job="77.pbs01")).acquire()
    assert "PBS job 77.pbs01" in str(e.value) and "`qstat -f 77.pbs01` shows it" in str(e.value)
    # the same job, requeued (SLURM_RESTART_COUNT one higher than the lock's): its own earlier run's lock
    monkeypatch.setenv("SLURM_JOB_ID", "111")
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
    run = lock_of("slurm_requeued", slurm_job="111", slurm_restarts=0)
    assert taken_over(run).endswith("SLURM job 111 (host gpu-node-17, pid 4242, since 2026-11-20T10:00:00): this "
                                    "job's earlier run (run 1; the job was requeued)")


def test_a_lock_of_this_same_job_is_gone_only_with_its_process(tmp_path, monkeypatch, caplog):
    """Two processes of one scheduler job share its id (two srun steps, a command typed inside salloc): a lock
    held by a live process of this very job refuses the second one, on this host or another (whose processes
    this host cannot see), however the scheduler answers; one whose process is gone on this host, or one of
    the job's earlier run (SLURM_RESTART_COUNT, PBS's run_count: higher now), is taken over. A lock is released
    only while it is still its holder's own."""
    import socket

    from tacl.runtime import lock

    for var in ("SLURM_RESTART_COUNT", "PBS_JOBID"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    monkeypatch.setattr(lock, "job_state", lambda *a: pytest.fail("the scheduler is not asked about this job"))
    sibling = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    here = socket.gethostname()

    def locked(name: str, **owner) -> Path:
        run = tmp_path / name
        run.mkdir()
        (run / "LOCK").write_text(json.dumps({"slurm_job": "4242", "slurm_restarts": 0, "since": "2026-11-27",
                                              **owner}))
        return run

    try:
        with pytest.raises(InputError, match=f"SLURM job 4242 \\(host {here}, pid {sibling.pid}.*another process "
                                             "of this same job, still running"):
            RunLock(locked("sibling", host=here, pid=sibling.pid)).acquire()
        with pytest.raises(InputError, match="another process of this same job, on host gpu-node-17"):
            RunLock(locked("sibling_there", host="gpu-node-17", pid=sibling.pid)).acquire()
        # (a pid given to a later process: the record's process start differs)
        with caplog.at_level("WARNING", logger="tacl.pretrain"), RunLock(
                locked("pid_reused", host=here, pid=sibling.pid, pid_start=1)):
            pass
        assert "its process no longer runs on this host" in caplog.text
    finally:
        sibling.kill()
        sibling.wait()
    for name, owner in (("gone_here", {"host": here, "pid": gone.pid}),
                        ("requeued_there", {"host": "gpu-node-17", "pid": 4242, "slurm_restarts": 0})):
        monkeypatch.setenv("SLURM_RESTART_COUNT", "1" if name == "requeued_there" else "0")
        run = locked(name, **owner)
        with RunLock(run):
            assert json.loads((run / "LOCK").read_text())["slurm_restarts"] == int(os.environ["SLURM_RESTART_COUNT"])
        assert not (run / "LOCK").exists()
    # released only while its own: a lock taken over meanwhile stays its new holder's
    run = tmp_path / "taken"
    held = RunLock(run).acquire()
    (run / "LOCK").write_text(json.dumps({"host": "gpu-node-17", "pid": 1, "slurm_job": "4243"}))
    held.release()
    assert json.loads((run / "LOCK").read_text())["slurm_job"] == "4243" and not held.held


def _race_for_lock(run: Path, start, done, results) -> None:
    """One of several takers of a stale lock (multiprocessing, forked): each judges the holder gone before any
    of them acts on it (`start`), then tries to take the lock over; the winner holds it until `done`."""
    from tacl.runtime import lock

    judge, first = lock.holder, []

    def judged_together(owner):
        verdict = judge(owner)
        if not first:
            first.append(1)
            start.wait()
        return verdict

    lock.holder = judged_together
    try:
        taken = RunLock(run).acquire()
    except InputError as e:
        results.put(("refused", str(e)))
        return
    results.put(("won", os.getpid()))
    done.wait()
    taken.release()


def test_takers_racing_for_a_stale_lock_have_one_winner(tmp_path):
    """Six processes find the same stale lock and all judge its holder gone before any of them acts: exactly
    one takes it over; the others are refused, naming the winner, which holds it."""
    import multiprocessing

    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    run = tmp_path / "run"
    run.mkdir()
    (run / "LOCK").write_text(json.dumps({"host": os.uname().nodename, "pid": gone.pid}))
    context = multiprocessing.get_context("fork")
    takers = 6
    start, done, results = context.Barrier(takers), context.Event(), context.Queue()
    procs = [context.Process(target=_race_for_lock, args=(run, start, done, results)) for _ in range(takers)]
    for p in procs:
        p.start()
    try:
        outcomes = [results.get(timeout=60) for _ in procs]
        winners = [who for what, who in outcomes if what == "won"]
        assert len(winners) == 1, outcomes
        assert json.loads((run / "LOCK").read_text())["pid"] == winners[0]
        assert all(f"process {winners[0]} on host" in why for what, why in outcomes if what == "refused")
    finally:
        done.set()
        for p in procs:
            p.join(timeout=30)
    assert not (run / "LOCK").exists() and [p.name for p in run.iterdir()] == ["LOCK.log"]
    history = [json.loads(line) for line in (run / "LOCK.log").read_text().splitlines()]
    assert [(h["event"], h["pid"]) for h in history] == [("acquired", winners[0]), ("released", winners[0])]


def test_changed_result_settings_start_again_and_a_change_undone_comes_back(demo_data, tmp_path):
    """Operational settings change between chunks and the run goes on; a result setting changed makes chunk 0
    set the old run aside (naming the change) and start from the start model, while a later chunk of a
    chain stops; undoing the change brings the set-aside run back. A run.json of the earlier format (a hash
    of the result settings without the precision) reads as the same run."""
    run = tmp_path / "run"
    train(demo_data, run, settings("mlm_nsp", steps=4), "--max-steps", "2")
    ops = {"log_every": 2, "micro_batch": 2, "loader_workers": 0, "keep_checkpoints": 1}
    proc = train(demo_data, run, settings("mlm_nsp", steps=4, **ops), "--chunk", "1")
    assert "resumed from step00000002 at step 2" in proc.stderr and not (tmp_path / "superseded").exists()
    first = final_weights(run)
    record = read_json(run / "run.json")
    assert record["result"]["lr"] == 2e-3 and record["identity"]["result"]["precision"] == "fp32"

    proc = train(demo_data, run, settings("mlm_nsp", steps=4, zero_stage=1), "--chunk", "2", check=False)
    assert proc.returncode == 2 and "written at ZeRO stage 0 and pretrain.zero_stage is now 1" in proc.stderr

    changed = settings("mlm_nsp", steps=4, lr=1e-3)
    proc = train(demo_data, run, changed, "--chunk", "1", check=False)
    assert proc.returncode == 2 and "lr 0.002 -> 0.001" in proc.stderr and "this is chunk 1 of the chain" in proc.stderr
    proc = train(demo_data, run, changed, "--max-steps", "1")
    assert "the result settings changed (lr 0.002 -> 0.001)" in proc.stderr, proc.stderr[-3000:]
    (aside,) = (tmp_path / "superseded").iterdir()
    assert_same_weights(final_weights(aside), first)
    assert read_json(run / "run.json")["result"]["lr"] == 1e-3 and checkpoint.latest_tag(run) == "step00000001"

    proc = train(demo_data, run, settings("mlm_nsp", steps=4, **ops))
    assert "is back in" in proc.stderr and checkpoint.latest_tag(run) == "step00000004"
    assert_same_weights(final_weights(run), first)
    assert len(list((tmp_path / "superseded").iterdir())) == 1  # the lr 1e-3 run, set aside in its turn

    # a run.json from before commit a513d30 (2026-11-25): a `trajectory` hash for its identity, no `result`
    legacy = read_json(run / "run.json")
    del legacy["identity"]["result"], legacy["result"]
    legacy["identity"]["trajectory"] = TrainSettings.from_dict(legacy["settings"]).legacy_trajectory_hash()
    (run / "run.json").write_text(json.dumps(legacy))
    proc = train(demo_data, run, settings("mlm_nsp", steps=4))
    assert "changed" not in proc.stderr and checkpoint.latest_tag(run) == "step00000004"


def test_bad_batch_split_fails_before_training(demo_data, tmp_path):
    proc = train(demo_data, tmp_path / "run", settings("mlm_nsp", micro=3), check=False)
    # one line, before the model is built and before DeepSpeed's import (its start-up line, on standard output)
    assert proc.returncode == 2 and proc.stdout == "" and proc.stderr.splitlines() == [
        "tacl: error: pretrain.global_batch=8 is not a multiple of pretrain.micro_batch=3 x 1 rank(s)"]
    assert not (tmp_path / "run" / "checkpoints").exists()
    proc = train(demo_data, tmp_path / "coco", settings("coco_lm", objective_params={**run_params("coco_lm"),
                                                                                    "aux_layers": 3}), check=False)
    assert proc.returncode == 2 and ("tacl: error: pretrain.coco_lm.aux_layers: 3 layers for the auxiliary model, "
                                     "but the main model has 2") in proc.stderr
    assert not (tmp_path / "coco" / "checkpoints").exists()


def test_another_micro_batch_and_number_of_ranks_train_the_same_run(demo_data, tmp_path):
    """The micro-batch, the ranks and the accumulation are operational: with dropout off (the only draws seeded
    per micro-batch), TACO (negatives from groups of 2, tokens and masked positions counted over the step)
    trained on 1 rank at micro-batch 8, and on 2 ranks at micro-batch 2 (accumulation 2) then resumed on 1 rank
    at micro-batch 4, logs the same losses and reaches the same weights, within float reordering."""
    start = tmp_path / "start"
    shutil.copytree(demo_data["start"], start)
    config = json.loads((start / "config.json").read_text())
    config.update(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    (start / "config.json").write_text(json.dumps(config))
    data = {**demo_data, "start": start}
    params = run_params("taco", group=2)
    whole = tmp_path / "whole"
    train(data, whole, settings("taco", steps=6, micro=8, objective_params=params))
    run = tmp_path / "run"
    train(data, run, settings("taco", steps=6, micro=2, objective_params=params), "--max-steps", "3", nproc=2)
    proc = train(data, run, settings("taco", steps=6, micro=4, objective_params=params))
    assert "resumed from step00000003 at step 3 (written by 2 rank(s), now 1)" in proc.stderr
    assert_same_losses(run, whole, 6)
    # (AdamW divides each gradient by its own running size: where an embedding row's gradient is as small as
    # the float reordering's noise, two orders of summation move it apart by up to about 2e-5, seen on 2 of
    # its 976,704 weights)
    assert_same_weights(final_weights(run), final_weights(whole), exact=False, atol=5e-5)
    written = checkpoint.checkpoint_dir(run) / "step00000003"  # (ZeRO 0: no universal checkpoint needed)
    assert written.is_dir() and not (written / "universal").exists()


@pytest.mark.parametrize("zero_stage, before, after", [(1, 1, 2), (2, 2, 1)])
def test_resume_on_another_number_of_ranks(demo_data, tmp_path, zero_stage, before, after):
    """A run checkpointed by N ranks goes on with M and follows the uninterrupted run (the data order, dropout
    and TACO draws do not depend on the world size; ZeRO 1-2 optimizer state goes through DeepSpeed's
    universal checkpoint). At ZeRO 0 (2 ranks, then 1, no universal checkpoint):
    test_another_micro_batch_and_number_of_ranks_train_the_same_run; 2 ranks resumed on 2, bit for bit: the
    SLURM tests (test_slurm.py's scancel test, two srun ranks; test_slurm_nodes.py, a rank per node)."""
    s = settings("tacl", zero_stage=zero_stage)
    uninterrupted = tmp_path / "uninterrupted"  # the same stage and ranks (ZeRO's bucketed reductions round
    train(demo_data, uninterrupted, s, nproc=after)  # differently from ZeRO 0's)
    run = tmp_path / "run"
    train(demo_data, run, s, "--max-steps", "5", nproc=before)
    proc = train(demo_data, run, s, nproc=after)
    assert f"resumed from step00000005 at step 5 (written by {before} rank(s), now {after})" in proc.stderr
    assert_same_losses(run, uninterrupted, 12)
    assert_same_weights(final_weights(run), final_weights(uninterrupted), exact=False)
    assert (checkpoint.checkpoint_dir(run) / "step00000005" / "universal").is_dir()


def test_zero_stage_3_refuses_another_number_of_ranks(demo_data, tmp_path):
    s = settings("mlm_nsp", steps=4, zero_stage=3)
    train(demo_data, tmp_path / "run", s, "--max-steps", "2")
    proc = train(demo_data, tmp_path / "run", s, nproc=2, check=False)
    assert proc.returncode != 0
    assert ("checkpoint step00000002 was written by 1 rank(s) with ZeRO stage 3, which cannot go on with 2" in
            proc.stderr), proc.stderr[-3000:]


def test_export_loads_for_fine_tuning(demo_data, reference, tmp_path):
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    marker = tmp_path / "chunk-0.json"
    marker.write_text(json.dumps({"objective": "tacl", "done": True, "step": 12, "steps": 12, "samples": 96,
                                  "tokens": 5000, "wall_s": 3.0}))
    out = tmp_path / "model"
    # an export killed halfway on this host, one killed between its renames before temporaries named their
    # host, one a live process on this host writes, and one written on another node (whose writer this host
    # cannot see, and no lock holder vouches for): the export removes the first two, saying so
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    killed, old = tmp_path / f".model.tmp-{os.uname().nodename}-{gone.pid}", tmp_path / ".model.old-4243"
    writer = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    live = tmp_path / f".model.tmp-{os.uname().nodename}-{writer.pid}"
    elsewhere = tmp_path / ".model.tmp-gpu-node-17-4242"
    for folder in (killed, old, live, elsewhere):
        folder.mkdir()
        (folder / "model.safetensors").write_bytes(b"x" * 1500)
    try:
        proc = run_tacl("pretrain", "export", "--start-model", str(demo_data["start"]), "--run-dir",
                        str(reference["tacl"]), "--marker", str(marker), "--out", str(out), "--summary",
                        str(tmp_path / "summary.json"))
        assert (f"{tmp_path}: removed what earlier writers of model left unfinished: .model.old-4243 (1.5 kB), "
                f"{killed.name} (1.5 kB) (3.0 kB in all)") in proc.stderr
        assert not killed.exists() and not old.exists() and live.is_dir() and elsewhere.is_dir()
    finally:
        writer.kill()
        writer.wait()
    clf = AutoModelForSequenceClassification.from_pretrained(out, num_labels=2)
    trained = final_weights(reference["tacl"])
    assert torch.equal(clf.bert.encoder.layer[0].attention.self.query.weight,
                       trained["bert.encoder.layer.0.attention.self.query.weight"])
    assert AutoTokenizer.from_pretrained(out)("hello world")["input_ids"][0] == 101
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["steps"] == 12 and summary["final"]["tacl"] > 0 and summary["wall_s"] == 3.0


def test_zero_stage_2_bf16_trains_and_exports_fp32(demo_data, tmp_path):
    run = tmp_path / "run"
    train(demo_data, run, settings("mlm_nsp", steps=3, zero_stage=2, precision="bf16"))
    weights = final_weights(run)
    assert all(v.dtype == torch.float32 for v in weights.values())
    from transformers import BertForPreTraining

    initial = BertForPreTraining.from_pretrained(demo_data["start"]).state_dict()
    key = "bert.encoder.layer.0.attention.self.query.weight"
    assert not torch.equal(weights[key], initial[key])


def test_settings_from_config():
    pretrain = {"steps": 10, "global_batch": 8, "micro_batch": 4, "tacl": {"tau": 0.05}, "taco": {"tau": 0.1},
                "objectives": ["tacl"]}
    s = TrainSettings.from_config({k: v for k, v in pretrain.items() if k != "objectives"}, "tacl", 128)
    assert s.objective_params == {"tau": 0.05} and s.max_len == 128
    assert s.accumulation(2) == 1
    assert TrainSettings.from_dict(s.to_dict()) == s


def test_micro_batch_auto_is_a_ranks_share_up_to_the_cap_of_its_gpu_memory():
    """config.yaml's micro_batch: auto: 64 on each of 4 A100s 40 GB (no accumulation), 32 on 8 of them across
    two nodes, 128 on one H200 and on one 80 GB A100 or H100 (which report 79.2-79.6 GiB, not 80), 64 on a
    48 GB card (COCO-LM held 39.2 GiB at 128 on the H200); always whole groups of negatives."""
    from tacl.pretrain.settings import auto_micro_batch

    assert [auto_micro_batch(256, 4, 39.4), auto_micro_batch(256, 8, 39.4), auto_micro_batch(256, 1, 139.8),
            auto_micro_batch(256, 1, 79.2), auto_micro_batch(256, 1, 79.6), auto_micro_batch(256, 1, 44.4),
            auto_micro_batch(256, 1, 39.4), auto_micro_batch(96, 1, 39.4), auto_micro_batch(8, 1, None)] == [
        64, 32, 128, 128, 128, 64, 64, 48, 8]
    # in whole groups: 96 per rank in groups of 32 -> 32 (48 is no multiple); a cap below the group -> the group
    assert auto_micro_batch(96, 1, 39.4, 32) == 32 and auto_micro_batch(256, 1, None, 64) == 64
    with pytest.raises(InputError, match="pretrain.negatives_group: 32 sequences per group, but a rank gets 16"):
        auto_micro_batch(256, 16, 39.4, 32)
    s = TrainSettings("tacl", steps=10, global_batch=256, micro_batch="auto")
    assert s.resolve_micro_batch(2, 39.4) == 64 and s.micro_batch == 64 and s.accumulation(2) == 2
    s = TrainSettings("taco", steps=10, global_batch=96, micro_batch="auto", objective_params={"negatives_group": 32})
    assert s.resolve_micro_batch(1, 39.4) == 32


def test_a_lock_judges_its_holder_by_cluster_user_namespace_boot_and_allocation(tmp_path, monkeypatch, caplog):
    """Who a lock names, as a cluster sees it: a job of another SLURM cluster is asked of that cluster (`squeue -M`),
    and one that cluster does not answer for is not taken; another user's job that squeue does not list (hidden
    by PrivateData) is not taken, the user's own is; a process of this host in another PID namespace (a
    container) cannot be judged by its pid; one of an earlier boot of this host is gone; a PBS job's earlier run
    on other hosts is gone without asking qstat (compute nodes may not run it), and writing a record asks no
    scheduler at all."""
    import socket

    from tacl.runtime import lock, scheduler

    monkeypatch.setattr(scheduler, "_pause", lambda seconds: None)  # (between tries of a failing squeue)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    asked = tmp_path / "asked"
    # squeue: on cluster gpu (-M gpu) job 5 runs; other clusters are out of reach; the default lists nothing
    _stand_in(bin_dir, "squeue", f'echo "$@" >> {asked}\nif [ "$1" = -M ]; then [ "$2" = gpu ] || '
              '{ echo "squeue: error: Problem talking to the database" >&2; exit 1; }; echo "CLUSTER: gpu"; '
              '[ "$5" = 5 ] && echo RUNNING; exit 0; fi\necho "slurm_load_jobs error: Invalid job id specified" '
              '>&2; exit 1\n')
    _stand_in(bin_dir, "qstat", f'echo "$@" >> {asked}\nexit 1\n')
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    for var in ("SLURM_JOB_ID", "PBS_JOBID", "SLURM_CLUSTER_NAME", "SLURM_RESTART_COUNT", "SLURM_JOB_NODELIST"):
        monkeypatch.delenv(var, raising=False)

    def judged(**owner) -> tuple[bool, str]:
        return lock.holder({"host": "gpu-node-17", "pid": 4242, "since": "2026-11-28", **owner})

    alive, who = judged(slurm_job="5", slurm_cluster="gpu")
    assert alive and who.endswith("still running: `squeue -M gpu -j 5` shows it") and "on cluster gpu" in who
    assert judged(slurm_job="6", slurm_cluster="gpu") == (
        False, "SLURM job 6 on cluster gpu (host gpu-node-17, pid 4242, since 2026-11-28): squeue no longer lists it")
    alive, who = judged(slurm_job="5", slurm_cluster="cpu")
    assert alive and "squeue could not say whether it still runs" in who and "Problem talking" in who
    alive, who = judged(slurm_job="7", uid=os.getuid() + 1)
    assert alive and "another user's job" in who and "does not show to this user" in who
    assert not judged(slurm_job="7", uid=os.getuid())[0]

    here = socket.gethostname()
    alive, who = judged(host=here, pid=os.getpid(), pid_ns="pid:[1]")
    assert alive and "another PID namespace of this host" in who
    assert judged(host=here, pid=os.getpid(), boot="an-earlier-boot") == (
        False, f"process {os.getpid()} on host {here} (since 2026-11-28): it ran on this host before it restarted")
    assert judged(host=here, pid=os.getpid(), boot=lock.boot_id(), pid_ns=lock.pid_namespace())[0]

    nodefile = tmp_path / "nodes"
    nodefile.write_text("cn07\ncn07\ncn08\n")
    monkeypatch.setenv("PBS_JOBID", "4242.pbs01")
    monkeypatch.setenv("PBS_NODEFILE", str(nodefile))
    asked.write_text("")
    mine = lock.owner_record()
    assert mine["allocation"] == ["cn07", "cn08"] and mine["pbs_cluster"] == "pbs01" and asked.read_text() == ""
    alive, who = judged(pbs_job="4242.pbs01", allocation=["cn01"])
    assert not alive and "this job's earlier run, on hosts cn01 (this run has cn07,cn08" in who
    assert judged(pbs_job="4242.pbs01", allocation=["cn07", "cn08"])[0]  # (a sibling on another of its hosts)
    assert not lock.same_job("pbs", "4242.pbs01", "4242.pbs02", None, None)  # (two servers' job 4242)
    assert lock.same_job("pbs", "4242.pbs01", "4242.pbs01.example.org", None, None)
    assert asked.read_text() == "", "no qstat asked"
    assert lock.hostlist("gpu[01-03,07],login1,r[1-2]n[8-9]") == [
        "gpu01", "gpu02", "gpu03", "gpu07", "login1", "r1n8", "r1n9", "r2n8", "r2n9"]


def test_a_lock_without_hard_links_and_a_dead_takers_claim(tmp_path, monkeypatch, caplog):
    """On a file system without hard links (os.link: EPERM, as FUSE mounts of object stores answer) a lock is
    created exclusively instead, refuses a second holder and is taken over from a dead one. A claim left by a
    taker that died between claiming and removing (its process gone) is passed by, whatever the clocks say (its
    time stamps set an hour into the future); one of another host's process, which may live, is not: the lock
    is then refused with one line naming the claim files."""
    import errno

    from tacl.runtime import lock

    def no_links(*args, **kwargs):
        raise PermissionError(errno.EPERM, "Operation not permitted")

    monkeypatch.setattr(os, "link", no_links)
    run = tmp_path / "run"
    with RunLock(run):
        assert json.loads((run / "LOCK").read_text())["pid"] == os.getpid()
        with pytest.raises(InputError, match="locked by another trainer"):
            RunLock(run).acquire()
    assert [p.name for p in run.iterdir()] == ["LOCK.log"]
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    record = json.dumps({"host": os.uname().nodename, "pid": gone.pid}).encode()
    (run / "LOCK").write_bytes(record)
    claim = run / f".LOCK.taking-{lock.hashlib.sha256(record).hexdigest()[:16]}"
    claim.write_text(json.dumps({"host": os.uname().nodename, "pid": gone.pid, "boot": lock.boot_id()}))
    os.utime(claim, (time.time() + 3600, time.time() + 3600))
    with caplog.at_level("WARNING", logger="tacl.pretrain"), RunLock(run):
        pass
    assert "took over the stale lock" in caplog.text and [p.name for p in run.iterdir()] == ["LOCK.log"]
    (run / "LOCK").write_bytes(record)
    claim.write_text(json.dumps({"host": "gpu-node-17", "pid": 4242}))
    monkeypatch.setattr(lock.time, "sleep", lambda s: None)
    with pytest.raises(InputError, match=r"could not take the lock .*\.taking-\* files beside it name it"):
        RunLock(run).acquire()
