"""Indexing and data movement: gather, embedding, index_select, advanced indexing, cat, stack,
constant padding; and values computed from the index alone: constants, arange, random numbers
(counter-based, keyed by the program's seed, so a program gives the same numbers every run)."""

from __future__ import annotations

from typing import Any

import sympy

from fireclay_loops import dtypes, exprs
from fireclay_loops.lowering.context import fallback
from fireclay_loops.lowering.registry import register_lowering
from fireclay_loops.lowering.values import GeneratedValue, TensorValue, load_broadcast, view
from fireclay_loops.ops import ops


def _indirect(ctx, index_tensor: TensorValue, idx: list, size: Any, mask: Any, negative: bool, site: str):
    """The symbol for ``index_tensor[idx]`` as an index into a dimension of ``size``. Where eager
    takes negative indices (``negative``: advanced indexing) they count from the end; the index
    is checked against the dimension (``ops.check_bounds``, unless ``config.kernel_checks`` is
    off), so a bad one raises as in eager instead of reading outside the tensor. ``site``: from
    ``ctx.check_site`` while the indexing op itself is lowered (its loads run later, inside the
    consumer's lowering)."""
    v = _checked_index(ctx, index_tensor, idx, size, mask, negative, site)
    if negative:
        v = ops.where(ops.lt(v, ops.constant(0, "int64")),
                      ops.add(v, ops.to_dtype(ops.index_expr(size, "int64"), "int64")), v)
    return ops.indirect_indexing(v, size)


def _checked_index(ctx, index_tensor: TensorValue, idx: list, size: Any, mask: Any, negative: bool, site: str):
    """``index_tensor[idx]`` as an int64 value, checked against a dimension of ``size`` (from
    ``-size`` where ``negative``) unless ``config.kernel_checks`` is off."""
    v = ops.to_dtype(index_tensor.load(idx, mask), "int64")
    if ctx.checks_on(index_tensor.device):
        v = ops.check_bounds(v, size, negative, site, mask)
    return v


# Eager's gather, index_select and embedding refuse negative indices; advanced indexing
# (``x[idx]``, ``index.Tensor``) counts them from the end.
@register_lowering("gather.default")
def lower_gather(ctx, x, dim, index, sparse_grad=False):
    dim = dim % x.rank if x.rank else 0
    site = ctx.check_site(f"dimension {dim} of gather")

    def fn(idx, mask=None):
        old = list(idx)
        if x.rank:
            old[dim] = _indirect(ctx, index, idx, x.size[dim], mask, False, site)
        return x.load(old, mask)

    return GeneratedValue(index.size, x.dtype, x.device, fn, reads=[x, index])


@register_lowering("index_select.default")
def lower_index_select(ctx, x, dim, index):
    dim = dim % x.rank if x.rank else 0
    size = ctx.out_meta()[0]
    site = ctx.check_site(f"dimension {dim} of index_select")

    def fn(idx, mask=None):
        old = list(idx)
        if x.rank:
            pos = [idx[dim]] if index.rank else []
            old[dim] = _indirect(ctx, index, pos, x.size[dim], mask, False, site)
        return x.load(old, mask)

    return GeneratedValue(size, x.dtype, x.device, fn, reads=[x, index])


@register_lowering("embedding.default")
def lower_embedding(ctx, weight, indices, padding_idx=-1, scale_grad_by_freq=False, sparse=False):
    size = ctx.out_meta()[0]
    k = indices.rank
    site = ctx.check_site("dimension 0 of embedding")

    def fn(idx, mask=None):
        row = _indirect(ctx, indices, list(idx[:k]), weight.size[0], mask, False, site)
        return weight.load([row, idx[k]], mask)

    return GeneratedValue(size, weight.dtype, weight.device, fn, reads=[weight, indices])


