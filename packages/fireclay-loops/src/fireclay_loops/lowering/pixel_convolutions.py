"""Convolutions over a one-pixel image, as matrix products (CPU).

A 2-D convolution whose image is one pixel and whose kernel is 1 x 1 (ungrouped, no padding, not
transposed: the squeeze-and-excitation layers of MobileNetV3 and EfficientNet) is a matrix
product, ``y[n, o] = sum_c x[n, c] w[o, c] + b[o]``, whatever its stride and dilation. The
library's convolution pays for its generality there: on the 2-core development box oneDNN took
25-110 us per call on such shapes where ``addmm`` takes 3-15 us, and its backward 120-2400 us
against two ``mm`` calls and a sum (docs/status.md). So on the CPU the forward lowers to
``addmm`` (``mm`` without a bias) of 2-D views of the input and the weight, the backward to
``grad @ w`` for the input's gradient, ``grad.T @ x`` for the weight's and a reduction kernel
for the bias's; the results are the same values up to the order of the sums.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from fireclay_loops import exprs
from fireclay_loops.ir import TensorArg
from fireclay_loops.lowering.context import LoweringContext
from fireclay_loops.lowering.reductions import sum_over
from fireclay_loops.lowering.values import BufferValue, TensorValue


def is_pixel_convolution(x: Any, weight: Any, padding: Any, transposed: Any, groups: Any) -> bool:
    """Whether a CPU convolution's input is one pixel and its kernel 1 x 1, ungrouped, unpadded
    and not transposed (static sizes only)."""
    if not isinstance(x, TensorValue) or not isinstance(weight, TensorValue) or x.rank != 4 or weight.rank != 4:
        return False
    if not str(x.device).startswith("cpu") or transposed is not False or groups != 1:
        return False
    if not isinstance(padding, (list, tuple)) or any(exprs.to_static(p) != 0 for p in padding):
        return False
    return all(exprs.to_static(d) == 1 for d in (*x.size[2:], *weight.size[2:]))


def _matrix(arg: TensorArg, transpose: bool = False) -> TensorArg:
    """A 4-D tensor of one pixel, passed to a library call as the matrix of its first two
    dimensions (transposed if asked)."""
    rows, cols = (1, 0) if transpose else (0, 1)
    return TensorArg(arg.buffer, (arg.size[rows], arg.size[cols]), (arg.stride[rows], arg.stride[cols]), arg.offset)


def _as_pixels(product: BufferValue, size: Sequence[Any]) -> BufferValue:
    """A [rows, cols] product as the node's [rows, cols, 1, 1] result (the same memory)."""
    return BufferValue(product.buffer, size, exprs.contiguous_strides(size))


def lower_pixel_convolution(ctx: LoweringContext, x: TensorValue, weight: TensorValue, bias: Any) -> BufferValue:
    x2 = _matrix(ctx.realize_strided(x))
    wt = _matrix(ctx.realize_strided(weight), transpose=True)
    size, dtype, device = ctx.out_meta()
    if bias is None:
        product = ctx.library_call("aten::mm.default", (x2, wt), size[:2], dtype, device)
    else:
        product = ctx.library_call("aten::addmm.default", (ctx.realize_strided(bias), x2, wt), size[:2], dtype, device)
    return _as_pixels(product, size)


def lower_pixel_convolution_backward(ctx: LoweringContext, grad: TensorValue, x: TensorValue, weight: TensorValue,
                                     output_mask: Sequence[Any]) -> tuple[BufferValue | None, ...]:
    g = ctx.realize_strided(grad)
    results: list[BufferValue | None] = [None, None, None]
    if output_mask[0]:
        size, dtype, device = ctx.out_meta(0)
        w2 = _matrix(ctx.realize_strided(weight))
        results[0] = _as_pixels(ctx.library_call("aten::mm.default", (_matrix(g), w2), size[:2], dtype, device), size)
    if output_mask[1]:
        size, dtype, device = ctx.out_meta(1)
        x2 = _matrix(ctx.realize_strided(x))
        results[1] = _as_pixels(ctx.library_call("aten::mm.default", (_matrix(g, transpose=True), x2), size[:2],
                                                 dtype, device), size)
    if len(output_mask) > 2 and output_mask[2]:
        grad_value = BufferValue(ctx.out.buffers[g.buffer], g.size, g.stride, g.offset)
        results[2] = ctx.realize(sum_over(ctx, grad_value, [0, 2, 3], out=2))
    return tuple(results)
