"""Token classification's data and scores, free of torch: CoNLL columns read as (words, tags), the tag list
in id order, and the scores: seqeval's entity metrics where the tags are entities' (IOB1, IOB2 or BIOES),
token accuracy and macro F1 over tags where they are not (tacl.finetune.ner fine-tunes with them;
tacl.finetune.declared reads a declared task's CoNLL files and scores its chance with them)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

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
    """seqeval's entity F1, precision and recall in its default mode (conlleval's reading of IOB1 and IOB2
    alike) and its token accuracy, plus "main", the F1: CoNLL-2003's scores (`CONLL_SCORING`)."""
    from seqeval.metrics import accuracy_score, f1_score, precision_score, recall_score

    return {"f1": float(f1_score(gold, pred)), "precision": float(precision_score(gold, pred)),
            "recall": float(recall_score(gold, pred)), "accuracy": float(accuracy_score(gold, pred)),
            "main": float(f1_score(gold, pred))}


# -- how a token task's tags are scored ------------------------------------------------------------------------

# The metrics each kind of tag set is scored with: for entity tags (IOB1, IOB2 or BIOES, `tag_scheme`), entities'
# F1, precision and recall (seqeval) and the accuracy of tags (seqeval's accuracy_score); for any other tags (part
# of speech, say), the accuracy of tags and the macro F1 over tags, named so that neither reads as an entity F1.
ENTITY_METRICS = ("f1", "precision", "recall", "accuracy")
TAG_METRICS = ("token_accuracy", "tag_macro_f1")
# CoNLL-2003's scoring: entities in seqeval's default mode (conlleval's reading, which takes IOB1 and IOB2 alike),
# as its published numbers are computed; a declared task's comes from its tags (`scoring`)
CONLL_SCORING = {"metrics": "entities", "scheme": None, "mode": "default"}


def entity_tag(tag: str) -> tuple[str, str] | None:
    """(prefix, type) of an entity tag PREFIX-TYPE, PREFIX one of B, I, E, S and TYPE not empty; None for any
    other tag ('O', 'NOUN', 'B-', 'B')."""
    prefix, dash, kind = tag[:1], tag[1:2], tag[2:]
    return (prefix, kind) if prefix in ("B", "I", "E", "S") and dash == "-" and kind.strip("-") else None


def _valid(sequence: list[str], scheme: str) -> bool:
    """Whether a tag sequence keeps `scheme`'s rules: IOB2, an I-X only inside an entity of type X (after
    B-X or I-X); IOB1, a B-X only between two entities of type X (after B-X or I-X); BIOES, B-X and I-X
    followed by I-X or E-X and I-X and E-X after B-X or I-X, all of type X (a sentence's ends count as O)."""
    tags = [entity_tag(t) for t in sequence] + [None]
    previous = None
    for tag in tags:
        inside = previous is not None and tag is not None and previous[1] == tag[1] and previous[0] in ("B", "I")
        if scheme == "IOB2" and tag is not None and tag[0] == "I" and not inside:
            return False
        if scheme == "IOB1" and tag is not None and tag[0] == "B" and not inside:
            return False
        if scheme == "BIOES":
            opened = previous is not None and previous[0] in ("B", "I")
            if opened and not (tag is not None and tag[0] in ("I", "E") and inside):
                return False
            if tag is not None and tag[0] in ("I", "E") and not inside:
                return False
        previous = tag
    return True


