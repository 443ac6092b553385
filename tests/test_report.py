"""The report on a fixture results tree: means, sample stds, GLUE average, missing runs, references."""

import json
import re

import pandas as pd
import pytest

from scipy import stats

from tacl.report.compose import build_report
from tacl.report.tables import (HEADLINE, collect, differences_table, glue_average, glue_reference_table, interval,
                                reference_numbers, summarise)


S = "lr2e-5_b32_e3"  # the setting of the fixture's runs


def write_run(root, model, task, seed, family, dev, test=None, preset="reference", setting=S):
    d = root / "finetune" / model / task / setting / f"seed{seed}"
    d.mkdir(parents=True)
    m = {"task": task, "family": family, "seed": seed, "preset": preset, "dev": dev}
    if test:
        m["test"] = test
    (d / "metrics.json").write_text(json.dumps(m))


@pytest.fixture
def tree(tmp_path):
    for seed, acc in enumerate([0.80, 0.84, 0.86]):
        write_run(tmp_path, "tacl", "rte", seed, "glue", {"dev": {"accuracy": acc, "main": acc, "examples": 277}})
    for seed, (f1, acc) in enumerate([(0.90, 0.86), (0.88, 0.84)]):
        write_run(tmp_path, "tacl", "mrpc", seed, "glue",
                  {"dev": {"f1": f1, "accuracy": acc, "main": (f1 + acc) / 2, "examples": 408}})
    write_run(tmp_path, "none", "rte", 0, "glue", {"dev": {"accuracy": 0.70, "main": 0.70}})
    write_run(tmp_path, "tacl", "mnli", 0, "glue", {"dev_matched": {"accuracy": 0.84, "main": 0.84},
                                                     "dev_mismatched": {"accuracy": 0.82, "main": 0.82}})
    write_run(tmp_path, "tacl", "squad_v2", 0, "squad", {"dev": {"exact": 70.0, "f1": 73.0, "best_exact": 71.0,
                                                               "best_f1": 75.5, "best_f1_thresh": -1.2}})
    write_run(tmp_path, "tacl", "conll2003", 0, "ner", {"dev": {"f1": 0.95}}, {"test": {"f1": 0.91}})
    return tmp_path


def test_summary_mean_and_sample_std(tree):
    s = summarise(collect(tree))
    rte = s[(s.model == "tacl") & (s.task == "rte") & (s.metric == "accuracy")].iloc[0]
    assert rte["mean"] == pytest.approx(83.333333, rel=1e-6)
    # sample std of 80, 84, 86: mean 83.33; deviations -3.33, 0.67, 2.67; sum of squares 18.67; /2 -> 9.33
    assert rte["std"] == pytest.approx(9.333333 ** 0.5, rel=1e-6) and rte["n"] == 3
    assert not ((s.metric == "best_f1_thresh") | (s.metric == "examples")).any()


