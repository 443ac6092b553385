"""`tacl report`'s files: every table (tacl.report.tables computes them) written as .md, .csv and .tex, the
GLUE figure, the training curves, and report.md / report.html, which put the tables, figures and the words
that say how to read them in one document. The same results give the same bytes.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from tacl.objectives.registry import REGISTRY
from tacl.report.curves import Run, pretraining_runs, write_curves
from tacl.report.document import Document, markdown, save_png, table_text
from tacl.runtime.io import write_text_atomic
from tacl.report.tables import (CONTROLS, GLUE_AVERAGE_LABELS, GLUE_COLUMNS, HEADLINE, PUBLISHED_FAMILY, cls_table,
                                declared_headline_rows, declared_headlines, declared_table,
                                differences_table, embeddings_table, f1_classes, finished, glue_reference_table,
                                glue_table, ner_table, published_numbers, read_result, similarity_table, squad_table,
                                start_family, status_table, summary_row, sweep_table)

EMBEDDINGS_OFF = ("Not run: `analysis.embeddings.enabled: false` in the config. Set it to true to evaluate "
                  "sentence embeddings (STS-B dev and `analysis.embeddings.cluster_task` dev from "
                  "`analysis.embeddings.source`; the demo ships neither).")


def write_table(df: pd.DataFrame, stem: Path) -> None:
    """stem.md, stem.csv, stem.tex (each written atomically), with '-' where a number does not exist."""
    write_text_atomic(stem.with_suffix(".md"), markdown(df) + "\n")
    write_text_atomic(stem.with_suffix(".csv"), table_text(df).to_csv(index=False))
    write_text_atomic(stem.with_suffix(".tex"), table_text(df).to_latex(index=False, escape=True))


def glue_figure(summary: pd.DataFrame, models: list[str], tasks: list[str],
                chance: dict[str, dict[str, Any]] | None = None) -> Any:
    """One bar per model and task (mean, std over seeds as error bar), and over each task's bars a dashed line at
    the chance level of the glue_dev table's chance row (majority class; STS-B's constant scores 0)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    cols = [(label, task, split, metric) for label, task, split, metric, _ in HEADLINE
            if task in tasks and label in GLUE_AVERAGE_LABELS + ("WNLI",)]
    fig, ax = plt.subplots(figsize=(10, 4))
    width = 0.8 / max(1, len(models))
    for k, model in enumerate(models):
        means, stds = [], []
        for _, task, split, metric in cols:
            r = summary_row(summary, model, task, split, metric)
            means.append(r["mean"] if r is not None else np.nan)
            stds.append(r["std"] if r is not None and r["n"] > 1 else 0.0)
        ax.bar(np.arange(len(cols)) + k * width, means, width, yerr=stds, label=model, capsize=2)
    labelled = False
    for i, (_, task, split, metric) in enumerate(cols):
        score = (chance or {}).get(task, {}).get("dev", {}).get(split, {}).get(metric)
        if score is not None:
            ax.hlines(100 * score, i - width / 2, i - width / 2 + 0.8, colors="black", linestyles="dashed",
                      label=None if labelled else "chance (majority class / constant)")
            labelled = True
    ax.set_xticks(np.arange(len(cols)) + 0.4 - width / 2, [c[0] for c in cols])
    ax.set_ylabel("dev score (x100; MCC, F1, Spearman or accuracy)")
    ax.set_title("GLUE dev, mean and std over seeds")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)  # beside the bars
    fig.tight_layout()
    return fig


@dataclass
class Results:
    """What the report shows: the tables by file stem, and what the words around them depend on."""

    every: pd.DataFrame  # every run found, of every fine-tuning setting (tables.collect)
    long: pd.DataFrame  # the selected settings' runs (tables.selected)
    summary: pd.DataFrame
    chance: dict[str, dict[str, Any]]
    tasks: list[str]
    glue_tasks: list[str]
    tables: dict[str, pd.DataFrame]
    missing: list[str]
    damaged: list[str]  # result files that do not read back: named, left out
    several: bool  # some (model, task) ran more than one fine-tuning setting
    models: list[str]
    runs: list[Run]  # the pretraining runs' metric lines (tacl.report.curves)
    prepared: dict[str, dict[str, Any]]  # each task's preparation record: split sizes, chance
    family: str | None = None  # the start model's family (tables.start_family); None before it exists


