"""The plan of one experiment, printed before anything runs: every job of the workflow (tacl.plan.Job) with
what it asks for and is expected to take, from the same estimates as the rules' resources (tacl.sizing), and
the text of tacl.plan.format_plan with the assumptions it rests on.

A job is to run where its output is not there, or where it or a job it depends on was made with settings that
changed (`changed`: the rerun tags of tacl.reruns). The workflow passes the rules that run on this machine
(its localrules); nothing here needs Snakemake."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from tacl import plan
from tacl.device import computes_bf16
from tacl.experiment import (
    embeddings_enabled,
    extra_models,
    finetune_models,
    gpus_per_node,
    model_tasks,
    settings_of,
    start_source,
    tabled_models,
    task_seeds,
    tasks_of,
    trained_objectives,
)
from tacl.pretrain.chain import chunks_present
from tacl.report.expected import RECORD as REPORT_RECORD
from tacl.sizing import Sizing

Chunk = tuple[str, float, float, Any]  # (marker, minutes asked for, expected GPU work, what ends it)


def planned_chunks(sizing: Sizing, objective: str, fresh: bool) -> list[Chunk]:
    """The chunks of one pretraining run as the plan counts them: (marker, minutes asked for, expected GPU
    work, what ends it), first those there already (none when `fresh`: the run starts again), then the rest
    of the work as estimated (tacl.plan.chunk_requests), from the speed the last of them measured."""
    p, cpu, layout = sizing.config["pretrain"], sizing.config["device"] == "cpu", sizing.layout
    minutes = sizing.pretrain_minutes(objective)
    present = 0 if fresh else chunks_present(lambda k: layout.chunk_marker(objective, k))
    chunks: list[Chunk] = []
    step = 0
    for k in range(present):
        with open(layout.chunk_marker(objective, k)) as f:
            marker = json.load(f)
        asked = sizing.chunk_runtime(objective, k)
        work = minutes * marker.get("steps_this_chunk", 0) / p["steps"]
        chunks.append((layout.chunk_marker(objective, k), asked, work, marker.get("reason")))
        step = marker["step"]
        if marker["done"]:
            return chunks
    rest = sizing.chunk_expected(objective, present) if present else minutes
    left = {**p, "steps": max(1, p["steps"] - step)}
    estimated = plan.chunk_requests(rest, left, sizing.plan, cpu)
    return chunks + [(layout.chunk_marker(objective, k), *c) for k, c in enumerate(estimated, start=present)]


class _Needs:
    """What each job's output is made from: the finished jobs (their rerun tags, tacl.reruns) it depends on."""

    def __init__(self, config: dict[str, Any]):
        self.config = config
        self.trained = trained_objectives(config)
        self.data, self.init = {"clean:", "shard:"}, {"init_model:"}

    def model(self, model: str) -> set[str]:
        base = model.split("+")[0]
        if base in self.trained:
            return self.data | self.init | {f"pretrain_chunk:{base}"}
        return self.init if base == "none" else set()

    def setting(self, m: str, t: str, setting: str) -> set[str]:
        source = start_source(self.config, t)
        before = self.selection(m.split("+")[0], source) if source else set()
        seeds = {f"finetune:{m}/{t}/{setting}/seed{s}" for s in task_seeds(self.config, t)}
        return self.model(m) | before | seeds

    def selection(self, m: str, t: str) -> set[str]:
        return set().union(*(self.setting(m, t, setting) for setting in settings_of(self.config, t)))

    def similarity(self, m: str) -> set[str]:
        return self.model(m) | {"clean:", f"similarity:{m}"}


