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


def test_all_environment_files_agree():
    cpu = pins((ENVS / "requirements-cpu.txt").read_text().splitlines())
    cuda = pins((ENVS / "requirements-cuda.txt").read_text().splitlines())
    test_only = {"pytest", "pytest-xdist"}
    assert {k: v for k, v in cpu.items() if k not in test_only} == cuda
    # the conda environments run jobs; Snakemake itself runs outside them
    runtime = {k: v for k, v in cuda.items() if not k.startswith("snakemake") and k != "jsonschema"}
    for name in ("tacl-cuda.yaml", "tacl-cpu.yaml"):
        assert conda_pins(ENVS / name) == runtime, name
