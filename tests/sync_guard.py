"""A test helper that refuses host-device synchronisations on a CPU-only machine.

On a GPU, `torch.cuda.set_sync_debug_mode("error")` reports every synchronisation (benchmarks/pretrain_step.py
--gpu counts them). On the CPU nothing synchronises, so this guard treats the CPU as "the device" and refuses,
inside its `with` block, every operation that would make the host wait for a GPU if the same tensor lived
there:

- reading a value on the host: `.item()`, `.tolist()`, `.numpy()`, `.cpu()`, `bool(t)`, `float(t)`,
  `int(t)`, `t.__index__()`, printing a tensor, `torch.equal`/`allclose`;
- shapes that depend on values: `nonzero`, `argwhere`, `torch.where(cond)`, `masked_select`, `unique`,
  `bincount`, `repeat_interleave(tensor)` without `output_size`, boolean-mask indexing (`t[mask]`,
  `t[mask] = v`) and indexing with a Python list;
- a tensor built from Python data on the device: `torch.tensor([...], device=d)` / `as_tensor` / `asarray`
  (a blocking host-to-device copy from pageable memory).

Two layers: a TorchFunctionMode sees the Python-level calls (whoever makes them: our code, DeepSpeed,
transformers), a TorchDispatchMode the aten operations underneath (`_local_scalar_dense`, `nonzero`, a
boolean `index`), so that a C++ composite reached without a Python call is caught too. Each refusal names
the innermost frame outside torch. `allow(stack)` may let some through (e.g. DeepSpeed's own overflow check in
its optimizer step, named as such); they are counted in `allowed`, by where they came from.
"""

from __future__ import annotations

import collections
import contextlib
import os
import traceback
from typing import Any, Callable, Iterator

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

_TORCH_DIR = os.path.dirname(torch.__file__)
_THIS = os.path.abspath(__file__)

T = torch.Tensor
READS = {T.item: "item()", T.tolist: "tolist()", T.numpy: "numpy()", T.cpu: "cpu()", T.__bool__: "bool(tensor)",
         T.__float__: "float(tensor)", T.__int__: "int(tensor)", T.__index__: "tensor used as a Python int",
         T.__complex__: "complex(tensor)", T.__repr__: "printing a tensor", T.__format__: "formatting a tensor",
         T.__array__: "numpy.asarray(tensor)", torch.equal: "torch.equal", T.equal: "Tensor.equal",
         torch.allclose: "torch.allclose", T.allclose: "Tensor.allclose", torch.is_nonzero: "torch.is_nonzero"}
VALUE_SHAPED = {torch.nonzero: "nonzero", T.nonzero: "nonzero", torch.argwhere: "argwhere", T.argwhere: "argwhere",
                torch.masked_select: "masked_select", T.masked_select: "masked_select", torch.unique: "unique",
                T.unique: "unique", torch.unique_consecutive: "unique_consecutive",
                T.unique_consecutive: "unique_consecutive", torch.bincount: "bincount", T.bincount: "bincount"}
FROM_PYTHON = {torch.tensor: "torch.tensor", torch.as_tensor: "torch.as_tensor", torch.asarray: "torch.asarray"}
A = torch.ops.aten
ATEN = {A._local_scalar_dense.default: "a value read on the host (aten._local_scalar_dense)",
        A.nonzero.default: "aten.nonzero", A.masked_select.default: "aten.masked_select",
        A.is_nonzero.default: "aten.is_nonzero", A.equal.default: "aten.equal",
        A._unique2.default: "aten._unique2", A.unique_dim.default: "aten.unique_dim",
        A.unique_consecutive.default: "aten.unique_consecutive", A.bincount.default: "aten.bincount"}


class HostSync(AssertionError):
    """An operation that would synchronise the host with the GPU."""


def _stack() -> list[traceback.FrameSummary]:
    return [f for f in traceback.extract_stack() if os.path.abspath(f.filename) != _THIS]


def where(stack: list[traceback.FrameSummary]) -> str:
    """The innermost frame outside torch (the code that asked for the operation)."""
    for f in reversed(stack):
        if not f.filename.startswith(_TORCH_DIR):
            return f"{f.filename}:{f.lineno} in {f.name}"
    return "inside torch"