def compute(results_dir: str, models: list[str], tasks: list[str], expected: list[dict[str, Any]],
            similarity: list[str], embeddings: list[str] | None) -> Results:
    """Every table of the report, from the result files (the damaged ones left out and named)."""
    damaged: list[str] = []
    every, tasks_prepared, chosen, long, summary = finished(results_dir, tasks, damaged)
    family = start_family(results_dir)
    refs = published_numbers(family)
    chance = {t: r["baseline"] for t, r in tasks_prepared.items() if r.get("baseline")}
    similarity = [p for p in similarity if read_result(p, damaged, ("model",)) is not None]
    embeddings = [p for p in embeddings or [] if read_result(p, damaged, ("model",)) is not None]
    glue_tasks = [t for t in tasks if t in {c[1] for c in GLUE_COLUMNS}]
    glue = glue_table(summary, long, models, glue_tasks, chance)
    squad = squad_table(summary, long, models, refs, tasks, chance, family)
    status, missing = status_table(every, expected, chosen)
    sim = similarity_table(similarity)
    diffs = differences_table(long, models, declared_headline_rows(tasks_prepared))
    anisotropy = similarity_table(similarity, "anisotropy")
    cls = cls_table(similarity)
    sentence = embeddings_table(embeddings or [])
    sweep = sweep_table(every, chosen, f1_classes(tasks_prepared))
    tables = {"glue_dev": glue, "glue_published": glue_reference_table(refs, family), "squad_dev": squad,
              "differences": diffs, "status": status, "self_similarity": sim, "anisotropy": anisotropy,
              "cls_cosine": cls, "embeddings": sentence, "sweep": sweep}
    if "conll2003" in tasks:
        tables["ner"] = ner_table(summary, long, models)
    if declared_headlines(tasks_prepared):
        tables["declared"] = declared_table(summary, long, models, tasks_prepared, chance)
    several = sweep.groupby(["model", "task"]).size().max() > 1 if not sweep.empty else False
    return Results(every, long, summary, chance, tasks, glue_tasks, tables, missing, damaged, several, models,
                   pretraining_runs(results_dir, models), tasks_prepared, family)


def build_report(results_dir: str, models: list[str], tasks: list[str], expected: list[dict[str, Any]],
                 similarity: list[str], out_dir: str, similarity_png: str | None = None,
                 embeddings: list[str] | None = None, embeddings_enabled: bool = True,
                 cls_png: str | None = None, name: str | None = None) -> dict[str, Any]:
    """Every table and plot for the configured models and tasks, report.md and report.html; returns the runs
    found and missing. `name`: how the report's title names the results (default: results_dir)."""
    out = Path(out_dir)
    r = compute(results_dir, models, tasks, expected, similarity, embeddings)
    write_text_atomic(out / "runs.csv", r.every.to_csv(index=False))
    write_text_atomic(out / "summary.csv", r.summary.to_csv(index=False))
    doc = document(r, name or results_dir, out, similarity_png, cls_png, embeddings_enabled)
    for stem, df in r.tables.items():
        write_table(df, out / stem)
    if not embeddings_enabled:
        write_text_atomic(out / "embeddings.md", EMBEDDINGS_OFF + "\n")
    save_png(glue_figure(r.summary, models, r.glue_tasks, r.chance), out / "glue_dev.png")
    write_curves(out, r.runs)
    write_text_atomic(out / "report.md", doc.markdown())
    write_text_atomic(out / "report.html", doc.html())
    long = r.long
    return {"runs": int(long[["model", "task", "seed"]].drop_duplicates().shape[0]) if not long.empty else 0,
            "missing": r.missing, "damaged": r.damaged}


def document(r: Results, name: str, out: Path, similarity_png: str | None, cls_png: str | None,
             embeddings_enabled: bool) -> Document:
    """report.md's (and report.html's) content: each section's tables and figures, with the words to read them."""
    doc = Document()
    _introduction(doc, r, name)
    doc.heading("Pretraining")
    doc.figure("training curves", out / "training_curves.png", CURVES_CAPTION)
    resumed = [f"{run.objective} at step{'s' if len(run.boundaries) > 1 else ''} "
               f"{', '.join(map(str, run.boundaries))}" for run in r.runs if run.boundaries]
    if resumed:
        doc.paragraph("Chunks resumed from a checkpoint: " + "; ".join(resumed) + ".")
    if r.glue_tasks:
        _glue(doc, r, out)
    if any(t.startswith("squad") for t in r.tasks):
        _squad(doc, r)
    doc.heading("Fine-tuning settings (headline dev number per setting)")
    doc.table(r.tables["sweep"])
    if "ner" in r.tables:
        doc.heading("CoNLL-2003 NER (entity F1, seqeval)")
        doc.table(r.tables["ner"])
    if "declared" in r.tables:
        _declared(doc, r)
    _differences(doc, r)
    _similarity(doc, r, similarity_png, cls_png)
    _embeddings(doc, r, embeddings_enabled)
    _runs(doc, r)
    return doc


