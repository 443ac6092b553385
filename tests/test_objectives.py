"""Each loss against a slow reference written with loops, on random tensors with padding and sequences
that have no masked token."""

import copy
import math
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from tacl.objectives import accuracy
from tacl.objectives.mlm_nsp import mlm_loss, nsp_loss
from tacl.objectives.taco import gathered_dots, sample_taco_pairs, taco_loss
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
    assert accuracy(acc) == pytest.approx(ref_acc)


def test_tacl_loss_at_tau_001_and_no_anchor():
    student, teacher, valid, special, anchors = random_batch(3)
    candidates = valid & ~special
    loss, _ = tacl_loss(student, teacher, anchors, candidates, 0.01)
    assert torch.isfinite(loss)
    # identical student and teacher: every anchor finds itself, loss near 0 at small tau
    loss_same, acc_same = tacl_loss(teacher, teacher, anchors, candidates, 0.01)
    assert accuracy(acc_same) == 1.0 and loss_same.item() < loss.item()
    student.requires_grad_(True)
    none, acc = tacl_loss(student, teacher, torch.zeros_like(anchors), candidates, 0.01)
    none.backward()
    assert none.item() == 0.0 and math.isnan(accuracy(acc)) and student.grad.abs().sum() == 0


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
    positive, negatives, _ = sample_taco_pairs(valid, window=2, k=7, draws=torch.Generator().manual_seed(seed))
    loss, acc = taco_loss(g, valid, positive, negatives, tau=0.07)
    ref_loss, ref_acc = taco_reference(g, valid, positive, negatives, 0.07)
    assert loss.item() == pytest.approx(ref_loss, rel=1e-5)
    assert accuracy(acc) == pytest.approx(ref_acc)


def test_gathered_dots_and_their_gradient_match_the_full_matrix():
    """The 1 + K similarities per anchor and their gradient (to the anchors only), computed without the
    [N, N] matrix, equal those gathered from it (float64: to 1e-12; gradcheck on top)."""
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(40, 16, generator=gen, dtype=torch.float64, requires_grad=True)
    columns = torch.randint(0, 40, (40, 9), generator=gen)
    weights = torch.randn(40, 9, generator=gen, dtype=torch.float64)
    (gathered_dots(q, q, columns) * weights).sum().backward()
    got = q.grad.clone()
    q.grad = None
    full = (q @ q.detach().T).gather(1, columns)
    (full * weights).sum().backward()
    assert torch.allclose(gathered_dots(q, q, columns), full, rtol=0, atol=1e-12)
    assert torch.allclose(got, q.grad, rtol=0, atol=1e-12)
    small = torch.randn(8, 4, generator=gen, dtype=torch.float64, requires_grad=True)
    keys, columns = torch.randn(8, 4, generator=gen, dtype=torch.float64), torch.randint(0, 8, (8, 3), generator=gen)
    assert torch.autograd.gradcheck(lambda x: gathered_dots(x, keys, columns), (small,))


