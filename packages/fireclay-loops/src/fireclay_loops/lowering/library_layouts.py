"""The layouts library calls really return, for the layouts their operands really have.

An extern call's results are declared in the graph with the strides the trace saw, and the trace
saw the operands in eager's layouts. The lowering chooses its own layouts for what it computes,
and several library kernels lay out their results after an operand: fused attention (flash,
cuDNN; forward and backward) writes its output in the query's dimension order, the
memory-efficient kernel always in (batch, sequence, heads, dim) order. A result planned in the
traced strides while the library returns others is copied into the plan by the wrapper on every
call (the generated wrappers check and ``conform``).

So the lowering asks the op's meta kernel (torch's meta registrations describe the CUDA kernels'
layouts too, on a build without CUDA) what it returns for meta tensors with the operands' planned
sizes, strides and offsets, and plans each result in that layout when it is dense (a permutation
of a contiguous tensor, starting at its origin). Sizes that are symbols are run at their hints,
and the dimension order found is rebuilt over the symbolic sizes. Where a meta kernel is absent,
fails, or returns something else (a view into an operand, a padded or packed result) the traced
strides are kept: the wrapper's check then copies only when the library differs.

Known differences between a meta kernel and the kernel it stands for (torch 2.13):
``_scaled_dot_product_efficient_attention_backward`` declares its gradients in (batch, sequence,
heads, dim) order always, while the CUDA kernel gives the query's gradient the query's strides
and packs the gradients of a query, key and value that share one storage into one allocation
(the same order when the query is in that order, as the lowering stores computed heads); the
wrapper's check conforms the rest. ``convolution``'s meta kernel answers contiguous always (meta
tensors carry no device to choose a backend by), where cuDNN and oneDNN write channels-last for a
channels-last input or weight: :data:`RULES` holds that rule instead. Checked against the CPU
library by the tests: mm, bmm, addmm, convolution and the CPU flash attention forward and
backward. The CUDA attention kernels (flash, cuDNN, memory-efficient, forward and backward) are
planned from their meta kernels, which follow the kernels' allocation code.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import sympy

from fireclay_loops import exprs
from fireclay_loops.ir import Buffer, TensorArg


def dense_order(size: Sequence[int], stride: Sequence[int]) -> list[int] | None:
    """The dimensions outermost first, when ``stride`` lays ``size`` out densely in that order
    (dimensions of extent 1, whose strides address nothing, first); None for a layout with gaps
    or overlaps, or no elements."""
    if any(n == 0 for n in size):
        return None
    big = sorted((k for k in range(len(size)) if size[k] != 1), key=lambda k: -stride[k])
    step = 1
    for k in reversed(big):
        if stride[k] != step:
            return None
        step *= size[k]
    return [k for k in range(len(size)) if size[k] == 1] + big


def strides_in_order(size: Sequence[Any], order: Sequence[int]) -> list[sympy.Expr]:
    """Dense strides of ``size`` whose dimensions are laid out in ``order`` (outermost first)."""
    out: list[sympy.Expr] = [sympy.Integer(0)] * len(size)
    step: sympy.Expr = sympy.Integer(1)
    for k in reversed(list(order)):
        out[k] = step
        step = step * exprs.as_expr(size[k])
    return out


class _NotConcrete(Exception):
    """An argument this module cannot make concrete."""


def _torch_dtype(name: str) -> Any:
    import torch

    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise _NotConcrete(f"torch has no dtype {name}")
    return dtype


@dataclass(frozen=True)
class _Tensor:
    dtype: str
    size: tuple[int, ...]
    stride: tuple[int, ...]
    offset: int


@dataclass(frozen=True)
class _Named:
    kind: str  # DType, Device, Layout, MemoryFormat
    name: str


@dataclass(frozen=True)
class _Sequence:
    is_list: bool
    items: tuple[Any, ...]


def _concrete(a: Any, buffers: Mapping[str, Buffer], hints: Mapping[str, int]) -> Any:
    """A hashable, concrete form of an extern argument (sizes at their hints)."""

    def number(e: Any) -> int:
        try:
            return int(exprs.hint(e, hints))
        except Exception as err:  # an unbound symbol
            raise _NotConcrete(str(err)) from None

    if isinstance(a, TensorArg):
        return _Tensor(buffers[a.buffer].dtype, tuple(number(s) for s in a.size), tuple(number(s) for s in a.stride),
                       number(a.offset))
    if isinstance(a, sympy.Basic):
        return number(a)
    if isinstance(a, (list, tuple)):
        return _Sequence(isinstance(a, list), tuple(_concrete(x, buffers, hints) for x in a))
    kind = type(a).__name__
    if kind in ("DType", "Device", "Layout", "MemoryFormat"):
        return _Named(kind, a.name)
    if a is None or isinstance(a, (bool, int, float, str)):
        return a
    raise _NotConcrete(f"an argument of type {kind}")


def _meta(a: Any) -> Any:
    """The argument a meta kernel takes for a :func:`_concrete` form."""
    import torch

    if isinstance(a, _Tensor):
        need = a.offset + 1 + sum((n - 1) * abs(s) for n, s in zip(a.size, a.stride)) if all(a.size) else a.offset
        base = torch.empty(max(need, 1), dtype=_torch_dtype(a.dtype), device="meta")
        return base.as_strided(a.size, a.stride, a.offset)
    if isinstance(a, _Sequence):
        items = [_meta(x) for x in a.items]
        return items if a.is_list else tuple(items)
    if isinstance(a, _Named):
        if a.kind == "DType":
            return _torch_dtype(a.name)
        if a.kind == "Device":
            return torch.device("meta")  # what the op makes stays on the meta device
        return getattr(torch, a.name)
    return a


Layout = tuple[tuple[int, ...], tuple[int, ...], int]  # a result's shape, strides, storage offset


@functools.lru_cache(maxsize=4096)
def _meta_results(op: str, args: _Sequence, kwargs: tuple[tuple[str, Any], ...]) -> tuple[Layout | None, ...] | None:
    """The layout of each tensor result of ``op`` on meta tensors; None where the meta kernel
    is absent or fails. (Cached: a model's layers make the same calls over and over, and a meta
    kernel costs 0.1-1 ms.)"""
    import torch

    from fireclay_loops.backend.runtime import aten_op

    try:
        fn = aten_op(op)
        with torch.no_grad():
            result = fn(*_meta(args), **{k: _meta(v) for k, v in kwargs})
    except Exception:  # no meta kernel, a data-dependent op: keep the trace's layouts
        return None
    results = list(result) if isinstance(result, (tuple, list)) else [result]
    return tuple((tuple(int(n) for n in r.shape), tuple(int(x) for x in r.stride()), int(r.storage_offset()))
                 if isinstance(r, torch.Tensor) and r.device.type == "meta" else None for r in results)


def _convolution_strides(args: Sequence[Any], sizes: Sequence[Sequence[Any] | None]) -> list[list[sympy.Expr] | None]:
    """A 2-D convolution's result: channels-last when its input or weight is (cuDNN's and
    oneDNN's choice), else contiguous. (Its meta kernel answers contiguous always: meta tensors
    carry no device to pick a backend by.)"""
    from fireclay_loops import layout

    x, w = args[0], args[1]
    size = sizes[0]
    if size is None or len(size) != 4 or not all(isinstance(t, TensorArg) and len(t.size) == 4 for t in (x, w)):
        return [None] * len(sizes)
    cl = any(layout.is_channels_last(t.size, t.stride) for t in (x, w))
    return [layout.channels_last_strides(size) if cl else exprs.contiguous_strides(size)]


# ops whose meta kernel does not describe the library's layout, and the rule that does
RULES = {"aten::convolution.default": _convolution_strides}


def result_strides(op: str, args: Sequence[Any], kwargs: Mapping[str, Any], buffers: Mapping[str, Buffer],
                   hints: Mapping[str, int], sizes: Sequence[Sequence[Any] | None]) -> list[list[sympy.Expr] | None]:
    """For each result of the library call ``op(*args, **kwargs)`` (``sizes``: each result's
    declared size, None for a non-tensor), the strides the library returns it in, when the meta
    kernel tells and they are dense from the origin; None where the traced strides should stay."""
    unknown: list[list[sympy.Expr] | None] = [None] * len(sizes)
    if op in RULES:
        return RULES[op](args, sizes)
    try:
        import torch  # noqa: F401
    except ImportError:  # installed without torch: the traced layouts
        return unknown
    try:
        concrete_args = _concrete(tuple(args), buffers, hints)
        concrete_kwargs = tuple(sorted((k, _concrete(v, buffers, hints)) for k, v in kwargs.items()))
        results = _meta_results(op, concrete_args, concrete_kwargs)
    except (_NotConcrete, TypeError):  # a symbol without a hint, an unhashable argument
        return unknown
    if results is None:
        return unknown
    out = list(unknown)
    for k, (r, size) in enumerate(zip(results, sizes)):
        if size is None or r is None or r[2] != 0:
            continue
        got, stride, _ = r
        if len(size) != len(got) or any(exprs.to_static(n) not in (None, m) for n, m in zip(size, got)):
            continue
        order = dense_order(got, stride)
        if order is None:
            continue
        static = all(exprs.to_static(n) is not None for n in size)
        out[k] = [sympy.Integer(x) for x in stride] if static else strides_in_order(size, order)
    return out