def test_tables_files_and_missing_runs(tree):
    expected = [{"model": m, "task": t, "setting": S, "seed": k} for m in ("none", "tacl") for t in ("rte", "mrpc")
                for k in range(3)]
    out = tree / "report"
    result = build_report(str(tree), ["none", "tacl"], ["rte", "mrpc", "mnli", "squad_v2", "conll2003"], expected,
                          [], str(out))
    assert set(result["missing"]) == {f"{run}/{S}/seed{k}" for run, k in [
        ("none/rte", 1), ("none/rte", 2), ("none/mrpc", 0), ("none/mrpc", 1), ("none/mrpc", 2), ("tacl/mrpc", 2)]}
    glue = pd.read_csv(out / "glue_dev.csv").set_index("model")
    assert glue.loc["tacl", "RTE (acc, dev)"] == "83.3 ± 3.1"
    assert glue.loc["tacl", "MRPC (F1/acc, dev)"] == "89.0 ± 1.4 / 85.0 ± 1.4"
    assert glue.loc["none", "MRPC (F1/acc, dev)"] == "- / -"
    assert glue.loc["tacl", "source"] == "this workflow" and glue.loc["tacl", "preset"] == "reference"
    # no average from 4 of the 9 numbers (RTE, MRPC F1, MNLI-m, MNLI-mm): it would compare with nothing
    assert glue.loc["tacl", "GLUE avg (dev)"] == "- (4/9 numbers)"
    squad = pd.read_csv(out / "squad_dev.csv", dtype=str)
    ours = squad[squad.model == "tacl"].iloc[0]
    # the headline is threshold 0 (exact/f1), the dev-tuned best scores have their own columns
    assert ours["SQuAD 2.0 F1 (dev, null threshold 0)"] == "73.0"
    assert ours["SQuAD 2.0 best F1 (dev-tuned threshold, not comparable)"] == "75.5"
    paper = squad[(squad.model == "BERT-base") & (squad.source == "TaCL paper (Su et al. 2021)")].iloc[0]
    assert paper["SQuAD 2.0 F1 (dev, null threshold 0)"] == "76.8" and paper["split"] == "dev"
    assert paper["SQuAD 2.0 best F1 (dev-tuned threshold, not comparable)"] == "-"
    ner = pd.read_csv(out / "ner.csv").set_index("model")
    assert ner.loc["tacl", "CoNLL-2003 F1 (test)"] == "91.0"
    for stem in ("glue_dev", "squad_dev", "glue_published", "differences", "status"):
        assert (out / f"{stem}.md").is_file() and (out / f"{stem}.tex").is_file()
    md = (out / "report.md").read_text()
    assert "Missing or failed (6)" in md and "Reproduction (2xA100; 130k steps)" in md
    assert (out / "glue_dev.png").stat().st_size > 1000


def test_results_from_another_family_stand_beside_no_published_number(tree):
    """The published numbers are BERT-base's: beside results whose start model (the results directory's
    models/start: tacl_start.json's family, else config.json's model_type) is of another family, the tables and
    the report say there is no published number instead; the differences compare with the mlm control."""
    from tacl.report.tables import start_family

    start = tree / "models" / "start"
    start.mkdir(parents=True)
    assert start_family(tree) is None  # (before init_model: the published rows, as for a BERT)
    (start / "config.json").write_text(json.dumps({"model_type": "bert"}))
    assert start_family(tree) == "bert"
    (start / "config.json").write_text(json.dumps({"model_type": "roberta"}))
    assert start_family(tree) == "roberta"
    (start / "tacl_start.json").write_text(json.dumps({"family": "xlm-roberta"}))
    assert start_family(tree) == "xlm-roberta"
    for seed, acc in enumerate([0.70, 0.72]):
        write_run(tree, "mlm", "rte", seed, "glue", {"dev": {"accuracy": acc, "main": acc}})
    out = tree / "report"
    build_report(str(tree), ["none", "mlm", "tacl"], ["rte", "mrpc", "squad_v2"], [], [], str(out))
    said = "no published number: the start model is of the xlm-roberta family"
    published = pd.read_csv(out / "glue_published.csv", dtype=str)
    assert len(published) == 1 and published.source[0].startswith(said)
    squad = pd.read_csv(out / "squad_dev.csv", dtype=str)
    assert list(squad.model) == ["none", "mlm", "tacl", "-"] and squad.source.iloc[-1].startswith(said)
    md = (out / "report.md").read_text()
    assert "BERT paper" not in md and "Reproduction (2xA100" not in md and "(BERT-base 79.6, TaCL 81.2)" not in md
    assert md.count("No published number: the start model is of the xlm-roberta family") == 2
    assert "mlm, as much continued masked-LM pretraining (without NSP)" in md
    diffs = pd.read_csv(out / "differences.csv", dtype=str)
    assert set(diffs[diffs.model == "tacl"].vs) == {"mlm", "none"} and list(diffs[diffs.model == "none"].vs) == ["mlm"]


