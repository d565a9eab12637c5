"""``mm`` and ``addmm``: library matmuls, with aligned operands and the bias added where it is
cheapest.

``mm(a, b)`` whose reduction length K is not a multiple of 16 bytes (a language model's
vocabulary, 50257, in the backward of its output projection) makes cuBLAS run its ``align1``
GEMMs, several times slower than the aligned ones; so does an unaligned N, the row length of the
product (the same projection's forward writes logits of 50257 per row). Where
``config.pad_matmul`` names the device type, the program passes operands zero-padded along K and
N to a multiple of 16 bytes instead, as Inductor's ``pad_mm`` does: the zeros add nothing to any
dot product, the product's extra columns are never read, the copies cost a pass over the
operands, and the GEMM runs its fast kernels (what it gains is measured in docs/status.md).

An operand our own kernels compute needs no copy (:func:`padded_in_place`): its rows are already
laid out longer than the tensor (``config.pad_strides``, :func:`fireclay_loops.layout.padded_strides`:
a language model's logits gradient, 50257 elements a row stored 50304 apart), so the padded
operand is a view of the same buffer that reads a few columns of the row padding, and a small
kernel writes zeros there (``M x 7`` elements, where the copy wrote ``M x 50264``). Every other
reader (the weight's gradient, ``grad_logits.t() @ hidden``; a pointwise kernel) reads the
tensor through its view as before. Padding along a dimension with the largest stride (rows of a
``[K, N]`` operand) grows the buffer's allocation past its end instead.

``addmm(bias, x, w)`` adds a broadcast bias to ``x @ w``. As one library call the bias is the
library's epilogue; on CUDA, cuBLAS then often picks a slower GEMM than for the plain product
(docs/status.md). When everything that reads the result is computed
by our own kernels (a GELU, a residual add before a layer norm), the program instead calls
``mm`` and adds the bias as a pointwise value, which those kernels fuse: no extra pass over
memory, and the faster GEMM.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import sympy

from fireclay_ir import Value, iter_values
from fireclay_loops import dtypes, exprs
from fireclay_loops.config import config
from fireclay_loops.dtypes import ITEMSIZE
from fireclay_loops.ir import ComputeNode
from fireclay_loops.lowering import library_layouts
from fireclay_loops.lowering.context import LoweringContext, fallback
from fireclay_loops.lowering.pointwise import lower_add
from fireclay_loops.lowering.registry import register_lowering
from fireclay_loops.lowering.values import BufferValue, TensorValue
from fireclay_loops.lowering.views import PURE_VIEW_TARGETS
from fireclay_loops.ops import ops

# cuBLAS' fast GEMMs want every row of every operand to start 16-byte aligned.
GEMM_ALIGNMENT_BYTES = 16
# A padded GEMM copies both operands: worth it when the product is large on both sides (the
# lm_head's backward is 8192 x 50257 x 768); a thin one runs about as fast unaligned.
MIN_PADDED_SIDE = 256

# A bias added by our kernel for a view a library call reads (q, k and v permuted into attention)
# would be a pass of its own, where the library's epilogue costs nothing: readers are looked for
# through views.


def _kernel_readers_only(graph: Any, value: Any) -> bool:
    """Whether every reader of ``value`` (through views) is an op our kernels compute, and the
    value is no graph output."""
    from fireclay_loops.lowering.driver import lowering_for
    from fireclay_loops.lowering.extern import EXTERN_OPS

    outputs = {id(v) for v in iter_values(graph.outputs)}
    pending, seen = [value], set()
    while pending:
        v = pending.pop()
        if id(v) in outputs:
            return False
        for user in v.users:
            if id(user) in seen:
                continue
            seen.add(id(user))
            target = user.target
            if target in PURE_VIEW_TARGETS:
                pending.extend(o for o in user.outputs if o.is_tensor)
                continue
            if target in EXTERN_OPS or lowering_for(target) is None or target == "addmm.default":
                return False
    return True


def unfuse_bias(ctx: LoweringContext, bias: TensorValue) -> bool:
    """Whether this ``addmm`` lowers to ``mm`` plus a fused bias: its device type is in config
    ``unfuse_addmm_bias`` (CUDA by default), the bias is broadcast along rows, and only our
    kernels read the result."""
    _, _, device = ctx.out_meta()
    if str(device).split(":")[0] not in config.unfuse_addmm_bias:
        return False
    if not isinstance(bias, TensorValue) or len(bias.size) > 1:
        return False
    return _kernel_readers_only(ctx.graph, ctx.node.outputs[0])


class _Call(NamedTuple):
    """An aten call for :func:`fallback` other than the node being lowered (its outputs' types)."""

    op: str
    args: tuple[Any, ...]
    kwargs: dict[str, Any]


def _aligned_extent(ctx: LoweringContext, n: int) -> int:
    """``n`` elements of the current node's dtype rounded up to :data:`GEMM_ALIGNMENT_BYTES`."""
    align = max(1, GEMM_ALIGNMENT_BYTES // ITEMSIZE[ctx.out_meta()[1]])
    return -(-n // align) * align


def padded_extents(ctx: LoweringContext, a: TensorValue, b: TensorValue) -> tuple[int | None, int | None, int | None]:
    """``(K, N, M)`` of ``a @ b`` rounded up to :data:`GEMM_ALIGNMENT_BYTES` where they are
    unaligned and at least ``config.pad_min_stride`` long, on a device type in
    ``config.pad_matmul``, with both other sides at least :data:`MIN_PADDED_SIDE` (None for each
    extent kept as it is). Static sizes only."""
    _, dtype, device = ctx.out_meta()
    if str(device).split(":")[0] not in config.pad_matmul or a.rank != 2 or b.rank != 2 or dtype not in ITEMSIZE:
        return None, None, None
    sizes = [exprs.to_static(n) for n in (a.size[0], a.size[1], b.size[1])]
    if any(n is None for n in sizes):
        return None, None, None
    m, k, n = (int(x) for x in sizes)  # type: ignore[arg-type]

    def padded(extent: int, *others: int) -> int | None:
        wide = _aligned_extent(ctx, extent)
        if wide == extent or extent < config.pad_min_stride or min(others) < MIN_PADDED_SIDE:
            return None
        return wide

    return padded(k, m, n), padded(n, m, k), padded(m, k, n)


def zero_padded(ctx: LoweringContext, x: TensorValue, extents: dict[int, int]) -> BufferValue:
    """``x`` stored with each dimension ``d`` of ``extents`` grown to ``extents[d]`` by zeros, in
    ``x``'s dimension order when ``x`` is a dense view of a buffer (a transposed weight stays
    transposed)."""
    size = list(x.size)
    for d, extent in extents.items():
        size[d] = sympy.Integer(extent)
    compute = dtypes.compute_dtype(x.dtype)
    stride = None
    if isinstance(x, BufferValue):
        hints = [exprs.to_static(s) for s in (*x.size, *x.stride)]
        if all(h is not None for h in hints):
            order = library_layouts.dense_order([int(h) for h in hints[:x.rank]],  # type: ignore[arg-type]
                                                [int(h) for h in hints[x.rank:]])  # type: ignore[arg-type]
            stride = None if order is None else library_layouts.strides_in_order(size, order)

    def inner(index: list[Any]) -> Any:
        inside = None
        for d in extents:
            here = ops.lt(ops.index_expr(index[d], "int64"), ops.index_expr(x.size[d], "int64"))
            inside = here if inside is None else ops.logical_and(inside, here)
        return ops.where(inside, ops.to_dtype(x.load(index, inside), compute), ops.constant(0, compute))

    return ctx.pointwise(size, x.dtype, x.device, inner, stride=stride or exprs.contiguous_strides(size))


def _views_reach_output(graph: Any, value: Value) -> bool:
    """Whether ``value``, the value it views, or a view of either is an output of ``graph``
    (returned, or saved for the backward: an output is a whole buffer of its own layout)."""
    root = value
    while root.node is not None and root.node.target in PURE_VIEW_TARGETS:
        root = root.node.args[0]
    outputs = {id(v) for v in iter_values(graph.outputs)}
    pending, seen = [root], {id(root)}
    while pending:
        v = pending.pop()
        if id(v) in outputs:
            return True
        for user in v.users:
            if user.target in PURE_VIEW_TARGETS:
                fresh = [o for o in user.outputs if o.is_tensor and id(o) not in seen]
                seen.update(id(o) for o in fresh)
                pending.extend(fresh)
    return False


def _static_ints(values: Sequence[Any]) -> list[int] | None:
    found = [exprs.to_static(v) for v in values]
    return None if any(n is None for n in found) else [int(n) for n in found]  # type: ignore[arg-type]


def _dimension_groups(x: BufferValue, sizes: list[int], strides: list[int]) -> dict[int, list[int]] | None:
    """For each dimension of the view ``x`` (of extent above 1), the dimensions of its buffer
    (of ``sizes`` and ``strides``) it walks, innermost first: ``x`` must walk the whole buffer,
    each of its dimensions a dense run of the buffer's (a ``[B * T, V]`` view of ``[B, T, V]``
    rows walks ``T`` and ``B`` along its first). None for any other view."""
    view_sizes, view_strides = _static_ints(x.size), _static_ints(x.stride)
    if view_sizes is None or view_strides is None or not exprs.equal(x.offset, x.buffer.offset):
        return None
    inner = sorted((d for d, n in enumerate(sizes) if n != 1), key=lambda d: strides[d])
    groups: dict[int, list[int]] = {}
    k = 0
    for d in sorted((d for d, n in enumerate(view_sizes) if n != 1), key=lambda d: view_strides[d]):
        if k >= len(inner) or strides[inner[k]] != view_strides[d]:
            return None
        group, extent = [inner[k]], sizes[inner[k]]
        k += 1
        while extent < view_sizes[d]:
            if k >= len(inner) or strides[inner[k]] != strides[group[-1]] * sizes[group[-1]]:
                return None
            group.append(inner[k])
            extent *= sizes[inner[k]]
            k += 1
        if extent != view_sizes[d]:
            return None
        groups[d] = group
    return groups if k == len(inner) else None


def _overlaps(sizes: list[int], strides: list[int]) -> bool:
    """Whether two indices of a layout may address one element: not so when, in stride order,
    each stride steps past everything the smaller ones reach."""
    span = 1
    for d in sorted((d for d, n in enumerate(sizes) if n != 1), key=lambda d: strides[d]):
        if strides[d] < span:
            return True
        span += strides[d] * (sizes[d] - 1)
    return False


def padded_in_place(ctx: LoweringContext, source: Value, x: TensorValue, extents: dict[int, int]) -> BufferValue | None:
    """``x`` (the value of the graph's ``source``) with each dimension ``d`` of ``extents`` grown
    to ``extents[d]`` by zeros, as a view of ``x``'s own buffer: where our kernels write that
    buffer and each grown dimension walks one of the buffer's dimensions, whose new positions
    fall in no element of the tensor (rows padded by ``config.pad_strides`` have room past their
    end; the outermost dimension grows the allocation). The buffer's size becomes the grown one
    (its allocation covers the view), a node writes the zeros, and every other reader keeps its
    view. None where that cannot be: the buffer is a graph input, a library result, a scatter's
    target, an output (through views), or laid out otherwise."""
    if not isinstance(x, BufferValue) or not extents:
        return None
    buf = x.buffer
    if buf.is_input or _views_reach_output(ctx.graph, source):
        return None
    writers = [n for n in ctx.out.nodes if buf.name in n.write_buffers()]
    if not writers or not all(isinstance(n, ComputeNode) and not n.body.accumulates for n in writers):
        return None
    current = _static_ints(buf.size)
    base = _static_ints(ctx.grown.get(buf.name, buf.size))  # the computed tensor's extents
    strides = _static_ints(buf.stride)
    if current is None or base is None or strides is None:
        return None
    groups = _dimension_groups(x, base, strides)
    if groups is None:
        return None
    grown = list(current)
    for d, extent in extents.items():
        group = groups.get(d)
        if group is None or len(group) != 1 or grown[group[0]] not in (base[group[0]], extent):
            return None
        grown[group[0]] = extent
    if _overlaps(grown, strides):
        return None
    for e, extent in enumerate(grown):
        if extent != current[e]:  # the zeros of each grown dimension, past what is there already
            starts = [0] * len(grown)
            starts[e] = current[e]
            size = list(current)
            size[e] = extent - current[e]
            ctx.zero_fill(buf, starts, size)
            current[e] = extent
    ctx.grown.setdefault(buf.name, list(buf.size))
    buf.size = [sympy.Integer(n) for n in grown]
    size = [sympy.Integer(extents[d]) if d in extents else n for d, n in enumerate(x.size)]
    return BufferValue(buf, size, x.stride, x.offset)


def padded_operand(ctx: LoweringContext, source: Value, x: TensorValue, extents: dict[int, int]) -> TensorValue:
    """``x`` zero-padded to ``extents``: in its own buffer where :func:`padded_in_place` can,
    else a copy (:func:`zero_padded`)."""
    return padded_in_place(ctx, source, x, extents) or zero_padded(ctx, x, extents)


def library_mm(ctx: LoweringContext, a: TensorValue, b: TensorValue, call: Any = None) -> tuple[TensorValue | None, ...]:
    """The library's ``mm`` of ``a`` and ``b`` (the current node, or ``call``), with K and N
    zero-padded where :func:`padded_extents` says so, and M where ``a`` can grow in its own
    buffer (a copy of ``a`` would cost what the aligned GEMM saves): the product of the
    language-model head's weight gradient, ``grad_logits.t() @ hidden``, has 50257 rows, and
    cuBLAS runs a slower kernel for it than for 50264. A padded product is wider or longer; the
    result is a strided view of its first rows and columns, copied into eager's layout where
    the result must have it (returned to the caller)."""
    k, n, m = padded_extents(ctx, a, b)
    node = call or ctx.node
    a_extents = {d: e for d, e in ((1, k),) if e is not None}
    grown = None if m is None else padded_in_place(ctx, node.args[0], a, a_extents | {0: m})
    if grown is None:
        m = None
    if k is None and n is None and m is None:
        return fallback(ctx, call, kind="extern")
    if grown is not None:
        a = grown
    elif k is not None:
        a = padded_operand(ctx, node.args[0], a, a_extents)
    b_extents = {d: e for d, e in ((0, k), (1, n)) if e is not None}
    if b_extents:
        b = padded_operand(ctx, node.args[1], b, b_extents)
    replace: dict[Value, TensorValue] = {node.args[0]: a, node.args[1]: b}
    if n is None and m is None:
        return fallback(ctx, call, kind="extern", replace=replace)
    size, dtype, device = ctx.out_meta()
    (wide,) = fallback(ctx, call, kind="extern", replace=replace, sizes=[[m or size[0], n or size[1]]])
    assert wide is not None
    result: TensorValue = BufferValue(wide.buffer, size, wide.stride)
    if call is None and ctx.needs_eager_layout():
        result = ctx.pointwise(size, dtype, device, result.load, stride=exprs.contiguous_strides(size))
    return (result,)


@register_lowering("mm.default")
def lower_mm(ctx: LoweringContext, a: TensorValue, b: TensorValue) -> Any:
    return library_mm(ctx, a, b)


@register_lowering("addmm.default")
def lower_addmm(ctx: LoweringContext, bias: TensorValue, x: TensorValue, w: TensorValue, beta: Any = 1,
                alpha: Any = 1) -> Any:
    if beta != 1 or alpha != 1 or not unfuse_bias(ctx, bias):
        return fallback(ctx, kind="extern")
    node = ctx.node
    (product,) = library_mm(ctx, x, w, _Call("aten::mm.default", (node.args[1], node.args[2]), {}))
    return lower_add(ctx, product, bias)
