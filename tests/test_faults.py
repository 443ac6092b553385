"""Faults at any moment (tests/faults.py): a short schedule over the small DAG, drawn anew at every run, and the
pieces the schedule rests on: the outputs' records that find a damaged result, and the schedule's draw."""

from __future__ import annotations

import json
import os
import time

import pytest

from conftest import REPO


def test_a_damaged_output_is_found_and_removed_and_bookkeeping_is_not_damage(tmp_path):
    """tacl.runtime.outputs: a job's outputs recorded (a file, a folder, a folder of results beside them); an
    output cut short, a file deleted inside a folder output, a seed's result file cut short: each job found
    damaged, once, and its outputs removed with one line naming what is wrong (the seeds' folder stays: the job
    run again keeps its intact seeds). The locks, their history, a
    job's record and checkpoints in a results folder are bookkeeping, not damage; a job whose outputs are not
    all gone is left to Snakemake (it runs again and records anew); one of a job's several outputs gone makes the
    job damaged; what was made from a damaged job's outputs, directly or not, is made again too."""
    from tacl.runtime.outputs import damaged, record, remove_damaged

    results = tmp_path / "results"
    (results / "models" / "m").mkdir(parents=True)
    (results / "models" / "m" / "model.safetensors").write_bytes(b"w" * 100)
    (results / "models" / "m" / "config.json").write_text("{}")
    (results / "marker.json").write_text('{"done": true}')
    seeds = results / "finetune" / "setting"
    (seeds / "seed0").mkdir(parents=True)
    (seeds / "seed0" / "metrics.json").write_text('{"dev": 1}')
    (seeds / "seeds.json").write_text("{}")
    record(results, [str(results / "models" / "m")])
    record(results, [str(results / "marker.json")])
    record(results, [str(seeds / "seeds.json")], [str(seeds)], inputs=[str(results / "models" / "m")])
    (results / "report.csv").write_text("a,b\n")  # (made from the seeds' marker)
    record(results, [str(results / "report.csv")], inputs=[str(seeds / "seeds.json"), str(results / "x.json")])
    record(results, [str(tmp_path / "elsewhere.json")])  # (outside the results: not recorded)
    assert damaged(results) == []
    for name in ("LOCK", "LOCK.log", "job.json", "checkpoint.pt"):
        (seeds / "seed0" / name).write_text("bookkeeping")
    (seeds / "seed0" / ".metrics.json.tmp-host-1").write_text("{")
    assert damaged(results) == []

    (results / "models" / "m" / "config.json").unlink()
    with open(results / "marker.json", "r+b") as f:
        f.truncate(3)
    (seeds / "seed0" / "metrics.json").write_text('{"de')
    found = {str(paths[0].relative_to(results)): why for paths, why in damaged(results)}
    assert found == {"models/m": f"{results}/models/m/config.json is missing",
                     "marker.json": f"{results}/marker.json has 3 bytes, 14 when its job wrote it",
                     "finetune/setting/seeds.json": f"{seeds}/seed0/metrics.json has 4 bytes, 10 when its job wrote it",
                     "report.csv": f"made from {seeds}/seeds.json, which is made again"}
    said = []
    lines = remove_damaged(results, say=said.append)
    assert said == lines and len(lines) == 4 and lines[0].startswith("damaged since its job wrote it (")
    assert "removed finetune/setting/seeds.json, which this run makes again" in "".join(lines)
    assert lines[-1] == (f"to be made again (made from {seeds}/seeds.json, which is made again): removed report.csv, "
                         "which this run makes again")
    assert not (results / "models" / "m").exists() and not (results / "marker.json").exists()
    assert not (seeds / "seeds.json").exists() and (seeds / "seed0").is_dir()  # (the job redoes the damaged seed)
    assert not (results / "report.csv").exists()
    assert damaged(results) == []  # (outputs gone: Snakemake runs their jobs again, which record anew)
    # a job of several outputs, one of them deleted (Snakemake would take it for a temporary file): damaged, and
    # what was made from the others is made again
    for name in ("shard.bin", "shard.json"):
        (results / name).write_text("s" * 8)
    (results / "manifest.json").write_text("{}")
    record(results, [str(results / "shard.bin"), str(results / "shard.json")])
    record(results, [str(results / "manifest.json")], inputs=[str(results / "shard.json")])
    (results / "shard.bin").unlink()
    assert [(sorted(p.name for p in paths), why) for paths, why in damaged(results)] == [
        (["shard.bin", "shard.json"], f"{results}/shard.bin is missing"),
        (["manifest.json"], f"made from {results}/shard.json, which is made again")]


