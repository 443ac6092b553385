"""Packed micro-batches (no padding): the layout holds the padded batch's sequences and masks; for every
objective, the packed loss terms and gradients equal the padded reference's on the same sequences, under the
sync guard; a packed run resumes bit for bit.

Tolerance (fp32, tiny random BERT, dropout off in both layouts: its draws depend on the layout): every loss
term within rtol 1e-4, atol 1e-6 of the padded one (measured: equal to the last bit for all five objectives),
the accuracy counts equal, every gradient entry within rtol 1e-4 and atol 1e-6 x the largest gradient entry
(measured worst: 1.1e-5 absolute on TACO against a largest entry of 8.1, i.e. 1.4e-6; float reordering only:
per-sequence attention instead of masked attention, other summation orders).
"""

from __future__ import annotations

import contextlib
import dataclasses
import math

import numpy as np
import pytest
import torch

from conftest import run_params
from sync_guard import SyncGuard
from test_step import env  # noqa: F401 (the module's gloo process group)
from tacl.data.masking import MaskingSpec, max_share
from tacl.data.pretraining import Batching, PretrainingData
from tacl.data.shards import ShardSet
from tacl.objectives import build_objective, objective_draws, seeded_draws
from tacl.objectives.packed import use_packed_attention
from tacl.objectives.registry import packing_error

OBJECTIVES = ("mlm_nsp", "tacl", "tacl_batch", "taco", "coco_lm")


@pytest.fixture(scope="module")
def data(demo_data):
    from tacl.runtime.hub import load_tokenizer

    tokenizer = load_tokenizer(str(demo_data["start"]))
    shards = ShardSet(str(demo_data["manifest"]), verify=False)
    # no length grouping: micro-batch 1 of step 5 holds sequences of 28, 42, 64 and 64 tokens
    return PretrainingData(shards, MaskingSpec.from_tokenizer(tokenizer, 64), 3, Batching(8, 4, False))


def twins(data, step=5, j=1):
    """A micro-batch padded, and packed (as the loader builds it with `packing` on)."""
    packing = PretrainingData(data.shards, data.spec, data.seed, dataclasses.replace(data.batching, packing=True))
    return data.micro_batch(step, j), packing.micro_batch(step, j)


def test_the_packed_layout_holds_the_padded_batch(data):
    padded, packed = twins(data)
    attention = padded["attention_mask"].bool()
    lengths = attention.sum(1)
    assert packed["lengths"] == tuple(lengths.tolist()) and packed["max_seqlen"] == int(lengths.max())
    assert (lengths < attention.shape[1]).any(), "the fixture has padding"
    cu = packed["cu_seqlens"]
    assert cu.tolist() == [0, *lengths.cumsum(0).tolist()]
    for key in ("input_ids", "clean_ids", "token_type_ids", "special_tokens_mask"):
        row = packed["special_tokens_packed" if key == "special_tokens_mask" else key][0]
        assert row.shape == (int(lengths.sum()),)
        for b, n in enumerate(lengths.tolist()):  # sequence b, without its padding, at cu[b]
            assert torch.equal(row[cu[b] : cu[b] + n], padded[key][b, :n]), key
        assert torch.equal(padded[key].flatten()[packed["unpad_index"]], row)
    for b, n in enumerate(lengths.tolist()):
        assert packed["position_ids"][0, cu[b] : cu[b] + n].tolist() == list(range(n))
    valid = padded["mlm_targets"] >= 0
    assert torch.equal(packed["input_ids"][0][packed["mlm_index"][valid]],
                       padded["input_ids"].flatten()[padded["mlm_index"][valid]])
    assert torch.equal(packed["mlm_targets"], padded["mlm_targets"])
    first = packed["clean_ids"][0][cu[:-1]]
    assert (first == padded["clean_ids"][:, 0]).all() and len(set(first.tolist())) == 1  # every [CLS]


def models(demo_data, objective: str, params: dict, packed: bool = True):
    """Student (dropout off: its draws depend on the layout), teacher and objective, packed attention on
    (`packed`; else SDPA as a padded run has it)."""
    from tacl.pretrain.model import load_student, load_teacher

    torch.manual_seed(0)
    objective_ = build_objective(objective, params)
    student = load_student(str(demo_data["start"]))
    teacher = load_teacher(str(demo_data["start"])) if objective_.needs_teacher else None
    if hasattr(objective_, "attach"):
        objective_.check(str(demo_data["start"]))
        objective_.attach(str(demo_data["start"]), student)
    modules = [student, teacher, objective_ if isinstance(objective_, torch.nn.Module) else None]
    if packed:
        use_packed_attention(*modules)
    for m in modules:
        if m is not None:
            m.eval()
    return student, teacher, objective_


