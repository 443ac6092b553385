"""The training step as it runs on a GPU, checked on the CPU with the real DeepSpeed engine, in this process:
no host-device synchronisation in `optimizer_step` (tests/sync_guard.py) for every objective, bf16 against
fp32 at ZeRO 0 and 1 (optimizer class, losses, exported fp32 masters), DeepSpeed's throughput timer off, a
non-finite gradient stopping the run at the step it happened, and a fine-tuning loop without syncs.

Tolerance of bf16 against fp32 (3 steps, tiny random BERT, lr 2e-3): MLM and NSP terms within 0.2% (measured
at most 0.03%), every other loss term within 0.05 * max(1, |fp32|) (measured at most 0.009 on TaCL's 0.064,
tau 0.01, and 0.11 on TACO's 3.5 at ZeRO 1, where h - e of this untrained 2-layer model cancels in bf16).
"""

from __future__ import annotations

import contextlib
import math
import os
import re
import threading
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import MINILM, TINY_BERT, run_params
from sync_guard import HostSync, SyncGuard
from tacl.data.packing import pack_sequences
from tacl.data.pretraining import MicroBatches, micro_batch_loader, on_device, pack
from tacl.data.tensors import as_tensors
from tacl.objectives import seeded_draws
from tacl.objectives.registry import OBJECTIVES
from tacl.pretrain import checkpoint
from tacl.pretrain.model import checkpoint_state_dict
from tacl.pretrain.settings import TrainSettings
from tacl.pretrain.trainer import ChunkArgs, Meter, NonFiniteGradient, _save, _setup, optimizer_step
from tacl.runtime.lock import RunLock

STEPS = 3  # DeepSpeed's throughput timer synchronises from its third step on
STRICT_TERMS = ("mlm", "nsp", "aux_mlm")
# DeepSpeed's own host reads in its ZeRO optimizer's step (DeepSpeedZeroOptimizer.step, ZeRO 1 on an fp32
# model), per optimizer step: its overflow checks (is_invalid_grad_norm, twice) and scalars made on the device
# (mask_nan_or_inf_with_val_inplace, three times), 5 in all. What the GPU benchmark names "DeepSpeed's".
DEEPSPEED_SYNCS = {"is_invalid_grad_norm", "clip_tensors_by_global_norm", "mask_nan_or_inf_with_val_inplace"}
ZERO_1_SYNCS = 5


@pytest.fixture(scope="module")
def env():
    """One gloo process group of one rank for the module; the environment is restored afterwards (a RANK
    left behind would stop `tacl pretrain train --nproc 2` in a later test from starting its ranks)."""
    import torch.distributed as dist

    from tacl.pretrain.distributed import free_port, init_distributed

    saved = dict(os.environ)
    os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(free_port()))
    yield init_distributed("cpu")
    if dist.is_initialized():  # through DeepSpeed where it ran: it forgets its cached groups (a later module's
        import deepspeed.comm as ds  # engine would use the world group of this one, destroyed)

        (ds.destroy_process_group if getattr(ds.comm, "cdb", None) is not None else dist.destroy_process_group)()
    os.environ.clear()
    os.environ.update(saved)


def start(demo_data, tmp_path, env, objective, zero_stage=0, precision="fp32", steps=STEPS, **settings):
    s = TrainSettings(objective=objective, steps=steps, global_batch=8, micro_batch=4, lr=2e-3, seed=3, max_len=64,
                      zero_stage=zero_stage, precision=precision, loader_workers=0, device="cpu",
                      log_every=1, objective_params=run_params(objective), **settings)
    run = tmp_path / f"{objective}-{zero_stage}-{precision}"
    chunk = _setup(ChunkArgs(str(run), str(demo_data["start"]), str(demo_data["manifest"]), s,
                             tensorboard=False), env, RunLock(run))
    batches = micro_batch_loader(MicroBatches(chunk.data, 0, steps, chunk.accumulation, 0, 1), 0, False)
    return chunk, batches


def step(chunk, batches, env, guard: SyncGuard) -> dict[str, float]:
    """One optimizer step under the guard; its loss terms (read after it, as the trainer does at a log line)."""
    meter = Meter()
    with guard:
        optimizer_step(chunk, batches, meter)
    chunk.step += 1
    return {k: v for k, v in meter.read(env).items() if k != "tokens_per_s" and not k.endswith("_acc")}


def deepspeeds(stack) -> bool:
    return any(f.filename.endswith("deepspeed/runtime/zero/stage_1_and_2.py") and f.name == "step" for f in stack)


def weights(chunk) -> dict[str, torch.Tensor]:
    return {name: p.detach().clone() for name, p in chunk.engine.module.named_parameters()}


@pytest.fixture(scope="module")
def fp32_runs(demo_data, tmp_path_factory, env):
    """fp32 at ZeRO 0 (the CPU's default), each objective, every step under the guard: no sync at all. Each
    objective's losses per step, and its weights after the last step."""
    out = {}
    for objective in OBJECTIVES:
        chunk, batches = start(demo_data, tmp_path_factory.mktemp("fp32"), env, objective)
        out[objective] = [step(chunk, batches, env, SyncGuard("cpu")) for _ in range(STEPS)], weights(chunk)
    return out


@pytest.fixture(scope="module")
def fp32_losses(fp32_runs):
    return {objective: losses for objective, (losses, _) in fp32_runs.items()}