def test_a_schedule_draws_its_moments_and_kinds_from_its_seed():
    """The same seed, the same schedule; another seed, another; moments within the span, in order."""
    from faults import FAULT_KINDS, draw_schedule

    a, b = draw_schedule(7, 6, 100.0), draw_schedule(7, 6, 100.0)
    assert [(f.moment, f.kind, f.draw) for f in a] == [(f.moment, f.kind, f.draw) for f in b]
    assert [f.moment for f in a] == sorted(f.moment for f in a) and all(0 <= f.moment <= 100 for f in a)
    assert all(f.kind in FAULT_KINDS for f in a)
    assert [f.kind for f in draw_schedule(8, 6, 100.0)] != [f.kind for f in a] or \
        [f.moment for f in draw_schedule(8, 6, 100.0)] != [f.moment for f in a]


@pytest.mark.slow
def test_faults_at_drawn_moments_leave_the_same_tables_and_nothing_behind(small_dag_again, tmp_path):
    """The small DAG run a second time from scratch, its seeds side by side (`fault_config`), under a schedule
    of 2 faults drawn from a seed that changes with every run (printed; set TACL_FAULT_SEED to run one again):
    after the documented recovery steps the run ends well, its report is the uninterrupted run's byte for byte
    (small_dag_again's, its seeds one after the other: the same config twice gives the same tables, seeds
    side by side or not, faults or not), no lock was held twice, nothing is left behind, and every message says
    what to do (tests/faults.py, `check`). About 40 s a fault beyond the run's own 100 s on 2 cores."""
    from faults import check, small_fs, unmount, Schedule, draw_schedule, fault_config

    seed = int(os.environ.get("TACL_FAULT_SEED") or time.time()) % 100_000
    reference = small_dag_again["report"]  # (as its run wrote it)
    assert reference, "the uninterrupted run's report"
    root = tmp_path / "faulted"
    mounted = small_fs(root, 96)
    try:
        faults = draw_schedule(seed, 2, 100.0)
        schedule = Schedule(root, fault_config(root), faults,
                            ["--profile", str(REPO / "profiles" / "local"), "--cores", "2"], seed, mounted)
        outcome = schedule.run()
        problems = check(schedule, reference)
    finally:
        if mounted:
            unmount(root)
    struck = json.dumps([(f.kind, f.job, round(f.struck_at, 1), f.outcome) for f in outcome.faults])
    assert problems == [], f"fault schedule {seed} (TACL_FAULT_SEED={seed} runs it again): {struck}: {problems}"


def test_a_full_disk_is_one_line_from_the_job_and_no_traceback_from_its_threads(capsys, monkeypatch):
    """A job that cannot write (ENOSPC, EDQUOT; torch.save says only "file write failed", whatever wraps it) ends
    with one line that says to free space and run again, exit status 2; a background thread that meets the full
    disk first (a TensorBoard writer) prints no traceback before it. Any other error is Python's own."""
    import errno
    import threading
    import types

    from tacl import cli

    full = OSError(errno.ENOSPC, "No space left on device", "/results/x.pt")
    wrapped = RuntimeError("[enforce fail at inline_container.cc:664] . PytorchStreamWriter failed writing file "
                           "data/0: file write failed")
    wrapped.__cause__ = None
    try:
        raise RuntimeError("saving the checkpoint") from full
    except RuntimeError as e:
        chained = e
    for error in (full, wrapped, chained, OSError(errno.EDQUOT, "Disk quota exceeded")):
        assert cli.no_space(error).startswith("no space left on the file system")
    assert "(/results/x.pt)" in cli.no_space(full)
    assert cli.no_space(ValueError("bad")) is None and cli.no_space(OSError(errno.EACCES, "denied")) is None

    def writes(args):
        thread = threading.Thread(target=lambda: (_ for _ in ()).throw(OSError(errno.ENOSPC, "No space")))
        thread.start()
        thread.join()
        raise full

    parsed = types.SimpleNamespace(func=writes, online=False)
    monkeypatch.setattr(cli, "build_parser", lambda: types.SimpleNamespace(parse_args=lambda argv: parsed))
    monkeypatch.setattr(cli, "claim_for_job", lambda args: None)
    monkeypatch.setattr(threading, "excepthook", threading.excepthook)  # (main() sets it: put back after)
    capsys.readouterr()
    assert cli.main(["data", "clean"]) == 2
    err = capsys.readouterr().err
    assert err.splitlines() == [f"tacl: error: {cli.no_space(full)}"] and "Traceback" not in err