def test_glue_average_is_berts_on_its_published_numbers():
    """The mean of BERT-base's nine published test numbers (MCC, F1 for MRPC/QQP, Spearman for STS-B,
    MNLI-m and -mm apart, no WNLI) is the 79.6 BERT and TaCL report."""
    refs = reference_numbers()
    bert = refs[refs.source.str.startswith("BERT paper")]
    keys = {key: label for label, *_, key in HEADLINE}
    scores = {keys[r.task]: r.value for r in bert.itertuples() if r.task in keys}
    assert round(glue_average(scores), 1) == 79.6 == bert[bert.task == "glue_avg"].value.iloc[0]
    assert glue_average({k: v for k, v in scores.items() if k != "RTE"}) is None
    assert glue_average({**scores, "WNLI": 0.0}) == glue_average(scores), "WNLI is left out"
    published = glue_reference_table(refs).set_index(["source", "model"])
    assert published.loc[("TaCL paper (Su et al. 2021)", "TaCL"), "GLUE avg (as published)"] == "81.2"
    assert published.loc[("TaCL paper (Su et al. 2021)", "BERT-base"), "GLUE avg (as published)"] == "79.6"
    quoted = published.loc[("TaCL paper as quoted by the reproduction", "TaCL")]
    assert quoted["GLUE avg (as published)"] == "-" and quoted["QQP"] == "80.7" and quoted["split"] == "test"
    assert set(published["split"]) == {"test"}


def test_differences_beyond_seed_noise(tmp_path):
    """Paired by seed: tacl - mlm_nsp on RTE = +4, +5, +6 (clearly beyond noise); taco - mlm_nsp = +1, -1, +0.5;
    tacl_attn, a variant of tacl, also against tacl: +2 on every seed."""
    base = [0.60, 0.62, 0.64]
    for seed, acc in enumerate(base):
        write_run(tmp_path, "mlm_nsp", "rte", seed, "glue", {"dev": {"accuracy": acc}})
        write_run(tmp_path, "tacl", "rte", seed, "glue", {"dev": {"accuracy": acc + (0.04, 0.05, 0.06)[seed]}})
        write_run(tmp_path, "taco", "rte", seed, "glue", {"dev": {"accuracy": acc + (0.01, -0.01, 0.005)[seed]}})
        write_run(tmp_path, "tacl_attn", "rte", seed, "glue", {"dev": {"accuracy": acc + (0.06, 0.07, 0.08)[seed]}})
    write_run(tmp_path, "none", "rte", 0, "glue", {"dev": {"accuracy": 0.5}})
    table = differences_table(collect(tmp_path), ["none", "mlm_nsp", "tacl", "tacl_attn", "taco"])
    assert list(table[table.model == "tacl_attn"].vs) == ["mlm_nsp", "none", "tacl"]  # a variant: also vs tacl
    assert list(table[table.vs == "tacl"].model) == ["tacl_attn"]
    row = table[(table.model == "tacl_attn") & (table.vs == "tacl")].iloc[0]
    assert row["mean difference"] == "+2.00" and row["paired"] == "yes" and row["95% interval"] == "[+2.00, +2.00]"
    row = table[(table.model == "tacl") & (table.vs == "mlm_nsp")].iloc[0]
    half = stats.t.ppf(0.975, 2) * 1.0 / 3 ** 0.5  # the diffs 4, 5, 6: mean 5, sd 1
    assert row["mean difference"] == "+5.00" and row["paired"] == "yes"
    assert row["95% interval"] == f"[{5 - half:+.2f}, {5 + half:+.2f}]" and row["beyond seed noise"] == "yes"
    row = table[(table.model == "taco") & (table.vs == "mlm_nsp")].iloc[0]
    assert row["beyond seed noise"] == "no"
    row = table[(table.model == "tacl") & (table.vs == "none")].iloc[0]
    assert row["paired"] == "no" and row["beyond seed noise"] == "-" and row["seeds"] == "3 vs 1"
    low, high = interval(None, [1.0, 2.0, 3.0], [0.0, 0.5])[1:]
    welch = stats.ttest_ind([1.0, 2.0, 3.0], [0.0, 0.5], equal_var=False).confidence_interval(0.95)
    assert (low, high) == pytest.approx((welch.low, welch.high))


