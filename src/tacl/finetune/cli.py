"""`tacl finetune ...`: prepare (login node), glue, squad, ner: one (model, task, seed) each."""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from dataclasses import replace
from pathlib import Path

from tacl.finetune import CONTRASTIVE_FORMS, PRESETS, TASKS
from tacl.finetune.settings import FineTune
from tacl.runtime.device import DEVICES
from tacl.runtime.io import InputError, with_cache

log = logging.getLogger("tacl.finetune")


def register(stages: argparse._SubParsersAction) -> None:
    p = stages.add_parser("finetune", help="GLUE, SQuAD and CoNLL-2003 fine-tunes")
    cmds = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    c = cmds.add_parser("select", help="the setting with the best mean dev score over seeds, of one (model, task)")
    c.add_argument("--task", required=True)
    c.add_argument("--runs", nargs="+", required=True,
                   help="every setting's seeds marker (or every setting's and seed's metrics.json)")
    c.add_argument("--out", required=True)
    c.set_defaults(func=_select)

    c = cmds.add_parser("submissions", help="one zip per model: GLUE test files and SQuAD predictions of the "
                                            "selected settings")
    c.add_argument("--selections", nargs="+", required=True, help="the model's finetune/MODEL/TASK/selected.json")
    c.add_argument("--out", required=True)
    c.set_defaults(func=_submissions)

    c = cmds.add_parser("prepare", help="fetch or check a task's data (login node)")
    c.add_argument("--task", required=True, help=f"a built-in task ({', '.join(TASKS)}) or a declared one")
    c.add_argument("--source", required=True,
                   help="the task family's source as JSON (a declared task: its declaration, named)")
    c.add_argument("--cache-dir", help="Hugging Face datasets cache (a source's own cache_dir wins)")
    c.add_argument("--out", required=True)
    c.set_defaults(func=_prepare, online=True)

    for name, help_ in (("glue", "one GLUE task"), ("squad", "SQuAD v1.1 (squad_v1) or v2.0 (squad_v2)"),
                        ("ner", "CoNLL-2003 NER")):
        c = cmds.add_parser(name, help=help_)
        start = c.add_mutually_exclusive_group(required=True)
        start.add_argument("--model", help="a Hugging Face BERT directory")
        if name == "glue":
            start.add_argument("--start-selection",
                               help="start from the weights of another task's selected run (its selected.json)")
        c.add_argument("--task", required=True,
                       help=f"one of {', '.join(t for t, family in TASKS.items() if family == name)}, or a task "
                            "declared in the config whose kind this family runs (its declaration as --source)")
        seeds = c.add_mutually_exclusive_group(required=True)
        seeds.add_argument("--seed", type=int, help="one seed, trained in --out")
        seeds.add_argument("--seeds", type=int, nargs="+",
                           help="several seeds one after the other, each in --out/seedN (a seed done before "
                                "with the same settings and start model is kept), then --marker")
        c.add_argument("--source", required=True, help="data source as JSON")
        c.add_argument("--cache-dir", help="Hugging Face datasets cache (a source's own cache_dir wins)")
        c.add_argument("--hparams", default="{}", help="hyperparameters as JSON")
        c.add_argument("--precision", default="auto", choices=["auto", "bf16", "fp32"])
        c.add_argument("--preset", default="standard", choices=sorted(PRESETS),
                       help="reference: the reference's choices (no warmup, no weight decay); standard: 10%% "
                            "warmup, weight decay 0.01 (the config's hparams override either)")
        c.add_argument("--device", default="auto", choices=DEVICES,
                       help="cuda: stop at once unless a GPU is usable (the config's `device`)")
        c.add_argument("--compile", default="auto", choices=["auto", "true", "false"],
                       help="torch.compile the model (finetune.compile; auto: on a GPU)")
        c.add_argument("--shapes", default="auto", choices=["auto", "exact", "buckets"],
                       help="batches padded to their longest row (exact) or to a few fixed widths and full "
                            "rows (buckets) (finetune.shapes; auto: buckets where compiled)")
        c.add_argument("--checkpoint-minutes", type=float, default=30.0,
                       help="save the seed's state in its folder this often, and on SIGUSR1/SIGUSR2/SIGTERM "
                            "(then stop, exit status 3); a seed with a checkpoint goes on from it "
                            "(finetune.checkpoint_minutes)")
        if name == "glue":
            c.add_argument("--contrastive", choices=CONTRASTIVE_FORMS,
                           help="add a contrastive term on [CLS] (classification tasks; weight and tau in hparams)")
            c.add_argument("--save-model", action="store_true",
                           help="keep the fine-tuned encoder (without its head) in OUT/model, to start other tasks")
        c.add_argument("--out", required=True,
                       help="the run directory (--seed; metrics.json is written last), or the seeds' parent")
        c.add_argument("--marker", help="with --seeds: written at the end, listing every seed's metrics.json")
        c.add_argument("--seeds-per-gpu", default="auto", type=_count_or_auto,
                       help="with --seeds: train this many seeds at once, each in its own process with its share "
                            "of the CPU cores (finetune.seeds_per_gpu; auto: one on a CPU, as many as the GPU's "
                            "compute mode, memory and the cores allow on a GPU); with --seed: this many seeds of "
                            "the job share the GPU and save at once before the job's end")
        c.add_argument("--tracking", help="the trackers beside the seed's files (W&B, MLflow) as JSON, with the "
                                          "run's labels (tacl.runtime.tracking.job_spec; config `tracking`)")
        c.set_defaults(func=_finetune)


