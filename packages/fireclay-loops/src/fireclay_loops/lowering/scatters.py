"""Scatter-adds: ``index_put`` with ``accumulate=True`` (the backward of ``x[idx]``: Swin's
relative position bias), ``index_add``, ``scatter_add`` and the embedding's backward.

Each becomes one loop node over the points that add (``ops.store_add`` at an index read from a
tensor, checked as eager checks it) into a buffer that starts at zero, then the op's ``self``
plus that sum, computed where it is read (nothing when ``self`` is zeros, as in every backward).
Half-precision values add into a float32 buffer: fewer roundings than eager's, and the only
kind a GPU adds atomically everywhere. Boolean results and masks stay library calls.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import sympy

from fireclay_loops import dtypes, exprs
from fireclay_loops.lowering.context import LoweringContext, fallback
from fireclay_loops.lowering.indexing import _indirect
from fireclay_loops.lowering.registry import register_lowering
from fireclay_loops.lowering.values import (
    BufferValue,
    ConstantValue,
    GeneratedValue,
    Index,
    TensorValue,
    broadcast_index,
)
from fireclay_loops.ops import ops

# What a lowering here returns: the result, or the outputs of the library call it falls back to.
Lowered = TensorValue | tuple[BufferValue | None, ...]
# A point of a scatter-add -> the index into the result it adds at, and the value it adds.
AddAt = Callable[[Index], tuple[Index, Any]]


def _sum_dtype(dtype: str) -> str | None:
    """The dtype values of ``dtype`` are summed in, or None where the lowering does not add them
    (bool: eager's sum saturates; complex: no loop body computes it)."""
    if dtype == "bool" or dtypes.is_complex(dtype):
        return None
    if dtype in ("float16", "bfloat16"):
        return "float32"
    if dtypes.is_int(dtype) and dtype not in ("int32", "int64", "uint32", "uint64"):
        return "int64"  # (GPUs add 32 and 64-bit integers atomically; the sum wraps as eager's)
    return dtype


def _added(ctx: LoweringContext, base: TensorValue, points: list[Any], inner: AddAt) -> TensorValue:
    """``base`` plus what ``inner(point) -> (index into base, value)`` adds over ``points``."""
    size, dtype, device = ctx.out_meta()
    acc_dtype = _sum_dtype(dtype)
    assert acc_dtype is not None  # the lowerings fall back for the dtypes that are not summed
    summed = ctx.scatter_add(size, acc_dtype, device, points, inner)
    if isinstance(base, ConstantValue) and base.value == 0:
        if acc_dtype == dtype:
            return summed

        def load(idx: Index, mask: Any = None) -> Any:
            return ops.to_dtype(summed.load(idx, mask), dtype)

        return GeneratedValue(size, dtype, device, load, reads=[summed])

    def fn(idx: Index, mask: Any = None) -> Any:
        old = ops.to_dtype(base.load(idx, mask), acc_dtype)
        return ops.to_dtype(ops.add(old, summed.load(idx, mask)), dtype)

    return GeneratedValue(size, dtype, device, fn, reads=[base, summed])


def _integer_indices(tensors: list[TensorValue]) -> bool:
    return all(t.dtype in ("int64", "int32") for t in tensors)


@register_lowering("index_put.default", "index_put.hacked_twin", "_unsafe_index_put.default")
def lower_index_put(ctx: LoweringContext, x: TensorValue, indices: list[TensorValue | None], values: TensorValue,
                    accumulate: bool = False) -> Lowered:
    """``x[indices] += values`` (advanced indexing: index tensors broadcast together, negative
    indices count from the end). Without ``accumulate`` the op is a library call: where indices
    repeat, which value stays is eager's choice."""
    positions = [k for k, t in enumerate(indices) if t is not None]
    tensors = [t for t in indices if t is not None]  # the indices at ``positions``
    if not accumulate or not tensors or not _integer_indices(tensors) or _sum_dtype(x.dtype) is None:
        return fallback(ctx)  # (a boolean mask picks a count of elements that the data decides)
    brank = max(t.rank for t in tensors)
    bshape: list[Any] = []
    for j in range(brank):
        sizes = [t.size[j - brank + t.rank] for t in tensors if j - brank + t.rank >= 0]
        wide = [s for s in sizes if not exprs.equal(s, 1)]
        bshape.append(wide[0] if wide else sympy.Integer(1))
    adjacent = positions == list(range(positions[0], positions[-1] + 1))
    start = positions[0] if adjacent else 0
    rest = [k for k in range(x.rank) if k not in positions]
    # the points of x[indices], in eager's order: the indexed dimensions where they stand when
    # they are adjacent, else first
    if adjacent:
        points = list(x.size[:start]) + bshape + [x.size[k] for k in rest if k > positions[-1]]
    else:
        points = bshape + [x.size[k] for k in rest]
    sites = {k: ctx.check_site(f"dimension {k} of index_put") for k in positions}

    def inner(idx: Index) -> tuple[Index, Any]:
        bidx = idx[start:start + brank]
        where: list[Any] = [None] * x.rank
        for k, t in zip(positions, tensors):
            sub = [sympy.Integer(0) if exprs.equal(t.size[j], 1) else bidx[brank - t.rank + j] for j in range(t.rank)]
            where[k] = _indirect(ctx, t, sub, x.size[k], None, True, sites[k])
        others = [j for j in range(len(points)) if not (start <= j < start + brank)]
        for j, k in zip(others, rest):
            where[k] = idx[j]
        return where, values.load(broadcast_index(values, idx, points))

    return _added(ctx, x, points, inner)


@register_lowering("index_add.default")
def lower_index_add(ctx: LoweringContext, x: TensorValue, dim: int, index: TensorValue, source: TensorValue,
                    alpha: complex | sympy.Basic = 1) -> Lowered:
    """``x`` with ``alpha * source[..., i, ...]`` added at ``index[i]`` along ``dim``."""
    if not x.rank or source.rank != x.rank or _sum_dtype(x.dtype) is None or not _integer_indices([index]) or (
            isinstance(alpha, sympy.Basic) and not isinstance(alpha, sympy.Number)):
        return fallback(ctx)
    dim = dim % x.rank
    site = ctx.check_site(f"dimension {dim} of index_add")
    compute = dtypes.compute_dtype(x.dtype)

    def inner(idx: Index) -> tuple[Index, Any]:
        where = list(idx)
        where[dim] = _indirect(ctx, index, [idx[dim]] if index.rank else [], x.size[dim], None, False, site)
        value = ops.to_dtype(source.load(idx), compute)
        if alpha != 1:
            value = ops.mul(value, ops.constant(alpha, compute))
        return where, value

    return _added(ctx, x, list(source.size), inner)


@register_lowering("scatter_add.default")
def lower_scatter_add(ctx: LoweringContext, x: TensorValue, dim: int, index: TensorValue,
                      src: TensorValue) -> Lowered:
    """``x`` with ``src[p]`` added at ``p`` with ``index[p]`` in place of its ``dim``-th
    coordinate, for every point ``p`` of ``index``."""
    if not x.rank or index.rank != x.rank or _sum_dtype(x.dtype) is None or not _integer_indices([index]):
        return fallback(ctx)
    dim = dim % x.rank
    site = ctx.check_site(f"dimension {dim} of scatter_add")

    def inner(idx: Index) -> tuple[Index, Any]:
        where = list(idx)
        where[dim] = _indirect(ctx, index, idx, x.size[dim], None, False, site)
        return where, src.load(idx)

    return _added(ctx, x, list(index.size), inner)


@register_lowering("embedding_dense_backward.default")
def lower_embedding_dense_backward(ctx: LoweringContext, grad_output: TensorValue, indices: TensorValue,
                                   num_weights: int | sympy.Expr, padding_idx: int | sympy.Expr,
                                   scale_grad_by_freq: bool) -> Lowered:
    """The weight's gradient: each index's row of ``grad_output`` added at that row. Like
    eager, indices outside ``[0, num_weights)`` and ``padding_idx`` add nothing (the forward
    refused the former)."""
    size = ctx.out_meta()[0]
    if scale_grad_by_freq or _sum_dtype(grad_output.dtype) is None or not _integer_indices([indices]) or \
            exprs.equal(size[0], 0):
        return fallback(ctx)  # (scaled: by each index's count over the batch)
    k = indices.rank

    def inner(idx: Index) -> tuple[Index, Any]:
        i = ops.to_dtype(indices.load(list(idx[:k])), "int64")
        valid = ops.logical_and(ops.ge(i, ops.constant(0, "int64")),
                                ops.lt(i, ops.to_dtype(ops.index_expr(size[0], "int64"), "int64")))
        if isinstance(padding_idx, int) and padding_idx >= 0:
            valid = ops.logical_and(valid, ops.ne(i, ops.constant(padding_idx, "int64")))
        # a skipped point adds zero to row 0 (rather than a store under a mask)
        row = ops.indirect_indexing(ops.where(valid, i, ops.constant(0, "int64")), size[0])
        grad = ops.to_dtype(grad_output.load(list(idx)), dtypes.compute_dtype(grad_output.dtype))
        return [row, idx[k]], ops.where(valid, grad, ops.constant(0, dtypes.compute_dtype(grad_output.dtype)))

    return _added(ctx, ConstantValue(0, size, grad_output.dtype, grad_output.device), list(grad_output.size), inner)


__all__ = ["lower_embedding_dense_backward", "lower_index_add", "lower_index_put", "lower_scatter_add"]