def test_headline_rows_use_the_selected_setting(tree):
    """A second RTE setting for tacl with a better mean (86, 88 against 83.3): the GLUE table, the summary and
    the differences use it alone; the sweep table lists both; the status names it."""
    for seed, acc in enumerate([0.86, 0.88]):
        write_run(tree, "tacl", "rte", seed, "glue", {"dev": {"accuracy": acc, "main": acc}}, setting="lr5e-5_b32_e3")
    write_run(tree, "none", "rte", 1, "glue", {"dev": {"accuracy": 0.72, "main": 0.72}}, setting="lr5e-5_b32_e3")
    out = tree / "report"
    expected = [{"model": "tacl", "task": "rte", "setting": s, "seed": k} for s in (S, "lr5e-5_b32_e3")
                for k in range(3)]
    build_report(str(tree), ["none", "tacl"], ["rte"], expected, [], str(out))
    glue = pd.read_csv(out / "glue_dev.csv").set_index("model")
    assert glue.loc["tacl", "RTE (acc, dev)"] == "87.0 ± 1.4"
    assert glue.loc["none", "RTE (acc, dev)"] == "72.0", "none: 72 (one seed) beats 70"
    sweep = pd.read_csv(out / "sweep.csv", dtype=str)
    rows = sweep[(sweep.model == "tacl") & (sweep.task == "rte")].set_index("setting")
    assert rows.loc[S, "mean ± std"] == "83.3 ± 3.1" and rows.loc["lr5e-5_b32_e3", "selected"] == "yes"
    status = pd.read_csv(out / "status.csv").set_index(["model", "task"])
    assert status.loc[("tacl", "rte"), "selected setting"] == "lr5e-5_b32_e3"
    assert status.loc[("tacl", "rte"), "finished"] == "5/6"
    diffs = pd.read_csv(out / "differences.csv", dtype=str)
    row = diffs[(diffs.model == "tacl") & (diffs.vs == "none") & (diffs.task == "RTE")].iloc[0]
    assert row["mean difference"] == "+15.00" and row["seeds"] == "2 vs 1"
    assert "optimistic as estimates of dev itself" in (out / "report.md").read_text()


def test_a_layer_a_model_does_not_have_is_a_dash_and_no_plan_is_one_error(tmp_path):
    """Models of 2 and 3 layers side by side: '-' in the 2-layer row's L3, never `nan`, in every file; `tacl
    report RESULTS_DIR` without the workflow's expected.json stops with one message naming it."""
    from tacl.report.expected import report_now
    from tacl.runtime.io import InputError

    paths = []
    for name, values in (("small", [0.5, 0.4]), ("large", [0.6, 0.5, 0.45])):
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps({"model": name, "layers": list(range(1, len(values) + 1)),
                                    "self_similarity": values, "anisotropy": values}))
        paths.append(str(path))
    out = tmp_path / "report"
    build_report(str(tmp_path), ["small", "large"], ["rte"], [], paths, str(out))
    for suffix in ("csv", "md", "tex"):
        text = (out / f"self_similarity.{suffix}").read_text()
        assert "nan" not in text.lower() and "-" in text, suffix
    rows = pd.read_csv(out / "self_similarity.csv", dtype=str).set_index("model")
    assert rows.loc["small", "L3"] == "-" and rows.loc["large", "L3"] == "0.450"
    assert "| small   | 0.500 | 0.400 | -     |" in (out / "report.md").read_text()
    with pytest.raises(InputError, match=r"expected\.json: not found; the workflow writes it when Snakemake starts"):
        report_now(tmp_path)