def _declared(doc: Document, r: Results) -> None:
    doc.heading("Declared tasks (the config's own)")
    kinds = [f"{t}: {rec['declared']['kind']}, {declared_metric(rec['declared'])} (x100 for a fraction), "
             f"{', '.join(f'{n} {s}' for s, n in rec['splits'].items())} examples"
             + (f"; chance: {rec['baseline']['name']}" if rec.get("baseline") else "")
             for t, rec in r.prepared.items() if rec.get("declared")]
    doc.paragraph("Each declared task's headline metric, on dev and on its labelled test split where it has "
                  "one, for the setting selected on dev; no published number exists for these. " + "; ".join(kinds)
                  + ".")
    doc.table(r.tables["declared"])


def declared_metric(declared: dict[str, Any]) -> str:
    """A declared task's headline metric in words, with what it is of: the class of an F1 (its positive_label),
    a token task's scoring (entities of their scheme in seqeval's mode, or tags that are not entities')."""
    from tacl.finetune.tokens import describe

    metric = declared["metric"]
    if metric == "f1" and declared.get("positive_label") is not None:
        return f"f1 (the F1 of {declared['positive_label']})"
    if declared.get("scoring"):
        return f"{metric} ({describe(declared['scoring'])})"
    return metric


def _introduction(doc: Document, r: Results, name: str) -> None:
    doc.heading(f"Results ({name})", 1)
    doc.paragraph("Our rows: dev-set scores x100, mean ± sample std over fine-tuning seeds, with the fine-tuning "
                  "preset they used; '-' = no finished run. Published rows name their source and split.")
    doc.paragraph("Each (model, task) shows the fine-tuning setting with the best mean dev score over seeds (named "
                  "in 'Runs' and 'Fine-tuning settings'). " + (
                      "Scores selected on dev are optimistic as estimates of dev itself, as in the papers (BERT "
                      "chose its learning rate on dev the same way)." if r.several else
                      "Every task ran one setting here (finetune.sweep), so nothing was selected."))


def _glue(doc: Document, r: Results, out: Path) -> None:
    doc.heading("GLUE dev")
    doc.table(r.tables["glue_dev"])
    doc.paragraph("GLUE avg (dev): as BERT and TaCL compute theirs, the mean of nine numbers (CoLA MCC, SST-2 "
                  "acc, MRPC F1, STS-B Spearman, QQP F1, MNLI-m and MNLI-mm acc, QNLI acc, RTE acc; WNLI left "
                  "out), shown only when all nine are there. MRPC's and QQP's F1 is the F1 of class 1 (the pair "
                  "is a paraphrase, a duplicate), as GLUE scores it. The chance row predicts the majority class of "
                  "train (STS-B: the mean train score, whose correlation is 0) for every dev example." + (
                      " '(from MNLI)': those runs started from the model's selected MNLI fine-tune, its best "
                      "seed (finetune.start_from), not from the pretrained model."
                      if (r.long.start != "").any() else ""))
    note = glue_chance_note(r)
    if note:
        doc.paragraph(note)
    doc.figure("GLUE dev", out / "glue_dev.png", "Dashed: the chance row's score on that task.")
    doc.heading("Published GLUE numbers (test server: not comparable one-to-one with dev scores)")
    doc.table(r.tables["glue_published"])
    if not bert_numbers_apply(r):
        doc.paragraph(published_note(r))
        return
    doc.paragraph("The TaCL paper's own GLUE figures are its averages (BERT-base 79.6, TaCL 81.2). The nine "
                  "per-task numbers the reproduction quotes for the paper average 80.9 and cannot be "
                  "reconciled with it (their QQP fits neither F1 nor accuracy), so no average is derived from "
                  "them.")


def bert_numbers_apply(r: Results) -> bool:
    """Whether the published numbers (BERT-base's) stand beside these results: a BERT start model, or one
    not made yet."""
    return r.family in (None, PUBLISHED_FAMILY)


def published_note(r: Results) -> str:
    """Why no published number stands beside results from a start model of another family."""
    return (f"No published number: the start model is of the {r.family} family, and the published numbers the "
            "workflow carries are BERT-base's and TaCL's from BERT-base (reference_numbers.csv), which would "
            "read as this model's own. Compare these rows with each other and with the chance rows.")


