"""The package's floors (docs/development.md, Layout): no import circle between modules, and no import from a
floor up to a higher one, directly or through other modules. Every import of tacl counts, at the top of a
module and inside its functions (an import inside a function only delays the arrow, it does not turn it).

Floors, lowest first: two modules that import nothing from tacl (tacl.runtime.scheduler, the scheduler queries;
tacl.runtime.layout, the results folder's paths), their packages' __init__ importing nothing either; the
runtime (tacl itself and tacl.runtime: only each other); the stages, in their order (data, objectives,
pretrain, finetune, analysis, report: a stage imports its own and lower stages); tacl.experiment (what the
workflow derives from the config); tacl.planning (what a run will cost); the rest of tacl.cluster; tacl.cli
on top. Every module stands on one of them, by its name.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from conftest import REPO

SRC = REPO / "src"
STAGES = ("data", "objectives", "pretrain", "finetune", "analysis", "report")  # lowest first
SCHEDULER, LAYOUT = "tacl.runtime.scheduler", "tacl.runtime.layout"
ALONE = (SCHEDULER, LAYOUT)  # import nothing from tacl, and stand below everything
CLI = ("tacl.cli", "tacl.__main__")
FLOORS = ("alone", "runtime", *STAGES, "experiment", "planning", "cluster", "cli")  # lowest first


def module_name(path: Path) -> str:
    """tacl/finetune/glue.py -> tacl.finetune.glue; a package's __init__.py is the package's own node."""
    parts = path.relative_to(SRC).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted((SRC / "tacl").rglob("*.py"))}


def nearest_module(name: str) -> str | None:
    """The module an imported name lives in: itself, or the closest enclosing module (tacl.runtime.io.read_json ->
    tacl.runtime.io)."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def imported_names(name: str) -> set[str]:
    """Every module of tacl that module `name` imports (`from tacl.x import y`: tacl.x.y where y is a module,
    else tacl.x)."""
    path, found = MODULES[name], set()
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # (relative: from the package, up level - 1)
                base = ".".join([*package.split(".")[: len(package.split(".")) - node.level + 1], base]).strip(".")
            found.update(f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES else base for alias in node.names)
    return {m for n in found if n.split(".")[0] == "tacl" and (m := nearest_module(n)) and m != name}


GRAPH = {name: imported_names(name) for name in MODULES}


def reach(name: str) -> dict[str, list[str]]:
    """Every module `name` imports, directly or through others, with one import path to it."""
    paths, todo = {name: [name]}, [name]
    while todo:
        current = todo.pop()
        for target in sorted(GRAPH[current]):
            if target not in paths:
                paths[target] = paths[current] + [target]
                todo.append(target)
    del paths[name]
    return paths


def floor(name: str) -> str:
    """The floor a module stands on, by its name; "none" for a module outside every floor."""
    parts = name.split(".")
    if name in ALONE:
        return "alone"
    if name in CLI:
        return "cli"
    if len(parts) == 1 or parts[1] == "runtime":
        return "runtime"
    return parts[1] if parts[1] in FLOORS else "none"


def above(level: str) -> set[str]:
    return set(FLOORS[FLOORS.index(level) + 1:])


def cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle of the graph (its modules, the first repeated at the end), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for target in sorted(graph[node]):
            if state.get(target) == 1:
                return stack[stack.index(target):] + [target]
            if target not in state and (found := visit(target)):
                return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_the_graph_is_read():
    """The parse finds what is known to be there: top-level and function-level imports; every module stands
    on a floor."""
    assert len(MODULES) > 80 and "tacl.finetune" in MODULES and "tacl.pretrain.trainer" in MODULES
    assert SCHEDULER in GRAPH["tacl.pretrain.deadline"] and LAYOUT in GRAPH["tacl.report.expected"]
    assert "tacl.finetune.glue" in GRAPH["tacl.analysis.embeddings"]  # (inside a function)
    assert {"tacl.finetune", "tacl.finetune.sweep"} <= GRAPH["tacl.finetune.cli"]  # (the package: its own node)
    assert "tacl.experiment.design" in GRAPH["tacl.cluster.handlers"]  # (`from tacl.experiment import design`)
    assert cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert [m for m in MODULES if floor(m) == "none"] == []