def plan_jobs(sizing: Sizing, local: Iterable[str], changed: set[str]) -> list[plan.Job]:
    """Every job of the whole experiment (tacl.plan.Job), with what it asks for and is expected to take: the
    same functions as the rules' resources. Pretraining chunks: those there, then as many as the rest of the
    work needs as estimated. `local`: the rules that run on this machine; `changed`: the rerun tags."""
    config, layout, local = sizing.config, sizing.layout, set(local)
    start = sizing.plan["startup_minutes"]

    def job(name: str, output: str, gpus: int = 0, requested: float = 0, compute: float = 0.0, key: str = "",
            finetune: bool = False, needs: Iterable[str] = (), open_ended: bool = False) -> plan.Job:
        where = "login" if name in local else ("gpu" if gpus else "cpu")
        overhead = start if gpus else 0.0
        done = os.path.exists(output) and not changed & set(needs)
        return plan.Job(name, where, gpus, requested, compute, done, key, overhead, finetune, open_ended and not done)

    need, data = _Needs(config), layout.data
    p = config["pretrain"]
    jobs = [job("download_corpus", f"{data}/raw.json"), job("fetch_tokenizer", f"{data}/tokenizer")]
    jobs += [job("clean", f"{data}/corpus.txt", needs={"clean:"})]
    shards = [f"{k:05d}" for k in range(config["data"]["num_shards"])]
    jobs += [job("shard", f"{data}/shards/shard-{k}.bin", needs=need.data) for k in shards]
    jobs += [job("gather_shards", layout.manifest, needs=need.data)]
    jobs += [job("init_model", layout.start, needs=need.init)]
    if "none" in p["objectives"]:
        jobs.append(job("export_start", layout.model_summary("none"), needs=need.init))
    jobs += [job("extra_model", layout.model(m)) for m in extra_models(config)]
    gpus = gpus_per_node(config, "pretrain_chunk") * p["nodes"]
    for o in need.trained:
        needs = need.model(o)
        for marker, asked, work, ends in planned_chunks(sizing, o, fresh=bool(changed & needs)):
            open_ended = ends == "deadline"
            jobs.append(job("pretrain_chunk", marker, gpus, asked, work, o, needs=needs, open_ended=open_ended))
        jobs.append(job("export_model", layout.model_summary(o), needs=needs))
    jobs += [job("prepare_task", layout.task_data(t)) for t in config["finetune"]["tasks"]]
    gpu = gpus_per_node(config, "finetune")
    for m, t in model_tasks(config):
        for setting in settings_of(config, t):
            asked = sizing.finetune_runtime(m, t, setting)
            work = sizing.finetune_expected(m, t, setting)
            needs = need.setting(m, t, setting)
            output = layout.seeds_marker(m, t, setting)
            jobs.append(job("finetune", output, gpu, asked, work, f"{m}/{t}", True, needs))
        jobs.append(job("select_setting", layout.selection_file(m, t), needs=need.selection(m, t)))
    for m in tabled_models(config):
        needs = set().union(*(need.selection(m, t) for t in tasks_of(config, m)))
        jobs.append(job("submissions", layout.submissions(m), needs=needs))
    return jobs + _analysis_jobs(sizing, job, need)


def _analysis_jobs(sizing: Sizing, job: Any, need: _Needs) -> list[plan.Job]:
    """The analyses and the report, at the end of plan_jobs (`job` makes one of its jobs)."""
    config, layout = sizing.config, sizing.layout
    jobs = []
    if embeddings_enabled(config):
        jobs.append(job("embeddings_data", layout.embeddings_data))
    gpu = gpus_per_node(config, "similarity")
    for m in finetune_models(config):
        asked, work = sizing.similarity_runtime(), sizing.similarity_expected()
        jobs.append(job("similarity", layout.similarity(m), gpu, asked, work, m, True, need.similarity(m)))
    analysed = set().union(*(need.similarity(m) for m in finetune_models(config)))
    tuned = set().union(*(need.selection(m, t) for m, t in model_tasks(config)))
    jobs.append(job("similarity_plot", layout.similarity_png, needs=analysed))
    jobs.append(job("report", f"{layout.report}/{REPORT_RECORD}", needs=analysed | tuned))
    jobs.append(plan.Job("all", "login"))
    return jobs


def plan_text(sizing: Sizing, local: Iterable[str], changed: set[str]) -> str:
    """The plan printed before anything runs (tacl.plan.format_plan)."""
    config, shape, gpu = sizing.config, sizing.shape, sizing.gpu
    jobs = plan_jobs(sizing, local, changed)
    chain = plan.longest_chain(jobs, config["finetune"]["start_from"])
    data = sizing.data_summary()
    assumptions = [f"start model ({shape.source}): {shape.encoder / 1e6:.3g} M encoder parameters"]
    if config["device"] == "cpu":
        assumptions.append("device: cpu, so no job asks for a GPU and the runtimes are the configured ones")
        return plan.format_plan(jobs, chain, _disk(sizing, data), assumptions, {})
    _, seq_source = plan.mean_length(config["data"]["max_len"], data)
    p = sizing.plan
    assumptions += [
        (f"runtimes sized for {gpu.name}: start-up {p['startup_minutes']} min + {p['safety']} x the "
         f"expected minutes, at least {p['min_runtime_minutes']} (plan.*); explicit finetune.runtime_minutes win"),
        (f"pretraining sequences {sizing.pretrain_seq():.0f} tokens padded ({seq_source}); fine-tuning: published "
         "task sizes and typical lengths (tacl.plan.TASK_SIZES) until prepare_task has counted the splits"),
    ]
    assumptions += [
        f"{g.name}: {g.peak_tflops:g} TFLOP/s peak, MFU {g.pretrain_mfu:g} pretraining / "
        f"{g.finetune_mfu:g} fine-tuning (plan.gpus; {g.source})"
        for g in plan.gpus_of(p).values()
    ]
    expected = {k: (plan.expected_gpu_hours(jobs, gpu, g), g.name) for k, g in plan.gpus_of(p).items()}
    return plan.format_plan(jobs, chain, _disk(sizing, data), assumptions, expected)