@register_lowering("index.Tensor")
def lower_index(ctx, x, indices):
    size = ctx.out_meta()[0]
    positions = [k for k, t in enumerate(indices) if t is not None]
    tensors = [indices[k] for k in positions]
    brank = max(t.rank for t in tensors)
    adjacent = positions == list(range(positions[0], positions[-1] + 1))
    start = positions[0] if adjacent else 0
    bshape = size[start:start + brank]
    rest = [k for k in range(x.rank) if k not in positions]
    sites = {k: ctx.check_site(f"dimension {k} of index") for k in positions}

    def fn(idx, mask=None):
        bidx = list(idx[start:start + brank])
        old: list[Any] = [None] * x.rank
        for k, t in zip(positions, tensors):
            # boolean masks were turned into integer indices by the aten decomposition
            lead = len(bshape) - t.rank
            sub = [sympy.Integer(0) if exprs.equal(t.size[j], 1) else bidx[lead + j] for j in range(t.rank)]
            old[k] = _indirect(ctx, t, sub, x.size[k], mask, True, sites[k])
        out_pos = [j for j in range(len(size)) if not (start <= j < start + brank)]
        for j, k in zip(out_pos, rest):
            old[k] = idx[j]
        return x.load(old, mask)

    return GeneratedValue(size, x.dtype, x.device, fn, reads=[x, *tensors])


@register_lowering("one_hot.default")
def lower_one_hot(ctx, x, num_classes=-1):
    size, dtype, device = ctx.out_meta()
    if not isinstance(num_classes, (int, sympy.Basic)) or isinstance(num_classes, bool) or (
            isinstance(num_classes, int) and num_classes < 0):
        return fallback(ctx)  # the count of classes read from the data (eager: the largest class + 1)
    classes = size[-1]
    site = ctx.check_site("the classes of one_hot")

    def fn(idx, mask=None):
        # eager refuses a class outside [0, num_classes); unchecked, it would give a row of zeros
        cls = _checked_index(ctx, x, list(idx[:-1]), classes, mask, False, site)
        here = ops.eq(cls, ops.to_dtype(ops.index_expr(idx[-1], "int64"), "int64"))
        return ops.to_dtype(here, dtype)

    return GeneratedValue(size, dtype, device, fn, reads=[x])


# --------------------------------------------------------------------------- cat, stack, pad


def _in_range(i, lo, hi):
    iv = ops.index_expr(i, "int64")
    return ops.logical_and(ops.ge(iv, ops.to_dtype(ops.index_expr(lo, "int64"), "int64")),
                           ops.lt(iv, ops.to_dtype(ops.index_expr(hi, "int64"), "int64")))


@register_lowering("cat.default")
def lower_cat(ctx, tensors, dim=0):
    size, dtype, device = ctx.out_meta()
    parts = [t for t in tensors if not (t.rank == 1 and exprs.equal(t.size[0], 0) and len(size) != 1)]
    dim = dim % len(size)
    compute = dtypes.compute_dtype(dtype)

    def fn(idx, outer=None):
        out = None
        offset = sympy.Integer(0)
        for t in parts:
            n = t.size[dim]
            mask = _in_range(idx[dim], offset, offset + n)
            shifted = list(idx)
            shifted[dim] = idx[dim] - offset
            load_mask = mask if outer is None else ops.logical_and(outer, mask)
            v = ops.to_dtype(t.load(shifted, load_mask), compute)
            out = v if out is None else ops.where(mask, v, out)
            offset = offset + n
        return out

    return GeneratedValue(size, dtype, device, fn, reads=parts)


@register_lowering("stack.default")
def lower_stack(ctx, tensors, dim=0):
    size = ctx.out_meta()[0]
    dim = dim % len(size)
    unsqueezed = [view(t, t.size[:dim] + [sympy.Integer(1)] + t.size[dim:],
                       lambda idx, d=dim: list(idx[:d]) + list(idx[d + 1:])) for t in tensors]
    return lower_cat(ctx, unsqueezed, dim)