def _on_device(x: Any, device: torch.device) -> bool:
    return isinstance(x, torch.Tensor) and x.device.type == device.type


def _bool_or_list_index(index: Any) -> str | None:
    items = index if isinstance(index, tuple) else (index,)
    for i in items:
        if isinstance(i, torch.Tensor) and i.dtype == torch.bool and i.dim() > 0:
            return "boolean-mask indexing"
        if isinstance(i, list):
            return "indexing with a Python list (a host-to-device copy)"
    return None


class _Functions(TorchFunctionMode):
    def __init__(self, guard: "SyncGuard"):
        super().__init__()
        self.guard = guard

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        what = self._what(func, args, kwargs)
        if what is None:
            return func(*args, **kwargs)
        self.guard.report(what)
        with self.guard.reported():
            return func(*args, **kwargs)

    def _what(self, func, args, kwargs) -> str | None:
        device = self.guard.device
        if func in READS and any(_on_device(a, device) for a in args):
            return READS[func]
        if func in VALUE_SHAPED:
            return VALUE_SHAPED[func]
        if func is torch.where and len(args) + len(kwargs) == 1:
            return "torch.where(condition) (nonzero)"
        if func in (torch.repeat_interleave, T.repeat_interleave) and kwargs.get("output_size") is None:
            repeats = args[1] if len(args) > 1 else kwargs.get("repeats")
            if isinstance(repeats, torch.Tensor) or len(args) == 1:
                return "repeat_interleave with tensor repeats and no output_size"
        if func in (T.__getitem__, T.__setitem__) and len(args) > 1 and _on_device(args[0], device):
            return _bool_or_list_index(args[1])
        if func in FROM_PYTHON:
            target = kwargs.get("device")
            data = args[0] if args else kwargs.get("data")
            if target is not None and torch.device(target).type == device.type and not isinstance(data, torch.Tensor):
                return f"{FROM_PYTHON[func]}(<Python data>, device={target}) (a blocking host-to-device copy)"
        return None


class _Aten(TorchDispatchMode):
    def __init__(self, guard: "SyncGuard"):
        super().__init__()
        self.guard = guard

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if not self.guard.inside_report:
            what = ATEN.get(func)
            if what is None and func in (A.index.Tensor, A.index_put.default, A.index_put_.default,
                                         A._index_put_impl_.default):
                if any(isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8) for i in args[1] if
                       i is not None):
                    what = f"boolean-mask indexing ({func})"
            if what is None and func is A.repeat_interleave.Tensor and kwargs.get("output_size") is None:
                what = "aten.repeat_interleave without output_size"
            if what is not None and any(_on_device(a, self.guard.device) for a in args):
                self.guard.report(what)
        return func(*args, **kwargs)


class SyncGuard:
    """`with SyncGuard(device): ...` raises HostSync at the first refused operation; with `allow`, the
    operations it accepts (given the Python stack) are counted in `allowed` instead."""

    def __init__(self, device: torch.device | str = "cpu",
                 allow: Callable[[list[traceback.FrameSummary]], bool] | None = None):
        self.device = torch.device(device)
        self.allow = allow
        self.allowed: collections.Counter[str] = collections.Counter()
        self.inside_report = False

    def report(self, what: str) -> None:
        stack = _stack()
        here = f"{what} at {where(stack)}"
        if self.allow is not None and self.allow(stack):
            self.allowed[here] += 1
            return
        raise HostSync(f"host-device synchronisation: {here}")

    @contextlib.contextmanager
    def reported(self) -> Iterator[None]:
        """While an operation already reported runs (its aten calls are the same synchronisation)."""
        before, self.inside_report = self.inside_report, True
        try:
            yield
        finally:
            self.inside_report = before

    def __enter__(self) -> "SyncGuard":
        self._modes = contextlib.ExitStack()
        self._modes.enter_context(_Functions(self))
        self._modes.enter_context(_Aten(self))
        return self

    def __exit__(self, *exc) -> None:
        self._modes.close()
