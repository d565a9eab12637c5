"""Extern calls: ops a library kernel does better (matmul, convolution, attention) stay calls
into torch's implementation, with their inputs passed as strided views of buffers.

Convolutions over 4-D activations in a program that keeps them channels-last
(:mod:`fireclay_loops.layout`) get their activations channels-last: copied once by a kernel
when the producer did not store them so already (a program input, say)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import sympy

from fireclay_ir import Value
from fireclay_ir.dialects.aten import ATTENTION_BIAS_ALIGNMENT, ATTENTION_BIAS_POSITIONS
from fireclay_loops import exprs, layout
from fireclay_loops.lowering import library_layouts
from fireclay_loops.lowering.context import LoweringContext, fallback
from fireclay_loops.lowering.pixel_convolutions import (
    is_pixel_convolution,
    lower_pixel_convolution,
    lower_pixel_convolution_backward,
)
from fireclay_loops.lowering.registry import register_lowering
from fireclay_loops.lowering.values import BufferValue, TensorValue

# (mm and addmm are lowered in fireclay_loops.lowering.matmul)
EXTERN_OPS: tuple[str, ...] = (
    "mm.default", "bmm.default", "baddbmm.default", "addmv.default", "mv.default",
    "linear.default",
    "scaled_dot_product_attention.default",
)
# The fused attention kernels behind scaled_dot_product_attention (forward and backward) read
# their tensors (query, key, value, output, gradients) with the last dimension dense (stride 1)
# without checking it: the public function picks one only for such operands, so the traced
# graph's operands had that layout, but a layout lowering chose for an intermediate buffer need
# not (a max-pooled query stored NCHW where eager kept it channels-last), and the kernel then
# returns wrong values with no error.
FUSED_ATTENTION_OPS = (
    "_scaled_dot_product_flash_attention_for_cpu.default",
    "_scaled_dot_product_efficient_attention.default",
    "_scaled_dot_product_flash_attention.default",
    "_scaled_dot_product_cudnn_attention.default",
)
FUSED_ATTENTION_BACKWARD_OPS = (
    "_scaled_dot_product_flash_attention_for_cpu_backward.default",
    "_scaled_dot_product_efficient_attention_backward.default",
    "_scaled_dot_product_flash_attention_backward.default",
    "_scaled_dot_product_cudnn_attention_backward.default",
)
EXTERN_OPS += FUSED_ATTENTION_OPS + FUSED_ATTENTION_BACKWARD_OPS


def lower_extern(ctx: LoweringContext, *args: Any, **kwargs: Any) -> Any:
    return fallback(ctx, kind="extern")


for _target in EXTERN_OPS:
    if _target not in FUSED_ATTENTION_OPS + FUSED_ATTENTION_BACKWARD_OPS + ("mm.default",):
        register_lowering(_target)(lower_extern)


def heads_after_sequence(size: Sequence[Any]) -> list[sympy.Expr]:
    """Dense strides of a (batch, heads, sequence, dim) tensor stored in (batch, sequence, heads,
    dim) order: the layout of heads split off a projection by view + transpose, which eager's
    pointwise ops on them keep, and in which the fused kernels write their results for it."""
    return library_layouts.strides_in_order(size, [0, 2, 1, 3])


def _attention_operands(ctx: LoweringContext) -> dict[Any, TensorValue]:
    """Copies of the current node's tensor arguments whose last dimension is not dense in the
    buffer they view, by graph value. A 4-D operand computed for this call (a query after a
    rotary embedding) is stored with :func:`heads_after_sequence` strides: flash and cuDNN
    attention write their output in the query's order, so the output projection then reads the
    output's heads merged back as a view (stored (batch, heads, sequence, dim), the output had
    to be copied into the other order first)."""
    replace: dict[Any, TensorValue] = {}
    bias = BIAS_POSITIONS.get(ctx.node.target)
    bias_value = ctx.node.args[bias] if bias is not None and bias < len(ctx.node.args) else None
    for a in [*ctx.node.args, *ctx.node.kwargs.values()]:
        v = ctx.env.get(a) if isinstance(a, Value) else None
        if not isinstance(v, TensorValue) or v.rank == 0 or a in replace:
            continue
        order = heads_after_sequence(v.size) if v.rank == 4 and a is not bias_value else None
        if not isinstance(v, BufferValue):
            v = ctx.env[a] = ctx.pointwise(v.size, v.dtype, v.device, v.load, stride=order)
        if not exprs.equal(v.stride[-1], 1) and not exprs.equal(v.size[-1], 1):
            stride = order if order is not None else exprs.contiguous_strides(v.size)
            replace[a] = ctx.pointwise(v.size, v.dtype, v.device, v.load, stride=stride)
    return replace


# The memory-efficient and cuDNN kernels' additive mask: dense rows whose strides and start are
# aligned (fireclay_ir.dialects.aten.ATTENTION_BIAS_POSITIONS says why); a buffer the lowering lays
# out densely loses the row padding eager's scaled_dot_product_attention gives it.
BIAS_POSITIONS = {op.removeprefix("aten::"): position for op, position in ATTENTION_BIAS_POSITIONS.items()}
BIAS_ALIGNMENT = ATTENTION_BIAS_ALIGNMENT


def _aligned(v: BufferValue) -> bool:
    steps = [st for sz, st in zip(v.size[:-1], v.stride[:-1]) if not exprs.equal(sz, 1)]
    return all((n := exprs.to_static(x)) is not None and n % BIAS_ALIGNMENT == 0 for x in [*steps, v.offset])


def _aligned_bias(ctx: LoweringContext, replace: dict[Any, TensorValue]) -> dict[Any, TensorValue]:
    """``replace`` plus, where the op takes an attention mask whose strides or start are not
    aligned, a copy of it laid out in rows padded to :data:`BIAS_ALIGNMENT` elements."""
    position = BIAS_POSITIONS.get(ctx.node.target)
    if position is None or position >= len(ctx.node.args) or not isinstance(ctx.node.args[position], Value):
        return replace
    a = ctx.node.args[position]
    v = replace.get(a) or ctx.env.get(a)
    if not isinstance(v, TensorValue) or v.rank < 2:
        return replace
    if isinstance(v, BufferValue) and _aligned(v):
        return replace
    last = exprs.to_static(v.size[-1])
    if last is None:
        return replace  # a symbolic row length: the kernel's own check reports it
    padded = [*v.size[:-1], sympy.Integer(-(-last // BIAS_ALIGNMENT) * BIAS_ALIGNMENT)]
    # the graph value now stands for the aligned buffer: the next attention call reading the same
    # mask (one per layer) finds it aligned, instead of storing a copy of its own
    aligned = ctx.env[a] = ctx.pointwise(v.size, v.dtype, v.device, v.load, stride=exprs.contiguous_strides(padded))
    return {**replace, a: aligned}


def lower_fused_attention(ctx: LoweringContext, *args: Any, **kwargs: Any) -> Any:
    return fallback(ctx, kind="extern", replace=_aligned_bias(ctx, _attention_operands(ctx)))


def lower_fused_attention_backward(ctx: LoweringContext, *args: Any, **kwargs: Any) -> Any:
    return fallback(ctx, kind="fallback", replace=_aligned_bias(ctx, _attention_operands(ctx)))


for _target in FUSED_ATTENTION_OPS:
    register_lowering(_target)(lower_fused_attention)
for _target in FUSED_ATTENTION_BACKWARD_OPS:
    register_lowering(_target)(lower_fused_attention_backward)


def _activations_in_layout(ctx: LoweringContext, positions: tuple[int, ...],
                           channels_last: bool = True) -> dict[Any, TensorValue]:
    """The 4-D activations at ``positions`` of the current node's arguments (those that can be
    channels-last) channels-last, or in eager's layout, by graph value."""
    replace: dict[Any, TensorValue] = {}
    for k in positions:
        a = ctx.node.args[k]
        v = ctx.env.get(a)
        if isinstance(v, TensorValue) and layout.can_be_channels_last(v.size) and a not in replace:
            replace[a] = ctx.arg_in_layout(v, channels_last)
    return replace