def _squad(doc: Document, r: Results) -> None:
    doc.heading("SQuAD dev")
    doc.table(r.tables["squad_dev"])
    doc.paragraph("SQuAD 2.0 headline: EM/F1 of the predictions made with null threshold 0, the Hugging Face "
                  "QA example's default that the reference ran, scored by the official definitions; this is "
                  "what the paper reports. The best EM/F1 at the threshold tuned on dev itself can only be "
                  "higher and are not comparable with published numbers.")
    note = squad_chance_note(r)
    if note:
        doc.paragraph(note)
    if not bert_numbers_apply(r):
        doc.paragraph(published_note(r))


# A score within this of the chance row (display scale, x100) counts as at chance
AT_CHANCE = 0.05


def _mean(r: Results, model: str, task: str, split: str, metric: str) -> float | None:
    row = summary_row(r.summary, model, task, split, metric)
    return None if row is None else float(row["mean"])


def glue_chance_note(r: Results) -> str | None:
    """The models at or below the chance row on every GLUE task they ran, named, with what that means."""
    at_chance = []
    for model in r.models:
        scores = []
        for _, task, split, metric, _ in HEADLINE:
            level = r.chance.get(task, {}).get("dev", {}).get(split, {}).get(metric)
            mean = _mean(r, model, task, split, metric) if task in r.glue_tasks else None
            if level is not None and mean is not None:
                scores.append(mean <= 100 * level + AT_CHANCE)
        if scores and all(scores):
            at_chance.append(model)
    if not at_chance:
        return None
    return (f"At or below the chance row on every GLUE task here: {', '.join(at_chance)}. Such a model predicts "
            "one label for (nearly) every dev example, the majority's or another (its share is then the score): "
            "it learned nothing of the task, and its row says nothing of its objective. Differences between "
            "objectives mean something once their models clear the chance row; a small model pretrained for few "
            "steps (the demo's) does not.")


def squad_chance_note(r: Results) -> str | None:
    """Where no model's SQuAD 2.0 F1 clears the no-answer row: why, with the size of the fine-tunes."""
    level = r.chance.get("squad_v2", {}).get("dev", {}).get("dev", {}).get("f1")
    scores = [f1 for m in r.models if (f1 := _mean(r, m, "squad_v2", "dev", "f1")) is not None]
    if level is None or not scores or any(f1 > level + AT_CHANCE for f1 in scores):
        return None
    train = r.prepared.get("squad_v2", {}).get("splits", {}).get("train")
    steps = max((m["step"] for run in r.runs for m in run.metrics), default=None)
    text = (f"No model clears the no-answer row (F1 {level:.1f}): every SQuAD 2.0 F1 is at or below it, so the "
            "fine-tunes learned nothing of the task here. At null threshold 0 a model that has not learned when "
            "to abstain answers every question with a span, losing the unanswerable ones, and its EM is 0 where "
            "none of its spans matches a gold answer exactly.")
    if train and train < SQUAD_FEW:
        return (text + f" Expected at this size: {train} training questions are too few for any model, a real "
                "encoder included, to learn where answers lie" +
                (f", and the models pretrained here trained for {steps} steps" if steps else "") +
                ". A paper-scale run fine-tunes on the full SQuAD 2.0 train set (about 130,000 questions).")
    return text + (f" With {train} training questions" if train else " With a full train set") + (
        " that points to the fine-tune or the models themselves: read the fine-tunes' logs (their losses) and "
        "the pretraining curves above.")


SQUAD_FEW = 10_000  # training questions below which no model is expected to learn SQuAD 2.0


CONTROL_WORDS = {"mlm_nsp": "mlm_nsp, as much continued pretraining without the contrastive loss",
                 "mlm": "mlm, as much continued masked-LM pretraining (without NSP) without the contrastive loss",
                 "none": "none, the start model"}


def variants(models: list[str]) -> dict[str, str]:
    """{variant: the objective it varies} of the models here whose objective varies another one here."""
    return {m: REGISTRY[m].variant_of for m in models if m in REGISTRY and REGISTRY[m].variant_of in models}


def differences_text(models: list[str]) -> str:
    """How to read the differences table, naming only the controls and variants among `models`."""
    controls = [CONTROL_WORDS[c] for c in CONTROLS if c in models]
    pairs = ", ".join(f"{m} minus {base}" for m, base in variants(models).items())
    return ((f"Each model minus the control ({'; '.join(controls)})" if controls else "Each model")
            + (f", and each variant of an objective minus that objective ({pairs})" if pairs else "")
            + ", on the headline number of each task: mean over fine-tuning seeds, 95% t interval, paired by "
            "seed where both ran the same seeds (Welch otherwise). 'yes' = the interval excludes 0.")