def test_taco_pairs_obey_the_window_and_other_sequences():
    _, _, valid, _, _ = random_batch(5, bsz=4, length=30)
    positive, negatives, has = sample_taco_pairs(valid, window=2, k=50, draws=torch.Generator().manual_seed(0))
    assert has.all()
    length = valid.shape[1]
    for b, t in valid.nonzero().tolist():
        p = positive[b, t].item()
        assert 0 < abs(p - t) <= 2 and valid[b, p]
        for n in negatives[b, t].tolist():
            assert n // length != b and valid[n // length, n % length]
    again = sample_taco_pairs(valid, window=2, k=50, draws=torch.Generator().manual_seed(0))
    assert torch.equal(again[0], positive) and torch.equal(again[1], negatives)
    lonely = torch.zeros(3, 9, dtype=torch.bool)
    lonely[0, 0] = lonely[0, 5] = True  # no neighbour within 2: a random other position instead
    lonely[1, :2] = True
    lonely[2, [0, 3, 8]] = True  # three positions, none within 2 of another: one of the other two
    pos, _, _ = sample_taco_pairs(lonely, window=2, k=3, draws=torch.Generator().manual_seed(0))
    assert pos[0, 0].item() == 5 and pos[0, 5].item() == 0
    for _ in range(20):
        pos, _, _ = sample_taco_pairs(lonely, 2, 3, torch.Generator().manual_seed(_))
        assert pos[2, 0].item() in (3, 8) and pos[2, 3].item() in (0, 8) and pos[2, 8].item() in (0, 3)
    alone = torch.zeros(2, 4, dtype=torch.bool)
    alone[0, :3] = True  # the other sequence is empty (all padding): no negatives for sequence 0
    _, _, has = sample_taco_pairs(alone, 2, 3, torch.Generator().manual_seed(0))
    assert has.tolist() == [False, True]
    with pytest.raises(ValueError, match="needs >= 2 sequences"):
        sample_taco_pairs(valid[:1], 2, 5, torch.Generator())


def test_taco_negatives_come_from_the_anchors_group():
    """Groups of 2 sequences: every negative lies in another sequence of the anchor's own group; the
    positives are the ungrouped draws' (the same numbers, the same window)."""
    _, _, valid, _, _ = random_batch(5, bsz=4, length=30)
    positive, negatives, has = sample_taco_pairs(valid, 2, 50, torch.Generator().manual_seed(0), group=2)
    ungrouped, _, _ = sample_taco_pairs(valid, 2, 50, torch.Generator().manual_seed(0))
    assert has.all() and torch.equal(positive, ungrouped)
    length = valid.shape[1]
    for b, t in valid.nonzero().tolist():
        for n in negatives[b, t].tolist():
            assert n // length != b and n // length // 2 == b // 2 and valid[n // length, n % length]
    with pytest.raises(ValueError, match="whole groups"):
        sample_taco_pairs(valid, 2, 5, torch.Generator(), group=3)


def test_taco_draws_are_uniform():
    """Negatives uniform over the other sequences' valid positions; a positive uniform over the window."""
    valid = torch.zeros(3, 10, dtype=torch.bool)
    valid[0, :10], valid[1, :4], valid[2, :6] = True, True, True
    _, negatives, _ = sample_taco_pairs(valid, 2, 4000, torch.Generator().manual_seed(0))
    drawn = torch.bincount(negatives[0, 3], minlength=30).float() / 4000  # anchor (0, 3): pool = 4 + 6 tokens
    expected = torch.zeros(30)
    expected[10:14] = expected[20:26] = 0.1
    assert (drawn - expected).abs().max() < 0.025
    picks = torch.stack([sample_taco_pairs(valid, 2, 1, torch.Generator().manual_seed(i))[0][0, 5]
                         for i in range(2000)])
    share = torch.bincount(picks, minlength=10).float() / 2000
    assert (share[[3, 4, 6, 7]] - 0.25).abs().max() < 0.04 and share[[0, 1, 2, 5, 8, 9]].sum() == 0


def test_taco_positives_and_negatives_are_detached():
    _, _, valid, _, _ = random_batch(6)
    g = F.normalize(torch.randn(*valid.shape, 8, dtype=torch.float64), dim=-1).requires_grad_(True)
    positive, negatives, _ = sample_taco_pairs(valid, 2, 5, torch.Generator().manual_seed(1))
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
    assert accuracy(acc) == pytest.approx(sum(int(logits[i].argmax() == labels[i]) for i in range(10)) / 10)
    # the fixed-length list of positions is padded with IGNORE_INDEX targets: they count for nothing
    padded = torch.cat([labels, torch.full((6,), -100)])
    loss_padded, acc_padded = mlm_loss(torch.cat([logits, torch.randn(6, 50, generator=g)]), padded)
    assert loss_padded.item() == pytest.approx(loss.item(), rel=1e-6) and torch.equal(acc_padded, acc)
    logits.requires_grad_(True)
    empty, acc = mlm_loss(logits[:8], torch.full((8,), -100))
    empty.backward()
    assert empty.item() == 0.0 and math.isnan(accuracy(acc)) and logits.grad.abs().sum() == 0
    nsp_logits, nsp_labels = torch.randn(6, 2, generator=g), torch.tensor([0, 1, 1, 0, 1, 0])
    loss, _ = nsp_loss(nsp_logits, nsp_labels)
    assert loss.item() == pytest.approx(F.cross_entropy(nsp_logits, nsp_labels).item())


