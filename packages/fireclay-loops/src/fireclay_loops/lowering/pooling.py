"""Max pooling as loop code: each output point is the maximum of its window's loads (as
Inductor does), not a library call; the indices output is computed only where something uses it.

Semantics follow eager's CPU kernel: NaN wins (and for indices the last NaN of the window in
row-major order), otherwise the first maximum; padded points are never chosen; an index is
``h * W + w`` in the input plane. The backward is loop code too: each input point gathers the
gradients of the windows whose index names it.
"""

from __future__ import annotations

import math

import sympy

from fireclay_loops import dtypes, exprs
from fireclay_loops.lowering.registry import register_lowering
from fireclay_loops.lowering.values import GeneratedValue
from fireclay_loops.ops import ops

MAX_WINDOW = 64  # larger windows stay library calls: unrolled loads would bloat the kernel


def _pair(v) -> list:
    v = list(v) if isinstance(v, (list, tuple)) else [v]
    return v * 2 if len(v) == 1 else v


def _may_overrun(out_size, in_size, k: int, stride: int, pad: int, dilation: int) -> bool:
    """Whether the last window of a dimension can reach past the input's end (ceil_mode, padding)."""
    o, n = exprs.to_static(out_size), exprs.to_static(in_size)
    return o is None or n is None or (o - 1) * stride - pad + (k - 1) * dilation > n - 1


def _window(x, idx, out_size, kernel, stride, padding, dilation):
    """``(in_bounds mask or None, input index, flat position)`` for each window point, in
    row-major order; the mask tests only the bounds a window can cross."""
    h, w = idx[-2], idx[-1]
    overrun = [_may_overrun(out_size[d - 2], x.size[d - 2], kernel[d], stride[d], padding[d], dilation[d])
               for d in range(2)]
    points = []
    for kh in range(kernel[0]):
        for kw in range(kernel[1]):
            ih = h * stride[0] - padding[0] + kh * dilation[0]
            iw = w * stride[1] - padding[1] + kw * dilation[1]
            mask = None
            for d, (i, n) in enumerate(((ih, x.size[-2]), (iw, x.size[-1]))):
                conds = []
                if padding[d]:
                    conds.append(ops.ge(ops.index_expr(i, "int64"), ops.constant(0, "int64")))
                if overrun[d]:
                    conds.append(ops.lt(ops.index_expr(i, "int64"), ops.to_dtype(ops.index_expr(n, "int64"), "int64")))
                for c in conds:
                    mask = c if mask is None else ops.logical_and(mask, c)
            points.append((mask, list(idx[:-2]) + [ih, iw], ih * x.size[-1] + iw))
    return points


def _static_ints(values) -> bool:
    return all(isinstance(v, int) or (isinstance(v, sympy.Basic) and v.is_Integer) for v in values)


def _static_window(kernel_size, stride, padding, dilation) -> tuple[list[int], ...] | None:
    """A 2-D pooling's kernel, stride, padding and dilation as pairs of ints (the stride defaults
    to the kernel); None when one is symbolic or the window is too large to unroll."""
    kernel = _pair(kernel_size)
    stride = _pair(stride) if stride else list(kernel)
    padding, dilation = _pair(padding), _pair(dilation)
    if not _static_ints(kernel + stride + padding + dilation) or kernel[0] * kernel[1] > MAX_WINDOW:
        return None
    return tuple([int(v) for v in p] for p in (kernel, stride, padding, dilation))


@register_lowering("max_pool2d_with_indices.default")
def lower_max_pool2d_with_indices(ctx, x, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False):
    window = _static_window(kernel_size, stride, padding, dilation)
    if window is None:
        from fireclay_loops.lowering.context import fallback

        return fallback(ctx)
    kernel, stride, padding, dilation = window
    size, dtype, device = ctx.out_meta(0)
    isize, idtype, _ = ctx.out_meta(1)
    compute = dtypes.compute_dtype(dtype)
    lowest = _lowest(compute)

    def values(idx):
        best = None
        for mask, at, _ in _window(x, idx, size, kernel, stride, padding, dilation):
            v = ops.to_dtype(x.load(at, mask), compute)
            if mask is not None:
                v = ops.where(mask, v, lowest())
            best = v if best is None else ops.maximum(best, v)
        return best

    def indices(idx, outer=None):
        points = _window(x, idx, size, kernel, stride, padding, dilation)
        first = None  # the first in-bounds point: eager's index when nothing beats -inf
        for mask, _, flat in reversed(points):
            pos = ops.index_expr(exprs.as_expr(flat), "int64")
            first = pos if first is None or mask is None else ops.where(mask, pos, first)
        best, chosen = lowest(), first
        for mask, at, flat in points:
            full = mask if outer is None else (outer if mask is None else ops.logical_and(mask, outer))
            v = ops.to_dtype(x.load(at, full), compute)
            take = ops.logical_or(ops.gt(v, best), ops.isnan(v))
            if mask is not None:
                take = ops.logical_and(mask, take)
            best = ops.where(take, v, best)
            chosen = ops.where(take, ops.index_expr(exprs.as_expr(flat), "int64"), chosen)
        return ops.to_dtype(chosen, idtype)

    # the indices are recomputed by their reader (a backward), loading the whole window again
    return (ctx.pointwise(size, dtype, device, values),
            GeneratedValue(isize, idtype, device, indices, reads=[x] * (kernel[0] * kernel[1])))