@pytest.mark.parametrize("zero_stage", [0, 1])
@pytest.mark.parametrize("objective", OBJECTIVES)
def test_bf16_step_computes_in_bf16_has_no_host_sync_and_exports_fp32_masters(
        demo_data, tmp_path, env, fp32_losses, monkeypatch, objective, zero_stage):
    """bf16 at every ZeRO stage: autocast over fp32 weights (the same numerics whatever the stage), with
    PyTorch's fused AdamW at ZeRO 0 and not one sync, DeepSpeed's ZeRO optimizer at ZeRO 1, whose only syncs
    are its own, in its step. The student's matmuls inside the DeepSpeed engine run in bf16 with
    `torch.is_autocast_enabled()` answering as on CUDA (for the autocast in force: on the CPU it answers for
    CUDA's, and DeepSpeed, which asks it, would leave an outer autocast on), and the chunk records what they
    ran in."""
    from deepspeed.accelerator import get_accelerator
    from deepspeed.runtime.zero.stage_1_and_2 import DeepSpeedZeroOptimizer

    from tacl.pretrain.trainer import check_compute_dtype

    synchronized = []
    monkeypatch.setattr(get_accelerator(), "synchronize", lambda *a, **k: synchronized.append(1))
    is_autocast_enabled = torch.is_autocast_enabled
    monkeypatch.setattr(torch, "is_autocast_enabled", lambda *a: is_autocast_enabled(*(a or ("cpu",))))
    chunk, batches = start(demo_data, tmp_path, env, objective, zero_stage, "bf16")
    engine = chunk.engine
    weights = next(engine.module.model.parameters())
    assert chunk.bf16 and engine.module.autocast == "cpu" and weights.dtype == torch.float32
    assert isinstance(engine.optimizer, torch.optim.AdamW if zero_stage == 0 else DeepSpeedZeroOptimizer)
    assert all(g["fused"] for g in engine.basic_optimizer.param_groups)
    ran_in = []  # the dtype of every linear layer's output in the student's forward, through engine(...)
    hooks = [m.register_forward_hook(lambda m, i, o: ran_in.append(o.dtype))
             for m in engine.module.model.modules() if isinstance(m, torch.nn.Linear)]
    for s, reference in enumerate(fp32_losses[objective]):
        guard = SyncGuard("cpu", allow=deepspeeds if zero_stage else None)
        got = step(chunk, batches, env, guard)
        if s == 0:
            for hook in hooks:
                hook.remove()
            assert ran_in and set(ran_in) == {torch.bfloat16}, set(ran_in)
            assert check_compute_dtype(chunk) == "bfloat16"
        named = {where.split(" in ")[-1] for where in guard.allowed}
        assert named <= DEEPSPEED_SYNCS and sum(guard.allowed.values()) == (ZERO_1_SYNCS if zero_stage else 0), \
            guard.allowed
        assert got.keys() == reference.keys()
        for term, value in got.items():
            assert math.isfinite(value), (s, term)
            tolerance = 2e-3 * abs(reference[term]) if term in STRICT_TERMS else 0.05 * max(1.0, abs(reference[term]))
            assert abs(value - reference[term]) <= tolerance, (s, term, value, reference[term])
    assert not synchronized, "DeepSpeed's throughput timer synchronised the device"

    # the export: fp32 masters (not the bf16 weights the model computes with at ZeRO 1)
    _save(chunk)
    exported = checkpoint_state_dict(Path(chunk.args.run_dir) / checkpoint.CHECKPOINTS, checkpoint.tag_for(STEPS))
    key = "bert.encoder.layer.0.attention.self.query.weight"
    if zero_stage == 0:
        master = engine.module.model.state_dict()[key]
    else:
        from deepspeed.utils import safe_get_full_fp32_param

        master = safe_get_full_fp32_param(engine.module.model.bert.encoder.layer[0].attention.self.query.weight)
    assert all(v.dtype == torch.float32 for v in exported.values())
    assert torch.equal(exported[key], master)
    assert not torch.equal(exported[key], exported[key].bfloat16().float()), "not representable in bf16"


def test_a_run_that_says_bf16_and_computes_in_fp32_stops(demo_data, tmp_path, env):
    """The check behind each chunk's recorded matmul dtype: an fp32 computation labelled bf16 stops the run."""
    from tacl.pretrain.trainer import check_compute_dtype

    chunk, batches = start(demo_data, tmp_path, env, "mlm_nsp", steps=1)
    step(chunk, batches, env, contextlib.nullcontext())
    assert check_compute_dtype(chunk) == "float32"
    chunk.bf16 = True
    with pytest.raises(RuntimeError, match="precision bf16, but the student's matmuls ran in torch.float32"):
        check_compute_dtype(chunk)


def test_throughput_timer_is_off_and_its_synchronize_would_be_counted(demo_data, tmp_path, env, monkeypatch):
    """DeepSpeed's throughput timer (on by default, synchronized) synchronises the device in every forward and
    step from its third step on; ds_config turns it off. Turned back on, the same count sees it."""
    from deepspeed.accelerator import get_accelerator

    synchronized = []
    monkeypatch.setattr(get_accelerator(), "synchronize", lambda *a, **k: synchronized.append(1))
    chunk, batches = start(demo_data, tmp_path, env, "mlm_nsp", steps=6)
    for _ in range(3):
        step(chunk, batches, env, SyncGuard("cpu"))
    assert synchronized == []
    timer = chunk.engine.tput_timer.config
    timer.enabled = timer.synchronized = True  # what DeepSpeed does by default
    for _ in range(3):
        step(chunk, batches, env, SyncGuard("cpu"))
    # from the timer's third step on: at the start of each micro-batch's forward and in each engine.step()
    assert len(synchronized) == 2 * chunk.accumulation


@pytest.mark.parametrize("what, code", [
    ("item()", lambda t: t.sum().item()),
    ("tolist()", lambda t: t.tolist()),
    ("cpu()", lambda t: t.cpu()),
    ("bool(tensor)", lambda t: bool(t.sum() > 0)),
    ("float(tensor)", lambda t: float(t.sum())),
    ("nonzero", lambda t: (t > 0).nonzero()),
    ("torch.where(condition)", lambda t: torch.where(t > 0)),
    ("boolean-mask indexing", lambda t: t[t > 0]),
    ("boolean-mask indexing", lambda t: t.__setitem__(t > 0, 0.0)),
    ("indexing with a Python list", lambda t: t[[0, 2]]),
    ("torch.tensor(<Python data>, device=cpu)", lambda t: torch.tensor([1.0, 2.0], device=t.device)),
    ("masked_select", lambda t: t.masked_select(t > 0)),
    ("unique", lambda t: t.unique()),
])
def test_the_guard_refuses_what_would_synchronise_a_gpu(what, code):
    t = torch.randn(4, 3)
    with pytest.raises(HostSync, match=rf"host-device synchronisation: {re.escape(what)}.* at .*test_step.py"):
        with SyncGuard("cpu"):
            code(t)


def test_the_guard_lets_device_side_work_through():
    t = torch.randn(4, 3)
    with SyncGuard("cpu"):
        t.masked_fill(t > 0, 0.0).gather(1, torch.zeros(4, 1, dtype=torch.long)).sum()
        torch.where(t > 0, t, 0.0)
        torch.tensor([1.0, 2.0])  # a host tensor, meant to stay there
        t.nonzero_static(size=12)  # a fixed shape