def _prepare(a: argparse.Namespace) -> None:
    from tacl.finetune.data import prepare

    print(json.dumps(prepare(a.task, with_cache(json.loads(a.source), a.cache_dir), a.out)))


def _finetune(a: argparse.Namespace) -> int:
    from tacl.finetune import EXIT_STOPPED, Stopped
    from tacl.finetune.resume import Checkpointing
    from tacl.finetune.seeds import note_job, run_seeds, weights_fingerprint
    from tacl.finetune.side_by_side import cannot_share, run_side_by_side, seeds_at_once
    from tacl.runtime.device import GpuUnavailable, open_gpu, resolve_device

    # (a seed of a job of several, `--seed` with `--seeds-per-gpu N`: N seeds share its GPU and save at once;
    # one whose GPU will not take it says which setting lets the job run)
    together = int(a.seeds_per_gpu) if a.seeds is None and a.seeds_per_gpu != "auto" else 1
    try:
        device = resolve_device(a.device)  # a GPU asked for and none usable: stop before anything is written
    except GpuUnavailable as e:
        raise cannot_share(e, together) from e
    model, start_from = start_model(a)
    tune = fine_tune(a, model, start_from)
    if tune.family != a.command:
        raise InputError(f"--task {a.task}: not a task that `tacl finetune {a.command}` runs "
                         f"({tune.family or 'unknown: neither built in nor declared in --source'})")
    model_dir = resolve_model(model)
    run_dir = (lambda seed: Path(a.out)) if a.seeds is None else (lambda seed: Path(a.out) / f"seed{seed}")
    seeds = [a.seed] if a.seeds is None else a.seeds
    count, why = (1, "") if a.seeds is None else seeds_at_once(a.seeds_per_gpu, len(seeds), device, model_dir,
                                                               tune.family, tune.hparams)
    given: dict = {}
    if count == 1:  # (this process trains; side by side, each seed's process opens the GPU, reads the job's end
        # time, hashes the start model and checks its own input)
        try:
            open_gpu(device)
        except GpuUnavailable as e:
            raise cannot_share(e, together) from e
        tune = replace(tune, checkpointing=Checkpointing(a.checkpoint_minutes, end=job_end(), at_once=together))
        given = {**tune.given(), "model_sha256": weights_fingerprint(model_dir)}

    def train_one(seed: int, out: Path) -> dict:
        from tacl.finetune.tracked import tracked_seed

        spec = json.loads(a.tracking) if a.tracking else None
        result = tracked_seed(spec, a.task, seed, out, given, lambda: _train(tune, seed, out))
        print(json.dumps({k: result[k] for k in ("task", "seed", "dev", "wall_s")}))
        return result

    # (which job runs the seeds, for `tacl status`: running, or stopped; each seed's leftovers go under its lock)
    note_job(Path(a.out))
    try:
        if count > 1:
            log.info("seeds side by side (%s)", why)
            run_side_by_side(seeds, count, lambda seed: seed_command(a, seed, count), run_dir, a.marker)
        else:
            run_seeds(seeds, run_dir, given, train_one, a.marker)
    except Stopped as e:
        print(f"tacl: stopped: {e}", file=sys.stderr)
        return EXIT_STOPPED
    return 0


