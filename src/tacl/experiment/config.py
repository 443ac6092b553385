"""Config validation with one readable line per problem, naming the key. The Snakefile calls
`config_errors` (the schema) before Snakemake's own `validate`, which then fills in the defaults, and
`plan_errors` (what the keys say together: batch arithmetic, the start model's depth and positions, chunk
times) after it, so that both kinds stop the workflow before anything runs, dry runs included."""

from __future__ import annotations

import copy
import difflib
import functools
import json
from pathlib import Path
from typing import Any, Callable

import yaml

from tacl.data.headings import stop_rule
from tacl.objectives.registry import MODELS, family_error, group_error, objective_params, packing_error
from tacl.pretrain.settings import CHUNK_OPERATIONAL_KEYS, OPERATIONAL_KEYS, ZERO3_COMPILE
from tacl.runtime.io import InputError
from tacl.runtime.tracking import config_errors as tracking_errors

# The config keys that decide no result, only where and how a job runs (the schema marks each key with its
# `x-role`, result or operational; tests/test_reruns.py keeps the two equal). Changing one reruns nothing:
# the workflow hands them to jobs outside the parameters Snakemake compares. The trainer's own are in
# tacl.pretrain.settings; the rest lay jobs out (ranks, nodes, chunk times) or name places.
OPERATIONAL_CONFIG_KEYS = tuple(sorted(
    {"results_dir", "resources_dir", "conda_env", "device", "gpus", "data.clean_workers",
     "finetune.runtime_minutes", "finetune.compile", "finetune.shapes",
     "finetune.checkpoint_minutes", "finetune.seeds_per_gpu",
     "pretrain.remove_checkpoints", "plan.gpu", "plan.gpus", "plan.safety", "plan.startup_minutes",
     "plan.min_runtime_minutes", "tracking.trackers", "tracking.wandb.project", "tracking.wandb.entity",
     "tracking.wandb.mode", "tracking.mlflow.uri", "tracking.mlflow.experiment"}
    | {f"pretrain.{k}" for k in OPERATIONAL_KEYS if k != "device"}
    | {f"pretrain.{k}" for k in CHUNK_OPERATIONAL_KEYS if k != "chunk"}
    | {f"pretrain.chunk.{k}" for k in ("runtime_minutes", "margin_minutes", "max_chunks", "max_steps")}))


def schema_roles(schema: dict[str, Any], prefix: str = "") -> dict[str, str]:
    """{dotted key: its `x-role`} of every key the schema defines that holds no keys of its own."""
    roles = {}
    for name, spec in schema.get("properties", {}).items():
        key = f"{prefix}{name}"
        if "properties" in spec:
            roles.update(schema_roles(spec, f"{key}."))
        else:
            roles[key] = spec.get("x-role", "(none)")
    return roles


def _lookup(config: dict[str, Any], key: str) -> tuple[bool, Any]:
    for part in key.split("."):
        if not isinstance(config, dict) or part not in config:
            return False, None
        config = config[part]
    return True, config


def unset_keys(config: dict[str, Any], schema: dict[str, Any]) -> list[str]:
    """The schema's keys (those holding no keys of their own) that `config` does not set: before Snakemake's
    `validate` fills them in, the keys whose values will be the schema's defaults."""
    return [key for key in schema_roles(schema) if not _lookup(config, key)[0]]


def defaults_unlike(unset: list[str], config: dict[str, Any], reference: dict[str, Any]) -> list[str]:
    """Of the keys no config file set (`unset_keys`), those whose default differs from `reference`'s value
    (config.yaml, the paper's experiment): `key default (config.yaml: value)`. A file given with
    `--replace-workflow-config` loses config.yaml's values; these are the ones that then change."""
    lines = []
    for key in unset:
        present, wanted = _lookup(reference, key)
        value = _lookup(config, key)[1]
        if present and value != wanted:
            lines.append(f"{key} {json.dumps(value)} (config.yaml: {json.dumps(wanted)})")
    return lines