def test_the_guard_catches_an_item_injected_into_a_loss(demo_data, tmp_path, env, monkeypatch):
    """The guard around the trainer's own step fails when a loss reads a value on the host."""
    from tacl.objectives import mlm_nsp

    nsp_loss = mlm_nsp.nsp_loss

    def reads_on_the_host(logits, labels):
        loss, acc = nsp_loss(logits, labels)
        loss.item()
        return loss, acc

    monkeypatch.setattr(mlm_nsp, "nsp_loss", reads_on_the_host)
    chunk, batches = start(demo_data, tmp_path, env, "tacl")
    with pytest.raises(HostSync, match=r"item\(\) at .*test_step.py:\d+ in reads_on_the_host"):
        step(chunk, batches, env, SyncGuard("cpu"))


def inject_inf(chunk, at_step: int):
    """An inf gradient on one weight of the student in optimizer step `at_step` (1-based)."""
    weight = chunk.engine.module.model.bert.encoder.layer[0].attention.self.query.weight
    return weight.register_hook(lambda g: g * float("inf") if chunk.step + 1 == at_step else g)


def test_deepspeed_skipping_a_non_finite_step_stops_the_run_naming_it(demo_data, tmp_path, env):
    """bf16 at ZeRO 1: DeepSpeed skips the update of a step whose gradient is inf, without telling; the trainer
    stops there (its step counter and the LR schedule would drift otherwise), before anything is saved."""
    chunk, batches = start(demo_data, tmp_path, env, "mlm_nsp", zero_stage=1, precision="bf16", steps=4)
    inject_inf(chunk, 3)
    for _ in range(2):
        step(chunk, batches, env, SyncGuard("cpu", allow=deepspeeds))
    lr_steps = chunk.scheduler.last_epoch
    with pytest.raises(NonFiniteGradient, match=r"pretraining mlm_nsp, optimizer step 3: the gradient is not finite "
                                                 r"\(inf or nan\); DeepSpeed skipped its update. The run stopped "
                                                 r"without saving; its latest checkpoint \(none\) is intact"):
        step(chunk, batches, env, SyncGuard("cpu", allow=deepspeeds))
    assert chunk.step == 2 and chunk.scheduler.last_epoch == lr_steps and chunk.engine.skipped_steps == 1


@pytest.mark.parametrize("grad_clip", [1.0, 0.0])
def test_a_non_finite_gradient_at_zero_0_stops_at_the_next_log_or_save(demo_data, tmp_path, env, grad_clip):
    """ZeRO 0 (the trainer clips, or only measures the norm without clipping): the first non-finite step is
    noted on the device, without a host read in the step, and named when the trainer next reads (a log line)
    or would save."""
    chunk, batches = start(demo_data, tmp_path, env, "mlm_nsp", precision="bf16", steps=4, grad_clip=grad_clip)
    inject_inf(chunk, 2)
    for _ in range(3):
        step(chunk, batches, env, SyncGuard("cpu"))
    with pytest.raises(NonFiniteGradient, match=r"optimizer step 2: the gradient is not finite \(inf or nan\); its "
                                                 r"update was applied"):
        _save(chunk)
    assert not (Path(chunk.args.run_dir) / checkpoint.CHECKPOINTS).exists()


def loop_reads(stack) -> bool:
    """The fine-tuning loop's reads that are not per step: the mean loss of a log line (every LOG_EVERY steps,
    `Progress.add`) and of the training record (once, after the last step, `_record`)."""
    return any(f.name in ("add", "_record") and f.filename.endswith(os.path.join("finetune", "common.py"))
               and f.line.lstrip().startswith(("log.info(\"fine-tune step %d/%d: mean loss", "\"final_loss\""))
               for f in stack)


@pytest.mark.parametrize("shapes", ["exact", "buckets"])
def test_fine_tune_loop_has_no_host_sync(demo_data, tokenizer, monkeypatch, shapes):
    """The whole fine-tuning loop (`train`: batches made and copied, each step, the loss kept) of a classifier
    with the supervised contrastive term, a regression and a QA model, in bf16 autocast, under the guard,
    `torch.is_autocast_enabled()` answering as on CUDA (for the autocast in force; on the CPU it answers for
    CUDA's): 5 rows at batch 2, 3 steps, a log line every 2: the only host reads are the log line's and the
    record's, once each, whatever the number of steps; AdamW creates its state in the first step without one."""
    from transformers import AutoModelForQuestionAnswering, AutoModelForSequenceClassification

    from tacl.finetune import common
    from tacl.finetune.common import Run, load_task_model, train
    from tacl.finetune.contrastive import contrastive_loss

    is_autocast_enabled = torch.is_autocast_enabled
    monkeypatch.setattr(torch, "is_autocast_enabled", lambda *a: is_autocast_enabled(*(a or ("cpu",))))
    monkeypatch.setattr(common, "LOG_EVERY", 2)
    run = Run(torch.device("cpu"), bf16=True, buckets=shapes == "buckets")
    hp = {"lr": 1e-3, "weight_decay": 0.01, "warmup_ratio": 0.1, "grad_clip": 1.0, "batch": 2, "epochs": 1,
          "max_len": 64}
    enc = tokenizer(SENTENCES[:5], ["b"] * 5)
    rows = [{k: enc[k][i] for k in ("input_ids", "token_type_ids", "attention_mask")} for i in range(5)]

    def extra(model, batch, outputs):
        return 0.9 * contrastive_loss("scl", outputs.hidden_states[-1][:, 0], batch["labels"], 0.3)

    for auto, kwargs, labels, extra_loss in (
            (AutoModelForSequenceClassification, {"num_labels": 2}, {"labels": [0, 1, 0, 1, 1]}, extra),
            (AutoModelForSequenceClassification, {"num_labels": 1, "problem_type": "regression"},
             {"labels": [0.5, 1.0, 2.0, 3.5, 4.0]}, None),
            (AutoModelForQuestionAnswering, {}, {"start_positions": [1, 2, 0, 1, 3], "end_positions": [2, 3, 0, 1, 3]},
             None)):
        model = load_task_model(auto, str(demo_data["start"]), 0, **kwargs)
        guard = SyncGuard("cpu", allow=loop_reads)
        with guard:
            record = train(model, [{**r, **{k: v[i] for k, v in labels.items()}} for i, r in enumerate(rows)], hp, 0,
                           run, tokenizer.pad_token_id, extra_loss=extra_loss, task_weight=0.1 if extra_loss else 1.0)
        assert record["steps"] == 3 and math.isfinite(record["final_loss"])
        assert sorted(guard.allowed.values()) == [1, 1] and all("common.py" in k for k in guard.allowed), guard.allowed