def tag_scheme(sequences: list[list[str]]) -> str | None:
    """The entity scheme every tag fits: 'O' and PREFIX-TYPE tags with prefixes B and I only, IOB2 (or IOB1
    where I- opens entities and every B- stands between two entities of one type, as in the original CoNLL
    files; where both conventions are seen, IOB2, whose B- never means anything else); with E- or S- among
    them, and B-, I-, E-, S- only, BIOES. None where some tag is neither 'O' nor PREFIX-TYPE (part-of-speech
    tags such as 'NOUN', a bare 'B-') or no tag is an entity's (every tag 'O'): entity F1 means nothing there."""
    prefixes = set()
    for tag in {t for s in sequences for t in s}:
        if tag == "O":
            continue
        found = entity_tag(tag)
        if found is None:
            return None
        prefixes.add(found[0])
    if not prefixes:
        return None
    if prefixes & {"E", "S"}:
        return "BIOES"
    if all(_valid(s, "IOB2") for s in sequences):
        return "IOB2"
    return "IOB1" if all(_valid(s, "IOB1") for s in sequences) else "IOB2"


def scoring(sequences: list[list[str]]) -> dict[str, Any]:
    """How a declared token task's gold tags (every split's) are scored: entity tags (`tag_scheme`) as
    entities of their scheme in seqeval's strict mode, where every sentence keeps the scheme's rules, else in
    its default mode (conlleval's reading: an I- that opens an entity counts as its start, which IOB2 data cut
    inside an entity needs); any other tags by token accuracy and macro F1 over tags."""
    scheme = tag_scheme(sequences)
    if scheme is None:
        return {"metrics": "tags"}
    strict = all(_valid(s, scheme) for s in sequences)
    return {"metrics": "entities", "scheme": scheme, "mode": "strict" if strict else "default"}


def metrics_of(rule: dict[str, Any]) -> tuple[str, ...]:
    """The metrics a scoring (`scoring`) reports."""
    return ENTITY_METRICS if rule["metrics"] == "entities" else TAG_METRICS


def describe(rule: dict[str, Any]) -> str:
    """A scoring in words, for messages and the report."""
    if rule["metrics"] == "tags":
        return "tags that are not entities'"
    scheme = rule["scheme"] or "IOB1 or IOB2 (conlleval's reading)"
    return f"entities, {scheme}, seqeval's {rule['mode']} mode"


def token_scores(gold: list[list[str]], pred: list[list[str]], rule: dict[str, Any]) -> dict[str, float]:
    """The metrics of `rule` (`scoring`) on words' gold and predicted tags, as fractions: entity F1,
    precision and recall and token accuracy (seqeval, in the scheme's strict mode or the default one), or
    token accuracy and the macro F1 over tags (`tag_metrics`)."""
    if rule["metrics"] == "tags":
        return tag_metrics(gold, pred)
    if rule["mode"] != "strict":
        return {k: v for k, v in entity_metrics(gold, pred).items() if k != "main"}
    from seqeval import scheme as schemes
    from seqeval.metrics import accuracy_score, f1_score, precision_score, recall_score

    how = {"mode": "strict", "scheme": {"IOB1": schemes.IOB1, "IOB2": schemes.IOB2,
                                        "BIOES": schemes.IOBES}[rule["scheme"]], "zero_division": 0}
    return {"f1": float(f1_score(gold, pred, **how)), "precision": float(precision_score(gold, pred, **how)),
            "recall": float(recall_score(gold, pred, **how)), "accuracy": float(accuracy_score(gold, pred))}


def tag_metrics(gold: list[list[str]], pred: list[list[str]]) -> dict[str, float]:
    """Token accuracy (the share of words tagged right) and the macro F1 over tags (the mean of each tag's F1,
    over the tags on either side, as scikit-learn's average="macro"; a tag never predicted right scores 0)."""
    from collections import Counter

    pairs = [(g, p) for gs, ps in zip(gold, pred, strict=True) for g, p in zip(gs, ps, strict=True)]
    if not pairs:
        return {"token_accuracy": 0.0, "tag_macro_f1": 0.0}
    right = Counter(g for g, p in pairs if g == p)
    said, true = Counter(p for _, p in pairs), Counter(g for g, _ in pairs)
    tags = set(said) | set(true)
    f1 = [2 * right[t] / (said[t] + true[t]) for t in tags]
    return {"token_accuracy": sum(right.values()) / len(pairs), "tag_macro_f1": sum(f1) / len(f1)}
