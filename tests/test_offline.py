"""A login node that cannot reach the Hugging Face Hub (HF_HUB_OFFLINE=1, an empty cache): every download rule
stops with one line naming what it could not fetch, the cache it looked in and what to do; no traceback
unless TACL_DEBUG is set; exit status non-zero."""

from __future__ import annotations

import re

from conftest import demo_config, run_snakemake, run_tacl

HF = {"kind": "hf"}


def error_line(log: str) -> str:
    """The log's one error line (and nothing like a traceback)."""
    assert "Traceback" not in log, log[-3000:]
    (line,) = [x for x in log.splitlines() if "error" in x.lower()]
    assert line.startswith("tacl: error: "), log
    return line


def test_every_download_rule_fails_with_one_line_naming_the_name(tmp_path, monkeypatch, tokenizer_dir):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    cfg = demo_config(tmp_path, model="bert-base-uncased", tokenizer="no-such-org/no-such-tokenizer",
                      **{"model_init": {"kind": "pretrained"},
                         "data.source": {"kind": "hf", "dataset": "wikimedia/wikipedia", "config": "20231101.en"},
                         "data.max_lines": 1000, "finetune.tasks": ["qnli", "squad_v2"],
                         "finetune.glue_source": HF, "finetune.squad_source": HF,
                         "finetune.extra_models": {"other": "no-such-org/no-such-model"},
                         "analysis.embeddings": {"enabled": True, "source": HF}})
    proc = run_snakemake(tmp_path, cfg, "--cores", "2", "--keep-going", check=False)
    assert proc.returncode != 0
    logs = tmp_path / "results" / "logs"
    datasets = str(tmp_path / "resources" / "datasets")
    hub = str(tmp_path / "hf" / "hub")
    expected = {  # rule's log: (what it names, the cache it looked in)
        "data/download_corpus.log": ("dataset 'wikimedia/wikipedia'", datasets),
        "data/fetch_tokenizer.log": ("tokenizer 'no-such-org/no-such-tokenizer'", hub),
        "pretrain/extra-other.log": ("tokenizer 'no-such-org/no-such-model'", hub),
        "finetune/prepare-qnli.log": ("dataset 'nyu-mll/glue'", datasets),
        "finetune/prepare-squad_v2.log": ("dataset 'rajpurkar/squad_v2'", datasets),
        "analysis/embeddings_data.log": ("dataset 'nyu-mll/glue'", datasets),
    }
    for name, (what, cache) in expected.items():
        line = error_line((logs / name).read_text())
        assert line.startswith(f"tacl: error: {what}: not in the cache, and HF_HUB_OFFLINE=1"), (name, line)
        assert f"looked in the cache {cache}. What to do: fetch it into that cache on a machine that reaches " \
               "the Hub" in line, (name, line)
        assert re.search(r"or point `[a-z_.]+`.* at a local folder", line), line

    # the start model (init_model waits for the tokenizer above): the same line, after the traceback with TACL_DEBUG
    proc = run_tacl("pretrain", "init-model", "--model", "bert-base-uncased", "--tokenizer", str(tokenizer_dir),
                    "--out", str(tmp_path / "start"), check=False, env={"TACL_DEBUG": "1"})
    assert proc.returncode == 2 and "Traceback (most recent call last)" in proc.stderr
    last = proc.stderr.rstrip().splitlines()[-1]
    assert last.startswith(f"tacl: error: model 'bert-base-uncased': not in the cache, and HF_HUB_OFFLINE=1 keeps "
                           f"this process off the Hub; looked in the cache {hub}."), last