SENTENCES = ["a short one", "a somewhat longer sentence here", "and a third", "four", "five words in a row",
             "the longest of these sentences, by a margin of several words and then a few more at its end", "seven",
             "eight is short too", "nine"]


@pytest.mark.parametrize("task", ["classification+scl", "regression", "qa", "tokens"])
def test_bucketed_batches_give_exact_paddings_losses_and_predictions(demo_data, tokenizer, task):
    """finetune.shapes buckets against exact: the same fine-tune (dropout off, fp32; 9 rows at batch 4 for an
    epoch, so the last batch has one real row and three ignored ones) has the same training losses
    and the same predictions within float rounding (and so the same argmax), for a classifier with the
    supervised contrastive term, a regression, a QA model and a token classifier; the batches are of the
    bucket widths and full, with more padding."""
    from transformers import (AutoModelForQuestionAnswering, AutoModelForSequenceClassification,
                              AutoModelForTokenClassification)

    from tacl.finetune import common
    from tacl.finetune.common import Run, load_task_model, predict, train
    from tacl.finetune.contrastive import contrastive_loss

    enc = tokenizer(SENTENCES, ["b"] * len(SENTENCES))
    rows = [{k: enc[k][i] for k in ("input_ids", "token_type_ids", "attention_mask")} for i in range(9)]
    n = [len(r["input_ids"]) for r in rows]
    auto, kwargs, extra, outputs = AutoModelForSequenceClassification, {"num_labels": 2}, None, lambda o: (o.logits,)
    if task == "classification+scl":
        labels = {"labels": [i % 2 for i in range(9)]}
        kwargs["problem_type"] = "single_label_classification"

        def extra(model, batch, out):
            return 0.9 * contrastive_loss("scl", out.hidden_states[-1][:, 0], batch["labels"], 0.3)
    elif task == "regression":
        labels = {"labels": [0.5 * i for i in range(9)]}
        kwargs = {"num_labels": 1, "problem_type": "regression"}
    elif task == "qa":
        auto, kwargs, outputs = AutoModelForQuestionAnswering, {}, lambda o: (o.start_logits, o.end_logits)
        labels = {"start_positions": [i % k for i, k in enumerate(n)], "end_positions": [k - 2 for k in n]}
    else:
        auto, kwargs = AutoModelForTokenClassification, {"num_labels": 3}
        labels = {"labels": [[-100] + [(i + j) % 3 for j in range(k - 2)] + [-100] for i, k in enumerate(n)]}
    train_rows = [{**r, **{k: v[i] for k, v in labels.items()}} for i, r in enumerate(rows)]
    hp = {"lr": 1e-3, "weight_decay": 0.01, "warmup_ratio": 0.1, "grad_clip": 1.0, "batch": 4, "epochs": 1,
          "max_len": 64, "group_by_length": False}
    shapes, steps = [], []
    pad_batch = common.pad_batch

    def recorded(*args, **kw):
        batch = pad_batch(*args, **kw)
        shapes.append(tuple(batch["input_ids"].shape))
        return batch

    def fine_tune(buckets, monkeypatch):
        run = Run(torch.device("cpu"), bf16=False, buckets=buckets)
        model = load_task_model(auto, str(demo_data["start"]), 0, hidden_dropout_prob=0.0,
                                attention_probs_dropout_prob=0.0, **kwargs)
        shapes.clear()
        with monkeypatch.context() as m:
            m.setattr(common, "pad_batch", recorded)
            m.setattr(common, "train_step", lambda *a, **k: steps.append(step(*a, **k)) or steps[-1])
            record = train(model, train_rows, hp, 0, run, tokenizer.pad_token_id, extra_loss=extra,
                           task_weight=0.1 if extra else 1.0)
            trained = list(shapes)
            predicted = predict(model, rows, run, tokenizer.pad_token_id, 2, outputs,
                                per_token=task in ("qa", "tokens"), max_len=64)
        return record, trained, list(shapes[len(trained):]), predicted

    step = common.train_step
    with pytest.MonkeyPatch.context() as monkeypatch:
        monkeypatch.setattr(common, "EVAL_TOKENS", 128)  # (8 rows of 16 tokens, 4 of 32)
        exact = fine_tune(False, monkeypatch)
        exact_losses = [float(x) for x in steps]
        steps.clear()
        bucketed = fine_tune(True, monkeypatch)
        bucketed_losses = [float(x) for x in steps]
    assert len(exact_losses) == len(bucketed_losses) == 3
    assert bucketed_losses == pytest.approx(exact_losses, rel=1e-4, abs=1e-6)
    assert bucketed[0]["final_loss"] == pytest.approx(exact[0]["final_loss"], rel=1e-4)
    assert bucketed[0]["padding"] > exact[0]["padding"]
    assert {s[0] for s in exact[1]} == {4, 1} and len({s[1] for s in exact[1]}) > 2
    assert set(bucketed[1]) <= {(4, 16), (4, 32)} and (4, 16) in bucketed[1] and (4, 32) in bucketed[1]
    assert len(exact[2]) == 5 and bucketed[2] == [(4, 32), (8, 16)]
    for ours, reference in zip(bucketed[3], exact[3]):
        for a, b in zip(ours, reference):
            if task == "qa":  # (span scores up to a constant: AdamW turns the qa_outputs bias's gradient, zero but
                a, b = a - a.mean(), b - b.mean()  # for rounding, into a step that shifts every position alike)
            np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)
            assert np.array_equal(a.argmax(-1), b.argmax(-1))


@pytest.fixture
def compiled_with(monkeypatch):
    """`pretrain.compile: true` compiled with this torch.compile backend (in a test: "aot_eager", dynamo's
    tracing and AOTAutograd's joint graph without inductor's code generation: the same graph breaks,
    recompilations and autograd tracing in seconds rather than inductor's minutes on a CPU; "eager" would skip
    AOTAutograd, where the teacher's inference_mode used to fail); dynamo's caches, counters and compilation
    metrics start empty."""
    from torch._dynamo.utils import clear_compilation_metrics, counters

    from tacl.pretrain.trainer import Pretrainer

    compile_losses = Pretrainer.compile_losses

    def use(backend):
        monkeypatch.setattr(Pretrainer, "compile_losses",
                            lambda self, teacher=None: compile_losses(self, teacher, backend))
        torch._dynamo.reset()
        counters.clear()
        clear_compilation_metrics()
        return counters

    yield use
    torch._dynamo.reset()