def yaml_error(path: str | Path) -> str | None:
    """A config file that does not read as YAML, in one line naming the file and the line (Snakemake's own
    message names neither); None for a file that reads, or that is not there (Snakemake names that)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError:
        return None
    try:
        yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark, opened = getattr(e, "problem_mark", None), getattr(e, "context_mark", None)
        where = f", line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        what = " ".join(str(getattr(e, "problem", None) or e).split())
        context = getattr(e, "context", None) or ""
        if context and opened is not None and (mark is None or opened.line != mark.line):
            context += f" from line {opened.line + 1}"
        return f"{path}{where}: not valid YAML: {what}" + (f" ({context})" if context else "")
    return None


def working_directory_error(cwd: str | Path, repo: str | Path, chosen: bool) -> str | None:
    """Where a run started, in one line, when it is not where the config's relative paths (config.yaml,
    `results_dir`, the demo's data) are meant from: the repository root. None there, or where the working
    directory was chosen on purpose (`chosen`: Snakemake's --directory, whose relative paths then start
    there)."""
    here, root = Path(cwd).resolve(), Path(repo).resolve()
    if chosen or here == root:
        return None
    return (f"run the workflow from the repository root: cd {root} (it started in {here}, where config.yaml and "
            "the config's relative paths such as results_dir would not be found or would land; --directory DIR "
            "runs it in another folder on purpose)")


# the workflow's schema, in the checkout this package is imported from
SCHEMA = Path(__file__).resolve().parents[3] / "workflow" / "schemas" / "config.schema.yaml"


@functools.lru_cache(maxsize=8)
def _parsed_schema(path: str, mtime_ns: int, size: int) -> dict[str, Any]:
    # libyaml's parser where PyYAML has it (the same document, several times faster), else PyYAML's own
    return yaml.load(Path(path).read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))


def load_schema(path: str | Path) -> dict[str, Any]:
    """The schema at `path`, parsed once per version of the file (its path, modification time and size): a
    process that checks many configs (the tests) reads it once. Each call returns a copy of its own, which
    the caller may change."""
    path = Path(path).resolve()
    stat = path.stat()
    return copy.deepcopy(_parsed_schema(str(path), stat.st_mtime_ns, stat.st_size))


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


def start_model_shape(config: dict[str, Any]) -> dict[str, Any] | None:
    """Depth, positions, sizes and family of the start model where they are known without a download:
    `model_init` (kind random: its sizes, and `model_init.family`), the config.json of a local model
    directory, a package's model or the Hub's local cache, or the sizes a Hub model's published config.json
    gives (tacl.runtime.shape.PUBLISHED_CONFIGS); None for another Hub name that is not in the local cache
    yet. `config` holds the config.json keys (tacl.runtime.shape.Shape.of_config reads them); `key` names
    where they come from, for messages."""
    init = config.get("model_init") or {}
    if init.get("kind", "pretrained") == "random":
        family = init.get("family", "bert")
        model = {"model_type": family, "num_hidden_layers": init["layers"], "hidden_size": init.get("hidden"),
                 "intermediate_size": init.get("intermediate"), "max_position_embeddings": init.get("max_position",
                                                                                                    512)}
        # (a random RoBERTa or XLM-R gets max_position positions for tokens, its position table pad + 1 more:
        # tacl.pretrain.model)
        return {**_described(model, "model_init"), "positions": model["max_position_embeddings"]}
    from tacl.runtime.hub import resolve_pretrained
    from tacl.runtime.shape import PUBLISHED_CONFIGS

    try:
        path = Path(resolve_pretrained(config["model"])) / "config.json"
    except InputError:
        return None  # (init_model names the problem with the model itself)
    if not path.is_file():
        try:
            from huggingface_hub import try_to_load_from_cache

            cached = try_to_load_from_cache(config["model"], "config.json")
        except Exception:  # noqa: BLE001 (not a Hub name, no cache: unknown, checked later by the jobs)
            cached = None
        if not isinstance(cached, str):
            published = PUBLISHED_CONFIGS.get(config["model"])
            if published is None:
                return None
            return _described(published, f"model ({config['model']}): from {config['model']}'s published config.json")
        path = Path(cached)
    return _described(json.loads(path.read_text()), f"model ({config['model']})")


def _described(model: dict[str, Any], key: str) -> dict[str, Any]:
    """start_model_shape's answer for a model's config.json keys: the positions a sequence may use (RoBERTa's
    and XLM-R's first pad_token_id + 1 position ids are never given to a token)."""
    family = model.get("model_type")
    positions = model.get("max_position_embeddings")
    if positions and family in ("roberta", "xlm-roberta"):
        positions -= model.get("pad_token_id", 1) + 1
    return {"layers": model.get("num_hidden_layers"), "positions": positions, "hidden": model.get("hidden_size"),
            "intermediate": model.get("intermediate_size"), "vocab": model.get("vocab_size"), "family": family,
            "config": model, "key": key}


def plan_errors(config: dict[str, Any], schema: dict[str, Any]) -> list[str]:
    """What is wrong in a schema-valid config (defaults filled in) that needs no data to find: one line per
    problem, naming the key. The Snakefile raises these before anything runs (dry runs included); the jobs
    keep their own checks as a second line."""
    problems = finetune_errors(config, schema) + tracking_errors(config.get("tracking") or {})
    try:
        stop_rule(config["data"].get("language", "en"), config["data"].get("stop_headings"))
    except InputError as e:
        problems.append(str(e))
    gpus = config["plan"]["gpus"]
    if config["plan"]["gpu"] not in gpus:  # (the runtimes are sized for it: tacl.planning.sizing looks its figures up)
        problems.append(f"plan.gpu: {config['plan']['gpu']!r} is not in plan.gpus ({', '.join(gpus) or 'none'}); "
                        "name one of them, or add its figures under plan.gpus")
    p = config["pretrain"]
    trained = [o for o in p["objectives"] if o != "none"]
    if trained:
        ranks = p["nodes"] * p["ranks_per_node"]
        micro = p["micro_batch"]
        if micro == "auto" and p["global_batch"] % ranks:
            problems.append(f"pretrain.global_batch: {p['global_batch']} must be a multiple of the {ranks} rank(s) "
                            "(pretrain.nodes x pretrain.ranks_per_node)")
        elif micro != "auto" and p["global_batch"] % (micro * ranks):
            problems.append(
                f"pretrain.global_batch: {p['global_batch']} must be pretrain.micro_batch ({micro}) x "
                f"accumulation steps x {ranks} rank(s) (pretrain.nodes x pretrain.ranks_per_node), i.e. a "
                f"multiple of {micro * ranks}")
        elif why := group_error(trained, p.get("negatives_group"), micro, p["global_batch"] // ranks):
            problems.append(why)
        if p.get("packing"):
            problems += [why for o in trained if (why := packing_error(o, objective_params(p, o)))]
        if p.get("compile") is True and p.get("zero_stage") == 3:
            problems.append(ZERO3_COMPILE)
        chunk = p["chunk"]
        if chunk["margin_minutes"] >= chunk["runtime_minutes"]:
            problems.append(f"pretrain.chunk.margin_minutes: {chunk['margin_minutes']} leaves no time to train in "
                            f"a chunk of pretrain.chunk.runtime_minutes={chunk['runtime_minutes']}")
    shape = start_model_shape(config)
    if shape is None:
        return problems
    problems += family_errors(config, shape)
    aux = p.get("coco_lm", {}).get("aux_layers")
    if "coco_lm" in trained and aux is not None and shape["layers"] and aux > shape["layers"]:
        problems.append(f"pretrain.coco_lm.aux_layers: {aux} layers for the auxiliary model, but the start model "
                        f"has {shape['layers']} ({shape['key']})")
    layer = p.get("tacl_attn", {}).get("layer", -1)
    if "tacl_attn" in trained and shape["layers"] and not 0 < abs(layer) <= shape["layers"]:
        problems.append(f"pretrain.tacl_attn.layer: {layer}, but the start model has {shape['layers']} layers "
                        f"({shape['key']}: 1..{shape['layers']}, or -1 for the last)")
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


def family_errors(config: dict[str, Any], shape: dict[str, Any]) -> list[str]:
    """The objectives against the start model's family (`start_model_shape`'s): a family tacl does not know is
    named; each trained objective's refusal for the family (tacl.objectives.registry.family_error: `mlm_nsp`
    and TACO's NSP without an NSP head, tacl_attn without attention probabilities, packing without attention
    that reads packed batches); `mlm_nsp` among the models to fine-tune of a family without NSP, whose control
    is `mlm`. (`mlm` with a BERT start model is allowed: masked LM alone, without NSP.)"""
    from tacl.runtime.family import family

    if shape.get("family") is None:
        return []
    key = "model_init.family" if shape["key"] == "model_init" else "model"
    try:
        found = family(shape["family"], key)
    except InputError as e:
        return [f"{e} ({shape['key']})"]
    p = config["pretrain"]
    problems = [why for o in p["objectives"] if o not in ("none", "mlm_nsp")  # (mlm_nsp: below, with its source)
                if (why := family_error(o, objective_params(p, o), found, bool(p.get("packing"))))]
    if found.nsp:
        return problems
    ft = config["finetune"]
    named = [("pretrain.objectives", p["objectives"]), ("finetune.models", ft.get("models")),
             ("finetune.contrastive.models", (ft.get("contrastive") or {}).get("models"))]
    return problems + [f"{where}: mlm_nsp trains next sentence prediction, but the start model is of the {found.name} "
                       f"family, pretrained without it ({shape['key']}); its control is mlm (masked LM alone): put "
                       "mlm in place of mlm_nsp" for where, names in named if "mlm_nsp" in (names or [])]


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    return {int: "integer", float: "number", str: "string", list: "array", dict: "object"}.get(type(value), "")


def _types(spec: dict[str, Any]) -> set[str]:
    """The JSON types a schema node takes (its `type`, its alternatives', its constants'); "number" takes an
    integer too."""
    kinds = spec.get("type") or []
    found = {kinds} if isinstance(kinds, str) else set(kinds)
    for alternative in spec.get("oneOf", []) + spec.get("anyOf", []):
        found |= _types(alternative)
    found |= {_json_type(v) for v in spec.get("enum", []) + ([spec["const"]] if "const" in spec else [])}
    return found | ({"integer"} if "number" in found else set())


def _spec_at(schema: dict[str, Any], path: list[Any]) -> dict[str, Any] | None:
    """The schema node of a key (dotted into `path`, list positions as ints): {} inside an object the schema
    leaves free (finetune.hparams.tasks), None for a key the schema does not allow."""
    spec = schema
    for part in path:
        nodes = [spec] + spec.get("oneOf", []) + spec.get("anyOf", [])
        if isinstance(part, int):
            found = [n["items"] for n in nodes if isinstance(n.get("items"), dict)]
        else:
            found = [n["properties"][part] for n in nodes if part in n.get("properties", {})]
            found += [n["additionalProperties"] for n in nodes if isinstance(n.get("additionalProperties"), dict)]
            if not found and any(n.get("additionalProperties") is False for n in nodes):
                return None
        spec = found[0] if found else {}
    return spec


def _reading(text: str) -> Any:
    """Text as Snakemake reads a top-level `--config` value: an integer, a number, else YAML (true, null)."""
    for number in (int, float):
        try:
            return number(text)
        except ValueError:
            pass
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return text


def _typed(text: str, spec: dict[str, Any]) -> Any:
    """A `--config` text value, read (`_reading`) where the schema takes the reading's type there or says
    nothing of the type; else the text."""
    value, types = _reading(text), _types(spec)
    if not types:
        return value
    return value if _json_type(value) != "string" and _json_type(value) in types else text


def typed_overrides(config: dict[str, Any], given: Any, schema: dict[str, Any]) -> None:
    """`--config` values with their types. Snakemake reads `--config KEY=VALUE` as a number or a boolean where
    it can, but every value inside a nested VALUE (`pretrain={chunk: {max_chunks: 60}}`) stays text, which the
    schema then refuses ("'60' is not of type 'integer'"). The rule: each text value in `given` (the
    `--config` entries) is read the way Snakemake reads a top-level one (an integer, a number such as 1e-3,
    else YAML: true, false, null), and that reading replaces it in `config` where the schema takes the
    reading's type at that key, or says nothing of the type (finetune.hparams.tasks); where the schema wants
    text, text stays (a model named 123)."""
    def walk(value: Any, path: list[Any]) -> None:
        if isinstance(value, dict):
            for key, sub in value.items():
                walk(sub, path + [key])
        elif isinstance(value, list):
            for i, sub in enumerate(value):
                walk(sub, path + [i])
        elif isinstance(value, str) and (spec := _spec_at(schema, path)) is not None:
            typed = _typed(value, spec)
            if typed is not value:
                target = config
                for part in path[:-1]:
                    target = target[part]
                target[path[-1]] = typed

    walk(dict(given), [])


def expand_shorthands(config: dict[str, Any]) -> None:
    """The config's short forms in their full form, before anything reads it: `tracking: [mlflow, ...]` is
    `tracking: {trackers: [mlflow, ...]}`."""
    if isinstance(config.get("tracking"), list):
        config["tracking"] = {"trackers": config["tracking"]}


def checked_config(config: dict[str, Any], schema: dict[str, Any], fill_defaults: Callable[[dict], Any]
                   ) -> list[str]:
    """Every problem of a config, for the Snakefile: the schema's (`config_errors`), else, with the defaults
    filled in by `fill_defaults` (Snakemake's `validate`), what the keys say together (`plan_errors`)."""
    expand_shorthands(config)
    problems = config_errors(config, schema)
    if problems:
        return problems
    fill_defaults(config)
    return plan_errors(config, schema)


def finetune_errors(config: dict[str, Any], schema: dict[str, Any]) -> list[str]:
    """The fine-tuning plan: sweeps, intermediate-task starts and extra models name tasks and models that
    exist."""
    from tacl.finetune import TASKS, declared

    ft = config["finetune"]
    tasks = ft["tasks"]
    decls = ft["declared_tasks"]
    problems = [f"finetune.tasks: {task} is neither a built-in task ({', '.join(TASKS)}) nor declared under "
                f"{declared.KEY}" for task in tasks if task not in TASKS and task not in decls]
    for name, decl in decls.items():
        problems += declared.errors(name, decl, TASKS)
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
    problems += [f"finetune.extra_models.{name}: {name} is an objective's name; give the model another"
                 for name in ft["extra_models"] if name in MODELS]
    hparams = ft["hparams"]
    given = [(f"finetune.hparams.{family}", hparams.get(family) or {}) for family in ("glue", "squad", "ner")]
    given += [(f"finetune.hparams.tasks.{task}", hp or {}) for task, hp in (hparams.get("tasks") or {}).items()]
    problems += [f"{key}.group_by_length: {hp['group_by_length']!r} is not true or false" for key, hp in given
                 if not isinstance(hp.get("group_by_length", True), bool)]
    return problems


REFERENCE_BEGIN = "<!-- generated from workflow/schemas/config.schema.yaml by `tacl config reference`; do not edit -->"
REFERENCE_END = "<!-- end of the generated reference -->"


def _type_text(spec: dict[str, Any]) -> str:
    if "enum" in spec:
        return "one of " + ", ".join(f"`{v}`" for v in spec["enum"])
    if "oneOf" in spec or "anyOf" in spec:
        return " or ".join(_type_text(s) for s in spec.get("oneOf") or spec["anyOf"])
    kinds = spec.get("type", "any")
    return " or ".join(kinds) if isinstance(kinds, list) else kinds


def _cell(text: str) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def reference_markdown(schema: dict[str, Any]) -> str:
    """Every key of the schema, one table per section: its type, default, role (result: it decides what a job
    computes, and a change reruns what it changes; operational: it does not) and description. docs/
    configuration.md holds this text between REFERENCE_BEGIN and REFERENCE_END (a test keeps them equal)."""
    out = [REFERENCE_BEGIN]

    def section(spec: dict[str, Any], prefix: str, title: str) -> None:
        rows, nested = [], []
        for name, sub in spec.get("properties", {}).items():
            key = f"{prefix}{name}"
            if "properties" in sub:
                nested.append((sub, f"{key}.", key))
            else:
                rows.append(f"| `{key}` | {_cell(_type_text(sub))} | `{_cell(json.dumps(sub.get('default')))}` | "
                            f"{sub.get('x-role', '')} | {_cell(sub.get('description', ''))} |")
        if rows:
            out.extend(["", f"### {title}", ""])
            if prefix and spec.get("description"):
                out.extend([_cell(spec["description"]), ""])
            out.extend(["| key | type | default | role | description |", "|---|---|---|---|---|", *rows])
        for sub, sub_prefix, sub_title in nested:
            section(sub, sub_prefix, sub_title)

    section(schema, "", "Top level")
    out.extend(["", REFERENCE_END])
    return "\n".join(out) + "\n"


def generated_reference(document: str) -> str:
    """The generated part of a document (from REFERENCE_BEGIN to REFERENCE_END and its newline)."""
    start, end = document.find(REFERENCE_BEGIN), document.find(REFERENCE_END)
    if start < 0 or end < 0:
        raise InputError(f"no generated reference in it (the lines {REFERENCE_BEGIN!r} ... {REFERENCE_END!r})")
    return document[start:end + len(REFERENCE_END)] + "\n"


def register(commands) -> None:  # noqa: ANN001 (argparse's private subparsers type)
    c = commands.add_parser("config", help="the configuration's reference")
    cmds = c.add_subparsers(dest="command", required=True)
    r = cmds.add_parser("reference", help="every key of the schema as Markdown tables (docs/configuration.md)")
    r.add_argument("--schema", default=str(SCHEMA))
    r.add_argument("--write", metavar="DOC", help="replace the generated part of DOC instead of printing it")
    r.set_defaults(func=_reference)


def _reference(a) -> None:  # noqa: ANN001
    from tacl.runtime.io import write_text_atomic

    text = reference_markdown(load_schema(a.schema))
    if not a.write:
        print(text, end="")
        return
    doc = Path(a.write).read_text()
    write_text_atomic(a.write, doc.replace(generated_reference(doc), text))