@register_lowering("constant_pad_nd.default")
def lower_constant_pad_nd(ctx, x, pad, value=0):
    size, dtype, device = ctx.out_meta()
    pads = {x.rank - 1 - k: (pad[2 * k], pad[2 * k + 1]) for k in range(len(pad) // 2)}
    compute = dtypes.compute_dtype(dtype)

    def fn(idx, outer=None):
        old = list(idx)
        mask = outer
        for d, (left, _right) in pads.items():
            old[d] = idx[d] - left
            m = _in_range(old[d], 0, x.size[d])
            mask = m if mask is None else ops.logical_and(mask, m)
        if mask is None or mask is outer:
            return x.load(old, outer)
        return ops.where(mask, ops.to_dtype(x.load(old, mask), compute), ops.constant(value, compute))

    return GeneratedValue(size, dtype, device, fn, reads=[x])


# --------------------------------------------------------------------------- scatters of views
# Functionalization turns writes through views into these (the backward of a slice or a cat, a
# rotary embedding's halves); computed in place of the copy + strided write that the aten op does.


def _const_int(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, sympy.Integer):
        return int(value)
    return None


@register_lowering("slice_scatter.default")
def lower_slice_scatter(ctx, x, src, dim=0, start=None, end=None, step=1):
    """``src`` written over every ``step``-th element of ``x`` along ``dim`` from ``start``: the
    backward of a slice (a strided one: Swin's patch merging takes ``x[:, 0::2, 1::2]``)."""
    size, dtype, device = ctx.out_meta()
    dim = dim % len(size) if size else 0
    first = 0 if start is None else _const_int(start)
    every = _const_int(step)
    if first is None or every is None or every < 1 or not size:
        return fallback(ctx)  # a symbolic start (its sign decides where it counts from) or step
    if first < 0:
        wrapped = first + size[dim]
        if not isinstance(wrapped, (int, sympy.Integer)):
            return fallback(ctx)
        first = max(int(wrapped), 0)
    lo = sympy.Integer(first)
    # The slice's length is src's (eager checks they agree); its last element is at lo + (n-1)*step.
    hi = lo + (src.size[dim] - 1) * every + 1
    compute = dtypes.compute_dtype(dtype)

    def fn(idx, outer=None):
        inside = _in_range(idx[dim], lo, hi)
        shifted = list(idx)
        if every > 1:
            # i = lo + k*step exactly when i % step == lo % step, and then k = i // step - lo // step:
            # no negative dividend (i - lo is, below the slice), which keeps the index simple
            on_step = ops.eq(ops.index_expr(exprs.Mod(idx[dim], every), "int64"),
                             ops.constant(first % every, "int64"))
            inside = ops.logical_and(inside, on_step)
            shifted[dim] = exprs.FloorDiv(idx[dim], every) - first // every
        else:
            shifted[dim] = idx[dim] - lo
        load_mask = inside if outer is None else ops.logical_and(outer, inside)
        new = ops.to_dtype(src.load(shifted, load_mask), compute)
        return ops.where(inside, new, ops.to_dtype(x.load(list(idx), outer), compute))

    return GeneratedValue(size, dtype, device, fn, reads=[x, src])


@register_lowering("as_strided_scatter.default")
def lower_as_strided_scatter(ctx, x, src, size, stride, storage_offset=None):
    """``src`` written through an ``as_strided`` view of a flat buffer, where the view is one
    dense run of it: functionalization's form of a write through a reshaping view of a fresh
    buffer (Swin's pooler gradient). Other views of storage are library calls."""
    out_size, dtype, device = ctx.out_meta()
    # (the result is a copy of x: a fresh, dense buffer whatever x's strides, for a flat x)
    offset = 0 if storage_offset is None else _const_int(storage_offset)
    dims = [_const_int(d) for d in size]
    steps = [_const_int(st) for st in stride]
    if len(out_size) != 1 or offset is None or None in dims or None in steps or offset < 0:
        return fallback(ctx)
    numel = 1
    for d, st in zip(reversed(dims), reversed(steps)):
        if d != 1 and st != numel:
            return fallback(ctx)  # not one dense run in row-major order
        numel *= d
    total = exprs.to_static(out_size[0])
    if total is None or offset + numel > total:
        return fallback(ctx)
    lo, hi = sympy.Integer(offset), sympy.Integer(offset + numel)
    compute = dtypes.compute_dtype(dtype)

    def fn(idx, outer=None):
        inside = _in_range(idx[0], lo, hi)
        at = idx[0] - lo
        digits, inner = [], 1
        for d in reversed(dims):  # the position's digits in the view's shape, last dim first
            digits.append(exprs.modular_indexing(at, inner, d) if d != 1 else sympy.Integer(0))
            inner *= d
        load_mask = inside if outer is None else ops.logical_and(outer, inside)
        new = ops.to_dtype(src.load(list(reversed(digits)), load_mask), compute)
        return ops.where(inside, new, ops.to_dtype(x.load(list(idx), outer), compute))

    return GeneratedValue(out_size, dtype, device, fn, reads=[x, src])


@register_lowering("select_scatter.default")
def lower_select_scatter(ctx, x, src, dim, index):
    size, dtype, device = ctx.out_meta()
    position = _const_int(index)
    if position is None or not size:
        return fallback(ctx)
    dim = dim % len(size)
    at = position + size[dim] if position < 0 else sympy.Integer(position)
    compute = dtypes.compute_dtype(dtype)

    def fn(idx, outer=None):
        here = ops.eq(ops.index_expr(idx[dim], "int64"), ops.to_dtype(ops.index_expr(at, "int64"), "int64"))
        load_mask = here if outer is None else ops.logical_and(outer, here)
        new = ops.to_dtype(src.load(list(idx[:dim]) + list(idx[dim + 1:]), load_mask), compute)
        return ops.where(here, new, ops.to_dtype(x.load(list(idx), outer), compute))

    return GeneratedValue(size, dtype, device, fn, reads=[x, src])


def _lower_scatter(ctx, x, dim, index, new_value):
    """``x.scatter(dim, index, ...)`` where ``index`` holds one position per line along ``dim``
    and covers every other dimension of ``x`` (a loss's one-hot of its targets): a pointwise
    choice, ``new_value(pos, mask)`` where the line's index names this element, ``x`` elsewhere.
    Other shapes write several elements per line, or only part of ``x``: the library op."""
    size, dtype, device = ctx.out_meta()
    if not size:
        return fallback(ctx)
    dim = dim % len(size)
    if index.rank != len(size) or not exprs.equal(index.size[dim], 1) or not all(
            exprs.equal(index.size[d], size[d]) for d in range(len(size)) if d != dim):
        return fallback(ctx)
    site = ctx.check_site(f"dimension {dim} of scatter")
    compute = dtypes.compute_dtype(dtype)

    def fn(idx, outer=None):
        line = list(idx)
        line[dim] = sympy.Integer(0)
        # eager refuses an index outside [0, size), negative ones too
        target = _checked_index(ctx, index, line, size[dim], outer, False, site)
        here = ops.eq(target, ops.to_dtype(ops.index_expr(idx[dim], "int64"), "int64"))
        load_mask = here if outer is None else ops.logical_and(outer, here)
        return ops.where(here, ops.to_dtype(new_value(line, load_mask), compute),
                         ops.to_dtype(x.load(list(idx), outer), compute))

    return GeneratedValue(size, dtype, device, fn, reads=[x, index])


@register_lowering("scatter.value")
def lower_scatter_value(ctx, x, dim, index, value):
    if isinstance(value, sympy.Basic) and not isinstance(value, sympy.Number):
        return fallback(ctx)
    compute = dtypes.compute_dtype(ctx.out_meta()[1])
    return _lower_scatter(ctx, x, dim, index, lambda line, mask: ops.constant(value, compute))


@register_lowering("scatter.src")
def lower_scatter_src(ctx, x, dim, index, src):
    # each line takes src's element at the same place (index's shape picks src's elements)
    return _lower_scatter(ctx, x, dim, index, lambda line, mask: src.load(line, mask))


# --------------------------------------------------------------------------- constants, ranges


def _full(ctx, value):
    size, dtype, device = ctx.out_meta()
    if isinstance(value, sympy.Basic):
        return GeneratedValue(size, dtype, device,
                              lambda idx, mask=None: ops.to_dtype(ops.index_expr(value, "int64"), dtype))
    return ctx.constant(value, size, dtype, device)


@register_lowering("full.default")
def lower_full(ctx, size, fill_value, **_kwargs):
    return _full(ctx, fill_value)


@register_lowering("full_like.default", "fill.Scalar", "new_full.default")
def lower_full_like(ctx, x, fill_value, **_kwargs):
    return _full(ctx, fill_value)


@register_lowering("zeros.default", "empty.memory_format", "new_zeros.default", "new_empty.default")
def lower_zeros(ctx, size, *_args, **_kwargs):
    return _full(ctx, 0)


@register_lowering("zeros_like.default", "empty_like.default")
def lower_zeros_like(ctx, x, **_kwargs):
    return _full(ctx, 0)


@register_lowering("ones.default", "new_ones.default")
def lower_ones(ctx, size, *_args, **_kwargs):
    return _full(ctx, 1)


@register_lowering("ones_like.default")
def lower_ones_like(ctx, x, **_kwargs):
    return _full(ctx, 1)


@register_lowering("scalar_tensor.default")
def lower_scalar_tensor(ctx, value, **_kwargs):
    return _full(ctx, value)


@register_lowering("arange.start_step", "arange.start", "arange.default")
def lower_arange(ctx, *args, **_kwargs):
    numbers = [a for a in args if isinstance(a, (int, float, sympy.Basic)) and not isinstance(a, bool)]
    start, step = (0, 1) if len(numbers) == 1 else (numbers[0], numbers[2] if len(numbers) > 2 else 1)
    size, dtype, device = ctx.out_meta()

    def fn(idx, mask=None):
        i = idx[0]
        if dtypes.is_int(dtype) and all(isinstance(v, (int, sympy.Basic)) for v in (start, step)):
            return ops.to_dtype(ops.index_expr(exprs.as_expr(start) + i * step, "int64"), dtype)
        # Like eager, float ranges are computed as start + i * step in double precision.
        pos = ops.to_dtype(ops.index_expr(i, "int64"), "float64")
        return ops.add(ops.constant(float(start), "float64"), ops.mul(pos, ops.constant(float(step), "float64")))

    return GeneratedValue(size, dtype, device, fn)


# --------------------------------------------------------------------------- random


def _random(ctx, kind: str, size=None, device=None):
    """Counter-based random numbers: element ``i`` of this op is Philox(seed, base + i), where
    ``base`` moves past every earlier random op of the program, so ops never share numbers."""
    out_size, dtype, out_device = ctx.out_meta()
    size = out_size if size is None else size
    base = ctx.random_offset
    ctx.random_offset = base + exprs.product(size)
    strides = exprs.contiguous_strides(size)
    seed = ctx.out.seed

    def fn(idx, mask=None):
        flat = base + sum((i * s for i, s in zip(idx, strides)), sympy.Integer(0))
        return ops.random(kind, seed, flat)

    return GeneratedValue(size, "float32", device or out_device, fn)


@register_lowering("rand.default", "rand_like.default")
def lower_rand(ctx, *_args, **_kwargs):
    size, dtype, device = ctx.out_meta()
    r = _random(ctx, "rand")
    return GeneratedValue(size, dtype, device, lambda idx, mask=None: ops.to_dtype(r.load(idx), dtype))


@register_lowering("randn.default", "randn_like.default")
def lower_randn(ctx, *_args, **_kwargs):
    size, dtype, device = ctx.out_meta()
    r = _random(ctx, "randn")
    return GeneratedValue(size, dtype, device, lambda idx, mask=None: ops.to_dtype(r.load(idx), dtype))


@register_lowering("bernoulli.p")
def lower_bernoulli_p(ctx, x, p=0.5, generator=None):
    size, dtype, device = ctx.out_meta()
    r = _random(ctx, "rand")
    return GeneratedValue(size, dtype, device, lambda idx, mask=None: ops.to_dtype(
        ops.lt(r.load(idx), ops.constant(float(p), "float32")), dtype))


@register_lowering("bernoulli.default")
def lower_bernoulli(ctx, probs, generator=None):
    size, dtype, device = ctx.out_meta()
    r = _random(ctx, "rand")
    return GeneratedValue(size, dtype, device, lambda idx, mask=None: ops.to_dtype(
        ops.lt(r.load(idx), ops.to_dtype(probs.load(idx, mask), "float32")), dtype))


@register_lowering("native_dropout.default")
def lower_native_dropout(ctx, x, p, train):
    size, dtype, device = ctx.out_meta()
    mask_size, mask_dtype, _ = ctx.out_meta(1)
    if not train or p == 0:
        return x, ctx.constant(True, mask_size, mask_dtype, device)
    r = _random(ctx, "rand")
    keep = 1.0 - float(p)
    compute = dtypes.compute_dtype(dtype)
    mask = ctx.pointwise(size, "bool", device, lambda idx: ops.lt(r.load(idx), ops.constant(keep, "float32")))

    def out(idx):
        m = ops.to_dtype(load_broadcast(mask, idx, size), compute)
        return ops.mul(ops.mul(ops.to_dtype(x.load(idx), compute), m), ops.constant(1.0 / keep, compute))

    return ctx.pointwise(size, dtype, device, out), mask
