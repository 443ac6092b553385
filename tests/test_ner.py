"""CoNLL-2003 reading, first-piece labels, seqeval metrics, the supervised TaCL loss, and a run."""

import math

import numpy as np
import pytest
import torch

from tacl.finetune.ner import encode, entity_metrics, label_list, read_conll, word_predictions
from tacl.objectives import accuracy
from tacl.objectives.tacl import supervised_tacl_loss
from tacl.runtime.io import InputError

CONLL = """-DOCSTART- -X- -X- O

EU NNP B-NP B-ORG
rejects VBZ B-VP O
German JJ B-NP B-MISC
call NN I-NP O
. . O O

Peter NNP B-NP B-PER
Blackburn NNP I-NP I-PER

BRUSSELS NNP B-NP B-LOC
1996-08-22 CD I-NP O
"""


def write_conll(path, repeat=1):
    path.write_text(CONLL * repeat)
    return path


def test_read_conll_and_labels(tmp_path):
    sents = read_conll(write_conll(tmp_path / "train.txt"))
    assert sents[0] == (["EU", "rejects", "German", "call", "."], ["B-ORG", "O", "B-MISC", "O", "O"])
    assert len(sents) == 3 and sents[2][1] == ["B-LOC", "O"]
    assert label_list(sents) == ["O", "B-LOC", "I-LOC", "B-MISC", "I-MISC", "B-ORG", "I-ORG", "B-PER", "I-PER"]
    with pytest.raises(InputError, match="nope.txt: CoNLL file not found"):
        read_conll(tmp_path / "nope.txt")
    (tmp_path / "bad.txt").write_text("lonely\n")
    with pytest.raises(InputError, match=r"bad.txt:1: expected"):
        read_conll(tmp_path / "bad.txt")


def test_labels_on_first_word_piece(tmp_path, tokenizer):
    sents = read_conll(write_conll(tmp_path / "train.txt"))
    labels = label_list(sents)
    rows = encode(tokenizer, sents, labels, 64)
    row = rows[2]  # BRUSSELS 1996-08-22: both words split into several pieces
    pieces = tokenizer.convert_ids_to_tokens(row["input_ids"])
    assert pieces[0] == "[CLS]" and row["labels"][0] == -100 and row["labels"][-1] == -100
    kept = [(p, lab) for p, lab in zip(pieces, row["labels"]) if lab != -100]
    assert [labels[lab] for _, lab in kept] == ["B-LOC", "O"]
    assert len(pieces) > 4, "the date splits into several pieces, only the first carries the label"
    # predictions come back one per word
    logits = [np.eye(len(labels))[np.clip(np.array(r["labels"]), 0, None)] for r in rows]
    assert word_predictions(rows, logits, labels) == [s[1] for s in sents]


def test_entity_metrics_by_hand():
    gold = [["B-PER", "I-PER", "O", "B-LOC"], ["B-ORG", "O"]]
    pred = [["B-PER", "I-PER", "O", "O"], ["B-ORG", "B-MISC"]]
    # gold entities: PER, LOC, ORG (3); predicted: PER, ORG, MISC (3); correct: PER, ORG (2)
    m = entity_metrics(gold, pred)
    assert m["precision"] == pytest.approx(2 / 3) and m["recall"] == pytest.approx(2 / 3)
    assert m["f1"] == pytest.approx(2 / 3)


def supervised_reference(student, teacher, labels, tau):
    terms = []
    bsz, length, _ = student.shape
    for b in range(bsz):
        for i in range(length):
            if labels[b, i] == -100:
                continue
            def c(j):
                s, t = student[b, i], teacher[b, j]
                return float(s @ t / (s.norm() * t.norm())) / tau
            allowed = [j for j in range(length) if labels[b, j] != -100 and (labels[b, j] != labels[b, i] or j == i)]
            denom = sum(math.exp(c(j)) for j in allowed)
            terms.append(-math.log(math.exp(c(i)) / denom))
    return sum(terms) / len(terms)


def test_supervised_tacl_loss_matches_loops():
    g = torch.Generator().manual_seed(0)
    student = torch.randn(3, 9, 6, generator=g, dtype=torch.float64)
    teacher = torch.randn(3, 9, 6, generator=g, dtype=torch.float64)
    labels = torch.randint(0, 3, (3, 9), generator=g)
    labels[:, 0] = labels[:, -1] = -100
    labels[1, 3:5] = -100
    loss, _ = supervised_tacl_loss(student, teacher, labels, tau=0.3)
    assert loss.item() == pytest.approx(supervised_reference(student, teacher, labels, 0.3), rel=1e-6)
    # same-class tokens are no negatives: with one class only, every anchor's softmax is over itself
    one_class = torch.where(labels == -100, labels, torch.zeros_like(labels))
    loss, acc = supervised_tacl_loss(student, teacher, one_class, tau=0.3)
    assert loss.item() == pytest.approx(0.0, abs=1e-12) and accuracy(acc) == 1.0  # acc: [correct, total]


@pytest.mark.slow
@pytest.mark.parametrize("supervised_tacl", [False, True])
def test_ner_run_writes_metrics(tmp_path, demo_data, supervised_tacl):
    import json

    from tacl.finetune.ner import finetune_ner
    from tacl.finetune.settings import FineTune

    for name in ("train.txt", "valid.txt", "test.txt"):
        write_conll(tmp_path / name, repeat=4)
    hparams = {"epochs": 1, "batch": 4, "lr": 1e-3, "supervised_tacl": supervised_tacl}
    tune = FineTune(task="conll2003", model=str(demo_data["start"]), source={"data_dir": str(tmp_path)},
                    hparams=hparams)
    result = finetune_ner(tune, 0, tmp_path / "out")
    saved = json.loads((tmp_path / "out" / "metrics.json").read_text())
    assert saved["dev"]["dev"]["examples"] == 12 and 0.0 <= saved["test"]["test"]["f1"] <= 1.0
    assert saved["hparams"]["supervised_tacl"] is supervised_tacl
    assert result["train"]["steps"] == 3