# packed, the objectives with code of their own for a packed batch (tacl_attn reads the teacher's padded
# attention and packs nothing): mlm is mlm_nsp's without the pooled NSP head, tacl_batch TaCL's with other
# negatives on the same padded layout, each compiled padded below
PACKED = ("mlm_nsp", "tacl", "taco", "coco_lm")


@pytest.fixture(scope="module")
def one_layer(demo_data, tmp_path_factory, tokenizer_dir):
    """demo_data with a start model of one layer (TINY_BERT's otherwise): dynamo and AOTAutograd trace each
    layer's forward anew, the same code for every layer, so one layer goes through all of the encoder's code
    (its graph breaks and guards included) in half the encoder's share of the tracing time."""
    from tacl.pretrain.model import init_start_model

    start_dir = tmp_path_factory.mktemp("one_layer") / "start"
    init_start_model(MINILM, {**TINY_BERT, "layers": 1}, str(tokenizer_dir), str(start_dir))
    return {**demo_data, "start": start_dir}


@pytest.mark.parametrize("objective, packing", [(o, False) for o in OBJECTIVES] + [(o, True) for o in PACKED])
def test_compiled_step_has_one_graph_over_every_width_and_the_eager_losses(one_layer, tmp_path, env, compiled_with,
                                                                          objective, packing):
    """pretrain.compile: the student's forward and the objective's loss (the teacher's pass, TACO's hidden
    states, COCO-LM's draws and crops included), padded and packed, trace through AOTAutograd as one graph
    with no graph break, compiled once for micro-batches of several widths and numbers of masked positions
    (dynamic shapes), and give the eager step's losses (3 steps at lr 2e-3: the gradients of the first two
    are in the last two losses) within rel 1e-5. Padded, the loader's host flag `no_padding` (attention
    without a mask) makes a second graph, no more: one with the mask, one without, each for every width.
    Each graph is traced once (no restart of dynamo's analysis: the modules' floats are constants).
    (A start model of one layer: `one_layer`; the eager reference is the same model's, computed here.)"""
    reference, loader = start(one_layer, tmp_path / "eager", env, objective, packing=packing)
    eager = [step(reference, loader, env, contextlib.nullcontext()) for _ in range(STEPS)]
    counters = compiled_with("aot_eager")
    chunk, batches = start(one_layer, tmp_path, env, objective, compile=True, packing=packing)
    assert chunk.engine.module.compiled
    # (not under the guard: dynamo leaves every frame uncompiled while a dispatch mode such as the guard's is on)
    got = [step(chunk, batches, env, contextlib.nullcontext()) for _ in range(STEPS)]
    masked = {chunk.data.micro_batch(s, j)["mlm_index"].shape[0] for s in range(STEPS) for j in range(2)}
    # then micro-batches of other widths (the demo's first steps are all 64 wide), forward and backward
    lengths = chunk.data.shards.lengths(chunk.data.locate(np.arange(len(chunk.data.shards)))[1])
    widths, unpadded = set(), set()
    # widths 24, 40 and 56 with padding; 32 without (the steps' own micro-batches without padding are 64 wide)
    for top, exact in ((24, False), (40, False), (56, False), (32, True)):
        positions = np.flatnonzero(lengths == top if exact else (lengths <= top) & (lengths > top - 8))[:4]
        arrays = {**chunk.data.arrays(positions), "step_counts": chunk.data.step_counts(0),  # (as micro_batch)
                  "draw_width": chunk.data.batching.draw_width(0)}
        packed = pack(pack_sequences(arrays) if packing else as_tensors(arrays))  # (as the loader delivers it)
        batch = on_device(packed, torch.device("cpu"))  # (host values too)
        (unpadded if batch.get("no_padding") else widths).add(batch["input_ids"].shape[1])
        masked.add(batch["mlm_index"].shape[0])
        chunk.engine.backward(chunk.engine(batch, chunk.teacher, seeded_draws(chunk.generator))[0])
    # (packed: the row's number of tokens, no flag)
    assert (widths, unpadded) == ({24, 40, 56}, {32}) if not packing else len(widths) == 4
    assert dict(counters["graph_break"]) == {}
    assert len(masked) >= 2, masked  # (the number of masked positions varies too)
    graphs = 1 if packing else 2  # (padded: with and without the mask)
    assert counters["frames"]["total"] == counters["frames"]["ok"] == graphs, counters  # no other compilation
    assert counters["stats"]["unique_graphs"] == graphs, counters
    restarts = [sorted(m.restart_reasons or ()) for m in torch._dynamo.utils.get_compilation_metrics()]
    assert restarts == [[]] * graphs, restarts
    assert chunk.engine.module.compiled  # (no failure sent it on eager)
    for s, (value, reference) in enumerate(zip(got, eager)):
        assert value.keys() == reference.keys()
        for term in value:
            assert value[term] == pytest.approx(reference[term], rel=1e-5, abs=1e-6), (s, term)


def test_a_compilation_that_fails_inside_inference_mode_goes_on_eager_and_trains(demo_data, tmp_path, env,
                                                                                 fp32_runs, compiled_with,
                                                                                 monkeypatch, caplog):
    """The failure seen on a GPU: the teacher's pass under torch.inference_mode inside the compiled region (as
    TaCL's once was) makes AOTAutograd fail and leaves its thread's dispatcher state behind; the first
    micro-batch compiles in a thread of its own, before any optimizer step, so the eager retry of the same
    micro-batch trains in a thread that the failure never touched (before, in the same thread, it died: "Hit
    PythonDispatcher dispatch key but PythonDispatcherTLS was not set", on an H200 "Inference tensors cannot
    be saved for backward"): an uncompiled chunk, dynamo reset, the eager run's losses and weights bit for
    bit."""
    from tacl.objectives.tacl import TaCL

    teacher_side = TaCL.teacher_side

    def in_inference_mode(self, teacher, batch, metrics):
        with torch.inference_mode():
            h, weights = teacher_side(self, teacher, batch, metrics)
        return h.clone(), weights  # (as the code was: ordinary tensors for the backward)

    monkeypatch.setattr(TaCL, "teacher_side", in_inference_mode)
    resets = []
    monkeypatch.setattr(torch.compiler, "reset", lambda reset=torch.compiler.reset: (resets.append(1), reset()))
    compiled_with("aot_eager")
    chunk, batches = start(demo_data, tmp_path, env, "tacl", compile=True)
    included = torch._C._dispatch_tls_local_include_set()  # (read to check: the code never touches them)
    with caplog.at_level("WARNING", logger="tacl.pretrain"):
        got = [step(chunk, batches, env, contextlib.nullcontext()) for _ in range(STEPS)]
    warnings = [r.getMessage() for r in caplog.records if "torch.compile failed" in r.getMessage()]
    assert len(warnings) == 1 and "inference tensor" in warnings[0], warnings
    assert not chunk.engine.module.compiled and resets == [1]
    assert not torch.is_inference_mode_enabled() and torch._C._dispatch_tls_local_include_set() == included
    losses, eager = fp32_runs["tacl"]
    assert got == losses
    assert all(torch.equal(w, eager[name]) for name, w in weights(chunk).items())