def test_gpu_hours_are_each_jobs_seconds_times_its_gpus(tmp_path):
    """From the benchmark files: a chunk that ran on 4 GPUs (its marker), a fine-tune on one (its metrics.json),
    a similarity job (no device record: one GPU, as the others ran on GPUs), an export on the CPU."""
    from tacl.report.status import hours

    def bench(rel, seconds):
        path = tmp_path / "benchmarks" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"s\th:m:s\tmax_rss\n{seconds}\t0:00:00\t1.0\n")

    cuda = {"device": "cuda:0", "gpu": "NVIDIA A100-SXM4-40GB", "gpus": 4}
    bench("pretrain/tacl/chunk-0.tsv", 3600)
    (tmp_path / "pretrain/tacl").mkdir(parents=True)
    (tmp_path / "pretrain/tacl/chunk-0.json").write_text(json.dumps({"world_size": 4, "device": cuda}))
    bench("pretrain/tacl/export.tsv", 360)
    bench(f"finetune/tacl/rte/{S}.tsv", 1800)  # (one job: every seed of the setting)
    write_run(tmp_path, "tacl", "rte", 0, "glue", {"dev": {"accuracy": 0.7}})
    m = tmp_path / "finetune" / "tacl" / "rte" / S / "seed0" / "metrics.json"
    m.write_text(json.dumps({**json.loads(m.read_text()), "device": {**cuda, "gpus": 1}}))
    bench("analysis/similarity-tacl.tsv", 720)
    h = hours(tmp_path)
    assert h["benchmark_files"] == 4
    assert h["job_hours"] == pytest.approx((3600 + 360 + 1800 + 720) / 3600)
    assert h["gpu_hours"] == pytest.approx(4 + 0.5 + 0.2)


def test_a_damaged_result_file_is_named_and_the_tables_come_from_the_rest(tree, caplog):
    """A metrics.json cut short and a similarity file that is not JSON: one log line names each, the tables
    are built from the other runs, and report.md lists the damaged files beside the missing runs."""
    bad = tree / "finetune" / "tacl" / "rte" / S / "seed2" / "metrics.json"
    bad.write_text(bad.read_text()[:20])
    sim = tree / "tacl.json"
    sim.write_text("not json")
    expected = [{"model": "tacl", "task": "rte", "setting": S, "seed": k} for k in range(3)]
    out = tree / "report"
    with caplog.at_level("WARNING", logger="tacl.report"):
        result = build_report(str(tree), ["tacl"], ["rte", "mrpc"], expected, [str(sim)], str(out))
    lines = [r.getMessage() for r in caplog.records]
    assert any(line.startswith(f"{bad}: damaged, not valid JSON (Unterminated string starting at: line 1")
               and line.endswith("); left out of the report") for line in lines), lines
    assert any(line.startswith(f"{sim}: damaged, not valid JSON") for line in lines), lines
    assert result["damaged"] == [str(bad), str(sim)] and result["missing"] == [f"tacl/rte/{S}/seed2"]
    glue = pd.read_csv(out / "glue_dev.csv").set_index("model")
    assert glue.loc["tacl", "RTE (acc, dev)"] == "82.0 ± 2.8"  # (seeds 0 and 1)
    assert glue.loc["tacl", "MRPC (F1/acc, dev)"] != "- / -"
    md = (out / "report.md").read_text()
    assert "Missing or failed (1)" in md and "Damaged, left out of the tables (2; " in md and str(bad) in md