@register_lowering("convolution.default")
def lower_convolution(ctx: LoweringContext, x: TensorValue, *args: Any, **kwargs: Any) -> Any:
    """The input and the weight channels-last: the library then writes the result channels-last
    without reordering either activation. (Given an NCHW weight, the library would copy it to
    channels-last itself on every call, through an allocation and a dispatched copy that cost
    more than this program's copy kernel.) Over a one-pixel image with a 1 x 1 kernel: a matrix
    product (:mod:`fireclay_loops.lowering.pixel_convolutions`)."""
    weight, bias = args[0], args[1]
    padding, transposed, groups = args[3], args[5], args[7]
    if is_pixel_convolution(x, weight, padding, transposed, groups):
        return lower_pixel_convolution(ctx, x, weight, bias)
    if not ctx.channels_last or x.rank != 4:
        return fallback(ctx, kind="extern")
    return fallback(ctx, kind="extern", replace=_activations_in_layout(ctx, (0, 1)))


@register_lowering("convolution_backward.default")
def lower_convolution_backward(ctx: LoweringContext, grad_output: TensorValue, x: TensorValue, *args: Any,
                               **kwargs: Any) -> Any:
    """The gradient and the input channels-last (the weight as it is): the library then
    writes the input gradient channels-last too. A depthwise backward whose kernel is larger
    than its image gets both in eager's layout instead (:func:`layout.depthwise_backward_keeps_
    eager_layout`), and writes its gradients in that layout. Over a one-pixel image with a 1 x 1
    kernel: matrix products (:mod:`fireclay_loops.lowering.pixel_convolutions`)."""
    weight, padding, transposed, groups, output_mask = args[0], args[3], args[5], args[7], args[8]
    if is_pixel_convolution(x, weight, padding, transposed, groups):
        return lower_pixel_convolution_backward(ctx, grad_output, x, weight, output_mask)
    if not ctx.channels_last or x.rank != 4:
        return fallback(ctx, kind="fallback")
    if (str(x.device).startswith("cpu") and isinstance(weight, TensorValue)
            and layout.depthwise_backward_keeps_eager_layout([exprs.to_static(d) for d in x.size],
                                                             [exprs.to_static(d) for d in weight.size], groups)):
        return fallback(ctx, kind="fallback", replace=_activations_in_layout(ctx, (0, 1), channels_last=False))
    return fallback(ctx, kind="fallback", replace=_activations_in_layout(ctx, (0, 1)))