def test_a_failed_compilation_or_a_trial_out_of_memory_goes_on_eager_saying_so_once(
        demo_data, tmp_path, env, fp32_runs, compiled_with, caplog):
    """A backend that fails (as inductor without a C compiler or Triton would): one warning, and the chunk goes
    on uncompiled with the same losses and weights as an eager run (the micro-batch is computed again,
    reseeded). A trial that runs out of memory (inductor's autotuning can, and the trial holds the whole
    gradient at once, which no ZeRO step does) goes on uncompiled the same way, saying so, rather than
    failing every retry of the chunk."""

    def broken(graph, inputs):
        raise RuntimeError("no working C compiler")

    compiled_with(broken)
    chunk, batches = start(demo_data, tmp_path, env, "taco", compile=True)
    with caplog.at_level("WARNING", logger="tacl.pretrain"):
        got = [step(chunk, batches, env, contextlib.nullcontext()) for _ in range(STEPS)]
    warnings = [r.getMessage() for r in caplog.records if "torch.compile failed" in r.getMessage()]
    assert len(warnings) == 1 and "no working C compiler" in warnings[0] and "uncompiled" in warnings[0]
    assert not chunk.engine.module.compiled
    losses, eager = fp32_runs["taco"]
    assert got == losses
    assert all(torch.equal(w, eager[name]) for name, w in weights(chunk).items())

    def out_of_memory(graph, inputs):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    caplog.clear()
    compiled_with(out_of_memory)
    chunk, batches = start(demo_data, tmp_path / "oom", env, "taco", compile=True)
    with caplog.at_level("WARNING", logger="tacl.pretrain"):
        got = [step(chunk, batches, env, contextlib.nullcontext()) for _ in range(STEPS)]
    warnings = [r.getMessage() for r in caplog.records if "torch.compile failed" in r.getMessage()]
    assert len(warnings) == 1 and "the compile trial ran out of memory (CUDA out of memory" in warnings[0]
    assert not chunk.engine.module.compiled and got == losses
    assert all(torch.equal(w, eager[name]) for name, w in weights(chunk).items())


def test_a_compilation_failing_after_the_start_goes_on_eager_on_one_rank_and_stops_where_it_cannot(
        demo_data, tmp_path, env, compiled_with, caplog):
    """A compilation failing after the chunk's start (an unexpected recompilation; here the compiled call made to
    raise inductor's error in its forward, then in its backward) cannot be agreed between ranks without a
    collective in every step: failing in the forward, several ranks stop, naming pretrain.compile: false;
    failing in the backward, the chunk stops on any number of ranks (DeepSpeed's backward has begun); one rank
    failing in the forward goes on uncompiled, with one warning."""
    import dataclasses

    from torch._inductor.exc import InductorError

    from tacl.pretrain.trainer import CompileFailedMidRun

    def broken():
        return InductorError(RuntimeError("no working C compiler"), None)

    class FailingBackward(torch.autograd.Function):
        @staticmethod
        def forward(ctx, loss):
            return loss.clone()

        @staticmethod
        def backward(ctx, grad):
            raise broken()

    compiled_with("aot_eager")
    chunk, batches = start(demo_data, tmp_path, env, "mlm_nsp", steps=5, compile=True, packing=True)  # (one graph)
    step(chunk, batches, env, contextlib.nullcontext())
    module, fails = chunk.engine.module, []
    compiled = module.losses

    def losses(*args):
        if fails == ["forward"]:
            raise broken()
        loss, terms, metrics = compiled(*args)
        return FailingBackward.apply(loss) if fails == ["backward"] else loss, terms, metrics

    module.losses = losses
    chunk.env = dataclasses.replace(env, world_size=2)
    with caplog.at_level("WARNING", logger="tacl.pretrain"):
        for where in ("forward", "backward"):
            fails[:] = [where]
            with pytest.raises(CompileFailedMidRun, match=f"failed in the {where} .*pretrain.compile: false"):
                step(chunk, batches, env, contextlib.nullcontext())
            assert module.compiled
        fails[:] = ["forward"]
        chunk.env = env
        got = step(chunk, batches, env, contextlib.nullcontext())
    assert not module.compiled and all(math.isfinite(v) for v in got.values())
    warned = [r.getMessage() for r in caplog.records if r.name == "tacl.pretrain" and r.levelname == "WARNING"]
    assert len(warned) == 1 and "no working C compiler" in warned[0] and "uncompiled" in warned[0], warned


def test_compile_failures_are_the_compilers_errors_and_never_out_of_memory():
    """What tacl.runtime.compile.compile_failure takes for a failed compilation: dynamo's and inductor's errors,
    named by their root cause; not the model's own errors, and no out-of-memory error, whatever wraps it."""
    from torch._dynamo.exc import InternalTorchDynamoError
    from torch._inductor.exc import InductorError

    from tacl.runtime.compile import compile_failure

    def wrapped(inner, outer):
        try:
            try:
                raise inner
            except Exception as e:
                raise outer from e
        except Exception as e:
            return e

    assert compile_failure(wrapped(KeyError("<weakref>"), InternalTorchDynamoError("KeyError"))) == \
        "KeyError: '<weakref>'"
    assert compile_failure(InductorError(RuntimeError("no Triton"), None)) == "RuntimeError: no Triton"
    assert compile_failure(KeyError("a model's own")) is None and compile_failure(AssertionError()) is None
    for oom in (torch.OutOfMemoryError("CUDA out of memory"), RuntimeError("CUDA error: out of memory")):
        assert compile_failure(oom) is None
        assert compile_failure(wrapped(oom, InternalTorchDynamoError("while tracing"))) is None
        assert compile_failure(InductorError(oom, None)) is None