def test_status_refuses_a_folder_that_is_not_a_results_directory(tmp_path, tree, capsys):
    """`tacl status FOLDER` of a folder without expected.json, pretrain/, finetune/ or logs/: one line naming
    the folder and what it expected, exit status 2, no empty table. A results directory with a damaged
    metrics.json: the others counted, the damaged one listed."""
    from tacl.cli import main

    other = tmp_path / "elsewhere"
    (other / "data").mkdir(parents=True)
    assert main(["status", str(other)]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err == (f"tacl: error: {other}: not a results directory (it holds none of "
                                 "expected.json, pretrain, finetune, logs); give the config's results_dir\n")
    bad = tree / "finetune" / "tacl" / "rte" / S / "seed2" / "metrics.json"
    bad.write_text("{")
    assert main(["status", str(tree)]) in (0, None)
    out = capsys.readouterr().out
    assert f"damaged (does not parse; not done, trained again when its job runs again): {bad}" in out
    assert re.search(r"^tacl +rte +2 *$", out, re.M), out


def test_status_tells_a_stopped_fine_tune_job_from_a_running_one(tmp_path, monkeypatch, capsys):
    """A fine-tuning job with seed 0 done and seed 1 begun: running or stopped, naming how it was told, from
    the scheduler (SLURM's squeue, then sacct: TIMEOUT is the time limit; no answer: the log), from the
    process on this host, or from the log (its stop line; older than STALE_LOG_MINUTES: stopped)."""
    import os
    import socket
    import subprocess
    import sys

    from tacl.cli import main
    from tacl.report import status as st

    setting = tmp_path / "finetune" / "tacl" / "rte" / S
    write_run(tmp_path, "tacl", "rte", 0, "glue", {"dev": {"accuracy": 0.7}})
    (setting / "seed1").mkdir()
    log = tmp_path / "logs" / "finetune" / "tacl" / "rte" / f"{S}.log"
    log.parent.mkdir(parents=True)
    log.write_text("INFO tacl.finetune: fine-tune step 200/900: mean loss 0.6\n")
    (tmp_path / "expected.json").write_text(json.dumps({"version": 1, "objectives": [], "expected": [
        {"model": "tacl", "task": "rte", "setting": S, "seed": k} for k in (0, 1)]}))

    def job():
        return st.finetune_job(setting, log)

    assert job() == {"state": "running", "how": "its log was last written 0 min ago (less than 45 min: taken as "
                                                "running)"}
    os.utime(log, (log.stat().st_atime, log.stat().st_mtime - 3 * 3600))
    assert job() == {"state": "stopped", "how": "its log was last written 3.0 h ago (more than 45 min: taken as "
                                                "stopped)"}
    with open(log, "a") as f:
        f.write("tacl: stopped: stopped by SIGTERM at step 300/900, saved in X: running the job again resumes\n")
    assert job()["how"] == "its log: stopped by SIGTERM at step 300/900, saved in X: running the job again resumes"
    gone = subprocess.Popen([sys.executable, "-c", ""])
    gone.wait()
    for pid, state in ((os.getpid(), "running"), (gone.pid, "stopped")):
        (setting / "job.json").write_text(json.dumps({"host": socket.gethostname(), "pid": pid}))
        assert job()["state"] == state
    (setting / "job.json").write_text(json.dumps({"host": "node7", "pid": 12, "slurm_job": "77"}))
    monkeypatch.setattr(st, "slurm_job_state", lambda job_id: None)
    monkeypatch.setattr(st, "slurm_accounting_state", lambda job_id: "TIMEOUT")
    assert job() == {"state": "stopped", "how": "SLURM job 77, sacct: TIMEOUT, its time limit"}
    monkeypatch.setattr(st, "slurm_job_state", lambda job_id: "RUNNING")
    assert job() == {"state": "running", "how": "SLURM job 77, squeue: RUNNING"}

    def no_squeue(job_id):
        raise RuntimeError("squeue: [Errno 2] No such file or directory: 'squeue'")

    monkeypatch.setattr(st, "slurm_job_state", no_squeue)
    assert job()["how"].startswith("SLURM job 77: no answer (squeue: [Errno 2] No such file or directory: 'squeue'"
                                   "); its log: stopped by SIGTERM")
    assert main(["status", str(tmp_path)]) in (0, None)
    text = capsys.readouterr().out
    assert re.search(r"^tacl +rte +1/2 +0 +1 +0 *$", text, re.M), text
    assert f"stopped: tacl/rte/{S} (SLURM job 77: no answer" in text


def test_the_demos_report_says_why_its_figures_sit_at_chance_and_when_two_objectives_coincide(tmp_path):
    """A results tree shaped like the demo's (its models and tasks, from its config): the tiny models at QNLI's
    chance, MiniLM above it, every SQuAD 2.0 F1 below the no-answer row, tacl_attn's numbers equal to tacl's
    with its token weights near uniform. The report says why the SQuAD figures sit at chance (the training
    questions counted), names the models at GLUE's chance row (not MiniLM), says that tacl_attn and tacl
    coincide and why, and its differences name only the objectives that ran. Legends stay off the data."""
    import yaml
    from snakemake.utils import validate

    from conftest import DEMO_CONFIG, REPO
    from tacl.experiment import design
    from tacl.report.compose import glue_figure
    from tacl.report.curves import curves_figure, pretraining_runs

    cfg = yaml.safe_load(DEMO_CONFIG.read_text())
    validate(cfg, str(REPO / "workflow/schemas/config.schema.yaml"), set_default=True)
    models, tasks = design.tabled_models(cfg), cfg["finetune"]["tasks"]
    assert "tacl_attn" in models and "tacl_batch" not in models and tasks == ["qnli", "squad_v2"]
    for model in models:
        acc = 0.655 if model == "minilm" else 0.468
        write_run(tmp_path, model, "qnli", 0, "glue", {"dev": {"accuracy": acc, "main": acc}})
        if "+" not in model:
            f1 = {"tacl": 11.2, "tacl_attn": 11.2}.get(model, 9.0 + len(model) / 10)
            write_run(tmp_path, model, "squad_v2", 0, "squad", {"dev": {"exact": 0.0, "f1": f1}})
    data = tmp_path / "finetune_data"
    data.mkdir()
    (data / "qnli.json").write_text(json.dumps({"splits": {"train": 800, "dev": 400}, "baseline": {
        "name": "majority class", "dev": {"dev": {"accuracy": 0.532}}}}))
    (data / "squad_v2.json").write_text(json.dumps({"splits": {"train": 30, "dev": 16}, "baseline": {
        "name": "no answer to any question", "dev": {"dev": {"exact": 18.75, "f1": 18.75}}}}))
    for objective in design.trained_objectives(cfg):
        run = tmp_path / "pretrain" / objective / "run"
        run.mkdir(parents=True)
        lines = [{"step": s, "lr": 1e-3, "loss": 9.0 - s / 100, "mlm": 8.0 - s / 100,
                  **({"tacl_weight_ess": 0.9995} if objective == "tacl_attn" else {})} for s in (125, 250)]
        (run / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in lines))
    expected = [{"model": m, "task": t, "setting": S, "seed": 0} for m, t in design.model_tasks(cfg)]
    build_report(str(tmp_path), models, tasks, expected, [], str(tmp_path / "report"))
    md = (tmp_path / "report" / "report.md").read_text()
    tiny = ", ".join(m for m in models if m != "minilm")
    assert f"At or below the chance row on every GLUE task here: {tiny}." in md
    assert "No model clears the no-answer row (F1 18.8)" in md and "Expected at this size: 30 training questions" in md
    assert "the models pretrained here trained for 250 steps" in md
    assert ("tacl_attn and tacl coincide: every fine-tuning number here is the same for both: its token weights "
            "were near uniform (their effective share of the masked tokens, tacl_weight_ess in its metrics, was "
            "1.000") in md
    assert "tacl_batch" not in md and "tacl_attn minus tacl" in md
    assert "tacl_weight_ess" not in pd.read_csv(tmp_path / "report" / "training_curves.csv").series.unique()

    summary = summarise(collect(tmp_path))
    chance = {"qnli": {"dev": {"dev": {"accuracy": 0.532}}}}
    for fig in (glue_figure(summary, models, ["qnli"], chance), curves_figure(pretraining_runs(tmp_path))):
        fig.canvas.draw()
        renderer = fig.canvas.get_renderer()
        legends = [(ax, ax.get_legend()) for ax in fig.axes if ax.get_legend() is not None]
        assert legends
        for ax, legend in legends:
            box = legend.get_window_extent(renderer)
            beside = [other for other in fig.axes if other.bbox.bounds == ax.bbox.bounds]  # (lr's twin axis)
            assert not box.overlaps(ax.get_window_extent(renderer)), "a legend on the data"
            assert not any(box.overlaps(other.yaxis.get_tightbbox(renderer)) for other in beside if other is not ax)