def loss_and_grads(student, teacher, objective, batch, guard):
    trainable = [p for m in (student, objective) if isinstance(m, torch.nn.Module) for p in m.parameters()]
    for p in trainable:
        p.grad = None
    generator = torch.Generator().manual_seed(11)
    with guard:
        losses, metrics = objective(student, teacher, batch, objective_draws(objective, batch, seeded_draws(generator)))
        sum(losses.values()).backward()
    grads = [p.grad.clone() if p.grad is not None else torch.zeros_like(p) for p in trainable]
    return {k: v.detach() for k, v in losses.items()}, metrics, grads


@pytest.mark.parametrize("objective, negatives", [(o, None) for o in OBJECTIVES] + [("tacl", "all")])
def test_packed_loss_and_gradients_equal_the_padded_ones(demo_data, data, objective, negatives):
    """(tacl with negatives all: [CLS] and [SEP] among the negatives, never padding, so packed batches take it.)"""
    params = run_params(objective, group=2) | ({"negatives": negatives} if negatives else {})
    student, teacher, obj = models(demo_data, objective, params)
    padded, packed = twins(data)
    ref_losses, ref_metrics, ref_grads = loss_and_grads(student, teacher, obj, padded, contextlib.nullcontext())
    losses, metrics, grads = loss_and_grads(student, teacher, obj, packed, SyncGuard("cpu"))
    assert losses.keys() == ref_losses.keys()
    for term in losses:
        torch.testing.assert_close(losses[term], ref_losses[term], rtol=1e-4, atol=1e-6, msg=term)
    for name in metrics:  # accuracy counts: the same positions, the same decisions
        assert torch.equal(metrics[name], ref_metrics[name]), name
    scale = max(ref.abs().max() for ref in ref_grads)
    assert scale > 0
    for g, ref in zip(grads, ref_grads):
        torch.testing.assert_close(g, ref, rtol=1e-4, atol=1e-6 * scale)