def test_no_import_circles():
    found = cycle(GRAPH)
    assert found is None, "an import circle: " + " -> ".join(found)


def test_the_lowest_floor_imports_nothing_from_tacl():
    """tacl.runtime.scheduler (what a job asks SLURM or PBS) and tacl.runtime.layout (every path under the
    results folder) stand below everything: the run lock, the trainer's deadline, the report's status and
    tacl.cluster ask the first; the report's expected runs, the workflow and `tacl submit` name their files
    from the second. Importing either runs tacl's and tacl.runtime's __init__, which import nothing either."""
    for name in (*ALONE, "tacl", "tacl.runtime"):
        assert GRAPH[name] == set(), f"{name} imports {sorted(GRAPH[name])}"


PACKAGES = ("runtime", *STAGES, "experiment", "planning", "cluster", "cli")  # lowest first


def package(name: str) -> str:
    """The package a module belongs to when the graph is drawn package by package (tacl itself and
    tacl.runtime: runtime; tacl.cli and tacl.__main__: cli)."""
    if name in CLI:
        return "cli"
    parts = name.split(".")
    return "runtime" if len(parts) == 1 else parts[1]


def package_arrows() -> dict[tuple[str, str], list[str]]:
    """The graph drawn by package: each arrow between two packages, with the module imports that draw it."""
    arrows: dict[tuple[str, str], list[str]] = {}
    for name, targets in GRAPH.items():
        for target in sorted(targets):
            if package(name) != package(target):
                arrows.setdefault((package(name), package(target)), []).append(f"{name} -> {target}")
    return arrows


def test_drawn_by_package_no_arrow_runs_up_and_no_circle_closes():
    """Every module's package is one of PACKAGES; every arrow between packages runs down; so no circle of
    packages can close (checked all the same on the package graph)."""
    arrows = package_arrows()
    assert {package(m) for m in MODULES} == set(PACKAGES)
    up = {f"{a} -> {b}": imports for (a, b), imports in arrows.items() if PACKAGES.index(b) > PACKAGES.index(a)}
    assert up == {}, f"arrows that run up: {up}"
    graph = {p: {b for (a, b) in arrows if a == p} for p in PACKAGES}
    assert cycle(graph) is None


@pytest.mark.parametrize("name", sorted(m for m in MODULES if floor(m) == "runtime"))
def test_the_runtime_imports_only_the_runtime(name):
    wrong = {m: path for m, path in reach(name).items() if floor(m) not in ("alone", "runtime")}
    assert not wrong, f"{name} imports {' -> '.join(next(iter(wrong.values())))}"


@pytest.mark.parametrize("stage", STAGES)
def test_a_stage_imports_no_higher_floor(stage):
    """A stage imports its own and lower stages, the runtime and the lowest floor: never a higher stage,
    tacl.experiment (tacl.experiment.config reads the stages' settings: above them), tacl.planning, the rest of
    tacl.cluster or tacl.cli."""
    higher = above(stage)
    names = [m for m in MODULES if floor(m) == stage]
    assert names
    for name in names:
        for target, path in reach(name).items():
            assert floor(target) not in higher, f"{name} imports a higher floor: {' -> '.join(path)}"


@pytest.mark.parametrize("level", ["experiment", "planning", "cluster"])
def test_the_upper_floors_import_nothing_above_them(level):
    names = [m for m in MODULES if floor(m) == level]
    assert names
    for name in names:
        for target, path in reach(name).items():
            assert floor(target) not in above(level), f"{name} imports a higher floor: {' -> '.join(path)}"


def test_only_the_entry_point_imports_the_command_line():
    importers = sorted(m for m, targets in GRAPH.items() if "tacl.cli" in targets)
    assert importers == ["tacl.__main__"]
