"""torch.compile for pretraining and fine-tuning alike: where it compiles (`compiles`: pretrain.compile,
finetune.compile), and a compiled call that goes on uncompiled where its compilation fails
(`compiled_or_eager`).

A call that compiles a graph runs in a thread of its own (`compile_in_own_thread`): what a failed compilation
leaves behind goes with that thread. A failed compilation (`compile_failure`: the compiler's own errors, never
an out-of-memory error) sends the model on uncompiled with one warning, dynamo's caches emptied
(`give_up_compiling`); every other error propagates. What each stage adds is its caller's: the trainer compiles
every graph at a chunk's first micro-batch in a trial that writes no gradient, agreed over the ranks
(tacl.pretrain.trainer), and a fine-tune sets the gradients to none before a step is computed again
(tacl.finetune.common).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Callable, TypeVar

if TYPE_CHECKING:
    import torch

T = TypeVar("T")


# Where `compile: auto` compiles: on a GPU, for the stages where a GPU benchmark showed that it pays, compile
# time included. Measured 2026-11-26 on an NVIDIA H200 (torch 2.11.0+cu130, BERT-base, bf16, ZeRO 0;
# benchmarks/gpu_check.sh, figures in docs/pretraining.md and docs/finetuning.md):
# - pretraining: TaCL 0.157 -> 0.118 s per step at micro-batch 128 (1.33x), MLM+NSP 0.175 -> 0.096 s at 64
#   (1.82x), after 104-124 s of compilation at the start of each chunk: repaid after about 3,000 steps (under
#   10 minutes) of a chunk that runs for hours;
# - fine-tuning: QNLI at batch 32, 105 ms per step eager, 3,022 ms compiled (49 s for the first 3 steps).
COMPILE_PAYS = {"pretrain": True, "finetune": False}


def compiles(setting: bool | str, device: torch.device, stage: str) -> bool:
    """pretrain.compile and finetune.compile (`stage`): true, false, or auto = on a GPU where COMPILE_PAYS says
    the stage's compiled step was measured faster, its compile time included; off on a CPU (where compiling
    costs minutes and gains little)."""
    return setting is True or (setting == "auto" and device.type == "cuda" and COMPILE_PAYS[stage])


def compile_in_own_thread(call: Callable[[], T], device: torch.device) -> tuple[T | None, str | None]:
    """(`call()`'s result, None), `call` run in a thread of its own (on `device`), or (None, what failed:
    `compile_failure`) where it failed to compile; any other error is raised here. A compiled call that
    compiles runs so: a torch.compile that fails inside AOTAutograd can leave the thread's dispatcher state
    behind (its own dispatch keys on, inference mode on: seen on the CPU with torch 2.13, "Cannot set
    version_counter for inference tensor", and on an H200 with torch 2.11), and an eager retry in that thread
    died ("Hit PythonDispatcher dispatch key but PythonDispatcherTLS was not set", "Inference tensors cannot
    be saved for backward"). That state is per thread: it goes with the thread, and so does the failed call's
    error (its frames hold the compiler's context guards, which set the state of the thread that frees them),
    freed there; the caller's thread is never touched."""
    import gc
    import threading

    import torch

    box: dict[str, Any] = {}

    def run() -> None:
        if device.type == "cuda":  # (the current device is per thread)
            torch.cuda.set_device(device)
        try:
            box["result"] = call()
        except BaseException as e:
            failure = compile_failure(e) if isinstance(e, Exception) else None
            if failure is None:
                box["error"] = e  # (an out-of-memory error, the model's own: raised in the caller's thread)
                return
            box["failure"] = failure
        gc.collect()  # (the failed call's frames and guards, freed in this thread)

    thread = threading.Thread(target=run, name="tacl-compile", daemon=True)
    thread.start()
    thread.join()
    if "error" in box:
        raise box.pop("error")
    return box.get("result"), box.get("failure")


def out_of_memory(error: BaseException) -> BaseException | None:
    """The out-of-memory error in `error`'s chain (causes and contexts included), or None: never taken for a
    compilation failure, whatever wraps it."""
    import torch

    return next((e for e in _chain(error) if isinstance(e, torch.OutOfMemoryError) or "out of memory" in
                 str(e).lower() and not isinstance(e, torch._dynamo.exc.TorchDynamoException)), None)


def compile_failure(error: BaseException) -> str | None:
    """`Type: first line` of the root cause where `error` is a failure of torch.compile: an error of dynamo's
    or inductor's own types in its chain (torch._dynamo.exc.TorchDynamoException: BackendCompilerFailed, which
    wraps a backend's error, inductor's InductorError, dynamo's InternalTorchDynamoError, which wraps its own
    AssertionErrors and KeyErrors, as seen on an H200), and no out-of-memory error (`out_of_memory`). None
    for anything else: the model's own errors and an out-of-memory error propagate."""
    from torch._dynamo.exc import TorchDynamoException

    chain = _chain(error)
    if out_of_memory(error) is not None or not any(isinstance(e, TorchDynamoException) for e in chain):
        return None
    root = chain[-1]
    first = str(root).strip().splitlines()[0] if str(root).strip() else ""
    return f"{type(root).__name__}: {first[:300]}"


def _chain(error: BaseException) -> list[BaseException]:
    """`error` and what it wraps (dynamo's `inner_exception`, `__cause__`, `__context__`), outermost first."""
    chain: list[BaseException] = []
    at: BaseException | None = error
    while at is not None and all(at is not seen for seen in chain):
        chain.append(at)
        at = getattr(at, "inner_exception", None) or at.__cause__ or at.__context__
    return chain


def give_up_compiling(log: logging.Logger, warning: str, failure: str, drop: Callable[[], None]) -> None:
    """A compilation failed (`failure`: `compile_failure`'s words): the model goes on uncompiled, saying so in
    one warning on `log` (`warning`, whose %s is the failure); dynamo's caches are emptied
    (torch.compiler.reset: nothing of the failed compilation is kept) and `drop()` drops the model's compiled
    call."""
    import torch

    log.warning(warning, failure)
    torch.compiler.reset()
    drop()


def compiled_or_eager(call: Callable[[], T], device: torch.device,
                      uncompile: Callable[[str, Exception | None], None], *, first: bool) -> T:
    """`call()` on a compiled model, or, where its compilation fails, `call()` again on the model gone
    uncompiled.

    `first`: the first call of its graph, which compiles it, runs in a thread of its own (on `device`:
    `compile_in_own_thread`; `call` sets its own grad mode and autocast, which are the thread's); a later call
    runs in this thread (a failure there is a recompilation, not expected). A failed compilation
    (`compile_failure`) calls `uncompile(failure, error)` (`error`: the failed call's, None where it failed in
    a thread of its own and went with it), which sends the model on uncompiled (`give_up_compiling`) or raises
    where going on uncompiled cannot be done; then `call()` runs again. An out-of-memory error, as every error
    that is not the compiler's, propagates."""
    if first:
        out, failure = compile_in_own_thread(call, device)
        if failure is None:
            return out
        uncompile(failure, None)
    else:
        try:
            return call()
        except Exception as e:
            failure = compile_failure(e)
            if failure is None:
                raise
            uncompile(failure, e)
    return call()
