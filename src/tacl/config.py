"""Config validation with one readable line per problem, naming the key (the Snakefile calls this
before Snakemake's own `validate`, which then fills in the defaults)."""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any

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
