"""Fake tensors for tracing: fireclay-shapes' :class:`~fireclay_shapes.torch.FakeTensor`.

A trace owns one :class:`~fireclay_shapes.torch.FakeMode`, whose ShapeEnv holds the program's
symbols: input fakes get the program's symbolic sizes (or the real input's static ones), torch's
meta kernels compute symbolic output sizes, and every decision they take on a size becomes a
guard in that ShapeEnv. The tracer tags each fake with the IR value naming it (attribute
``value``); fakes made outside the tracer (by a decomposition's inner ops) have none.

Symbolic sizes cross into the IR as expression strings (``"2*s0"``, fireclay-shapes' string
form) and come back as ``torch.SymInt`` over the same ShapeEnv.
"""

from __future__ import annotations

from typing import Any

import torch

from fireclay_ir import IRError, Program, SymExpr, TensorMeta
from fireclay_shapes import ShapeEnv, dumps, parse
from fireclay_shapes.torch import FakeMode, FakeTensor, expr_of, make_symint

__all__ = ["FakeMode", "FakeTensor", "fake_like", "fake_of_meta", "ir_dim", "mode_for", "sym_atom", "torch_dim",
           "value_of"]


def mode_for(program: Program | None = None, hints: dict[str, int] | None = None) -> FakeMode:
    """A fake mode whose ShapeEnv holds ``program``'s symbols (their hints replaced by
    ``hints``, the sizes of the inputs being traced), or no symbols at all."""
    if program is None or not program.symbols:
        return FakeMode(ShapeEnv())
    records = []
    for name, sym in program.symbols.items():
        hint = (hints or {}).get(name, sym.hint)
        records.append({"name": name, "hint": hint, "min": sym.min, "max": sym.max})
    return FakeMode(ShapeEnv.restore(records))


def value_of(x: Any) -> Any:
    """The IR value a tracer tagged fake ``x`` with, or None."""
    return getattr(x, "value", None) if isinstance(x, FakeTensor) else None


def fake_like(t: torch.Tensor, mode: FakeMode, requires_grad: bool | None = None) -> FakeTensor:
    """A fresh fake with ``t``'s dtype, sizes, strides, offset and device (symbolic where
    ``t`` is a symbolic fake of the same mode, static where ``t`` is real)."""
    rg = bool(t.requires_grad if requires_grad is None else requires_grad)
    if isinstance(t, FakeTensor):
        if t.fake_mode is not mode:
            raise IRError("a fake tensor of another trace reached this one")
        return FakeTensor(t.meta.detach(), t.device, mode, rg)
    return mode.fake(list(t.shape), list(t.stride()), dtype=t.dtype, device=t.device, requires_grad=rg,
                     storage_offset=t.storage_offset())


def fake_of_meta(meta: TensorMeta, mode: FakeMode, requires_grad: bool = False) -> FakeTensor:
    """A fake of IR type ``meta``; its symbolic dims are expressions over ``mode``'s symbols."""
    strides = list(meta.strides) if meta.strides is not None else None
    return mode.fake(list(meta.shape), strides, dtype=meta.dtype, device=meta.device,
                     requires_grad=requires_grad, storage_offset=meta.storage_offset)


def ir_dim(x: Any) -> int | str:
    """A size as the IR stores it: an int, or the expression string of a symbolic size."""
    if isinstance(x, torch.SymInt):
        e = expr_of(x)
        return int(e) if e.is_Integer else dumps(e)
    return int(x)


def torch_dim(d: int | str, mode: FakeMode) -> Any:
    """An IR size as a value torch's kernels take (an int, or a SymInt of ``mode``)."""
    if isinstance(d, int):
        return d
    return make_symint(mode.env, parse(d))


def sym_atom(x: Any) -> Any:
    """A symbolic int/bool/float argument as an IR atom; concrete values pass through."""
    if isinstance(x, torch.SymInt):
        d = ir_dim(x)
        return d if isinstance(d, int) else SymExpr(d)
    if isinstance(x, torch.SymBool):
        return bool(x)  # a decision: the ShapeEnv records the guard
    if isinstance(x, torch.SymFloat):
        return float(x)
    return x