def test_varlen_attention_gets_the_packed_row_as_flash_attention_wants_it(demo_data, data, monkeypatch):
    """The CUDA path's call, checked on the CPU: varlen_attn replaced by a per-sequence reference that takes
    the call as the installed torch's varlen_attn would (its real signature: names, order, keywords) and
    asserts its arguments ([T, heads, d] tensors, int32 cumulative lengths, host ints): the loss is the
    padded one."""
    import inspect

    import torch.nn.functional as F

    from tacl.objectives import packed as packed_module

    real = packed_module._varlen_attn()
    if real is None:
        pytest.skip(f"torch {torch.__version__} has no varlen_attn taking `scale` (the packed path uses SDPA)")
    padded, packed = twins(data)
    calls = []

    def varlen_attn(*args, **kwargs):
        given = inspect.signature(real).bind(*args, **kwargs).arguments  # (a TypeError if the call does not fit)
        q, k, v, cu_q, cu_k, max_q, max_k = (given[n] for n in ("query", "key", "value", "cu_seq_q", "cu_seq_k",
                                                               "max_q", "max_k"))
        scale = given.get("scale")
        assert q.dim() == 3 and q.shape == k.shape == v.shape and q.shape[0] == packed["cu_seqlens"][-1]
        assert cu_q.dtype == torch.int32 and torch.equal(cu_q, cu_k) and torch.equal(cu_q.long(), packed["cu_seqlens"])
        assert type(max_q) is int and max_q == max_k == max(packed["lengths"])
        calls.append(1)
        bounds = cu_q.tolist()
        return torch.cat([F.scaled_dot_product_attention(*(x[a:b].transpose(0, 1) for x in (q, k, v)),
                                                         scale=scale).transpose(0, 1)
                          for a, b in zip(bounds, bounds[1:])])

    monkeypatch.setattr(packed_module, "VARLEN", varlen_attn)
    monkeypatch.setattr(packed_module, "use_varlen", lambda query: True)
    student, _, objective = models(demo_data, "mlm_nsp", {})
    with torch.no_grad():
        reference, _ = objective(student, None, padded, torch.Generator())
        losses, _ = objective(student, None, packed, torch.Generator())
    assert len(calls) == student.config.num_hidden_layers
    for term in losses:
        torch.testing.assert_close(losses[term], reference[term], rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("objective", ["tacl_attn", "taco", "coco_lm"])  # (every encoder and path)
def test_a_micro_batch_without_padding_runs_attention_without_a_mask(demo_data, data, monkeypatch, objective):
    """The loader's host flag `no_padding` (set where every sequence is as long as the micro-batch is wide):
    every SDPA call of the encoders (student, teacher, COCO-LM's auxiliary model) gets no mask, so that a GPU
    may run flash attention, with no read from the device (under the sync guard), and the losses, counts and
    gradients are the masked path's (the same batch with the flag off). A micro-batch with padding keeps the
    mask. (COCO-LM's cropped views have padding: masked either way.)"""
    import torch.nn.functional as F

    from tacl.data.tensors import as_tensors
    from tacl.objectives import NO_PADDING

    lengths = data.shards.lengths(data.locate(np.arange(len(data.shards)))[1])
    full = as_tensors(data.arrays(np.flatnonzero(lengths == 64)[:4]))
    assert full[NO_PADDING] is True and full["attention_mask"].all()
    assert data.micro_batch(5, 1)[NO_PADDING] is False  # (28, 42, 64 and 64 tokens)
    sdpa, masks = F.scaled_dot_product_attention, []

    def spy(*args, **kwargs):
        masks.append(kwargs.get("attn_mask", args[3] if len(args) > 3 else None))
        return sdpa(*args, **kwargs)

    monkeypatch.setattr(F, "scaled_dot_product_attention", spy)
    student, teacher, obj = models(demo_data, objective, run_params(objective, group=2), packed=False)
    ref_losses, ref_metrics, ref_grads = loss_and_grads(student, teacher, obj, {**full, NO_PADDING: False},
                                                        contextlib.nullcontext())
    assert masks and all(m is not None for m in masks)
    calls = len(masks)
    losses, metrics, grads = loss_and_grads(student, teacher, obj, full, SyncGuard("cpu"))
    unmasked = masks[calls:]
    assert len(unmasked) == calls
    # every encoder's layers without a mask; COCO-LM's cropped views (the main model's last pass) with one
    views = student.config.num_hidden_layers if objective == "coco_lm" else 0
    assert all(m is None for m in unmasked[: calls - views]) and all(m is not None for m in unmasked[calls - views:])
    for term in losses:
        torch.testing.assert_close(losses[term], ref_losses[term], rtol=1e-5, atol=1e-6, msg=term)
    for name in metrics:
        assert torch.equal(metrics[name], ref_metrics[name]), name
    scale = max(ref.abs().max() for ref in ref_grads)
    for g, ref in zip(grads, ref_grads):
        torch.testing.assert_close(g, ref, rtol=1e-5, atol=1e-6 * scale)


def test_a_packed_batch_on_a_model_without_packed_attention_is_refused(demo_data, data):
    from tacl.pretrain.model import load_student

    student = load_student(str(demo_data["start"]))
    with pytest.raises(RuntimeError, match="use_packed_attention"):
        build_objective("mlm_nsp")(student, None, twins(data)[1], torch.Generator())


def test_only_tacl_attn_refuses_packing():
    why = packing_error("tacl_attn", {})
    assert why.startswith("pretrain.packing:") and "tacl_attn" in why
    assert all(packing_error(o, {"negatives": "all"}) is None for o in OBJECTIVES)


def test_packed_resume_is_bit_exact(demo_data, tmp_path, env):  # noqa: F811 (the fixture imported above)
    """TACO, packed, in this process under the sync guard: 2 steps, a save, a fresh chunk resuming from it
    for 2 more steps: the losses and weights of the 4-step run without a break, bit for bit."""
    from test_step import step

    from tacl.data.pretraining import MicroBatches, micro_batch_loader
    from tacl.pretrain.settings import TrainSettings
    from tacl.pretrain.trainer import ChunkArgs, _save, _setup
    from tacl.runtime.lock import RunLock

    s = TrainSettings(objective="taco", steps=4, global_batch=8, micro_batch=4, lr=2e-3, seed=3, max_len=64,
                      zero_stage=0, precision="fp32", loader_workers=0, device="cpu", log_every=1, packing=True,
                      group_by_length=False, objective_params=run_params("taco"))

    def chunk_losses(run, steps):
        lock = RunLock(run)
        chunk = _setup(ChunkArgs(str(run), str(demo_data["start"]), str(demo_data["manifest"]), s,
                                 tensorboard=False), env, lock)
        batches = micro_batch_loader(MicroBatches(chunk.data, chunk.step, s.steps, chunk.accumulation, 0, 1), 0,
                                     False)
        got = [step(chunk, batches, env, SyncGuard("cpu")) for _ in range(steps)]
        _save(chunk)
        lock.release()
        return got, {k: v.clone() for k, v in chunk.engine.module.state_dict().items()}

    whole, whole_weights = chunk_losses(tmp_path / "whole", 4)
    first, _ = chunk_losses(tmp_path / "chunks", 2)
    second, weights = chunk_losses(tmp_path / "chunks", 2)
    assert first + second == whole and all(math.isfinite(v["taco"]) for v in whole)
    assert whole_weights.keys() == weights.keys()
    assert all(torch.equal(whole_weights[k], weights[k]) for k in weights)


def test_the_step_counts_use_the_runs_masking_rate(data):
    """The counts a micro-batch carries (the losses' denominators) are those of its masks at the run's rate
    (pretrain.mlm_probability, else the start model's family's)."""
    for rate in (0.15, 0.3):
        spec = dataclasses.replace(data.spec, mlm_prob=rate, max_predictions=int(max_share(rate) * 64))
        one = PretrainingData(data.shards, spec, data.seed, Batching(8, 8, False))
        batch = one.micro_batch(2, 0)
        candidates = int((batch["attention_mask"].bool() & ~batch["special_tokens_mask"]).sum())
        assert int(batch["step_counts"][0]) == int(batch["mlm_mask"].sum())
        assert abs(int(batch["mlm_mask"].sum()) / candidates - rate) < 0.02
