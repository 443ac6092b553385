"""A step computes the same loss on any machine: the micro-batch (2, 4 or 8 sequences of a global batch of 8,
length grouping on), and with it the accumulation steps, the number of ranks and the GPU model, change how a
step is computed, never what: for every objective, with dropout off, the step's loss terms, accuracy counts
and gradient are the same (the trainer's own averaging: each micro-batch's loss over the step's number of
micro-batches, as DeepSpeed divides by the accumulation steps and averages over ranks). The packed layout
gives them too. The DeepSpeed runs on 1 and 2 ranks are in tests/test_pretrain.py.

Tolerance (fp32, tiny random BERT): loss terms within rtol 1e-5; every gradient entry within rtol 1e-4 and
atol 1e-5 x the largest entry (float reordering only: other padded widths, other summation orders).
"""

from __future__ import annotations

import pytest
import torch

from conftest import run_params
from test_packing import models
from tacl.data.masking import MaskingSpec
from tacl.data.pretraining import Batching, PretrainingData
from tacl.data.shards import ShardSet
from tacl.objectives import GroupDraws, objective_draws
from tacl.objectives.registry import OBJECTIVES

GLOBAL, GROUP, STEP = 8, 2, 8  # (step 8: micro-batches of width 40 and 64 at micro-batch 2, 64 at 8)


@pytest.fixture(scope="module")
def shards_and_spec(demo_data):
    from tacl.runtime.hub import load_tokenizer

    return (ShardSet(str(demo_data["manifest"]), verify=False),
            MaskingSpec.from_tokenizer(load_tokenizer(str(demo_data["start"])), 64))


def step_terms(demo_data, shards_and_spec, objective: str, micro: int, packing: bool = False,
               step_means: bool = True):
    """One optimizer step at this micro-batch: the step's loss terms, accuracy counts and gradient.
    `step_means` False: each micro-batch its own mean (what the losses computed before step_counts)."""
    shards, spec = shards_and_spec
    data = PretrainingData(shards, spec, 3, Batching(GLOBAL, micro, True, packing=packing, max_len=64))
    student, teacher, obj = models(demo_data, objective, run_params(objective, GROUP))
    trainable = [p for m in (student, obj) if isinstance(m, torch.nn.Module) for p in m.parameters()]
    micro_batches = GLOBAL // micro
    terms, counts = {}, {}
    for j in range(micro_batches):
        batch = data.micro_batch(STEP, j)
        if not step_means:
            del batch["step_counts"]
        draws = GroupDraws(torch.Generator(), lambda group: 1000 + group, first=j * micro)
        losses, metrics = obj(student, teacher, batch, objective_draws(obj, batch, draws))
        (sum(losses.values()) / micro_batches).backward()
        for k, v in losses.items():
            terms[k] = terms.get(k, 0.0) + v.item() / micro_batches
        for k, v in metrics.items():
            counts[k] = counts.get(k, 0) + v
    grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in trainable]
    return terms, counts, grads


def assert_same_step(got, ref):
    (terms, counts, grads), (ref_terms, ref_counts, ref_grads) = got, ref
    assert terms.keys() == ref_terms.keys()
    for k in terms:
        assert terms[k] == pytest.approx(ref_terms[k], rel=1e-5), k
    for k in counts:
        torch.testing.assert_close(counts[k], ref_counts[k], rtol=1e-5, atol=0, msg=k)
    scale = max(g.abs().max() for g in ref_grads)
    assert scale > 0
    for g, ref in zip(grads, ref_grads):
        torch.testing.assert_close(g, ref, rtol=1e-4, atol=1e-5 * scale)


@pytest.mark.parametrize("objective", OBJECTIVES)
def test_every_micro_batch_computes_the_same_step(demo_data, shards_and_spec, objective):
    ref = step_terms(demo_data, shards_and_spec, objective, GLOBAL)
    for micro in (2, 4):
        assert_same_step(step_terms(demo_data, shards_and_spec, objective, micro), ref)
    if objective != "tacl_attn":  # (its weights come from the padded layout: not packable)
        assert_same_step(step_terms(demo_data, shards_and_spec, objective, 2, packing=True), ref)


def test_micro_batch_means_would_weigh_the_masked_tokens_unevenly(demo_data, shards_and_spec):
    """The check above can fail: with each micro-batch's own mean, as before the step's counts, the length
    grouping's short and long micro-batches weigh a masked token differently, and the gradient moves."""
    ref = step_terms(demo_data, shards_and_spec, "mlm_nsp", GLOBAL)
    assert_same_step(step_terms(demo_data, shards_and_spec, "mlm_nsp", GLOBAL, step_means=False), ref)
    with pytest.raises(AssertionError):
        assert_same_step(step_terms(demo_data, shards_and_spec, "mlm_nsp", 2, step_means=False), ref)


def test_the_step_counts_are_those_of_its_micro_batches(demo_data, shards_and_spec):
    shards, spec = shards_and_spec
    data = PretrainingData(shards, spec, 3, Batching(GLOBAL, 2, True, max_len=64))
    batches = [data.micro_batch(STEP, j) for j in range(GLOBAL // 2)]
    masked = sum(int(b["mlm_mask"].sum()) for b in batches)
    tokens = sum(int(b["attention_mask"].sum()) for b in batches)
    for b in batches:
        assert b["step_counts"].tolist() == [masked, tokens, GLOBAL // 2]
        assert b["draw_width"] == 64  # (the draws' width: the run's widest micro-batch, not this one's)
    assert min(b["attention_mask"].shape[1] for b in batches) < 64
