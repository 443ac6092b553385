"""The gradient's reduction on 2 ranks (gloo; the ranks are forked from this process, so they import nothing):
where it is issued relative to the backward that produces the gradient, at each ZeRO stage, with the real
engine and trainer step (`optimizer_step`, accumulation 2).

ZeRO 1 and 2 reduce bucket by bucket during the backward (`overlap_comm`), ZeRO 1 in the last micro-batch's
backward only, ZeRO 2 in every one; ZeRO 0 reduces once after the last backward (DeepSpeed's
`engine.allreduce_gradients`; docs/pretraining.md). The tiny model's 1M parameters are 95% word embedding,
whose gradient comes last: buckets of 2e4 elements (`REDUCE_BUCKET`) give it several, as 1e7 gives BERT-base.
The overlapped reduction gives the weights of the reduction after the backward, bit for bit.
"""

from __future__ import annotations

import multiprocessing
import os
import queue

import pytest
import torch
import torch.distributed as dist

from tacl.data.pretraining import MicroBatches, micro_batch_loader
from tacl.pretrain import trainer
from tacl.pretrain.settings import TrainSettings
from tacl.pretrain.trainer import ChunkArgs, Meter, _setup, optimizer_step
from tacl.runtime.lock import RunLock

pytestmark = pytest.mark.slow  # (2 ranks, each about 5 s)

RANKS = 2
COLLECTIVES = ("all_reduce", "reduce", "reduce_scatter", "reduce_scatter_tensor", "all_reduce_coalesced")
# (stage, overlap_comm): the last one is ZeRO 1 reducing after the backward, for its weights
RUNS = ((0, True), (1, True), (2, True), (1, False))


def _chunk(data: dict, run_dir: str, env, stage: int, overlap: bool):
    s = TrainSettings(objective="mlm_nsp", steps=1, global_batch=8, micro_batch=2, lr=2e-3, seed=3, max_len=64,
                      zero_stage=stage, precision="fp32", loader_workers=0, device="cpu", log_every=1)
    config = trainer.ds_config
    try:
        trainer.ds_config = lambda *a, **k: {**(c := config(*a, **k)),
                                             "zero_optimization": {**c["zero_optimization"], "overlap_comm": overlap}}
        chunk = _setup(ChunkArgs(run_dir, data["start"], data["manifest"], s, tensorboard=False), env,
                       RunLock(run_dir))
    finally:
        trainer.ds_config = config
    return chunk, micro_batch_loader(MicroBatches(chunk.data, 0, 1, chunk.accumulation, env.rank, RANKS), 0, False)


def _record(chunk, events: list) -> None:
    """Every gradient produced (after it is accumulated: when DeepSpeed's own hook sees it), every reduction
    issued and every backward's start and end, in order, into `events`."""
    for name, p in chunk.engine.module.named_parameters():
        if p.requires_grad:
            p.register_post_accumulate_grad_hook(lambda p, name=name: events.append(("grad", name)))
    backward = chunk.engine.backward

    def recorded(loss, *args, **kwargs):
        events.append(("backward", None))
        out = backward(loss, *args, **kwargs)
        events.append(("end", None))
        return out

    chunk.engine.backward = recorded


def _rank(rank: int, port: int, data: dict, tmp: str, results) -> None:
    torch.set_num_threads(1)
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(RANKS), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(RANKS),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    from tacl.pretrain.distributed import init_distributed

    env = init_distributed("cpu")
    trainer.REDUCE_BUCKET["cpu"] = 2e4
    events: list = []
    for name in COLLECTIVES:  # what DeepSpeed's comm backend calls (deepspeed/comm/torch.py)
        def issued(*args, _real=getattr(dist, name), **kwargs):
            tensor = kwargs.get("tensor", kwargs.get("input_tensor", args[0] if args else None))
            events.append(("reduce", tensor.numel() if isinstance(tensor, torch.Tensor) else 0))
            return _real(*args, **kwargs)

        setattr(dist, name, issued)
    out = {}
    for stage, overlap in RUNS:
        chunk, batches = _chunk(data, f"{tmp}/zero{stage}-{overlap}", env, stage, overlap)
        _record(chunk, events)
        events.clear()
        optimizer_step(chunk, batches, Meter())
        weights = [p.detach().clone().numpy() for p in chunk.engine.module.parameters()]
        out[stage, overlap] = (list(events), weights, sum(w.size for w in weights))
    results.put((rank, out))
    dist.barrier()
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def reductions(demo_data, tmp_path_factory):
    """Each run's events and weights on each rank."""
    from deepspeed.runtime.zero.muon import muon_optimizer  # noqa: F401  (what a ZeRO engine imports: once,

    from tacl.objectives import packed  # noqa: F401  before the fork)
    from tacl.pretrain.distributed import free_port
    from tacl.pretrain.model import load_student
    from tacl.runtime.hub import load_tokenizer

    assert not dist.is_initialized(), "a process group left over in this process would be the ranks' own"
    load_tokenizer(str(demo_data["start"]))  # (transformers' lazy imports, once)
    load_student(str(demo_data["start"]))
    context = multiprocessing.get_context("fork")
    results, port, tmp = context.Queue(), free_port(), str(tmp_path_factory.mktemp("overlap"))
    data = {k: str(v) for k, v in demo_data.items()}
    ranks = [context.Process(target=_rank, args=(r, port, data, tmp, results)) for r in range(RANKS)]
    for p in ranks:
        p.start()
    try:
        out = dict(results.get(timeout=300) for _ in ranks)
    except queue.Empty:
        raise AssertionError(f"a rank did not report (exit codes {[p.exitcode for p in ranks]})") from None
    finally:
        for p in ranks:
            p.join(timeout=60)
            if p.is_alive():
                p.kill()
    return out