def test_compile_auto_is_on_for_a_gpu_only_where_it_was_measured_to_pay_and_never_at_zero_3(monkeypatch):
    from tacl.runtime import compile as compiling
    from tacl.runtime.compile import compiles

    cpu, cuda = torch.device("cpu"), torch.device("cuda", 0)
    for stage in ("pretrain", "finetune"):
        assert compiles(True, cpu, stage) and not compiles(False, cuda, stage) and not compiles("auto", cpu, stage)
        assert compiles("auto", cuda, stage) == compiling.COMPILE_PAYS[stage]
        monkeypatch.setitem(compiling.COMPILE_PAYS, stage, True)
        assert compiles("auto", cuda, stage) and not compiles("auto", cpu, stage)
    # a chunk at ZeRO stage 3 never compiles (a rank whose compilation failed would leave the others waiting in a
    # parameter gather): auto compiles nothing there, true is refused in one line naming both keys
    from tacl.pretrain.settings import ZERO3_COMPILE, TrainSettings
    from tacl.pretrain.trainer import chunk_compiles
    from tacl.runtime.io import InputError

    def settings(zero_stage, compile):
        return TrainSettings(objective="tacl", steps=1, global_batch=8, micro_batch=8, zero_stage=zero_stage,
                             compile=compile)

    assert all(chunk_compiles(settings(zero, "auto"), cuda) for zero in (0, 1, 2))
    assert not chunk_compiles(settings(3, "auto"), cuda)
    with pytest.raises(InputError, match="^pretrain.compile: true cannot run at pretrain.zero_stage: 3"):
        chunk_compiles(settings(3, True), cpu)
    assert ZERO3_COMPILE.startswith("pretrain.compile: true cannot run at pretrain.zero_stage: 3")


def test_compiled_fine_tune_step_is_one_graph_and_a_failed_one_goes_on_eager(demo_data, tokenizer, compiled_with,
                                                                             caplog):
    """finetune.compile: a classifier's step (grouped batches of several widths) traces as one graph without
    a break, compiled once, with the eager losses; a failing backend leaves one warning and the eager losses."""
    from transformers import AutoModelForSequenceClassification

    from tacl.finetune.common import Run, load_task_model, optimizer_and_schedule, pad_batch, to_device, train_step

    run = Run(torch.device("cpu"), bf16=False)
    hp = {"lr": 1e-3, "weight_decay": 0.01, "warmup_ratio": 0.1, "grad_clip": 1.0}
    texts = [["a short one", "four"], ["a somewhat longer sentence here", "and a third one of them"],
             ["the longest of these sentences, by a margin of several words", "x"]]
    batches = []
    for group in texts:
        enc = tokenizer(group, ["b"] * len(group))
        rows = [{**{k: enc[k][i] for k in ("input_ids", "token_type_ids", "attention_mask")}, "labels": i % 2}
                for i in range(len(group))]
        batches.append(to_device(pad_batch(rows, tokenizer.pad_token_id), run.device))
    assert len({b["input_ids"].shape[1] for b in batches}) == 3

    def losses(backend):
        model = load_task_model(AutoModelForSequenceClassification, str(demo_data["start"]), 0, num_labels=2,
                                problem_type="single_label_classification")  # (as tacl.finetune.sequence does)
        if backend is not None:
            model.compile(dynamic=True, backend=backend)
        opt, sched = optimizer_and_schedule(model, hp, 10)
        torch.manual_seed(0)
        return [float(train_step(model, b, opt, sched, hp, run)) for b in batches], model

    eager, _ = losses(None)
    counters = compiled_with("eager")
    compiled, model = losses("eager")
    assert dict(counters["graph_break"]) == {} and counters["frames"]["total"] == 1, counters
    assert compiled == pytest.approx(eager, rel=1e-5)

    def broken(graph, inputs):
        raise RuntimeError("no working C compiler")

    with caplog.at_level("WARNING", logger="tacl.finetune"):
        fallen, model = losses(broken)
    warnings = [r.getMessage() for r in caplog.records if "torch.compile failed" in r.getMessage()]
    assert len(warnings) == 1 and "RuntimeError: no working C compiler" in warnings[0]
    assert fallen == eager and model._compiled_call_impl is None

    def out_of_memory(graph, inputs):  # (not a compilation failure: it propagates)
        raise torch.OutOfMemoryError("CUDA out of memory")

    with pytest.raises(Exception, match="out of memory"):
        losses(out_of_memory)


def test_a_fine_tune_step_whose_backward_fails_to_compile_starts_again_from_no_gradient(demo_data, tokenizer,
                                                                                       compiled_with, caplog):
    """finetune.compile: the backward's compilation (AOTAutograd may leave it to the first backward) fails
    after an uncompiled part of the loss (here an extra loss on a parameter outside the compiled forward) has
    put its gradient in: the step is computed again uncompiled from no gradient (the optimizer has not
    stepped), and the losses and weights are the eager fine-tune's."""
    from torch._inductor.exc import InductorError
    from transformers import AutoModelForSequenceClassification

    from tacl.finetune.common import Run, load_task_model, optimizer_and_schedule, pad_batch, to_device, train_step

    run = Run(torch.device("cpu"), bf16=False)
    hp = {"lr": 1e-2, "weight_decay": 0.0, "warmup_ratio": 0.0, "grad_clip": 0.0}
    enc = tokenizer(SENTENCES[:4], ["b"] * 4)
    rows = [{**{k: enc[k][i] for k in ("input_ids", "token_type_ids", "attention_mask")}, "labels": i % 2}
            for i in range(4)]
    batch = to_device(pad_batch(rows, tokenizer.pad_token_id), run.device)

    def extra(model, batch, outputs):
        return (model.outside ** 2).sum()

    def fine_tune(backend):
        model = load_task_model(AutoModelForSequenceClassification, str(demo_data["start"]), 0, num_labels=2,
                                problem_type="single_label_classification")
        model.outside = torch.nn.Parameter(torch.ones(3))  # (the compiled forward never reads it)
        if backend is not None:
            model.compile(dynamic=True, backend=backend)
        opt, sched = optimizer_and_schedule(model, hp, 10)
        torch.manual_seed(0)
        got = [float(train_step(model, batch, opt, sched, hp, run, extra_loss=extra)) for _ in range(2)]
        return got, model

    eager, reference = fine_tune(None)
    aot_eager = torch._dynamo.lookup_backend("aot_eager")

    def broken(graph, inputs):
        raise InductorError(RuntimeError("no working C compiler"), None)

    compiled_with("aot_eager")
    with caplog.at_level("WARNING", logger="tacl.finetune"):
        fallen, model = fine_tune(lambda graph, inputs: aot_eager(graph, inputs, bw_compiler=broken))
    warnings = [r.getMessage() for r in caplog.records if r.name == "tacl.finetune"]
    assert len(warnings) == 1 and "no working C compiler" in warnings[0], warnings
    assert model._compiled_call_impl is None
    assert fallen == eager
    assert all(torch.equal(p, dict(reference.named_parameters())[n]) for n, p in model.named_parameters())


