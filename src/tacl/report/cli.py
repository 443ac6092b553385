"""`tacl report`: tables and plots from every finished run; `tacl status`: where a results directory stands;
`tacl publish`: each pretrained model as the Hugging Face Hub takes it (tacl.report.publish)."""

from __future__ import annotations

import argparse
import json
import sys


def register(stages: argparse._SubParsersAction) -> None:
    p = stages.add_parser("report", help="result tables (Markdown, CSV, LaTeX), plots, report.md and report.html",
                          description="`tacl report RESULTS_DIR`: every table and plot from the runs finished so "
                          "far, the missing ones named (the runs the config asks for are in RESULTS_DIR/expected.json, "
                          "which the workflow writes); reads files, starts nothing. The workflow's report rule "
                          "passes the runs explicitly (--results ...).")
    p.add_argument("results_dir", nargs="?", metavar="RESULTS_DIR", help="report from RESULTS_DIR/expected.json")
    p.add_argument("--results", help="the results_dir")
    p.add_argument("--models", nargs="+")
    p.add_argument("--tasks", nargs="*", default=[], help="the configured fine-tuning tasks")
    p.add_argument("--expected", default="[]", help="JSON list of {model, task, seed} the config asks for")
    p.add_argument("--similarity", nargs="*", default=[])
    p.add_argument("--embeddings", nargs="*", default=[], help="analysis/embeddings/MODEL.json files")
    p.add_argument("--embeddings-disabled", action="store_true",
                   help="the sentence-embedding evaluation is off (analysis.embeddings.enabled: false)")
    p.add_argument("--similarity-png")
    p.add_argument("--cls-png", help="the [CLS] cosine figure")
    p.add_argument("--out")
    p.add_argument("--record", help="write what the tables were built from here, last (the workflow's report rule "
                   "only; any other report removes the record of its folder)")
    p.set_defaults(func=_report, parser=p)

    s = stages.add_parser("status", help="where a results directory stands: pretraining, fine-tunes, GPU-hours",
                          description="Reads files only (no scheduler, no Snakemake): each pretraining run's step, "
                          "speed, time left, chunks and checkpoint; fine-tunes done / failed / missing per model "
                          "and task; GPU-hours of the finished jobs.")
    s.add_argument("results_dir", nargs="?", metavar="RESULTS_DIR",
                   help="default: results_dir of ./config.yaml")
    s.add_argument("--json", action="store_true", help="the same as JSON, for scripts")
    s.set_defaults(func=_status)


    u = stages.add_parser("publish", help="each pretrained model as the Hugging Face Hub takes it: model card, "
                          "records, curve; --push uploads one",
                          description="`tacl publish RESULTS_DIR`: for each exported model (not the start model, "
                          "objective none) a folder RESULTS_DIR/publish/MODEL with the export's files (hard links), "
                          "a model card (README.md: the Hub's metadata and a model-index of the report's numbers), "
                          "tacl_config.json (what made it), data_summary.json and the training curve. Reads files "
                          "only. With --push REPO_ID it then uploads (from a login node, logged in).")
    u.add_argument("results_dir", metavar="RESULTS_DIR")
    u.add_argument("--models", nargs="+", help="these models only (default: every exported one)")
    u.add_argument("--license", help="the Hub's license id (e.g. apache-2.0, mit, cc-by-sa-4.0), needed with --push; "
                   "default: `other`, which the card says is not stated")
    u.add_argument("--language", help="ISO 639 code of the training text (default: the config's data.language, "
                   "as the workflow recorded it)")
    u.add_argument("--push", metavar="REPO_ID", help="upload to this Hub model repository (created if missing); "
                   "{model} in it names one repository per model")
    u.add_argument("--private", action="store_true", help="a repository --push creates is private")
    # (--push reaches the Hub: the command leaves HF_HUB_OFFLINE as the machine has it)
    u.set_defaults(func=_publish, online=True)


def _publish(a: argparse.Namespace) -> None:
    import os

    from tacl.report.publish import hub_token, publish, push, push_refusal, repo_ids, to_publish
    from tacl.runtime.io import InputError

    if a.push:  # (before anything is written: a compute node, no license, no token, one repository for several)
        refusal = push_refusal(os.environ, a.license)
        if refusal:
            raise InputError(refusal)
        token = hub_token()
        repos = repo_ids(a.push, to_publish(a.results_dir, a.models)[0])
    for m in publish(a.results_dir, a.models, a.license, a.language):
        print(f"{m['model']}: " + (f"not published: {m['skipped']}" if "skipped" in m else
                                   f"{m['folder']} (model card with {m['results']} results; the export's files "
                                   f"{m['files']})"), file=sys.stderr)
        if a.push and "folder" in m:
            url = push(m["folder"], repos[m["model"]], token, a.private)
            print(f"{m['model']}: pushed to {repos[m['model']]} ({url})", file=sys.stderr)


def _report(a: argparse.Namespace) -> None:
    from pathlib import Path

    from tacl.report.expected import RECORD
    from tacl.runtime.io import write_json_atomic

    if not (a.results_dir or (a.results and a.models and a.out)):
        a.parser.error("give RESULTS_DIR, or --results, --models and --out")
    # (removed first: tables written without it, or half written, are never the rule's up-to-date output)
    Path(Path(a.results_dir, "report") if a.results_dir else a.out, RECORD).unlink(missing_ok=True)
    if a.results_dir:
        from tacl.report.expected import report_now

        result = report_now(a.results_dir)
        damaged = f", {len(result['damaged'])} damaged files left out" if result["damaged"] else ""
        print(f"tables from {result['runs']} finished fine-tunes ({len(result['missing'])} missing{damaged}) "
              f"in {a.results_dir}/report: report.md, report.html", file=sys.stderr)
    else:
        from tacl.report.compose import build_report

        result = build_report(a.results, a.models, a.tasks, json.loads(a.expected), a.similarity, a.out,
                              a.similarity_png, a.embeddings, not a.embeddings_disabled, a.cls_png)
    if a.record:
        write_json_atomic(a.record, result)
    print(json.dumps(result))


def _status(a: argparse.Namespace) -> None:
    from tacl.report.status import default_results_dir, format_status, status

    found = status(a.results_dir or default_results_dir())
    sys.stdout.write(json.dumps(found, indent=2) + "\n" if a.json else format_status(found))