def _lowest(dtype: str):
    """A maker of the value padding reads as: -inf for floats, the lowest integer otherwise."""
    if dtype.startswith(("float", "bfloat")):
        return lambda: ops.constant(-math.inf, dtype)
    bits = {"int64": 64, "int32": 32, "int16": 16, "int8": 8}.get(dtype)
    low = -(2 ** (bits - 1)) if bits else 0
    return lambda: ops.constant(low, dtype)


def _windows_holding(i, d: int, out_extent, in_extent, kernel, stride, padding, dilation) -> list:
    """``(window index, mask or None)`` for each window along dim ``d`` that can hold input
    point ``i``, in increasing window order. Windows that tile the dim (stride = kernel, no
    padding or dilation) hold a point in exactly one window, ``i // stride``; otherwise a point
    is the ``k``-th point of window ``(i + padding - k * dilation) / stride`` when that divides
    and lands inside the output."""
    k, s, p, dl = kernel[d], stride[d], padding[d], dilation[d]
    if p == 0 and (dl == 1 or k == 1) and s == k:
        o = exprs.FloorDiv(i, s) if s > 1 else i
        out_n, in_n = exprs.to_static(out_extent), exprs.to_static(in_extent)
        covers = out_n is not None and in_n is not None and out_n * s >= in_n
        mask = None if covers else ops.lt(ops.index_expr(o, "int64"), ops.index_expr(out_extent, "int64"))
        return [(o, mask)]
    windows = []
    for kk in reversed(range(k)):
        shifted = i + p - kk * dl
        o = exprs.FloorDiv(shifted, s) if s > 1 else shifted
        mask = ops.logical_and(ops.ge(ops.index_expr(shifted, "int64"), ops.constant(0, "int64")),
                               ops.lt(ops.index_expr(o, "int64"), ops.index_expr(out_extent, "int64")))
        if s > 1:
            mask = ops.logical_and(mask, ops.eq(ops.index_expr(exprs.Mod(shifted, s), "int64"),
                                                ops.constant(0, "int64")))
        windows.append((o, mask))
    return windows


def _both(a, b):
    return a if b is None else b if a is None else ops.logical_and(a, b)


@register_lowering("max_pool2d_with_indices_backward.default")
def lower_max_pool2d_with_indices_backward(ctx, grad_output, x, kernel_size, stride, padding, dilation, ceil_mode,
                                           indices):
    """The gradient gathered per input point rather than scattered per window: a point gets the
    gradient of each window that holds it and whose index names it (eager adds them up the
    same way). As a pointwise value the scheduler fuses it into its reader (ReLU's and batch
    norm's backward in a CNN), so no zero-filled gradient is ever written."""
    window = _static_window(kernel_size, stride, padding, dilation)
    if window is None:
        from fireclay_loops.lowering.context import fallback

        return fallback(ctx)
    kernel, stride, padding, dilation = window
    size, dtype, device = ctx.out_meta()
    compute = dtypes.compute_dtype(dtype)
    pool = (kernel, stride, padding, dilation)

    def gradient(idx):
        h, w = idx[-2], idx[-1]
        here = ops.index_expr(exprs.as_expr(h * x.size[-1] + w), "int64")
        total = None
        for oh, mask_h in _windows_holding(h, 0, grad_output.size[-2], x.size[-2], *pool):
            for ow, mask_w in _windows_holding(w, 1, grad_output.size[-1], x.size[-1], *pool):
                at, mask = list(idx[:-2]) + [oh, ow], _both(mask_h, mask_w)
                hit = ops.eq(ops.to_dtype(indices.load(at, mask), "int64"), here)
                g = ops.where(_both(mask, hit), ops.to_dtype(grad_output.load(at, mask), compute),
                              ops.constant(0.0, compute))
                total = g if total is None else ops.add(total, g)
        return total

    return ctx.pointwise(size, dtype, device, gradient)
