"""`tacl finetune ner`: CoNLL-2003 named entities (seqeval's entity F1), or a declared token classification
task (scored by its tags: entities of their scheme, or token accuracy and macro F1 over tags), with an option
to add the supervised TaCL loss against a frozen copy of the starting encoder."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from tacl.finetune import CONLL_FILES, FAMILY_HPARAMS, declared
from tacl.finetune.common import Run, attention_of, hyperparameters, input_names, load_task_model, predict, train
from tacl.finetune.sequence import declared_record, subset
from tacl.finetune.settings import FineTune
from tacl.finetune.tokens import CONLL_SCORING, entity_metrics, label_list, read_conll, token_scores
from tacl.runtime.hub import resolve_pretrained
from tacl.runtime.io import InputError, write_json_atomic

SPLITS = CONLL_FILES


def encode(tokenizer: Any, sentences: list[tuple[list[str], list[str]]], labels: list[str],
           max_len: int) -> list[dict[str, Any]]:
    """Word pieces with the word's label on its first piece and -100 on the rest (and on specials)."""
    index = {t: i for i, t in enumerate(labels)}
    enc = tokenizer([s[0] for s in sentences], is_split_into_words=True, truncation=True, max_length=max_len,
                    padding=False)
    rows = []
    for i, (_, tags) in enumerate(sentences):
        word_ids = enc.word_ids(i)
        row_labels, previous = [], None
        for w in word_ids:
            if w is None or w == previous:
                row_labels.append(-100)
            else:
                if tags[w] not in index:
                    raise InputError(f"CoNLL tag {tags[w]!r} is not among the training tags {labels}")
                row_labels.append(index[tags[w]])
            previous = w
        rows.append({**{k: enc[k][i] for k in input_names(tokenizer)}, "labels": row_labels})
    return rows


def word_predictions(rows: list[dict[str, Any]], logits: list[np.ndarray], labels: list[str]) -> list[list[str]]:
    """One predicted tag per (kept) word: the prediction on the word's first piece."""
    out = []
    for row, lg in zip(rows, logits):
        first = np.array(row["labels"]) != -100
        out.append([labels[i] for i in lg[first].argmax(-1)])
    return out


def finetune_ner(tune: FineTune, seed: int, out_dir: str | Path) -> dict[str, Any]:
    """One seed of the CoNLL-2003 fine-tune (its files in the source's `data_dir`), in `out_dir`: trained
    (from its checkpoint there where it has one, `tune.checkpointing`, tacl.finetune.resume), scored on dev
    and test, and metrics.json written last."""
    from transformers import AutoModel, AutoModelForTokenClassification, AutoTokenizer

    from tacl.objectives.tacl import supervised_tacl_loss
    from tacl.pretrain.model import without_pooler
    from tacl.runtime.family import family, model_type_of

    model_dir = resolve_pretrained(tune.model)
    hp = hyperparameters(FAMILY_HPARAMS["ner"], tune.preset, tune.hparams)
    started = time.time()
    # (a job that asked for a GPU and has none stops here)
    run = Run.detect(tune.precision, tune.device, tune.compile, tune.shapes)
    decl = tune.declaration
    if decl is None:
        data_dir = tune.data_source()["data_dir"]
        data = {s: read_conll(Path(data_dir) / f) for s, f in SPLITS.items()}
    else:  # (a declared task: its own splits, test where it declares one; scored as its tags are, from all of them)
        data = {s: declared.token_sentences(decl, s) for s in declared.SPLITS if s in decl["splits"]}
        decl = declared.resolve(decl, data)
    labels = label_list(data["train"])
    train_s = subset(data["train"], hp.get("max_train_examples", 0))
    eval_s = {s: subset(data[s], hp.get("max_eval_examples", 0)) for s in ("dev", "test") if s in data}

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = load_task_model(
        AutoModelForTokenClassification, model_dir, seed, num_labels=len(labels), id2label=dict(enumerate(labels)),
        label2id={t: i for i, t in enumerate(labels)})
    extra = None
    if hp["supervised_tacl"]:
        teacher = AutoModel.from_pretrained(model_dir, attn_implementation=attention_of(model_dir),
                                            **without_pooler(family(model_type_of(model_dir))))
        teacher = teacher.to(run.device).eval()
        names = input_names(tokenizer)
        teacher.requires_grad_(False)

        def extra(model, batch, outputs):
            with torch.no_grad():
                h = teacher(**{k: batch[k] for k in names}).last_hidden_state
            loss, _ = supervised_tacl_loss(outputs.hidden_states[-1], h, batch["labels"], hp["tacl_tau"])
            return hp["tacl_weight"] * loss

    checkpoint = tune.checkpoint_at(out_dir)
    record = train(model, encode(tokenizer, train_s, labels, hp["max_len"]), hp, seed, run,
                   tokenizer.pad_token_id, extra_loss=extra, checkpoint=checkpoint)
    results = {}
    for split, sentences in eval_s.items():
        rows = encode(tokenizer, sentences, labels, hp["max_len"])
        (logits,) = predict(model, rows, run, tokenizer.pad_token_id, hp["eval_batch"], lambda o: (o.logits,),
                            per_token=True, max_len=hp["max_len"], checkpoint=checkpoint)
        pred = word_predictions(rows, logits, labels)
        gold = [[labels[i] for i in np.array(r["labels"])[np.array(r["labels"]) != -100]] for r in rows]
        if decl is None:  # (CoNLL-2003: seqeval's default mode, as its published numbers)
            found = entity_metrics(gold, pred)
        else:
            found = token_scores(gold, pred, decl["scoring"])
            found["main"] = found[decl["metric"]]
        results[split] = {**found, "examples": len(rows)}
    summary = {"task": tune.task, "family": "ner", "model": model_dir, "seed": seed, "preset": tune.preset,
               "hparams": hp,
               "dev": {"dev": results["dev"]}, **({"test": {"test": results["test"]}} if "test" in results else {}),
               "labels": labels, **(declared_record(decl) if decl else {"scoring": CONLL_SCORING}),
               "train": record, "device": run.describe(), "bf16": run.bf16,
               "wall_s": round(time.time() - started, 1)}
    write_json_atomic(Path(out_dir) / "metrics.json", summary)
    return summary