def backwards(events: list) -> tuple[list[list], list]:
    """The events of each backward, and those after the last one (the optimizer step's)."""
    out, current = [], None
    for kind, what in events:
        if kind == "backward":
            current = []
        elif kind == "end":
            out.append(current)
            current = None
        elif current is not None:
            current.append((kind, what))
    after = events[max(i for i, (kind, _) in enumerate(events) if kind == "end") + 1:]
    return out, after


def overlapped(backward: list) -> tuple[int, int]:
    """Gradients produced before the backward's first reduction was issued, and after it."""
    first = next(i for i, (kind, _) in enumerate(backward) if kind == "reduce")
    before = sum(kind == "grad" for kind, _ in backward[:first])
    return before, sum(kind == "grad" for kind, _ in backward) - before


@pytest.mark.parametrize("stage", [1, 2])
def test_zero_1_and_2_reduce_during_the_backward(reductions, stage):
    for rank in range(RANKS):
        events, _, elements = reductions[rank][stage, True]
        (first, last), _ = backwards(events)
        for backward in ([first, last] if stage == 2 else [last]):  # ZeRO 1: nothing before the last micro-batch
            before, after = overlapped(backward)
            # the first bucket goes while most gradients are still to come (the first bucket's last gradient
            # is recorded just after DeepSpeed's own hook issued it)
            assert before <= 3 and after >= 40, (rank, stage, before, after)
            assert sum(n for kind, n in backward if kind == "reduce") == elements  # all of it, in the backward
        if stage == 1:
            assert not any(kind == "reduce" for kind, _ in first)


def test_zero_0_reduces_once_after_the_last_backward(reductions):
    for rank in range(RANKS):
        events, _, elements = reductions[rank][0, True]
        (first, last), _ = backwards(events)
        assert not any(kind == "reduce" for kind, _ in first)
        assert [kind for kind, _ in last][-1] == "reduce" and sum(kind == "reduce" for kind, _ in last) == 1
        assert [n for kind, n in last if kind == "reduce"] == [elements]


def test_the_overlapped_reduction_gives_the_same_weights(reductions):
    for rank in range(RANKS):
        _, overlapped_weights, _ = reductions[rank][1, True]
        _, after_weights, _ = reductions[rank][1, False]
        assert all((a == b).all() for a, b in zip(overlapped_weights, after_weights, strict=True))
        _, other_rank, _ = reductions[1 - rank][1, True]
        assert all((a == b).all() for a, b in zip(overlapped_weights, other_rank, strict=True))


def test_overlap_is_asked_for_where_several_ranks_train():
    """On one rank there is nothing to overlap: no overlap_comm (its second buffer and its device
    synchronisation at the end of the backward would buy nothing) and the one large bucket as before."""
    s = TrainSettings(objective="mlm_nsp", steps=1, global_batch=8, micro_batch=2, zero_stage=1)
    one, four = (trainer.ds_config(s, 1, cpu=False, ranks=n)["zero_optimization"] for n in (1, 4))
    assert (one["overlap_comm"], one["reduce_bucket_size"]) == (False, 5e8)
    assert (four["overlap_comm"], four["reduce_bucket_size"]) == (True, trainer.REDUCE_BUCKET["cuda"]) == (True, 1e7)
