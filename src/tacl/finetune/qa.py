"""`tacl finetune squad`: SQuAD v1.1 / v2.0 span extraction with sliding windows, n-best decoding and the
official metrics; for v2.0 the headline uses null threshold 0 (as the reference), the dev-tuned threshold's
scores are reported beside it."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any

from tacl.finetune import FAMILY_HPARAMS, SQUAD_TASKS, squad
from tacl.finetune.common import Run, hyperparameters, load_task_model, predict, train
from tacl.finetune import declared
from tacl.finetune.sequence import declared_record, subset
from tacl.finetune.settings import FineTune
from tacl.runtime.hub import resolve_pretrained
from tacl.runtime.io import InputError, write_json_atomic, write_text_atomic

SQUAD_HPARAMS = FAMILY_HPARAMS["squad"]


def load_examples(version: str, split: str, source: dict[str, Any]) -> list[squad.SquadExample]:
    if source.get("kind", "hf") == "hf":
        return squad.load_hf(version, "validation" if split == "dev" else split, source.get("cache_dir"))
    key = f"v{version.replace('.', '_')}_{split}"  # e.g. v1_1_train, v2_0_dev
    if not source.get(key):
        raise InputError(f"finetune.squad_source.{key}: no SQuAD {version} {split} file given")
    return squad.read_squad_json(source[key])


def feature_rows(features: squad.Features, train: bool) -> list[dict[str, Any]]:
    rows = []
    for i in range(len(features.input_ids)):
        row = {"input_ids": features.input_ids[i], "attention_mask": features.attention_mask[i]}
        if features.token_type_ids:  # (what the tokenizer gives: none from RoBERTa's or ModernBERT's)
            row["token_type_ids"] = features.token_type_ids[i]
        if train:
            row["start_positions"] = features.start_positions[i]
            row["end_positions"] = features.end_positions[i]
        rows.append(row)
    return rows


def finetune_squad(tune: FineTune, seed: int, out_dir: str | Path) -> dict[str, Any]:
    """One seed of a SQuAD fine-tune (`tune.task`: squad_v1 or squad_v2), in `out_dir`: trained (from its
    checkpoint there where it has one, `tune.checkpointing`, tacl.finetune.resume), its dev predictions
    written (and v2.0's null odds), and metrics.json last."""
    from transformers import AutoModelForQuestionAnswering, AutoTokenizer

    decl = tune.declaration
    if decl is None and tune.task not in SQUAD_TASKS:
        raise InputError(f"finetune task {tune.task!r} is not a SQuAD task ({', '.join(SQUAD_TASKS)})")
    model_dir = resolve_pretrained(tune.model)
    hp = hyperparameters(SQUAD_HPARAMS, tune.preset, tune.hparams)
    started = time.time()
    # (a job that asked for a GPU and has none stops here)
    run = Run.detect(tune.precision, tune.device, tune.compile, tune.shapes)
    if decl is None:
        version, source = SQUAD_TASKS[tune.task], tune.data_source()
        splits = {s: load_examples(version, s, source) for s in ("train", "dev")}
    else:  # (a declared task: scored as SQuAD 2.0 is where its questions include some without an answer)
        splits = {s: declared.qa_examples(decl, s) for s in declared.SPLITS if s in decl["splits"]}
        version = "2.0" if any(declared.unanswerable(ex) for ex in splits.values()) else "1.1"
    train_ex = subset(splits["train"], hp.get("max_train_examples", 0))
    evaluated = {s: subset(splits[s], hp.get("max_eval_examples", 0)) for s in ("dev", "test") if s in splits}

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = load_task_model(AutoModelForQuestionAnswering, model_dir, seed)
    features = squad.prepare_features(train_ex, tokenizer, hp["max_len"], hp["doc_stride"], hp["max_query_len"],
                                      train=True)
    checkpoint = tune.checkpoint_at(out_dir)
    record = train(model, feature_rows(features, True), hp, seed, run, tokenizer.pad_token_id, checkpoint=checkpoint)

    v2 = version == "2.0"
    out = Path(out_dir)
    scored = {}
    for split, examples in evaluated.items():
        features_ = squad.prepare_features(examples, tokenizer, hp["max_len"], hp["doc_stride"], hp["max_query_len"],
                                           train=False)
        start, end = predict(model, feature_rows(features_, False), run, tokenizer.pad_token_id, hp["eval_batch"],
                             lambda o: (o.start_logits, o.end_logits), per_token=True, max_len=hp["max_len"],
                             checkpoint=checkpoint)
        preds, null_odds = squad.postprocess(examples, features_, start, end, hp["n_best"], hp["max_answer_len"],
                                             version_2=v2)
        metrics = squad.evaluate(examples, preds, null_odds if v2 else None, version_2=v2)
        # The headline, comparable with the paper: EM/F1 of the predictions as made (v2.0: null threshold 0, the
        # Hugging Face QA example's default that the reference ran). v2.0's dev-tuned best_exact/best_f1 stay in
        # their own keys (and report columns): tuned on the set they score, they can only be higher.
        metrics["main_exact"], metrics["main"] = metrics["exact"], metrics["f1"]
        scored[split] = {**metrics, "examples": len(examples), "features": len(features_.input_ids)}
        stem = "" if split == "dev" else f"{split}_"
        write_text_atomic(out / f"{stem}predictions.json", json.dumps(preds, indent=1))
        if v2:
            finite = {k: (v if math.isfinite(v) else None) for k, v in null_odds.items()}  # None: no span at all
            write_text_atomic(out / f"{stem}null_odds.json", json.dumps(finite, indent=1))
    summary = {"task": tune.task, "family": "squad", "model": model_dir, "seed": seed,
               "preset": tune.preset, "hparams": hp, "dev": {"dev": scored["dev"]},
               **({"test": {"test": scored["test"]}} if "test" in scored else {}), **declared_record(decl),
               "train": {**record, "features": len(features.input_ids)}, "device": run.describe(),
               "bf16": run.bf16, "wall_s": round(time.time() - started, 1)}
    write_json_atomic(out / "metrics.json", summary)
    return summary
