"""What changed between the settings a finished job ran with and the settings it would run with now, in
words: "lr 0.0001 -> 5e-05". Used by the trainer (a run whose result settings changed starts again) and by
the summary the workflow prints before anything runs (tacl.reruns)."""

from __future__ import annotations

from typing import Any

MISSING = object()


def _flat(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, dict) and v:
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def _text(value: Any) -> str:
    if value is MISSING:
        return "(unset)"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_text(v) for v in value) + "]"
    return str(value)


def changed_keys(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """Every key (nested keys dotted) whose value differs, as "key old -> new", sorted by key. Lists and
    tuples compare equal when their items do (JSON turns one into the other)."""
    a, b = _flat(old), _flat(new)

    def norm(v: Any) -> Any:
        return list(v) if isinstance(v, tuple) else v

    return [f"{k} {_text(a.get(k, MISSING))} -> {_text(b.get(k, MISSING))}"
            for k in sorted(set(a) | set(b)) if norm(a.get(k, MISSING)) != norm(b.get(k, MISSING))]