def start_model(a: argparse.Namespace) -> tuple[str, str | None]:
    """The model the seeds start from, and where it came from: `--model` as given (None), or the encoder kept
    by another task's selected run (`--start-selection`: its model/, and the run, TASK:SETTING/seedN)."""
    if not getattr(a, "start_selection", None):
        return a.model, None
    from tacl.finetune.submissions import selected_run

    run, start_from = selected_run(a.start_selection, with_label=True)
    return str(run / "model"), start_from


def fine_tune(a: argparse.Namespace, model: str, start_from: str | None) -> FineTune:
    """What each seed of the job is given, from its command line (`model` and `start_from`: `start_model`'s);
    how the seeds checkpoint is left to the process that trains them (`_finetune`), which reads the job's end
    time itself."""
    return FineTune(task=a.task, model=model, source=json.loads(a.source), hparams=json.loads(a.hparams),
                    cache_dir=a.cache_dir, precision=a.precision, preset=a.preset, device=a.device,
                    compile={"true": True, "false": False}.get(a.compile, a.compile), shapes=a.shapes,
                    contrastive=getattr(a, "contrastive", None), start_from=start_from,
                    save_model=getattr(a, "save_model", False))


def _count_or_auto(value: str) -> str:
    if value != "auto" and not (value.isdigit() and int(value) >= 1):
        raise argparse.ArgumentTypeError(f"a number of seeds (1 or more) or auto, not {value!r}")
    return value


def job_end() -> float | None:
    """Unix time at which the job's scheduler ends it (SLURM's squeue, PBS's walltime and start time: the end
    time a pretraining chunk reads, tacl.pretrain.deadline), said in the log; None where nothing limits it."""
    from tacl.pretrain.deadline import describe, end_times

    ends = end_times(time.time())
    if ends:
        log.info("fine-tune: this job %s", describe(ends))
    return min(ends.values(), default=None)


def seed_command(a: argparse.Namespace, seed: int, at_once: int) -> list[str]:
    """The command of one seed of a job of several (`--seeds`), trained side by side with `at_once` - 1
    others: the job's own command for that seed alone, in its folder (OUT/seedN), as a job of one seed runs;
    its `--seeds-per-gpu` says how many seeds share its GPU (and save at the same moment before the job's
    end)."""
    command = [sys.executable, "-m", "tacl", "finetune", a.command, "--task", a.task, "--seed", str(seed),
               "--source", a.source, "--hparams", a.hparams, "--precision", a.precision, "--preset", a.preset,
               "--device", a.device, "--compile", a.compile, "--shapes", a.shapes,
               "--checkpoint-minutes", repr(a.checkpoint_minutes), "--seeds-per-gpu", str(at_once),
               "--out", str(Path(a.out) / f"seed{seed}")]
    command += ["--model", a.model] if a.model else ["--start-selection", a.start_selection]
    if a.cache_dir:
        command += ["--cache-dir", a.cache_dir]
    if getattr(a, "contrastive", None):
        command += ["--contrastive", a.contrastive]
    if getattr(a, "save_model", False):
        command.append("--save-model")
    if a.tracking:
        command += ["--tracking", a.tracking]
    return command


def resolve_model(model: str) -> str:
    from tacl.runtime.hub import resolve_pretrained

    return resolve_pretrained(model)


def _train(tune: FineTune, seed: int, out: Path) -> dict:
    """One seed of the task family's fine-tune, in its folder `out`."""
    if tune.family == "glue":
        from tacl.finetune.sequence import finetune_glue

        return finetune_glue(tune, seed, out)
    if tune.family == "squad":
        from tacl.finetune.qa import finetune_squad

        return finetune_squad(tune, seed, out)
    from tacl.finetune.ner import finetune_ner

    return finetune_ner(tune, seed, out)


def _select(a: argparse.Namespace) -> None:
    from tacl.finetune.seeds import metrics_files
    from tacl.finetune.sweep import select_runs
    from tacl.runtime.io import write_json_atomic

    chosen = select_runs(a.task, metrics_files(a.runs))
    write_json_atomic(a.out, chosen)
    print(json.dumps({k: chosen[k] for k in ("task", "setting", "best_seed")}))


def _submissions(a: argparse.Namespace) -> None:
    from tacl.finetune.submissions import package

    print(json.dumps(package(a.selections, a.out)))
