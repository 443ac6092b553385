"""Config validation with one readable line per problem, naming the key. The Snakefile calls
`config_errors` (the schema) before Snakemake's own `validate`, which then fills in the defaults, and
`plan_errors` (what the keys say together: batch arithmetic, the start model's depth and positions, chunk
times) after it, so that both kinds stop the workflow before anything runs, dry runs included."""

from __future__ import annotations

import difflib
import json
from pathlib import Path
from typing import Any, Callable

import yaml


def load_schema(path: str | Path) -> dict[str, Any]:
    return yaml.safe_load(Path(path).read_text())


def config_errors(config: dict[str, Any], schema: dict[str, Any]) -> list[str]:
    """Problems in `config`, e.g. `data.num_shard: unknown key (did you mean 'num_shards'?)`."""
    import jsonschema

    validator = jsonschema.Draft202012Validator(schema)
    problems = []
    for error in validator.iter_errors(config):
        where = ".".join(str(p) for p in error.absolute_path)
        if error.validator == "additionalProperties":
            allowed = list(error.schema.get("properties", {}))
            for key in sorted(set(error.instance) - set(allowed)):
                name = f"{where}.{key}" if where else key
                close = difflib.get_close_matches(key, allowed, n=1)
                hint = f" (did you mean {close[0]!r}?)" if close else f" (known keys: {', '.join(allowed)})"
                problems.append(f"{name}: unknown key{hint}")
        else:
            problems.append(f"{where or '(top level)'}: {error.message}")
    return sorted(problems)


# Objectives whose negatives come from the other sequences of a micro-batch.
NEEDS_TWO_SEQUENCES = ("taco", "coco_lm", "tacl_batch")


def packing_error(objective: str, params: dict[str, Any]) -> str | None:
    """Why this objective cannot train on packed batches (one line naming the keys), or None."""
    if objective == "tacl" and params.get("negatives", "real") == "all":
        return ("pretrain.packing: tacl with pretrain.tacl.negatives 'all' counts padding as negatives, and packed "
                "batches have none; use negatives 'real' or packing false")
    return None


def start_model_shape(config: dict[str, Any]) -> dict[str, Any] | None:
    """Depth and positions of the start model where they are known without a download: `model_init` (kind
    random), or the config.json of a local model directory or a package's model; None for a Hub name that
    is not in the local cache yet. `key` names where they come from, for messages."""
    init = config.get("model_init") or {}
    if init.get("kind", "pretrained") == "random":
        return {"layers": init["layers"], "positions": init.get("max_position", 512), "key": "model_init"}
    from tacl.hub import resolve_pretrained
    from tacl.io import InputError

    try:
        path = Path(resolve_pretrained(config["model"])) / "config.json"
    except InputError:
        return None  # (init_model names the problem with the model itself)
    if not path.is_file():
        try:
            from huggingface_hub import try_to_load_from_cache

            cached = try_to_load_from_cache(config["model"], "config.json")
        except Exception:  # noqa: BLE001 (not a Hub name, no cache: unknown, checked later by the jobs)
            return None
        if not isinstance(cached, str):
            return None
        path = Path(cached)
    model = json.loads(path.read_text())
    return {"layers": model.get("num_hidden_layers"), "positions": model.get("max_position_embeddings"),
            "key": f"model ({config['model']})"}