def test_a_compiled_model_whose_prediction_fails_to_compile_predicts_uncompiled(demo_data, tokenizer, compiled_with,
                                                                                caplog):
    """finetune.compile: prediction is a graph of its own (eval mode, no gradient); where it fails to compile
    after the training compiled, the evaluation goes on uncompiled with one warning and the uncompiled model's
    predictions (the seed is not lost after its training), and this thread's state is as it was (the failed
    compilation ran in a thread of its own)."""
    from transformers import AutoModelForSequenceClassification

    from tacl.finetune import common

    enc = tokenizer(SENTENCES, ["b"] * len(SENTENCES))
    rows = [{**{k: enc[k][i] for k in ("input_ids", "token_type_ids", "attention_mask")}, "labels": i % 2}
            for i in range(len(SENTENCES))]
    run = common.Run(torch.device("cpu"), bf16=False)  # (compiled below, with the backend of this test)
    model = common.load_task_model(AutoModelForSequenceClassification, str(demo_data["start"]), 0, num_labels=2,
                                   problem_type="single_label_classification")
    graphs = []

    def training_only(graph, inputs):  # (the first graph: training's)
        graphs.append(graph)
        if len(graphs) > 1:
            raise RuntimeError("no working C compiler")
        return graph.forward

    compiled_with("eager")
    model.compile(dynamic=True, backend=training_only)
    hp = {"lr": 1e-3, "weight_decay": 0.01, "warmup_ratio": 0.1, "grad_clip": 1.0, "batch": 4, "epochs": 1,
          "max_len": 64, "group_by_length": False}
    with caplog.at_level("WARNING", logger="tacl.finetune"):
        common.train(model, rows[:8], hp, 0, run, tokenizer.pad_token_id)  # (2 batches of 4 rows: one graph)
        assert len(graphs) == 1 and model._compiled_call_impl is not None
        compiled = model._compiled_call_impl
        model._compiled_call_impl = None
        expected = common.predict(model, rows, run, tokenizer.pad_token_id, 4, lambda o: (o.logits,))
        model._compiled_call_impl = compiled
        included = torch._C._dispatch_tls_local_include_set()
        got = [common.predict(model, rows, run, tokenizer.pad_token_id, 4, lambda o: (o.logits,)) for _ in range(2)]
    warnings = [r.getMessage() for r in caplog.records if r.name == "tacl.finetune"]
    assert len(warnings) == 1 and "no working C compiler" in warnings[0] and "uncompiled" in warnings[0], warnings
    assert len(graphs) == 2 and model._compiled_call_impl is None
    assert all(np.array_equal(a, b) for again in got for a, b in zip(again[0], expected[0], strict=True))
    assert not torch.is_inference_mode_enabled() and torch._C._dispatch_tls_local_include_set() == included

def test_the_recompile_limit_holds_in_the_thread_that_compiles(demo_data, compiled_with):
    """Dynamo's settings are per thread, and each width's graph compiles in a thread of its own: the limit
    `compile_model` raises for the bucket widths (SQuAD's 384 tokens: 6 widths, 2 x 6 + 2 graphs) is the one
    that thread sees, not dynamo's default (8, which the 9th graph would hit and send it on uncompiled)."""
    from transformers import AutoModelForSequenceClassification

    from tacl.finetune import common

    compiled_with("eager")
    run = common.Run(torch.device("cpu"), bf16=False, compile=True, buckets=True)
    model = common.load_task_model(AutoModelForSequenceClassification, str(demo_data["start"]), 0, num_labels=2)
    common.compile_model(model, run, 384, backend="eager")
    batch = {"input_ids": torch.ones(4, 16, dtype=torch.long)}
    seen = []

    def call() -> int:
        seen.append(threading.current_thread() is threading.main_thread())
        return torch._dynamo.config.recompile_limit

    assert common._compiled_or_eager(model, call, batch, run) == 14 and seen == [False]  # (compiled in a thread)
    assert common._compiled_or_eager(model, call, batch, run) == 14 and seen == [False, True]
    assert torch._dynamo.config.recompile_limit == 8  # (nothing left changed in this thread)


def test_bucketed_shapes_compile_once_per_width_for_training_and_prediction(demo_data, tokenizer, compiled_with,
                                                                          monkeypatch):
    """finetune.compile with finetune.shapes buckets: a fine-tune whose batches fall in two widths (its last
    batch filled with ignored rows) compiles one graph per width for training and one per width for
    prediction, without a graph break, and nothing more when the same shapes come again."""
    from transformers import AutoModelForSequenceClassification

    from tacl.finetune import common

    compile_model = common.compile_model
    monkeypatch.setattr(common, "compile_model", lambda *a: compile_model(*a, backend="eager"))
    counters = compiled_with("eager")
    enc = tokenizer(SENTENCES, ["b"] * len(SENTENCES))
    rows = [{**{k: enc[k][i] for k in ("input_ids", "token_type_ids", "attention_mask")}, "labels": i % 2}
            for i in range(9)]
    run = common.Run(torch.device("cpu"), bf16=False, compile=True, buckets=True)
    model = common.load_task_model(AutoModelForSequenceClassification, str(demo_data["start"]), 0, num_labels=2,
                                   problem_type="single_label_classification")
    hp = {"lr": 1e-3, "weight_decay": 0.01, "warmup_ratio": 0.1, "grad_clip": 1.0, "batch": 4, "epochs": 2,
          "max_len": 64, "group_by_length": False}
    common.train(model, rows, hp, 0, run, tokenizer.pad_token_id)
    assert dict(counters["graph_break"]) == {} and counters["frames"]["ok"] == 2, counters  # (widths 16 and 32)
    for _ in range(2):
        common.predict(model, rows, run, tokenizer.pad_token_id, 2, lambda o: (o.logits,), max_len=64)
    assert dict(counters["graph_break"]) == {} and counters["frames"]["ok"] == 4, counters
