"""Contrastive fine-tuning terms on [CLS] (tacl.finetune.contrastive) against loop references."""

from __future__ import annotations

import math

import pytest
import torch

from tacl.finetune.contrastive import kl_contrastive_loss, supervised_contrastive_loss


def cos(a, b):
    return float((a @ b) / (a.norm() * b.norm()))


@pytest.fixture
def batch():
    g = torch.Generator().manual_seed(0)
    cls = torch.randn(6, 5, generator=g, dtype=torch.float64)
    labels = torch.tensor([0, 1, 0, 2, 1, 0])  # class 2 has a single example: no positive
    return cls, labels


def test_kl_form_matches_loops(batch):
    cls, labels = batch
    tau, n = 0.3, len(labels)
    total = 0.0
    for i in range(n):
        sims = [cos(cls[i], cls[j]) / tau for j in range(n)]
        log_z = math.log(sum(math.exp(s) for s in sims))
        same = [j for j in range(n) if labels[j] == labels[i]]
        total += sum((1 / len(same)) * (math.log(1 / len(same)) - (sims[j] - log_z)) for j in same)
    assert kl_contrastive_loss(cls, labels, tau).item() == pytest.approx(total / n, rel=1e-6)


def test_supervised_contrastive_form_matches_loops(batch):
    cls, labels = batch
    tau, n = 0.3, len(labels)
    terms = []
    for i in range(n):
        positives = [j for j in range(n) if j != i and labels[j] == labels[i]]
        if not positives:
            continue
        denom = sum(math.exp(cos(cls[i], cls[k]) / tau) for k in range(n) if k != i)
        terms.append(-sum(math.log(math.exp(cos(cls[i], cls[j]) / tau) / denom) for j in positives) / len(positives))
    assert supervised_contrastive_loss(cls, labels, tau).item() == pytest.approx(sum(terms) / len(terms), rel=1e-6)
    alone = supervised_contrastive_loss(cls[:4], torch.tensor([0, 1, 2, 3]), tau)
    assert alone.item() == 0.0, "no anchor with a positive: nothing to learn from"


@pytest.mark.parametrize("loss", [kl_contrastive_loss, supervised_contrastive_loss])
def test_ignored_rows_are_in_neither_form(batch, loss):
    """Rows labelled -100 (a batch padded to its full size with ignored rows) change neither the loss nor the
    real rows' gradients, and get none themselves."""
    cls, labels = batch
    padded = torch.cat([cls, torch.randn(3, 5, dtype=torch.float64)]).requires_grad_()
    real = cls.clone().requires_grad_()
    ours = loss(padded, torch.cat([labels, torch.full((3,), -100)]), 0.3)
    reference = loss(real, labels, 0.3)
    assert ours.item() == pytest.approx(reference.item(), rel=1e-6)  # (both computed in fp32)
    ours.backward()
    reference.backward()
    torch.testing.assert_close(padded.grad[:6], real.grad, rtol=1e-5, atol=1e-6)
    assert padded.grad[6:].abs().max() == 0