def test_status_shows_the_disk_a_run_holds_with_what_killed_processes_left(tmp_path, capsys):
    """`tacl status`: each pretraining run's disk in all, and in it what killed processes left unfinished (a
    save in .incoming/, a conversion's <tag>.incoming, files under a temporary name) and what is set aside
    (damaged, superseded), said as being written while the run's chunk runs and as left over once it is gone;
    a fine-tune's checkpoint under a temporary name elsewhere; the results directory's folders. The chunk that
    takes the lock (clear_leftovers) removes the run directory's unfinished ones and nothing else."""
    import os
    import socket

    from tacl.cli import main
    from tacl.pretrain.rundir import clear_leftovers
    from tacl.report.status import status
    from tacl.runtime.io import disk_bytes

    folder = tmp_path / "pretrain" / "tacl"
    run, root = folder / "run", folder / "run" / "checkpoints"

    def put(path, n):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"x" * n)

    put(root / "step00000004" / "mp_rank_00_model_states.pt", 3_000_000)
    (root / "latest").write_text("step00000004\n")
    unfinished = {"run/checkpoints/.incoming/step00000006": 1_500_000,
                  "run/checkpoints/step00000004/universal/step00000004.incoming": 200_000,
                  "run/.run.json.tmp-gpu-node-17-4242": 1000, ".chunk-1.json.tmp-gpu-node-17-4242": 100}
    aside = {"run/checkpoints/step00000002.damaged-20261126T101010": 2_000_000, "superseded/0123abcd": 500_000}
    for path, n in {**unfinished, **aside}.items():
        put(folder / path / "m.pt" if ".tmp-" not in path else folder / path, n)
    elsewhere = tmp_path / "finetune" / "tacl" / "rte" / S / "seed0" / ".checkpoint.pt.tmp-gpu-node-3-77"
    put(elsewhere, 4_000_000)
    (folder / "chunk-0.json").write_text(json.dumps({"chunk": 0, "reason": "deadline", "step": 4, "steps": 10,
                                                     "done": False, "steps_this_chunk": 4, "wall_s": 9.0}))
    (run / "LOCK").write_text(json.dumps({"host": socket.gethostname(), "pid": os.getpid()}))

    def disk():
        (p,) = status(tmp_path)["pretrain"]
        return p["state"], p["disk"]

    state, held = disk()
    assert state == "running" and held["bytes"] == disk_bytes(folder) > 3_000_000 + sum(unfinished.values()) + \
        sum(aside.values())
    assert {e["path"]: e["bytes"] for e in held["unfinished"]} == unfinished
    assert {e["path"]: e["bytes"] for e in held["set_aside"]} == aside
    found = status(tmp_path)["disk"]
    assert found["temporaries"] == [{"path": str(elsewhere.relative_to(tmp_path)), "bytes": 4_000_000}]
    assert found["parts"] == {"pretrain": held["bytes"], "finetune": 4_000_000}
    assert main(["status", str(tmp_path)]) in (0, None)
    text = capsys.readouterr().out
    assert re.search(r"^tacl +running +4/10 .* step00000004 +7.2 MB *$", text, re.M), text
    assert ("tacl: 1.7 MB unfinished (being written now, or left by a killed process: the run's next chunk removes "
            "what is left): run/checkpoints/.incoming/step00000006 (1.5 MB), ") in text
    assert "tacl: 2.5 MB set aside (kept until you delete them): run/checkpoints/step00000002.damaged-" in text
    assert f"disk: 11 MB in {tmp_path} (pretrain 7.2 MB, finetune 4.0 MB)" in text
    assert f"): {elsewhere.relative_to(tmp_path)} (4.0 MB)" in text
    (run / "LOCK").unlink()
    assert main(["status", str(tmp_path)]) in (0, None)
    assert "tacl: 1.7 MB unfinished (left by a killed process: the run's next chunk removes them): " in \
        capsys.readouterr().out
    assert clear_leftovers(run) == sum(n for p, n in unfinished.items() if p.startswith("run/"))
    state, held = disk()
    assert [e["path"] for e in held["unfinished"]] == [".chunk-1.json.tmp-gpu-node-17-4242"]  # (its chunk's)
    assert {e["path"]: e["bytes"] for e in held["set_aside"]} == aside and (root / "step00000004").is_dir()