def coincide_notes(r: Results) -> list[str]:
    """A variant whose every number (each task, split and metric, mean over seeds) equals its objective's to the
    tables' last digit: said, with why where its run measured it (tacl_attn's token weights near uniform: the
    share of the masked tokens they effectively count, `tacl_weight_ess`, near 1)."""
    notes = []
    keys = ["task", "split", "metric"]
    for model, base in variants(r.models).items():
        both = r.summary[r.summary.model == model].merge(r.summary[r.summary.model == base], on=keys)
        if both.empty or (both.mean_x - both.mean_y).abs().max() >= AT_CHANCE:
            continue
        run = next((run for run in r.runs if run.objective == model), None)
        shares = [m["tacl_weight_ess"] for m in run.metrics if "tacl_weight_ess" in m] if run else []
        share = sum(shares) / len(shares) if shares else None
        why = ""
        if share is not None and share >= 0.95:
            why = (f": its token weights were near uniform (their effective share of the masked tokens, "
                   f"tacl_weight_ess in its metrics, was {share:.3f}, where 1 weighs all alike), so it trained as "
                   f"{base} does; at this model size the teacher's attention spreads nearly evenly over the tokens")
        notes.append(f"{model} and {base} coincide: every fine-tuning number here is the same for both{why}. "
                     "The differences between the two compare nothing here.")
    return notes


def _differences(doc: Document, r: Results) -> None:
    doc.heading("Differences beyond seed noise")
    doc.table(r.tables["differences"])
    doc.paragraph(differences_text(r.models))
    for note in coincide_notes(r):
        doc.paragraph(note)


def _similarity(doc: Document, r: Results, similarity_png: str | None, cls_png: str | None) -> None:
    doc.heading("Self-similarity (lower = more distinguishable token vectors)")
    doc.table(r.tables["self_similarity"])
    doc.heading("Anisotropy (mean cosine between tokens of different sentences: self-similarity's baseline)")
    doc.table(r.tables["anisotropy"])
    if similarity_png:
        doc.figure("self-similarity and anisotropy", similarity_png)
    doc.heading("[CLS] cosines (sequence-level anisotropy)")
    doc.table(r.tables["cls_cosine"])
    doc.paragraph("The cosine between the last layer's [CLS] vectors of two sentences: random pairs of held-out "
                  "sentences, and STS-B dev pairs with a gold score of 4 or more (where the sentence-embedding "
                  "evaluation runs). Numbers: pairs, mean, sample std and quantiles of the cosine.")
    if cls_png:
        doc.figure("[CLS] cosines", cls_png, CLS_CAPTION)


def _embeddings(doc: Document, r: Results, enabled: bool) -> None:
    if enabled:
        doc.heading("Sentence embeddings without fine-tuning (x100)")
        doc.table(r.tables["embeddings"])
        doc.paragraph("STS-B dev: Spearman of the cosine of the two sentences' embeddings with the gold scores. "
                      "k-means: the labelled set's sentences in k = #labels clusters, adjusted Rand index / "
                      "adjusted mutual information against the labels. [CLS]: the last layer's first vector; "
                      "mean: its average over the real tokens.")
    else:
        doc.heading("Sentence embeddings without fine-tuning")
        doc.paragraph(EMBEDDINGS_OFF)


def _runs(doc: Document, r: Results) -> None:
    doc.heading("Runs")
    doc.table(r.tables["status"])
    if r.missing:
        doc.paragraph(f"Missing or failed ({len(r.missing)}): " + ", ".join(r.missing))
    if r.damaged:
        doc.paragraph(f"Damaged, left out of the tables ({len(r.damaged)}; the job that made one, run again, "
                      "e.g. with `--forcerun finetune`, keeps its intact seeds and trains that one again): "
                      + ", ".join(r.damaged))


CURVES_CAPTION = ("Each pretraining run's loss terms (left axis; `loss` is the total it trained on) and learning "
                  "rate (right axis, dotted) against the optimizer step, from its run/metrics.jsonl, one point "
                  "per `pretrain.log_every` steps. Where the chunks resumed is the run's history, listed below: "
                  "the figure holds the results alone, the same for a run killed and resumed as for one that was "
                  "not. The points: training_curves.csv.")


CLS_CAPTION = ("For each model, the distribution of the cosine between the last layer's [CLS] vectors of two "
               "sentences, over random pairs of held-out sentences (filled) and, where the sentence-embedding "
               "evaluation runs, over the STS-B dev pairs with a gold score of 4 or more (outline). Random pairs "
               "near 1 mean [CLS] vectors that all point one way; the gap between the two distributions is what "
               "[CLS] tells apart. The numbers: cls_cosine.csv.")
