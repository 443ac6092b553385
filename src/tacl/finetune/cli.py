"""`tacl finetune ...`: prepare (login node), glue, squad, ner: one (model, task, seed) each."""

from __future__ import annotations

import argparse
import json

from tacl.device import DEVICES
from tacl.finetune import PRESETS


def register(stages: argparse._SubParsersAction) -> None:
    p = stages.add_parser("finetune", help="GLUE, SQuAD and CoNLL-2003 fine-tunes")
    cmds = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    c = cmds.add_parser("prepare", help="fetch or check a task's data (login node)")
    c.add_argument("--task", required=True)
    c.add_argument("--source", required=True, help="the task family's source as JSON")
    c.add_argument("--out", required=True)
    c.set_defaults(func=_prepare, online=True)

    for name, help_ in (("glue", "one GLUE task"), ("squad", "SQuAD v1.1 (squad_v1) or v2.0 (squad_v2)"),
                        ("ner", "CoNLL-2003 NER")):
        c = cmds.add_parser(name, help=help_)
        c.add_argument("--model", required=True, help="a Hugging Face BERT directory")
        c.add_argument("--task", required=True)
        c.add_argument("--seed", type=int, required=True)
        c.add_argument("--source", required=True, help="data source as JSON")
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
        c.add_argument("--out", required=True, help="run directory (metrics.json is written last)")
        c.set_defaults(func=_finetune)


def _prepare(a: argparse.Namespace) -> None:
    from tacl.finetune.data import prepare

    print(json.dumps(prepare(a.task, json.loads(a.source), a.out)))


def _finetune(a: argparse.Namespace) -> None:
    source, hp = json.loads(a.source), json.loads(a.hparams)
    if a.command == "glue":
        from tacl.finetune.sequence import finetune_glue

        result = finetune_glue(a.model, a.task, source, hp, a.seed, a.out, a.precision, a.device, a.preset,
                               a.contrastive)
    elif a.command == "squad":
        from tacl.finetune.data import SQUAD_TASKS
        from tacl.finetune.qa import finetune_squad
        from tacl.io import InputError

        if a.task not in SQUAD_TASKS:
            raise InputError(f"finetune squad: task {a.task!r} is not one of {sorted(SQUAD_TASKS)}")
        result = finetune_squad(a.model, SQUAD_TASKS[a.task], source, hp, a.seed, a.out, a.precision, a.device,
                                a.preset)
    else:
        from tacl.finetune.ner import finetune_ner

        result = finetune_ner(a.model, source["data_dir"], hp, a.seed, a.out, a.precision, a.device, a.preset)
    print(json.dumps({k: result[k] for k in ("task", "seed", "dev", "wall_s")}))
