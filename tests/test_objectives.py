"""Each loss against a slow reference written with loops, on random tensors with padding and sequences
that have no masked token."""

import math

import pytest
import torch
import torch.nn.functional as F

from tacl.objectives.mlm_nsp import mlm_loss, nsp_loss
from tacl.objectives.taco import sample_taco_pairs, taco_loss
from tacl.objectives.tacl import tacl_loss


def cos(a, b):
    return float((a @ b) / (a.norm() * b.norm()))


def random_batch(seed, bsz=4, length=12, hidden=8):
    g = torch.Generator().manual_seed(seed)
    lengths = [length, length - 5, 3, length - 1][:bsz]
    valid = torch.zeros(bsz, length, dtype=torch.bool)
    for b, n in enumerate(lengths):
        valid[b, :n] = True
    special = torch.zeros_like(valid)
    for b, n in enumerate(lengths):
        special[b, 0] = special[b, n - 1] = True  # [CLS] ... [SEP]
    anchors = valid & ~special & (torch.rand(bsz, length, generator=g) < 0.4)
    anchors[2] = False  # a sequence with no masked token
    student = torch.randn(bsz, length, hidden, generator=g, dtype=torch.float64)
    teacher = torch.randn(bsz, length, hidden, generator=g, dtype=torch.float64)
    return student, teacher, valid, special, anchors


def tacl_reference(student, teacher, anchors, candidates, tau):
    terms, correct = [], 0
    bsz, length, _ = student.shape
    for b in range(bsz):
        for i in range(length):
            if not anchors[b, i]:
                continue
            sims = {j: cos(student[b, i], teacher[b, j]) / tau for j in range(length) if candidates[b, j]}
            denom = sum(math.exp(v) for v in sims.values())
            terms.append(-math.log(math.exp(sims[i]) / denom))
            correct += max(sims, key=sims.get) == i
    return sum(terms) / len(terms), correct / len(terms)