def plan_errors(config: dict[str, Any], schema: dict[str, Any]) -> list[str]:
    """What is wrong in a schema-valid config (defaults filled in) that needs no data to find: one line per
    problem, naming the key. The Snakefile raises these before anything runs (dry runs included); the jobs
    keep their own checks as a second line."""
    problems = finetune_errors(config, schema)
    p = config["pretrain"]
    trained = [o for o in p["objectives"] if o != "none"]
    if trained:
        ranks = p["nodes"] * p["ranks_per_node"]
        if p["global_batch"] % (p["micro_batch"] * ranks):
            problems.append(
                f"pretrain.global_batch: {p['global_batch']} must be pretrain.micro_batch ({p['micro_batch']}) x "
                f"accumulation steps x {ranks} rank(s) (pretrain.nodes x pretrain.ranks_per_node), i.e. a "
                f"multiple of {p['micro_batch'] * ranks}")
        needs_two = [o for o in trained if o in NEEDS_TWO_SEQUENCES]
        if needs_two and p["micro_batch"] < 2:
            problems.append(f"pretrain.micro_batch: {p['micro_batch']}, but {', '.join(needs_two)} take negatives "
                            "from the other sequences of a micro-batch: 2 or more")
        if p.get("packing"):
            from tacl.pretrain.settings import PARAMS_SECTION

            problems += [why for o in trained if (why := packing_error(o, p.get(PARAMS_SECTION.get(o, o), {})))]
        chunk = p["chunk"]
        if chunk["margin_minutes"] >= chunk["runtime_minutes"]:
            problems.append(f"pretrain.chunk.margin_minutes: {chunk['margin_minutes']} leaves no time to train in "
                            f"a chunk of pretrain.chunk.runtime_minutes={chunk['runtime_minutes']}")
    shape = start_model_shape(config)
    if shape is None:
        return problems
    aux = p.get("coco_lm", {}).get("aux_layers")
    if "coco_lm" in trained and aux is not None and shape["layers"] and aux > shape["layers"]:
        problems.append(f"pretrain.coco_lm.aux_layers: {aux} layers for the auxiliary model, but the start model "
                        f"has {shape['layers']} ({shape['key']})")
    positions = shape["positions"]
    lengths = [("data.max_len", config["data"]["max_len"]),
               ("analysis.similarity_max_len", config["analysis"]["similarity_max_len"])]
    hparams = config["finetune"]["hparams"]
    lengths += [(f"finetune.hparams.{family}.max_len", hparams[family]["max_len"])
                for family in ("glue", "squad", "ner") if "max_len" in hparams.get(family, {})]
    lengths += [(f"finetune.hparams.tasks.{task}.max_len", hp["max_len"])
                for task, hp in hparams.get("tasks", {}).items() if "max_len" in hp]
    if positions:
        problems += [f"{key}: {value} tokens, but the start model has {positions} positions ({shape['key']})"
                     for key, value in lengths if value > positions]
    return problems


def checked_config(config: dict[str, Any], schema: dict[str, Any], fill_defaults: Callable[[dict], Any]
                   ) -> list[str]:
    """Every problem of a config, for the Snakefile: the schema's (`config_errors`), else, with the defaults
    filled in by `fill_defaults` (Snakemake's `validate`), what the keys say together (`plan_errors`)."""
    problems = config_errors(config, schema)
    if problems:
        return problems
    fill_defaults(config)
    return plan_errors(config, schema)


def finetune_errors(config: dict[str, Any], schema: dict[str, Any]) -> list[str]:
    """The fine-tuning plan: sweeps, intermediate-task starts and extra models name tasks and models that
    exist."""
    ft = config["finetune"]
    tasks = ft["tasks"]
    problems = []
    for target, source in ft["start_from"].items():
        key = f"finetune.start_from.{target}"
        if target not in tasks:
            problems.append(f"{key}: {target} is not among finetune.tasks")
        if source not in tasks:
            problems.append(f"{key}: {source} is not among finetune.tasks, so there is no fine-tune to start from")
        elif source == target or source in ft["start_from"]:
            problems.append(f"{key}: {source} must be a task that starts from the pretrained model itself")
    problems += [f"finetune.sweep.tasks.{task}: {task} is not among finetune.tasks"
                 for task in ft["sweep"].get("tasks") or {} if task not in tasks]
    objectives = schema["properties"]["pretrain"]["properties"]["objectives"]["items"]["enum"]
    problems += [f"finetune.extra_models.{name}: {name} is an objective's name; give the model another"
                 for name in ft["extra_models"] if name in objectives]
    hparams = ft["hparams"]
    given = [(f"finetune.hparams.{family}", hparams.get(family) or {}) for family in ("glue", "squad", "ner")]
    given += [(f"finetune.hparams.tasks.{task}", hp or {}) for task, hp in (hparams.get("tasks") or {}).items()]
    problems += [f"{key}.group_by_length: {hp['group_by_length']!r} is not true or false" for key, hp in given
                 if not isinstance(hp.get("group_by_length", True), bool)]
    return problems