def _disk(sizing: Sizing, data: dict[str, Any] | None) -> plan.Disk:
    """The disk held at the peak (tacl.plan.disk_at_peak): the corpus, each run's checkpoints and the
    exported and kept fine-tuned models."""
    config, p = sizing.config, sizing.config["pretrain"]
    kept = sum(len(task_seeds(config, src)) for src in set(config["finetune"]["start_from"].values()))
    models = len(finetune_models(config))
    return plan.disk_at_peak(
        sizing.shape,
        data["tokens"] if data else plan.corpus_tokens(config["data"]["max_lines"], config["data"]["source"]),
        len(trained_objectives(config)),
        p["keep_checkpoints"],
        computes_bf16(p["precision"], config["device"]),
        p["zero_stage"],
        models,
        kept * models,
    )


# -- what a run says before it starts, and `tacl plan` ---------------------------------------------------

PLAN_OUT = "TACL_PLAN_OUT"  # set by `tacl plan`: the file that the start of the run's messages go to


def announce(text: str | None) -> None:
    """A message of the start of a run (the plan, the keys left to the schema's defaults, the reruns, the
    scheduler checks' notes) on stderr, or, under `tacl plan`, into its file (PLAN_OUT), which it prints
    alone, without Snakemake's job list."""
    if not text:
        return
    out = os.environ.get(PLAN_OUT)
    if out:
        with open(out, "a") as f:
            f.write(text.rstrip("\n") + "\n")
    else:
        print(text, file=sys.stderr)


def configfiles(args: list[str]) -> list[str]:
    """The files a Snakemake command line gives with --configfile / --configfiles (several may follow one)."""
    files, taking = [], False
    for a in args:
        if a.split("=")[0] in ("--configfile", "--configfiles"):
            taking = "=" not in a
            files += [a.split("=", 1)[1]] if "=" in a else []
        elif a.startswith("-"):
            taking = False
        elif taking:
            files.append(a)
    return files


# Snakemake's lines around its own messages, left out of `tacl plan`'s output when a dry run fails
NOISE = ("Using profile ", "Building DAG of jobs", "Config file config.yaml is extended by")


def register(stages: Any) -> None:
    """`tacl plan [SNAKEMAKE ARGS]`: the plan of the workflow in the working directory, from a dry run."""
    c = stages.add_parser("plan", help="what a run will cost: jobs, GPU-hours, the longest chain, disk (a dry run)")
    c.add_argument("snakemake_args", nargs="*",
                   help="Snakemake's own arguments, e.g. --profile profiles/slurm --configfile my.yaml")
    c.set_defaults(func=_plan)


def plan_command(args: list[str]) -> list[str]:
    """The quiet dry run behind `tacl plan` (Snakemake's arguments after ours: a target may come first)."""
    return [sys.executable, "-m", "snakemake", "--quiet", "rules", "progress", "host", "reason", "--dry-run", *args]


def _plan(a: Any) -> int:
    """The plan and its assumptions (with the reruns and the keys left to the schema's defaults) on stdout,
    from a dry run of the workflow in the working directory, whose job list is left out; where the dry run
    fails (a config error, a profile variable left unset, an input not found), its messages on stderr. A
    config file that is not YAML is named with its line before Snakemake starts."""
    import subprocess
    import tempfile

    from tacl.config import yaml_error

    for path in configfiles(a.snakemake_args):
        problem = yaml_error(path)
        if problem:
            print(problem, file=sys.stderr)
            return 1
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp, "plan.txt")
        proc = subprocess.run(plan_command(a.snakemake_args), capture_output=True, text=True,
                              env={**os.environ, PLAN_OUT: str(out)})
        said = out.read_text() if out.is_file() else ""
    print(said, end="", flush=True)
    if proc.returncode:
        lines = (proc.stdout + proc.stderr).splitlines()
        print("\n".join(line for line in lines if not line.startswith(NOISE)), file=sys.stderr)
    return proc.returncode
