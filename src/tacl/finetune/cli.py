"""`tacl finetune ...`: prepare (login node), glue, squad, ner: one (model, task, seed) each."""

from __future__ import annotations

import argparse
import json

from tacl.device import DEVICES
from tacl.finetune import PRESETS, TASKS
from tacl.io import with_cache


def register(stages: argparse._SubParsersAction) -> None:
    p = stages.add_parser("finetune", help="GLUE, SQuAD and CoNLL-2003 fine-tunes")
    cmds = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    c = cmds.add_parser("select", help="the setting with the best mean dev score over seeds, of one (model, task)")
    c.add_argument("--task", required=True)
    c.add_argument("--runs", nargs="+", required=True, help="metrics.json of every setting and seed")
    c.add_argument("--out", required=True)
    c.set_defaults(func=_select)

    c = cmds.add_parser("submissions", help="one zip per model: GLUE test files and SQuAD predictions of the "
                                            "selected settings")
    c.add_argument("--selections", nargs="+", required=True, help="the model's finetune/MODEL/TASK/selected.json")
    c.add_argument("--out", required=True)
    c.set_defaults(func=_submissions)

    c = cmds.add_parser("prepare", help="fetch or check a task's data (login node)")
    c.add_argument("--task", required=True, choices=TASKS)
    c.add_argument("--source", required=True, help="the task family's source as JSON")
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
        c.add_argument("--task", required=True, choices=[t for t, family in TASKS.items() if family == name])
        c.add_argument("--seed", type=int, required=True)
        c.add_argument("--source", required=True, help="data source as JSON")
        c.add_argument("--cache-dir", help="Hugging Face datasets cache (a source's own cache_dir wins)")
        c.add_argument("--hparams", default="{}", help="hyperparameters as JSON")
        c.add_argument("--precision", default="auto", choices=["auto", "bf16", "fp32"])
        c.add_argument("--preset", default="standard", choices=sorted(PRESETS),
                       help="reference: the reference's choices (no warmup, no weight decay); standard: 10%% "
                            "warmup, weight decay 0.01 (the config's hparams override either)")
        c.add_argument("--device", default="auto", choices=DEVICES,
                       help="cuda: stop at once unless a GPU is usable (the config's `device`)")
        if name == "glue":
            c.add_argument("--contrastive", choices=["kl", "scl"],
                           help="add a contrastive term on [CLS] (classification tasks; weight and tau in hparams)")
            c.add_argument("--save-model", action="store_true",
                           help="keep the fine-tuned encoder (without its head) in OUT/model, to start other tasks")
        c.add_argument("--out", required=True, help="run directory (metrics.json is written last)")
        c.set_defaults(func=_finetune)


def _prepare(a: argparse.Namespace) -> None:
    from tacl.finetune.data import prepare

    print(json.dumps(prepare(a.task, with_cache(json.loads(a.source), a.cache_dir), a.out)))


def _finetune(a: argparse.Namespace) -> None:
    from pathlib import Path

    from tacl.finetune import GIVEN, finetune_given
    from tacl.io import write_json_atomic

    given = finetune_given(json.loads(a.source), json.loads(a.hparams), a.precision, a.preset)
    write_json_atomic(Path(a.out) / GIVEN, given)
    source, hp = with_cache(given["source"], a.cache_dir), dict(given["hparams"])
    if a.command == "glue":
        from tacl.finetune.sequence import finetune_glue

        model, start_from = a.model, None
        if a.start_selection:
            from tacl.finetune.submissions import selected_run

            model, start_from = selected_run(a.start_selection, with_label=True)
            model = str(model / "model")
        result = finetune_glue(model, a.task, source, hp, a.seed, a.out, a.precision, a.device, a.preset,
                               a.contrastive, start_from, a.save_model)
    elif a.command == "squad":
        from tacl.finetune.data import SQUAD_TASKS
        from tacl.finetune.qa import finetune_squad

        result = finetune_squad(a.model, SQUAD_TASKS[a.task], source, hp, a.seed, a.out, a.precision, a.device,
                                a.preset)
    else:
        from tacl.finetune.ner import finetune_ner

        result = finetune_ner(a.model, source["data_dir"], hp, a.seed, a.out, a.precision, a.device, a.preset)
    print(json.dumps({k: result[k] for k in ("task", "seed", "dev", "wall_s")}))


def _select(a: argparse.Namespace) -> None:
    from tacl.finetune.sweep import select_runs
    from tacl.io import write_json_atomic

    chosen = select_runs(a.task, a.runs)
    write_json_atomic(a.out, chosen)
    print(json.dumps({k: chosen[k] for k in ("task", "setting", "best_seed")}))


def _submissions(a: argparse.Namespace) -> None:
    from tacl.finetune.submissions import package

    print(json.dumps(package(a.selections, a.out)))
