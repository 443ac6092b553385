"""Token classification's data and scores, free of torch: CoNLL columns read as (words, tags), the tag list
in id order, and seqeval's entity metrics (tacl.finetune.ner fine-tunes with them; tacl.finetune.declared
reads a declared task's CoNLL files and scores its chance with them)."""

from __future__ import annotations

from pathlib import Path

from tacl.runtime.io import InputError


def read_conll(path: str | Path) -> list[tuple[list[str], list[str]]]:
    """Sentences as (tokens, IOB2 tags) from the 4-column CoNLL-2003 format; -DOCSTART- lines skipped."""
    path = Path(path)
    if not path.is_file():
        raise InputError(f"{path}: CoNLL file not found")
    sentences, tokens, tags = [], [], []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            line = line.strip()
            if not line or line.startswith("-DOCSTART-"):
                if tokens:
                    sentences.append((tokens, tags))
                    tokens, tags = [], []
                continue
            cols = line.split()
            if len(cols) < 2:
                raise InputError(f"{path}:{n}: expected 'token ... tag', got {line!r}")
            tokens.append(cols[0])
            tags.append(cols[-1])
    if tokens:
        sentences.append((tokens, tags))
    return sentences


def label_list(sentences: list[tuple[list[str], list[str]]]) -> list[str]:
    """'O' first, then the entity types with B- before I-, sorted by type; tags that are not IOB2 (a declared
    task's part-of-speech tags, say) sorted."""
    tags = {t for _, ts in sentences for t in ts}
    if any(t != "O" and t[:2] not in ("B-", "I-") for t in tags):
        return sorted(tags)
    types = sorted({t[2:] for t in tags if t != "O"})
    return ["O"] + [f"{p}-{t}" for t in types for p in ("B", "I")]


def entity_metrics(gold: list[list[str]], pred: list[list[str]]) -> dict[str, float]:
    from seqeval.metrics import accuracy_score, f1_score, precision_score, recall_score

    return {"f1": float(f1_score(gold, pred)), "precision": float(precision_score(gold, pred)),
            "recall": float(recall_score(gold, pred)), "accuracy": float(accuracy_score(gold, pred)),
            "main": float(f1_score(gold, pred))}
