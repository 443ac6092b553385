"""The plan of one experiment, printed before anything runs: every job of the workflow
(tacl.planning.estimates.Job) with what it asks for and is expected to take, from the same estimates as the rules'
resources (tacl.planning.sizing), and the text of tacl.planning.estimates.format_plan with the assumptions it rests
on; and `announce`, which says it (and the run's other opening messages) before anything runs.

A job is to run where its output is not there, or where it or a job it depends on was made with settings that
changed (`changed`: the rerun tags of tacl.experiment.reruns). The rules that run on this machine are
tacl.experiment.design.LOCAL_RULES (the rules' `localrules:`); nothing here needs Snakemake. Why the plan lists
the jobs itself rather than taking them from Snakemake's DAG, and what keeps the two equal: docs/development.md
(the plan and Snakemake's jobs)."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from tacl.experiment.design import (
    LOCAL_RULES,
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
from tacl.finetune import SAVE_BYTES_PER_S, STOP_SLACK_S, finetune_checkpoint_bytes, save_margin_s
from tacl.planning import estimates
from tacl.planning.sizing import Sizing
from tacl.pretrain.chain import chunks_present
from tacl.report.expected import RECORD as REPORT_RECORD
from tacl.runtime.device import computes_bf16
from tacl.runtime.io import size_text

Chunk = tuple[str, float, float, Any]  # (marker, minutes asked for, expected GPU work, what ends it)


# What the plan takes a declared task to hold before prepare_task has counted it (tacl.planning.estimates'
# default for a task it does not know)
DECLARED_SIZES_TEXT = "{:,} training and {:,} evaluated examples of {} tokens".format(*estimates.UNKNOWN_TASK_SIZE)


def planned_chunks(sizing: Sizing, objective: str, fresh: bool) -> list[Chunk]:
    """The chunks of one pretraining run as the plan counts them: (marker, minutes asked for, expected GPU
    work, what ends it), first those there already (none when `fresh`: the run starts again), then the rest
    of the work as estimated (tacl.planning.estimates.chunk_requests), from the speed the last of them measured."""
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
    estimated = estimates.chunk_requests(rest, left, sizing.plan, cpu)
    return chunks + [(layout.chunk_marker(objective, k), *c) for k, c in enumerate(estimated, start=present)]


def recorded_seeds(marker: str) -> set[str] | None:
    """The seed folders a setting's marker (seeds.json) says its job trained, or None without a marker."""
    try:
        runs = json.loads(Path(marker).read_text())["runs"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return {Path(r).parent.name for r in runs}


def recorded_settings(selection: str) -> set[str] | None:
    """The settings a selection (selected.json) chose among, or None without one."""
    try:
        return set(json.loads(Path(selection).read_text())["settings"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


class _Jobs:
    """The jobs of plan_jobs, made in the order the workflow runs them: a job is to run where its output is not
    there, where its own settings changed (`tags` among the rerun tags), where its record names other inputs
    than the config gives it now (`stale`: Snakemake's input trigger), or where a job it depends on (`after`,
    those jobs' outputs) is to run, as Snakemake then runs it again."""

    def __init__(self, sizing: Sizing, changed: set[str]):
        self.changed, self.start = changed, sizing.plan["startup_minutes"]
        self.done: dict[str, bool] = {}
        self.jobs: list[estimates.Job] = []

    def add(self, name: str, output: str, gpus: int = 0, requested: float = 0, compute: float = 0.0, key: str = "",
            finetune: bool = False, tags: Iterable[str] = (), after: Iterable[str] = (), stale: bool = False,
            open_ended: bool = False) -> None:
        where = "login" if name in LOCAL_RULES else ("gpu" if gpus else "cpu")
        overhead = self.start if gpus else 0.0
        done = (os.path.exists(output) and not stale and not self.changed & set(tags)
                and all(self.done.get(u, True) for u in after))
        self.done[output] = done
        self.jobs.append(estimates.Job(name, where, gpus, requested, compute, done, key, overhead, finetune,
                                  open_ended and not done))

    def all_done(self, outputs: Iterable[str]) -> bool:
        return all(self.done.get(u, True) for u in outputs)


def plan_jobs(sizing: Sizing, changed: set[str]) -> list[estimates.Job]:
    """Every job of the whole experiment (tacl.planning.estimates.Job), with what it asks for and is expected to
    take: the same functions as the rules' resources. Pretraining chunks: those there, then as many as the rest
    of the work needs as estimated. `changed`: the rerun tags. A job is to run where Snakemake would run it
    (_Jobs): with everything downstream of a change."""
    config, layout = sizing.config, sizing.layout
    out = _Jobs(sizing, changed)
    data, p = layout.data, config["pretrain"]
    raw, tokenizer, corpus = f"{data}/raw.json", f"{data}/tokenizer", f"{data}/corpus.txt"
    out.add("download_corpus", raw, tags={"download_corpus:"})
    out.add("fetch_tokenizer", tokenizer, tags={"fetch_tokenizer:"})
    out.add("clean", corpus, tags={"clean:"}, after=[raw])
    shards = [f"{data}/shards/shard-{k:05d}.bin" for k in range(config["data"]["num_shards"])]
    for shard in shards:
        out.add("shard", shard, tags={"shard:"}, after=[corpus, tokenizer])
    out.add("gather_shards", layout.manifest, after=shards + [corpus])
    out.add("init_model", layout.start, tags={"init_model:"}, after=[tokenizer])
    if "none" in p["objectives"]:
        out.add("export_start", layout.model_summary("none"), after=[layout.start])
    extras = extra_models(config)
    for m in extras:
        out.add("extra_model", layout.model(m), key=m)
    gpus = gpus_per_node(config, "pretrain_chunk") * p["nodes"]
    for o in trained_objectives(config):
        upstream, previous = [layout.manifest, layout.start], []
        fresh = f"pretrain_chunk:{o}" in changed or not out.all_done(upstream)
        for marker, asked, work, ends in planned_chunks(sizing, o, fresh=fresh):
            out.add("pretrain_chunk", marker, gpus, asked, work, o, tags={f"pretrain_chunk:{o}"},
                    after=upstream + previous, open_ended=ends == "deadline")
            previous = [marker]
        out.add("export_model", layout.model_summary(o), after=previous + [layout.start])

    def model(m: str) -> str:
        """The job that makes model m (a contrastive MODEL+FORM fine-tunes MODEL): its export or extra_model."""
        base = m.split("+")[0]
        return layout.model(base) if base in extras else layout.model_summary(base)

    for t in config["finetune"]["tasks"]:
        out.add("prepare_task", layout.task_data(t), key=t, tags={f"prepare_task:{t}"})
    gpu = gpus_per_node(config, "finetune")
    for m, t in model_tasks(config):
        source = start_source(config, t)
        before = [layout.task_data(t), model(m)] + ([layout.selection_file(m.split("+")[0], source)] if source else [])
        seeds = {f"seed{s}" for s in task_seeds(config, t)}
        markers = []
        for setting in settings_of(config, t):
            marker = layout.seeds_marker(m, t, setting)
            tags = {f"finetune:{m}/{t}/{setting}/{seed}" for seed in seeds}
            stale = recorded_seeds(marker) not in (None, seeds)  # (seeds added or dropped: the job runs again)
            out.add("finetune", marker, gpu, sizing.finetune_runtime(m, t, setting),
                    sizing.finetune_expected(m, t, setting), f"{m}/{t}", True, tags, before, stale)
            markers.append(marker)
        selection = layout.selection_file(m, t)
        chosen_among = recorded_settings(selection)
        out.add("select_setting", selection, after=markers,
                stale=chosen_among is not None and chosen_among != set(settings_of(config, t)))
    for m in tabled_models(config):
        out.add("submissions", layout.submissions(m), after=[layout.selection_file(m, t) for t in tasks_of(config, m)])
    _analysis_jobs(sizing, out, model)
    out.jobs.append(estimates.Job("all", "login", done=all(j.done for j in out.jobs)))
    return out.jobs


def _analysis_jobs(sizing: Sizing, out: _Jobs, model: Any) -> None:
    """The analyses and the report, at the end of plan_jobs (`model`: the job that makes a model)."""
    config, layout = sizing.config, sizing.layout
    heldout = [f"{layout.data}/corpus.txt"]  # (clean writes the held-out sentences beside the corpus)
    if embeddings_enabled(config):
        out.add("embeddings_data", layout.embeddings_data)
        heldout.append(layout.embeddings_data)
    gpu = gpus_per_node(config, "similarity")
    for m in finetune_models(config):
        asked, work = sizing.similarity_runtime(), sizing.similarity_expected()
        out.add("similarity", layout.similarity(m), gpu, asked, work, m, True, {f"similarity:{m}"},
                [model(m)] + heldout)
    analysed = [layout.similarity(m) for m in finetune_models(config)]
    out.add("similarity_plot", layout.similarity_png, after=analysed)
    tuned = [layout.seeds_marker(m, t, s) for m, t in model_tasks(config) for s in settings_of(config, t)]
    out.add("report", f"{layout.report}/{REPORT_RECORD}", after=tuned + analysed + [layout.similarity_png])


def plan_text(sizing: Sizing, jobs: list[estimates.Job]) -> str:
    """The plan printed before anything runs (tacl.planning.estimates.format_plan) of the jobs plan_jobs lists."""
    config, shape, gpu = sizing.config, sizing.shape, sizing.gpu
    chain = estimates.longest_chain(jobs, config["finetune"]["start_from"])
    data = sizing.data_summary()
    masked = estimates.masked_share(config["pretrain"], shape)
    assumptions = [f"start model ({shape.source}): family {shape.family}, {shape.encoder / 1e6:.3g} M encoder "
                   f"parameters, {shape.total / 1e6:.4g} M in all; the MLM head on the masked {masked:.0%} of the "
                   "positions"]
    if passes := estimates.pretraining_passes(config["pretrain"], data):
        assumptions.append(passes)
    at_once = max((sizing.seeds_at_once(task) for task in config["finetune"]["tasks"]), default=1)
    assumptions.append(stops_before_limit(sizing, at_once))
    if config["device"] == "cpu":
        assumptions.append("device: cpu, so no job asks for a GPU and the runtimes are the configured ones")
        return estimates.format_plan(jobs, chain, _disk(sizing, data), assumptions, {})
    _, seq_source = estimates.mean_length(config["data"]["max_len"], data)
    p = sizing.plan
    assumptions += [
        (f"runtimes sized for {gpu.name}: start-up {p['startup_minutes']} min + {p['safety']} x the "
         f"expected minutes, at least {p['min_runtime_minutes']} (plan.*); explicit finetune.runtime_minutes win"),
        (f"pretraining sequences {sizing.pretrain_seq():.0f} tokens padded ({seq_source}); fine-tuning: published "
         "task sizes and typical lengths (tacl.planning.estimates.TASK_SIZES) until prepare_task has counted the "
         "splits" + (f"; a declared task ({', '.join(config['finetune']['declared_tasks'])}) {DECLARED_SIZES_TEXT} "
                     "until then" if config["finetune"]["declared_tasks"] else "")),
    ]
    if at_once > 1:
        assumptions.append(
            f"fine-tunes: up to {at_once} seeds of a job at once on its GPU (finetune.seeds_per_gpu "
            f"{config['finetune']['seeds_per_gpu']}), host memory for each; runtimes and GPU-hours as for one "
            "seed at a time (an upper bound: the gain of seeds side by side is not measured yet)")
    assumptions += [
        f"{g.name}: {g.peak_tflops:g} TFLOP/s peak, MFU {g.pretrain_mfu:g} pretraining / "
        f"{g.finetune_mfu:g} fine-tuning (plan.gpus; {g.source})"
        for g in estimates.gpus_of(p).values()
    ]
    return estimates.format_plan(jobs, chain, _disk(sizing, data), assumptions, expected_on_each_gpu(sizing, jobs))


def stops_before_limit(sizing: Sizing, at_once: int) -> str:
    """How long before its time limit each job saves and stops by itself, from the end time its scheduler
    gives it (tacl.pretrain.deadline, tacl.finetune.resume.TimeLimit)."""
    margin = sizing.config["pretrain"]["chunk"]["margin_minutes"]
    checkpoint = finetune_checkpoint_bytes(sizing.shape.total)
    seeds = f"{at_once} seeds' checkpoints" if at_once > 1 else "its seed's checkpoint"
    return (f"jobs save and stop by themselves before their time limit (the end time SLURM or PBS gives each): a "
            f"pretraining chunk {margin:g} min (pretrain.chunk.margin_minutes), its longest save and a step and a "
            f"half before it; a fine-tune {save_margin_s(checkpoint, at_once):.0f} s and a step and a half "
            f"before it ({seeds} of {size_text(checkpoint)} at {SAVE_BYTES_PER_S / 1e6:.0f} MB/s, and "
            f"{STOP_SLACK_S:.0f} s; more where its saves were slower); SLURM's warning signal (profiles/slurm: "
            "USR1 10 minutes before the limit) makes either save sooner; an analysis job holds nothing to save")


def expected_on_each_gpu(sizing: Sizing, jobs: list[estimates.Job]) -> dict[str, tuple[float, str]]:
    """The jobs' expected GPU-hours on each GPU of plan.gpus, {key: (hours, name)}
    (tacl.planning.estimates.format_plan)."""
    return {k: (estimates.expected_gpu_hours(jobs, sizing.gpu, g), g.name)
            for k, g in estimates.gpus_of(sizing.plan).items()}


def disk(sizing: Sizing) -> estimates.Disk:
    """The disk the run holds at its peak (the plan's last line)."""
    return _disk(sizing, sizing.data_summary())


def _disk(sizing: Sizing, data: dict[str, Any] | None) -> estimates.Disk:
    """The disk held at the peak (tacl.planning.estimates.disk_at_peak): the corpus, each run's checkpoints and the
    exported and kept fine-tuned models."""
    config, p = sizing.config, sizing.config["pretrain"]
    kept = sum(len(task_seeds(config, src)) for src in set(config["finetune"]["start_from"].values()))
    models = len(finetune_models(config))
    return estimates.disk_at_peak(
        sizing.shape,
        data["tokens"] if data else estimates.corpus_tokens(config["data"]["max_lines"], config["data"]["source"]),
        len(trained_objectives(config)),
        p["keep_checkpoints"],
        computes_bf16(p["precision"], config["device"]),
        p["zero_stage"],
        models,
        kept * models,
    )


# -- what a run says before it starts ----------------------------------------------------------------

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
