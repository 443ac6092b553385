"""The documentation as a user meets it: the configuration reference equals the schema, every link and path
it names exists, nothing points outside the repository, one spelling of the profile commands, every message
troubleshooting.md quotes is one the code prints, and the quick start's offline commands run."""

from __future__ import annotations

import re
import subprocess
import sys

import yaml

from conftest import REPO, demo_config
from tacl.experiment.config import generated_reference, load_schema, reference_markdown

DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
TOP = ("src", "workflow", "profiles", "envs", "benchmarks", "tests", "examples", "docs", ".ci")


def slug(heading: str) -> str:
    """GitHub's anchor of a Markdown heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(path) -> set[str]:
    return {slug(m.group(1)) for m in re.finditer(r"^#+ (.*)$", path.read_text(), re.M)}


def test_the_configuration_reference_is_the_schema():
    schema = load_schema(REPO / "workflow/schemas/config.schema.yaml")
    text = reference_markdown(schema)
    doc = (REPO / "docs/configuration.md").read_text()
    assert generated_reference(doc) == text, "run: tacl config reference --write docs/configuration.md"
    keys = set(re.findall(r"^\| `([\w.]+)` \|", text, re.M))

    def leaves(spec, prefix=""):
        for name, sub in spec.get("properties", {}).items():
            yield from leaves(sub, f"{prefix}{name}.") if "properties" in sub else [f"{prefix}{name}"]

    assert keys == set(leaves(schema)) and len(keys) > 100
    assert "| `pretrain.lr` | number | `0.0001` | result |" in text


def test_every_link_and_path_named_exists():
    missing = []
    for doc in DOCS:
        text = doc.read_text()
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if target.startswith(("http://", "https://")):
                continue
            file, _, anchor = target.partition("#")
            path = (doc.parent / file).resolve() if file else doc
            if not path.exists():
                missing.append(f"{doc.name}: link {target}")
            elif anchor and anchor not in anchors(path):
                missing.append(f"{doc.name}: anchor {target}")
        for name in re.findall(r"`((?:%s)/[\w./-]*[\w/])[^`]*`" % "|".join(re.escape(t) for t in TOP), text):
            if not any(ch in name for ch in "<*{") and not (REPO / name).exists():
                missing.append(f"{doc.name}: path {name}")
    assert missing == []
    assert len(DOCS) >= 8 and (REPO / "LICENSE").is_file() and (REPO / "CITATION.cff").is_file()


def test_nothing_points_outside_the_repository_and_one_profile_spelling():
    files = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout.split()
    outside = []
    for name in files:
        if name.startswith(("tests/", "benchmarks/")) or not (REPO / name).is_file():
            continue
        try:
            text = (REPO / name).read_text()
        except UnicodeDecodeError:
            continue
        if "DESIGN.md" in text or ("../shared" in text and name != "docs/development.md"):
            outside.append(name)
    assert outside == []
    profiles = sorted((REPO / "profiles").glob("*/config.yaml"))
    files = [*DOCS, REPO / "config.yaml", REPO / "workflow/Snakefile", *profiles]
    spelled = [f"{p.relative_to(REPO)}: {m.group(0)}" for p in files
               for m in re.finditer(r"--profile (?!profiles/)\w+", p.read_text())]
    assert spelled == []


def test_every_message_troubleshooting_quotes_is_one_the_code_prints():
    code = "\n".join(p.read_text() for d in ("src", "workflow") for p in (REPO / d).rglob("*")
                     if p.is_file() and p.suffix in (".py", ".smk", "") and "__pycache__" not in p.parts)
    doc = (REPO / "docs/troubleshooting.md").read_text()
    first_cells = re.findall(r"^\| (.+?) \| .+ \| .+ \|$", doc, re.M)
    quoted = [q for cell in first_cells for q in re.findall(r"`([^`]+)`", cell)]
    assert len(quoted) >= 20
    for q in quoted:
        for part in q.split(" ... "):
            assert part in code, f"troubleshooting.md quotes {part!r}, which nothing in src/ or workflow/ prints"


def test_the_quick_start_runs_offline(tmp_path):
    """The README's cluster quick start, in the order a user runs it; its commands that need no cluster run
    here with the demo's config standing in for config.yaml and profiles/local for the cluster's."""
    readme = (REPO / "README.md").read_text()
    quick = readme[readme.index("## On a cluster, step by step"):readme.index("## What a paper-scale run costs")]
    commands = [line.strip().split("  #")[0].strip() for line in quick.splitlines() if line.startswith("       ")]
    order = ["pip install", "export TACL_SLURM_ACCOUNT", "tacl plan", "snakemake --profile profiles/slurm -n",
             "snakemake --profile profiles/slurm", "tacl status", "tacl report"]
    where = [next(i for i, c in enumerate(commands) if step in c) for step in order]
    assert where == sorted(where), commands
    for step in ("tacl doctor --device cuda", "--unlock", "export HF_HOME="):
        assert step in quick

    doctor = subprocess.run([sys.executable, "-m", "tacl", "doctor"], capture_output=True, text=True, timeout=120)
    assert doctor.returncode == 0 and "ok: " in doctor.stdout
    plan = next(c for c in commands if c.startswith("tacl plan")).split()
    assert plan[1:] == ["plan", "--profile", "profiles/slurm"]
    config = tmp_path / "demo.yaml"
    config.write_text(yaml.safe_dump(demo_config(tmp_path)))
    proc = subprocess.run([sys.executable, "-m", "tacl", "plan", "--profile", str(REPO / "profiles/local"),
                           "--directory", str(tmp_path), "--snakefile", str(REPO / "workflow/Snakefile"),
                           "--configfile", str(config), "--replace-workflow-config"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout + proc.stderr
    assert "Plan of this run" in out and "longest chain:" in out and "disk at the peak: 0.4 GB" in out  # (5 demo runs)
    assert not (tmp_path / "results").exists(), "a plan writes nothing"


def test_one_html_report_where_the_readme_and_the_makefile_say(tmp_path):
    """The demo makes one HTML page, the report rule's (a dry run of the demo lists one .html output among
    every job's), and `make demo` and the README point at it; `make demo` asks Snakemake for no page of its
    own beside it, and no document names another."""
    from conftest import run_snakemake
    from tacl.runtime.layout import Layout

    page = f"{Layout.of(yaml.safe_load((REPO / 'examples/demo/config.yaml').read_text())).report}/report.html"
    make = (REPO / "Makefile").read_text()
    recipe = make[make.index("\ndemo:"):].split("\n\n")[0]
    assert page == "results/demo/report/report.html" and page in recipe and "--report" not in recipe
    assert page in (REPO / "README.md").read_text()
    assert not [doc.name for doc in DOCS if "results/demo/report.html" in doc.read_text()]
    listed = run_snakemake(tmp_path, demo_config(tmp_path), "-n").stdout
    outputs = [o for m in re.finditer(r"^    output: (.*)$", listed, re.M) for o in m.group(1).split(", ")]
    assert [o for o in outputs if o.endswith(".html")] == [f"{tmp_path}/results/report/report.html"]


def test_every_figure_the_documents_quote_comes_from_its_one_place():
    """Each generated block of README.md and docs/ holds what tacl.planning.figures makes of its one source:
    config.yaml's plan (jobs, GPU-hours asked and expected, disk) and the GPUs' rates it assumes, the demo's
    time measured on a stated machine (docs/figures.yaml). The demo's GLUE table (from a finished demo, which
    CI does not run) has the rows of the demo's models and the chance row. `tacl figures --write` rewrites
    them; README.md and docs/clusters.md quote the same plan."""
    from snakemake.utils import validate

    from tacl.experiment import design
    from tacl.planning.figures import BLOCK, rendered

    figures = rendered()
    found: dict[str, list[str]] = {}
    for doc in DOCS:
        for name, text in BLOCK.findall(doc.read_text()):
            found.setdefault(name, []).append(doc.name)
            if name != "demo-glue":
                assert text == figures[name], f"{doc.name}: block {name} differs: run tacl figures --write"
    assert found == {"demo-glue": ["README.md"], "demo-time": ["README.md", "development.md"],
                     "paper-plan": ["README.md", "clusters.md"], "paper-rates": ["README.md", "clusters.md"]}
    assert "GPU-hours asked for against" in figures["paper-plan"] and "minutes on 2 CPU cores" in figures["demo-time"]
    demo = yaml.safe_load((REPO / "examples/demo/config.yaml").read_text())
    validate(demo, str(REPO / "workflow/schemas/config.schema.yaml"), set_default=True)
    (table,) = [text for name, text in BLOCK.findall((REPO / "README.md").read_text()) if name == "demo-glue"]
    rows = [line.split("|")[1].strip() for line in table.strip().splitlines()[2:]]
    assert rows == design.tabled_models(demo) + ["majority class / constant"]
