"""`pretrain.compile` on 2 ranks (gloo; the ranks are forked from this process, as in tests/test_overlap.py) where
one rank's compilation fails: every rank goes on uncompiled, agreed at the chunk's first micro-batch, and the
weights are those of an uncompiled run, bit for bit.

ZeRO 2 with overlap_comm (what several ranks get): each micro-batch's backward reduces the gradient bucket by
bucket as it fills (buckets of 2e4 elements: several for the tiny model). A compiled backward (AOTAutograd)
hands the gradients over in another order than the eager one, so a rank running compiled beside an
uncompiled one would reduce mismatched buckets (gloo then stops the ranks, or they wait for ever). The graphs
that compile here run on dynamo's `eager` backend (traced, no AOTAutograd: a third of `aot_eager`'s time);
the single-rank tests of tests/test_step.py run the trial's compiled backward through AOTAutograd.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import queue

import numpy as np
import pytest
import torch
import torch.distributed as dist

from tacl.data.pretraining import MicroBatches, micro_batch_loader
from tacl.pretrain import trainer
from tacl.pretrain.settings import TrainSettings
from tacl.pretrain.trainer import ChunkArgs, Meter, Pretrainer, _setup, optimizer_step
from tacl.runtime.lock import RunLock

pytestmark = pytest.mark.slow  # (2 ranks)

RANKS = 2
STEPS = 2
FAILING = 1  # the rank whose compilation fails


def _backend(rank: int):
    """dynamo's `eager` (the traced graph, run as it is), except that on rank FAILING the second graph fails as
    inductor does without a C compiler (of the two graphs a padded run compiles at its start, with and without
    the attention mask; the second is the one for micro-batches that rank has not met yet)."""
    eager = torch._dynamo.lookup_backend("eager")
    graphs = []

    def backend(graph, inputs):
        graphs.append(graph)
        if rank == FAILING and len(graphs) == 2:
            raise RuntimeError("no working C compiler")
        return eager(graph, inputs)

    return backend


def _train(data: dict, run_dir: str, env, compile: bool) -> dict:
    s = TrainSettings(objective="mlm_nsp", steps=STEPS, global_batch=8, micro_batch=2, lr=2e-3, seed=3, max_len=64,
                      zero_stage=2, precision="fp32", loader_workers=0, device="cpu", log_every=1, compile=compile)
    chunk = _setup(ChunkArgs(run_dir, data["start"], data["manifest"], s, tensorboard=False), env, RunLock(run_dir))
    compiled_at_start = chunk.engine.module.compiled
    before = {n: p.detach().clone().numpy() for n, p in chunk.engine.module.named_parameters()}
    batches = micro_batch_loader(MicroBatches(chunk.data, 0, STEPS, chunk.accumulation, env.rank, RANKS), 0, False)
    for _ in range(STEPS):
        optimizer_step(chunk, batches, Meter())
        chunk.step += 1
    return {"compiled": (compiled_at_start, chunk.engine.module.compiled), "before": before,
            "weights": {n: p.detach().clone().numpy() for n, p in chunk.engine.module.named_parameters()}}


def _rank(rank: int, port: int, data: dict, tmp: str, results) -> None:
    torch.set_num_threads(1)
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(RANKS), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(RANKS),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    from tacl.pretrain.distributed import init_distributed

    env = init_distributed("cpu")
    trainer.REDUCE_BUCKET["cpu"] = 2e4
    torch._dynamo.reset()
    compile_losses = Pretrainer.compile_losses
    Pretrainer.compile_losses = lambda self, teacher=None: compile_losses(self, teacher, _backend(rank))
    warnings: list[str] = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = lambda record: warnings.append(record.getMessage())
    logging.getLogger("tacl.pretrain").addHandler(handler)
    out = {"compiled": _train(data, f"{tmp}/compiled", env, compile=True), "warnings": warnings}
    torch._dynamo.reset()
    out["eager"] = _train(data, f"{tmp}/eager", env, compile=False)
    results.put((rank, out))
    dist.barrier()
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def ranks(demo_data, tmp_path_factory):
    """Each rank's compiled run (its warnings, whether it was compiled at the start and at the end, its weights)
    and the same run uncompiled."""
    from deepspeed.runtime.zero.muon import muon_optimizer  # noqa: F401  (what a ZeRO engine imports: once,

    from tacl.objectives import packed  # noqa: F401  before the fork)
    from tacl.pretrain.distributed import free_port
    from tacl.pretrain.model import load_student
    from tacl.runtime.hub import load_tokenizer

    assert not dist.is_initialized(), "a process group left over in this process would be the ranks' own"
    load_tokenizer(str(demo_data["start"]))  # (transformers' lazy imports, once)
    load_student(str(demo_data["start"]))
    context = multiprocessing.get_context("fork")
    results, port, tmp = context.Queue(), free_port(), str(tmp_path_factory.mktemp("compile_ranks"))
    data = {k: str(v) for k, v in demo_data.items()}
    processes = [context.Process(target=_rank, args=(r, port, data, tmp, results)) for r in range(RANKS)]
    for p in processes:
        p.start()
    try:
        out = dict(results.get(timeout=300) for _ in processes)
    except queue.Empty:
        raise AssertionError(f"a rank did not report (exit codes {[p.exitcode for p in processes]}): a rank "
                             "that ran compiled beside an uncompiled one can wait for ever in a reduction") from None
    finally:
        for p in processes:
            p.join(timeout=60)
            if p.is_alive():
                p.kill()
    return out


def test_a_compilation_failing_on_one_rank_sends_every_rank_on_uncompiled(ranks):
    for rank in range(RANKS):
        got = ranks[rank]
        assert got["compiled"]["compiled"] == (True, False), rank  # compiled at the start, uncompiled at the end
        failed = [w for w in got["warnings"] if "torch.compile failed" in w]
        assert len(failed) == 1, (rank, got["warnings"])
        if rank == FAILING:
            assert "no working C compiler" in failed[0]
        else:
            assert f"on rank {FAILING}" in failed[0]
        assert got["eager"]["compiled"] == (False, False)


def test_the_weights_are_those_of_an_uncompiled_run(ranks):
    for rank in range(RANKS):
        compiled, eager = ranks[rank]["compiled"]["weights"], ranks[rank]["eager"]["weights"]
        assert compiled.keys() == eager.keys()
        assert all(np.array_equal(compiled[name], eager[name]) for name in eager), rank
        other = ranks[1 - rank]["compiled"]["weights"]
        assert all(np.array_equal(compiled[name], other[name]) for name in other)
        before = ranks[rank]["eager"]["before"]
        assert sum(not np.array_equal(before[name], w) for name, w in eager.items()) > len(eager) // 2  # (it trained)
