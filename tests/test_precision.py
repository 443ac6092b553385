"""bf16 without losing precision where it matters: the losses and the fine-tuning heads compute in fp32 under
autocast, AdamW's step counts land on the parameters' device after a universal-checkpoint load, and a
checkpoint without fp32 masters is not exported as if it had them."""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from tacl.runtime.io import InputError

MATMULS = {torch.ops.aten.mm.default, torch.ops.aten.bmm.default, torch.ops.aten.addmm.default,
           torch.ops.aten.baddbmm.default,
           torch.ops.aten._embedding_bag_per_sample_weights_backward.default}  # (TACO's gathered dot products)


class MatmulDtypes(TorchDispatchMode):
    """The output dtype of every matrix product computed inside."""

    def __init__(self):
        super().__init__()
        self.dtypes = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func in MATMULS:
            self.dtypes.append(out.dtype)
        return out


def loss_cases():
    from tacl.finetune.contrastive import contrastive_loss
    from tacl.objectives.coco_lm import corrective_lm_loss, sequence_contrastive_loss
    from tacl.objectives.mlm_nsp import mlm_loss
    from tacl.objectives.taco import taco_loss
    from tacl.objectives.tacl import supervised_tacl_loss, tacl_batch_loss, tacl_loss

    g = torch.Generator().manual_seed(0)
    b, length, hidden, vocab = 3, 6, 16, 40
    student, teacher = (torch.randn(b, length, hidden, generator=g) for _ in range(2))
    anchors = torch.rand(b, length, generator=g) < 0.5
    anchors[:, 0] = True
    valid = torch.ones(b, length, dtype=torch.bool)
    index = torch.tensor([0, 3, 7, 12])
    targets = torch.tensor([5, 7, 9, -100])
    labels = torch.tensor([0, 1, 0])
    return {  # each: (a function of the floating-point inputs giving the loss, the inputs)
        "tacl_loss": (lambda s, t: tacl_loss(s, t, anchors, valid, 0.01)[0], (student, teacher)),
        "tacl_batch_loss": (lambda s, t: tacl_batch_loss(s, t, index, targets, valid, 0.01)[0], (student, teacher)),
        "supervised_tacl_loss": (lambda s, t: supervised_tacl_loss(s, t, torch.tensor([[1, 2, -100, 1, 0, 2]] * 3),
                                                                   0.1)[0], (student, teacher)),
        "taco_loss": (lambda g: taco_loss(g, valid, torch.ones(b, length, dtype=torch.long),
                                          torch.arange(b * length * 4).remainder(b * length).view(b, length, 4),
                                          0.07)[0], (torch.nn.functional.normalize(student, dim=-1),)),
        "mlm_loss": (lambda logits: mlm_loss(logits, targets)[0], (torch.randn(4, vocab, generator=g),)),
        "sequence_contrastive_loss": (lambda s, t: sequence_contrastive_loss(s[:, 0], t[:, 0], 1.0)[0],
                                      (student, teacher)),
        "corrective_lm_loss": (lambda s: corrective_lm_loss(s.flatten(0, 1)[:4, :10].repeat(1, 4), s[0, :4, 0],
                                                            torch.tensor([5, 1, 9, 0]), targets)[0], (student,)),
        "contrastive_loss kl": (lambda s: contrastive_loss("kl", s[:, 0], labels, 0.3), (student,)),
        "contrastive_loss scl": (lambda s: contrastive_loss("scl", s[:, 0], labels, 0.3), (student,)),
    }


@pytest.mark.parametrize("name", list(loss_cases()))
def test_losses_compute_in_fp32_under_bf16_autocast(name):
    """bf16 inputs inside bf16 autocast (the ZeRO 0 trainer, fine-tuning): every matrix product of the loss
    (the similarity logits) is fp32, and the loss equals the one computed outside autocast on the same
    (bf16-rounded) inputs, bit for bit."""
    loss, inputs = loss_cases()[name]
    low = [x.bfloat16() for x in inputs]
    spy = MatmulDtypes()
    with torch.autocast("cpu", dtype=torch.bfloat16), spy:
        got = loss(*low)
    plain = loss(*(x.float() for x in low))
    assert got.dtype == torch.float32 and torch.equal(got, plain), (got, plain)
    if name not in ("mlm_loss", "corrective_lm_loss"):  # (no product of their own: given the logits)
        assert spy.dtypes and set(spy.dtypes) == {torch.float32}, spy.dtypes