def test_gathered_mlm_head_equals_boolean_selection():
    """The MLM head on the batch's fixed-length `mlm_index` gives the loss, accuracy and gradient of the
    previous way (boolean indexing of the selected positions, a host-device sync on a GPU)."""
    from transformers import BertConfig, BertForPreTraining

    from tacl.data.pretraining import masked_positions
    from tacl.objectives.mlm_nsp import mlm_nsp_terms

    torch.manual_seed(0)
    model = BertForPreTraining(BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                          intermediate_size=32))
    g = torch.Generator().manual_seed(1)
    labels = torch.where(torch.rand(3, 11, generator=g) < 0.3, torch.randint(50, (3, 11), generator=g), -100)
    batch = {**masked_positions(labels.numpy()), "nsp_labels": torch.tensor([0, 1, 1])}
    assert len(batch["mlm_index"]) % 8 == 0 and len(batch["mlm_index"]) >= int((labels != -100).sum())
    hidden = torch.randn(3, 11, 16, generator=g, requires_grad=True)
    pooled = torch.randn(3, 16, generator=g)
    out = SimpleNamespace(last_hidden_state=hidden, pooler_output=pooled)
    losses, metrics = mlm_nsp_terms(model, batch, out)
    (grad,) = torch.autograd.grad(losses["mlm"], hidden)
    selected = labels != -100
    logits = model.cls.predictions(hidden[selected])
    previous = F.cross_entropy(logits, labels[selected])
    (previous_grad,) = torch.autograd.grad(previous, hidden)
    assert losses["mlm"].item() == pytest.approx(previous.item(), rel=1e-6)
    assert accuracy(metrics["mlm_acc"]) == pytest.approx((logits.argmax(-1) == labels[selected]).float().mean().item())
    torch.testing.assert_close(grad, previous_grad, rtol=1e-5, atol=1e-7)


# -- TaCL with cross-sequence negatives, COCO-LM -------------------------------------------------------------------