@pytest.mark.parametrize("negatives", ["real", "all"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_tacl_loss_matches_loops(seed, negatives):
    student, teacher, valid, special, anchors = random_batch(seed)
    candidates = valid & ~special if negatives == "real" else torch.ones_like(valid)
    tau = 0.5  # exp(cos/0.01) overflows a float64 loop; the formula is the same for any tau
    loss, acc = tacl_loss(student, teacher, anchors, candidates, tau)
    ref_loss, ref_acc = tacl_reference(student, teacher, anchors, candidates, tau)
    assert loss.item() == pytest.approx(ref_loss, rel=1e-5)
    assert acc.item() == pytest.approx(ref_acc)


def test_tacl_loss_at_tau_001_and_no_anchor():
    student, teacher, valid, special, anchors = random_batch(3)
    candidates = valid & ~special
    loss, _ = tacl_loss(student, teacher, anchors, candidates, 0.01)
    assert torch.isfinite(loss)
    # identical student and teacher: every anchor finds itself, loss near 0 at small tau
    loss_same, acc_same = tacl_loss(teacher, teacher, anchors, candidates, 0.01)
    assert acc_same.item() == 1.0 and loss_same.item() < loss.item()
    student.requires_grad_(True)
    none, acc = tacl_loss(student, teacher, torch.zeros_like(anchors), candidates, 0.01)
    none.backward()
    assert none.item() == 0.0 and math.isnan(acc.item()) and student.grad.abs().sum() == 0


def test_tacl_gradient_flows_to_student_only():
    student, teacher, valid, special, anchors = random_batch(4)
    student.requires_grad_(True)
    loss, _ = tacl_loss(student, teacher, anchors, valid & ~special, 0.1)
    loss.backward()
    assert student.grad[anchors].abs().sum() > 0
    assert student.grad[~anchors].abs().sum() == 0, "only anchors carry the contrastive gradient"


def taco_reference(g, valid, positive, negatives, tau):
    bsz, length, hidden = g.shape
    flat = g.reshape(bsz * length, hidden)
    terms, correct = [], 0
    for b in range(bsz):
        for t in range(length):
            if not valid[b, t]:
                continue
            a = g[b, t]
            pos = float(a @ g[b, positive[b, t]]) / tau
            negs = [float(a @ flat[n]) / tau for n in negatives[b, t].tolist()]
            denom = math.exp(pos) + sum(math.exp(v) for v in negs)
            terms.append(-math.log(math.exp(pos) / denom))
            correct += all(pos > v for v in negs)
    return sum(terms) / len(terms), correct / len(terms)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_taco_loss_matches_loops(seed):
    _, _, valid, _, _ = random_batch(seed)
    g = F.normalize(torch.randn(*valid.shape, 8, generator=torch.Generator().manual_seed(seed),
                                dtype=torch.float64), dim=-1)
    positive, negatives = sample_taco_pairs(valid, window=2, k=7, generator=torch.Generator().manual_seed(seed))
    loss, acc = taco_loss(g, valid, positive, negatives, tau=0.07)
    ref_loss, ref_acc = taco_reference(g, valid, positive, negatives, 0.07)
    assert loss.item() == pytest.approx(ref_loss, rel=1e-5)
    assert acc.item() == pytest.approx(ref_acc)


def test_taco_pairs_obey_the_window_and_other_sequences():
    _, _, valid, _, _ = random_batch(5, bsz=4, length=30)
    positive, negatives = sample_taco_pairs(valid, window=2, k=50, generator=torch.Generator().manual_seed(0))
    length = valid.shape[1]
    for b, t in valid.nonzero().tolist():
        p = positive[b, t].item()
        assert 0 < abs(p - t) <= 2 and valid[b, p]
        for n in negatives[b, t].tolist():
            assert n // length != b and valid[n // length, n % length]
    again = sample_taco_pairs(valid, window=2, k=50, generator=torch.Generator().manual_seed(0))
    assert torch.equal(again[0], positive) and torch.equal(again[1], negatives)
    lonely = torch.zeros(2, 6, dtype=torch.bool)
    lonely[0, 0] = lonely[0, 5] = True  # no neighbour within 2: a random other position instead
    lonely[1, :2] = True
    pos, _ = sample_taco_pairs(lonely, window=2, k=3, generator=torch.Generator().manual_seed(0))
    assert pos[0, 0].item() == 5 and pos[0, 5].item() == 0
    with pytest.raises(ValueError, match="needs >= 2 sequences"):
        sample_taco_pairs(valid[:1], 2, 5, torch.Generator())


def test_taco_positives_and_negatives_are_detached():
    _, _, valid, _, _ = random_batch(6)
    g = F.normalize(torch.randn(*valid.shape, 8, dtype=torch.float64), dim=-1).requires_grad_(True)
    positive, negatives = sample_taco_pairs(valid, 2, 5, torch.Generator().manual_seed(1))
    loss, _ = taco_loss(g, valid, positive, negatives, 0.07)
    loss.backward()
    # the gradient reaches each anchor only through itself: a position that is nobody's anchor gets none
    assert g.grad[~valid].abs().sum() == 0
    single = torch.zeros_like(valid)
    single[0, 1] = True
    g.grad = None
    loss, _ = taco_loss(g, single, positive, negatives, 0.07)
    loss.backward()
    nonzero = g.grad.abs().sum(-1) > 0
    assert nonzero.sum() == 1 and nonzero[0, 1]


def test_mlm_and_nsp_losses():
    g = torch.Generator().manual_seed(0)
    logits, labels = torch.randn(10, 50, generator=g), torch.randint(0, 50, (10,), generator=g)
    loss, acc = mlm_loss(logits, labels)
    ref = sum(-torch.log_softmax(logits[i], -1)[labels[i]] for i in range(10)) / 10
    assert loss.item() == pytest.approx(ref.item(), rel=1e-6)
    assert acc.item() == pytest.approx(sum(int(logits[i].argmax() == labels[i]) for i in range(10)) / 10)
    empty, acc = mlm_loss(logits[:0], labels[:0])
    assert empty.item() == 0.0 and math.isnan(acc.item())
    nsp_logits, nsp_labels = torch.randn(6, 2, generator=g), torch.tensor([0, 1, 1, 0, 1, 0])
    loss, _ = nsp_loss(nsp_logits, nsp_labels)
    assert loss.item() == pytest.approx(F.cross_entropy(nsp_logits, nsp_labels).item())
