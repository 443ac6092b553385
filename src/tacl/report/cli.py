"""`tacl report`: tables and plots from every finished run."""

from __future__ import annotations

import argparse
import json


def register(stages: argparse._SubParsersAction) -> None:
    p = stages.add_parser("report", help="result tables (Markdown, CSV, LaTeX) and plots")
    p.add_argument("--results", required=True, help="the results_dir")
    p.add_argument("--models", nargs="+", required=True)
    p.add_argument("--tasks", nargs="*", default=[], help="the configured fine-tuning tasks")
    p.add_argument("--expected", default="[]", help="JSON list of {model, task, seed} the config asks for")
    p.add_argument("--similarity", nargs="*", default=[])
    p.add_argument("--embeddings", nargs="*", default=[], help="analysis/embeddings/MODEL.json files")
    p.add_argument("--embeddings-disabled", action="store_true",
                   help="the sentence-embedding evaluation is off (analysis.embeddings.enabled: false)")
    p.add_argument("--similarity-png")
    p.add_argument("--cls-png", help="the [CLS] cosine figure")
    p.add_argument("--out", required=True)
    p.set_defaults(func=_report)


def _report(a: argparse.Namespace) -> None:
    from tacl.report.tables import build_report

    result = build_report(a.results, a.models, a.tasks, json.loads(a.expected), a.similarity, a.out,
                          a.similarity_png, a.embeddings, not a.embeddings_disabled, a.cls_png)
    print(json.dumps(result))