@pytest.mark.parametrize("group", [None, 2])
def test_tacl_batch_negatives_match_loops(group):
    """Every real token of every sequence of the anchor's group (None: the micro-batch) is a candidate."""
    from tacl.data.pretraining import masked_positions
    from tacl.objectives.tacl import tacl_batch_loss

    student, teacher, valid, special, anchors = random_batch(4, bsz=4, length=10, hidden=8)
    candidates = valid & ~special
    labels = torch.where(anchors, 7, -100)
    batch = masked_positions(labels.numpy())
    loss, acc = tacl_batch_loss(student, teacher, batch["mlm_index"], batch["mlm_targets"], candidates, 0.1,
                                group=group)
    bsz, length, _ = student.shape
    size = group or bsz
    terms, correct = [], 0
    for b, i in anchors.nonzero().tolist():
        pool = [(c, j) for c in range(bsz) for j in range(length) if candidates[c, j] and c // size == b // size]
        scores = {(c, j): cos(student[b, i], teacher[c, j]) / 0.1 for c, j in pool}
        terms.append(-scores[(b, i)] + math.log(sum(math.exp(v) for v in scores.values())))
        correct += max(scores, key=scores.get) == (b, i)
    assert loss.item() == pytest.approx(sum(terms) / len(terms), rel=1e-5)
    assert accuracy(acc) == pytest.approx(correct / len(terms))


def test_coco_lm_losses_match_loops():
    from tacl.objectives.coco_lm import copy_loss, corrective_lm_loss, sequence_contrastive_loss

    g = torch.Generator().manual_seed(0)
    copy_logits = torch.randn(3, 6, generator=g, dtype=torch.float64)
    original = torch.rand(3, 6, generator=g) < 0.7
    valid = torch.ones(3, 6, dtype=torch.bool)
    valid[2, 4:] = False
    loss, _ = copy_loss(copy_logits, original, valid)
    def p_copy(b, i):
        return 1 / (1 + math.exp(-copy_logits[b, i]))

    terms = [-math.log(p_copy(b, i) if original[b, i] else 1 - p_copy(b, i))
             for b in range(3) for i in range(6) if valid[b, i]]
    assert loss.item() == pytest.approx(sum(terms) / len(terms), rel=1e-6)

    lm_logits = torch.randn(7, 11, generator=g, dtype=torch.float64, requires_grad=True)
    copy_sel = torch.randn(7, generator=g, dtype=torch.float64, requires_grad=True)
    targets = torch.tensor([3, 5, 0, 10, 2, -100, -100])
    corrupted = torch.tensor([3, 4, 0, 1, 2, 0, 0])  # positions 0, 2, 4: the auxiliary model sampled the original
    loss, _ = corrective_lm_loss(lm_logits, copy_sel, corrupted, targets)
    terms = []
    for k in range(5):
        p1 = 1 / (1 + math.exp(-copy_sel[k].item()))
        p_lm = torch.softmax(lm_logits[k].detach(), -1)[targets[k]].item()
        terms.append(-math.log((p1 if corrupted[k] == targets[k] else 0.0) + (1 - p1) * p_lm))
    assert loss.item() == pytest.approx(sum(terms) / 5, rel=1e-6)
    loss.backward()
    assert copy_sel.grad is None, "the copy probability is a stop-gradient weight in L_LM"
    assert lm_logits.grad[5:].abs().sum() == 0 and lm_logits.grad[:5].abs().sum() > 0

    a = torch.randn(4, 5, generator=g, dtype=torch.float64)
    b = torch.randn(4, 5, generator=g, dtype=torch.float64)
    for group in (None, 2):  # negatives: the other rows of the group (None: of the micro-batch)
        loss, _ = sequence_contrastive_loss(a, b, tau=1.0, group=group)
        size = group or 4
        sims = [[cos(a[i], b[j]) for j in range(4)] for i in range(4)]
        mates = [[j for j in range(4) if j // size == i // size] for i in range(4)]
        forward = [-sims[i][i] + math.log(sum(math.exp(sims[i][j]) for j in mates[i])) for i in range(4)]
        backward = [-sims[j][j] + math.log(sum(math.exp(sims[i][j]) for i in mates[j])) for j in range(4)]
        assert loss.item() == pytest.approx((sum(forward) + sum(backward)) / 8, rel=1e-6), group


def test_coco_lm_crop_view_is_a_contiguous_share_between_cls_and_sep():
    from tacl.objectives.coco_lm import crop_view

    ids = torch.zeros(3, 16, dtype=torch.long)
    lengths = [16, 12, 5]
    for b, n in enumerate(lengths):
        ids[b, :n] = torch.tensor([101] + list(range(1000 + 100 * b, 1000 + 100 * b + n - 2)) + [102])
    types = (torch.arange(16) >= 6).long().expand(3, -1).clone()
    attention = (torch.arange(16)[None, :] < torch.tensor(lengths)[:, None]).long()
    starts = {b: set() for b in range(3)}
    for seed in range(60):
        view, vtypes, vmask = crop_view(ids, types, attention, 0.9, 0, torch.Generator().manual_seed(seed))
        for b, n in enumerate(lengths):
            c = n - 2
            m = math.ceil(0.9 * c)
            row = view[b, : m + 2].tolist()
            assert row[0] == 101 and row[-1] == 102 and vmask[b].tolist() == [1] * (m + 2) + [0] * (16 - m - 2)
            body = row[1:-1]
            assert body == list(range(body[0], body[0] + m)), "contiguous"
            assert 1000 + 100 * b <= body[0] and body[-1] <= 1000 + 100 * b + c - 1
            starts[b].add(body[0] - 1000 - 100 * b)
            assert (view[b, m + 2:] == 0).all() and (vtypes[b, m + 2:] == 0).all()
    assert starts[0] == {0, 1} and starts[1] == {0, 1} and starts[2] == {0}  # every start in [0, c - m] is drawn


def test_coco_lm_samples_follow_the_auxiliary_distribution():
    from tacl.objectives.coco_lm import sample_rows

    probs = torch.tensor([[0.5, 0.0, 0.2, 0.3], [0.0, 0.0, 0.0, 1.0]])
    draws = torch.stack([sample_rows(probs, torch.Generator().manual_seed(i)) for i in range(4000)])
    share = torch.bincount(draws[:, 0], minlength=4).float() / 4000
    assert (share - probs[0]).abs().max() < 0.03 and share[1] == 0
    assert (draws[:, 1] == 3).all()


# -- TaCL with attention-weighted tokens ---------------------------------------------------------------------------


def received_reference(hidden, wq, bq, wk, bk, heads, valid):
    """The attention each token receives, by loops: explicit softmax over the real keys of each query, per head."""
    bsz, length, _ = hidden.shape
    d = wq.shape[0] // heads
    q, k = hidden @ wq.T + bq, hidden @ wk.T + bk
    received = [[0.0] * length for _ in range(bsz)]
    for b in range(bsz):
        keys = [j for j in range(length) if valid[b, j]]
        for h in range(heads):
            part = slice(h * d, (h + 1) * d)
            for i in keys:  # the real query tokens
                scores = {j: float(q[b, i, part] @ k[b, j, part]) / math.sqrt(d) for j in keys}
                top = max(scores.values())
                denom = sum(math.exp(s - top) for s in scores.values())
                for j in keys:
                    received[b][j] += math.exp(scores[j] - top) / denom / heads
    return received


def test_tacl_attn_loss_matches_loops():
    """The weighted loss from random tensors: explicit attention probabilities of a layer's own query and key
    projections, the weights |M| a_i^p / sum a^p, and each anchor's log-softmax term, all by loops."""
    from tacl.objectives.tacl_attn import attention_received, token_weights

    g = torch.Generator().manual_seed(5)
    student, teacher, valid, special, anchors = random_batch(5)
    bsz, length, _ = student.shape
    heads, width = 2, 6
    x = torch.randn(bsz, length, width, generator=g, dtype=torch.float64)
    wq, wk = (torch.randn(width, width, generator=g, dtype=torch.float64) for _ in range(2))
    bq, bk = (torch.randn(width, generator=g, dtype=torch.float64) for _ in range(2))
    received = attention_received(x, wq, bq, wk, bk, heads, valid[:, None, None, :], valid)
    ref_received = received_reference(x, wq, bq, wk, bk, heads, valid)
    torch.testing.assert_close(received, torch.tensor(ref_received, dtype=torch.float64), rtol=1e-9, atol=1e-12)
    n_real = valid.sum(1)
    torch.testing.assert_close(received.sum(1), n_real.double())  # every real query's row sums to 1
    candidates = valid & ~special
    tau = 0.5
    masked = [(b, i) for b in range(bsz) for i in range(length) if anchors[b, i]]
    for power in (1.0, 2.5):
        weights = token_weights(received, anchors, power)
        norm = sum(ref_received[b][i] ** power for b, i in masked)
        ref_weights = {(b, i): len(masked) * ref_received[b][i] ** power / norm for b, i in masked}
        terms = []
        for b, i in masked:
            sims = {j: cos(student[b, i], teacher[b, j]) / tau for j in range(length) if candidates[b, j]}
            log_softmax = sims[i] - math.log(sum(math.exp(v) for v in sims.values()))
            terms.append(-ref_weights[(b, i)] * log_softmax)
        loss, _ = tacl_loss(student, teacher, anchors, candidates, tau, weights)
        assert loss.item() == pytest.approx(sum(terms) / len(masked), rel=1e-6)  # (the cosines in fp32)
        assert [weights[b, i].item() for b, i in masked] == pytest.approx(list(ref_weights.values()), rel=1e-9)
        assert weights[~anchors].abs().sum() == 0


def test_tacl_attn_weights_sum_to_the_masked_count():
    from tacl.objectives.tacl_attn import token_weights

    g = torch.Generator().manual_seed(0)
    anchors = torch.rand(4, 30, generator=g) < 0.2
    anchors[1] = False  # a sequence without a masked token
    received = torch.rand(4, 30, generator=g) * 3
    for power in (0.0, 1.0, 3.0, 200.0):  # (a large power would overflow a^p without the scaling)
        w = token_weights(received, anchors, power)
        assert torch.isfinite(w).all() and w.dtype == torch.float32
        assert w.sum().item() == pytest.approx(anchors.sum().item(), rel=1e-5)
        assert (w[~anchors] == 0).all()
    assert (token_weights(received, anchors, 0.0)[anchors] == 1).all(), "power 0: every token alike"
    assert token_weights(received, torch.zeros_like(anchors), 1.0).abs().sum() == 0, "no anchor: no weight"
    grouped = token_weights(received, anchors, 2.0, group=2)  # each group of 2 sequences weighs its own tokens
    for first in (0, 2):
        assert grouped[first : first + 2].sum().item() == pytest.approx(anchors[first : first + 2].sum().item())
        alone = token_weights(received[first : first + 2], anchors[first : first + 2], 2.0)
        torch.testing.assert_close(grouped[first : first + 2], alone)


def tiny_pretraining_batch(seed: int = 0):
    """A student, a teacher with other weights, and a micro-batch as the loader makes it (padding, [CLS]/[SEP],
    masked positions, fixed-length gather list)."""
    from transformers import BertConfig, BertForPreTraining, BertModel

    from tacl.data.pretraining import masked_positions

    config = BertConfig(vocab_size=60, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=32, attn_implementation="sdpa")
    torch.manual_seed(seed)
    student, teacher = BertForPreTraining(config), BertModel(config, add_pooling_layer=False)
    teacher.requires_grad_(False)
    with torch.no_grad():  # sharper attention than a fresh BERT's (nearly uniform at this size)
        for layer in teacher.encoder.layer:
            layer.attention.self.query.weight.mul_(30.0)
    g = torch.Generator().manual_seed(seed)
    _, _, valid, special, anchors = random_batch(seed, bsz=4, length=12)
    clean = torch.where(valid, torch.randint(5, 60, valid.shape, generator=g), 0)
    clean = torch.where(special, 3, clean)
    labels = torch.where(anchors, clean, -100)
    batch = {"clean_ids": clean, "input_ids": torch.where(anchors, 4, clean), "token_type_ids": torch.zeros_like(clean),
             "attention_mask": valid.long(), "special_tokens_mask": special, "mlm_mask": anchors,
             "nsp_labels": torch.tensor([0, 1, 0, 1]), **masked_positions(labels.numpy())}
    return student, teacher, batch


@pytest.mark.parametrize("negatives", ["real", "batch"])
def test_tacl_attn_uniform_is_tacl_exactly_and_attention_weights_matter(negatives):
    """weighting uniform: TaCL's loss and gradient, bit for bit; power 0 goes through the weighted path with every
    weight 1 (equal within rounding); the attention weights give another loss."""
    from tacl.objectives.tacl import TaCL
    from tacl.objectives.tacl_attn import TaCLAttn

    student, teacher, batch = tiny_pretraining_batch()

    def run(objective):
        student.zero_grad()
        torch.manual_seed(0)  # (the student's dropout)
        losses, metrics = objective(student, teacher, batch, torch.Generator())
        losses["tacl"].backward()
        return losses["tacl"].detach(), [p.grad.clone() for p in student.parameters() if p.grad is not None], metrics

    tacl, tacl_grads, _ = run(TaCL(tau=0.1, negatives=negatives))
    uniform, uniform_grads, metrics = run(TaCLAttn(tau=0.1, negatives=negatives, weighting="uniform"))
    assert torch.equal(uniform, tacl) and all(torch.equal(a, b) for a, b in zip(uniform_grads, tacl_grads))
    assert "tacl_weight_ess" not in metrics
    flat, _, metrics = run(TaCLAttn(tau=0.1, negatives=negatives, power=0.0))
    assert flat.item() == pytest.approx(tacl.item(), rel=1e-6) and accuracy(metrics["tacl_weight_ess"]) == 1.0
    weighted, _, metrics = run(TaCLAttn(tau=0.1, negatives=negatives, power=4.0))
    assert abs(weighted.item() - tacl.item()) > 1e-4 * tacl.item() and accuracy(metrics["tacl_weight_ess"]) < 1.0


def test_tacl_attn_weights_are_the_teachers_own_attention():
    """The objective's weights from the teacher's layer (one SDPA pass, the layer's attention recomputed) equal
    those from the same teacher's attention probabilities as eager attention returns them."""
    from transformers import BertModel

    from tacl.objectives.tacl_attn import TaCLAttn, token_weights

    _, teacher, batch = tiny_pretraining_batch(1)
    config = copy.deepcopy(teacher.config)
    config._attn_implementation = "eager"
    eager = BertModel(config, add_pooling_layer=False).eval()
    eager.load_state_dict(teacher.state_dict())
    real = batch["attention_mask"].bool()
    with torch.no_grad():
        probs = eager(input_ids=batch["clean_ids"], token_type_ids=batch["token_type_ids"],
                      attention_mask=batch["attention_mask"], output_attentions=True).attentions
    for layer in (1, 2, -1):
        with torch.inference_mode():
            h, weights = TaCLAttn(layer=layer).teacher_side(teacher.eval(), batch, {})
        p = probs[layer - 1 if layer > 0 else layer]  # [B, heads, query, key]
        received = (p.mean(1) * real[:, :, None]).sum(1)
        torch.testing.assert_close(weights, token_weights(received, batch["mlm_mask"], 1.0), rtol=1e-5, atol=1e-6)
        assert h.shape == (4, 12, 16)


def test_tacl_attn_bad_settings_name_the_key(tmp_path):
    from transformers import BertConfig

    from tacl.objectives.tacl_attn import TaCLAttn
    from tacl.runtime.io import InputError

    BertConfig(num_hidden_layers=2).save_pretrained(tmp_path)
    for layer in (1, 2, -1, -2):
        TaCLAttn(layer=layer).check(str(tmp_path))
    for layer in (3, -3):
        with pytest.raises(InputError, match=rf"pretrain.tacl_attn.layer: {layer}, but the start model has 2 layers"):
            TaCLAttn(layer=layer).check(str(tmp_path))
    with pytest.raises(InputError, match="pretrain.tacl_attn.weighting: 'softmax' is not one of attention, uniform"):
        TaCLAttn(weighting="softmax")
    with pytest.raises(InputError, match="pretrain.tacl_attn.power: -1.0 is negative"):
        TaCLAttn(power=-1.0)
    with pytest.raises(InputError, match="pretrain.tacl_attn.layer: 0 is not a layer"):
        TaCLAttn(layer=0)