def test_without_in_fp32_autocast_would_compute_the_similarities_in_bf16():
    """What the decorator prevents: the same loss body, undecorated, computes its logits in bf16 under autocast
    although it calls `.float()` first."""
    from tacl.objectives.tacl import tacl_loss

    student, teacher = torch.randn(2, 5, 8), torch.randn(2, 5, 8)
    spy = MatmulDtypes()
    with torch.autocast("cpu", dtype=torch.bfloat16), spy:
        tacl_loss.__wrapped__(student, teacher, torch.ones(2, 5, dtype=torch.bool),
                              torch.ones(2, 5, dtype=torch.bool), 0.01)
    assert spy.dtypes == [torch.bfloat16]


@pytest.mark.parametrize("auto, kwargs, output", [
    ("AutoModelForQuestionAnswering", {}, "start_logits"),
    ("AutoModelForSequenceClassification", {"num_labels": 1, "problem_type": "regression"}, "logits"),
    ("AutoModelForTokenClassification", {"num_labels": 5}, "logits"),
])
def test_task_heads_compute_in_fp32_under_bf16_autocast(demo_data, auto, kwargs, output):
    """SQuAD's start/end logits (and so its null scores), STS-B's regression output: fp32 under autocast, where
    the same model loaded without `heads_in_fp32` gives bf16."""
    import transformers

    from tacl.finetune.common import load_task_model, pad_batch, to_device

    cls = getattr(transformers, auto)
    batch = to_device(pad_batch([{"input_ids": [101, 2023, 102], "token_type_ids": [0, 0, 0],
                                  "attention_mask": [1, 1, 1]}], 0), torch.device("cpu"))
    ours = load_task_model(cls, str(demo_data["start"]), 0, **kwargs).eval()
    plain = cls.from_pretrained(str(demo_data["start"]), attn_implementation="sdpa", **kwargs).eval()
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        assert getattr(ours(**batch), output).dtype == torch.float32
        assert getattr(plain(**batch), output).dtype == torch.bfloat16


def test_adamw_steps_go_to_the_parameters_device():
    """DeepSpeed's universal-checkpoint loader sets `step` as the CPU tensor it saved; a fused AdamW wants a
    float32 tensor on the parameter's device, where PyTorch's own load_state_dict puts it. (On this CPU-only
    machine the GPU is played by the `meta` device.)"""
    from tacl.pretrain.checkpoint import place_steps

    on_gpu = torch.nn.Parameter(torch.empty(3, device="meta"))
    opt = torch.optim.AdamW([on_gpu], lr=0.1)
    opt.param_groups[0]["fused"] = True
    opt.state[on_gpu] = {"step": torch.tensor(7.0), "exp_avg": torch.zeros(3, device="meta")}
    assert place_steps(opt) == 1
    assert opt.state[on_gpu]["step"].device.type == "meta" and opt.state[on_gpu]["step"].dtype == torch.float32
    assert place_steps(opt) == 0
    # a real fused AdamW (on the CPU): a float64 step or a plain number becomes float32, and it steps with it
    fused = torch.nn.Parameter(torch.randn(3))
    real = torch.optim.AdamW([fused], lr=0.1, fused=True)
    fused.grad = torch.ones(3)
    real.step()
    for step in (torch.tensor(7.0, dtype=torch.float64), 7):
        real.state[fused]["step"] = step
        assert place_steps(real) == 1 and torch.equal(real.state[fused]["step"], torch.tensor(7.0))
    real.step()
    assert float(real.state[fused]["step"]) == 8.0
    # an unfused optimizer keeps its step where PyTorch keeps it (on the CPU)
    plain = torch.nn.Parameter(torch.randn(3))
    unfused = torch.optim.AdamW([plain], lr=0.1)
    unfused.state[plain] = {"step": torch.tensor(7.0)}
    assert place_steps(unfused) == 0


def test_export_refuses_a_checkpoint_without_fp32_masters(tmp_path):
    """A ZeRO 0 checkpoint whose module holds bf16 weights (what DeepSpeed's own bf16 at ZeRO 0 saves) is not
    silently upcast and exported as if those were the fp32 masters."""
    from tacl.pretrain.model import checkpoint_state_dict

    (tmp_path / "step00000002").mkdir()
    torch.save({"module": {"model.bert.pooler.dense.weight": torch.ones(2, 2, dtype=torch.bfloat16)}},
               tmp_path / "step00000002" / "mp_rank_00_model_states.pt")
    with pytest.raises(InputError, match=r"mp_rank_00_model_states.pt: weights in torch.bfloat16 "
                                         r"\(model.bert.pooler.dense.weight, ...\), not the fp32 masters"):
        checkpoint_state_dict(tmp_path, "step00000002")
