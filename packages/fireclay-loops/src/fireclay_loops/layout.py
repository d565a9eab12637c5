"""Memory layout of computed buffers: channels-last around 2-D convolutions.

A library convolution on a CPU runs on channels-last (NHWC) activations as they are, but reorders
NCHW ones into its own blocked layout and back on every call, which costs more than the copy to
channels-last and the reorder-free convolution together. So in a program with 2-D convolutions on
a device named by ``config.channels_last`` the lowering keeps activations channels-last:

* the 4-D activation a convolution reads (``convolution``'s input, ``convolution_backward``'s
  gradient and input) is passed channels-last, copied once by a kernel when it is not already;
  so is a forward convolution's weight (the library would otherwise copy it to channels-last on
  every call, through an allocation and a dispatched copy: slower than a kernel of the program);
* a 4-D buffer computed by a pointwise or reduction node follows its inputs: channels-last when
  one of the node's 4-D inputs is (as eager's kernels choose their output's layout), and its
  loops run in the buffer's memory order so that the innermost loop walks the channels;
* a library call in :data:`FOLLOWS_INPUT_LAYOUT` writes its 4-D results channels-last when the
  argument its CPU kernel takes the layout from is (its input); if a library ever returns another
  layout, the generated wrapper copies the result into the planned one (slower, never wrong);
* the program's outputs keep the strides of the graph's output metadata (eager's), except those a
  forward graph lists under ``autograd.saved_outputs``: only its backward reads them, and the
  backward is compiled for the layouts it receives, so they stay channels-last.

Only unambiguous layouts decide: a tensor with one channel or one pixel is both contiguous and
channels-last, and libraries take it as contiguous. (A library's channels-last result of that
shape, a 1x1 kernel's weight gradient, reports other strides than eager's along its dimensions of
extent 1; as a program output it is declared in eager's strides and restrided, not copied.)

The choice is measured, not assumed (docs/status.md): on the CPU a small VGG-like network's
inference was faster with it, mostly the convolutions.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import sympy

from fireclay_loops import exprs

# The graph meta key under which fireclay-autograd lists a training forward's outputs that its
# backward reads.
SAVED_OUTPUTS = "autograd.saved_outputs"

# aten ops whose CPU kernels write their 4-D results channels-last when one argument is: the op
# and the position of that argument (the input, for backward ops; checked against eager by the
# tests for every entry).
FOLLOWS_INPUT_LAYOUT: dict[str, int] = {
    "aten::convolution.default": 0,
    "aten::convolution_backward.default": 1,
    "aten::_native_batch_norm_legit_functional.default": 0,
    "aten::_native_batch_norm_legit.default": 0,
    "aten::_native_batch_norm_legit.no_stats": 0,
    "aten::_native_batch_norm_legit_no_training.default": 0,
    "aten::native_batch_norm.default": 0,
    "aten::native_batch_norm_backward.default": 1,
    "aten::max_pool2d_with_indices.default": 0,
    "aten::max_pool2d_with_indices_backward.default": 1,
    "aten::avg_pool2d.default": 0,
    "aten::avg_pool2d_backward.default": 1,
}

# Ops that make a program choose channels-last: 2-D convolutions, forward and backward.
CONVOLUTIONS = frozenset({"aten::convolution.default", "aten::convolution_backward.default"})


def channels_last_strides(size: Sequence[Any]) -> list[sympy.Expr]:
    """Strides of a dense NCHW-indexed tensor stored as NHWC: ``[H*W*C, 1, W*C, C]``."""
    n, c, h, w = (exprs.as_expr(s) for s in size)
    return [sympy.Mul(h, w, c), sympy.Integer(1), sympy.Mul(w, c), c]


def _same(size: Sequence[Any], a: Sequence[Any], b: Sequence[Any]) -> bool:
    return all(exprs.equal(x, y) or exprs.equal(n, 1) for n, x, y in zip(size, a, b))


def is_channels_last(size: Sequence[Any], stride: Sequence[Any]) -> bool:
    """Whether a 4-D tensor is stored channels-last and not also contiguous (one channel or
    one pixel makes the two layouts the same memory; libraries then take it as contiguous)."""
    if len(size) != 4 or len(stride) != 4:
        return False
    size = [exprs.as_expr(s) for s in size]
    if exprs.equal(size[1], 1) or (exprs.equal(size[2], 1) and exprs.equal(size[3], 1)):
        return False
    return _same(size, stride, channels_last_strides(size)) and not is_contiguous(size, stride)


def is_contiguous(size: Sequence[Any], stride: Sequence[Any]) -> bool:
    """Whether a tensor is stored in eager's default (row-major) layout."""
    return len(size) == len(stride) and _same(size, stride, exprs.contiguous_strides(size))


def can_be_channels_last(size: Sequence[Any]) -> bool:
    """Whether a 4-D size has a channels-last layout distinct from the contiguous one."""
    if len(size) != 4:
        return False
    size = [exprs.as_expr(s) for s in size]
    return not (exprs.equal(size[1], 1) or (exprs.equal(size[2], 1) and exprs.equal(size[3], 1)))


def is_2d_convolution(op: str, args: Sequence[Any], rank_of: Callable[[Any], int | None]) -> bool:
    """Whether an aten call is a convolution over 4-D activations; ``rank_of(arg)`` gives a
    tensor argument's rank (None for non-tensors)."""
    if op not in CONVOLUTIONS or not args:
        return False
    first = args[1] if op == "aten::convolution_backward.default" else args[0]
    return bool(rank_of(first) == 4)


def uses_channels_last(graph: Any, device_types: Sequence[str]) -> bool:
    """Whether an aten graph should keep activations channels-last: it has a 2-D convolution on
    a device type listed in ``device_types`` (``config.channels_last``). On CUDA a float32
    convolution of training (a forward that saves for its backward, or the backward) stays in
    eager's layout: under torch's default ``torch.backends.cudnn.allow_tf32 = True`` cuDNN runs
    TF32 kernels for channels-last float32 convolutions where eager's NCHW calls mostly do not,
    and ResNet's weight gradients, sums over the batch and the image, then differ from eager's by
    6e-2 relative (eager's own error against float64: 3e-6). Inference outputs stay within
    float32's tolerance with those kernels, and run 1.4x faster (docs/status.md)."""
    if not device_types:
        return False
    from fireclay_ir import Value

    def rank_of(a: Any) -> int | None:
        return len(a.meta.shape) if isinstance(a, Value) and a.is_tensor else None

    convolutions = list(_convolutions(graph, rank_of))
    training = SAVED_OUTPUTS in graph.meta or any(backward for _, backward, _ in convolutions)
    if "cpu" in device_types and _cpu_weight_copies_outweigh_activations(convolutions):
        device_types = [d for d in device_types if d != "cpu"]
    for node, backward, device in convolutions:
        first = node.args[1] if backward else node.args[0]
        if device == "cuda" and training and first.meta.dtype not in ("bfloat16", "float16"):
            continue
        if device in device_types:
            return True
    return False


def _convolutions(graph: Any, rank_of: Callable[[Any], int | None]) -> Iterator[tuple[Any, bool, str]]:
    """The 2-D convolutions of an aten graph: (node, whether it is a backward, its device type)."""
    for node in graph.nodes:
        if node.dialect == "aten" and is_2d_convolution(node.op, node.args, rank_of):
            backward = node.op == "aten::convolution_backward.default"
            first = node.args[1] if backward else node.args[0]
            yield node, backward, str(first.meta.device).split(":")[0]


def _cpu_weight_copies_outweigh_activations(convolutions: list[tuple[Any, bool, str]]) -> bool:
    """Whether the CPU convolutions of ``graph`` have far more weight elements to copy than
    activation elements to read (``WEIGHT_COPY_LIMIT`` times). A channels-last program copies every
    k x k weight (its input, in eager's layout) into channels-last on every call: oneDNN given the
    weight as it is reorders it itself, 2.5x slower still. Measured (1 thread, docs/status.md):
    ResNet-18 at batch 2 x 64 x 64, 31 weight elements to copy per activation element, ran 1.8x
    slower channels-last; the hf suite's small ResNet, 1.35 per element, 1.27x faster;
    MobileNet-V3 and EfficientNet, whose depthwise and 1 x 1 weights are the same memory in both
    layouts, 15-35% faster. Unknown sizes count as large activations."""
    weights = activations = 0
    for node, backward, device in convolutions:
        if device != "cpu":
            continue
        # The convolution's input alone, in the backward too (not its output's gradient): a
        # training step's forward and backward then weigh the same numbers and choose alike. (A
        # forward in eager's layout feeding a channels-last backward copied every saved
        # activation, gradient and weight on each step: timm's ResNet-50, 1.2x slower.)
        acts = [node.args[1] if backward else node.args[0]]
        weight = node.args[2] if backward else node.args[1]
        sizes = [a.meta.shape for a in acts] + [weight.meta.shape]
        if not all(isinstance(d, int) for shape in sizes for d in shape):
            return False
        activations += sum(math.prod(a.meta.shape) for a in acts)
        if can_be_channels_last(weight.meta.shape):
            weights += math.prod(weight.meta.shape)
    return weights > WEIGHT_COPY_LIMIT * activations


def depthwise_backward_keeps_eager_layout(x_size: Sequence[Any], weight_size: Sequence[Any], groups: Any) -> bool:
    """Whether a CPU depthwise convolution's backward should run on eager's (NCHW) layout inside a
    channels-last program: its kernel is larger than the image it slides over. oneDNN's
    channels-last backward for those (EfficientNet's last stages: 1152 channels of 2 x 2 pixels
    under a 5 x 5 kernel) ran 2.5-4x slower than its NCHW one, where channels-last is faster for
    every other depthwise shape measured; the copies either way are of a few thousand elements."""
    if len(x_size) != 4 or len(weight_size) != 4:
        return False
    sizes = [*x_size[1:], *weight_size[1:], groups]
    if not all(isinstance(d, int) for d in sizes):
        return False
    channels, height, width = x_size[1], x_size[2], x_size[3]
    depthwise = groups == channels and weight_size[1] == 1 and channels > 1
    return bool(depthwise and (weight_size[2] > height or weight_size[3] > width))


# Weight elements copied per activation element read past which a CPU program keeps eager's layout.
WEIGHT_COPY_LIMIT = 4


def loop_order(size: Sequence[Any], stride: Sequence[Any]) -> list[int]:
    """The loop nest (dimensions of extent other than 1, outermost first) that walks a buffer
    in memory order: N, H, W, C for a channels-last buffer, the dimensions in order otherwise."""
    dims = [0, 2, 3, 1] if is_channels_last(size, stride) else list(range(len(size)))
    return [k for k in dims if not exprs.equal(size[k], 1)]


# Padded row strides. A GEMM library reads a matrix through its row stride; cuBLAS picks its fast
# kernels only when every row starts 16-byte aligned, so a [tokens, 50257] bf16 operand (a language
# model's logits gradient) runs the slow ``align1`` kernels, several times slower. A buffer the
# program lays out itself can have its rows start aligned instead: each stride of at least
# ``config.pad_min_stride`` elements is rounded up to a multiple of PAD_ALIGNMENT_BYTES, as
# Inductor's comprehensive padding does (128 bytes: whole cache lines, beyond cuBLAS' 16).
PAD_ALIGNMENT_BYTES = 128


def padded_strides(size: Sequence[Any], stride: Sequence[Any], itemsize: int, min_stride: int) -> list[sympy.Expr] | None:
    """Strides for a buffer of static ``size`` laid out contiguously (``stride``) with each
    stride of at least ``min_stride`` elements that is not a multiple of
    :data:`PAD_ALIGNMENT_BYTES` rounded up to one (strides inside are built on the padded ones);
    None when nothing changes: a symbolic size, another layout, short or aligned rows."""
    sizes = [exprs.to_static(s) for s in size]
    if len(sizes) < 2 or any(n is None for n in sizes):
        return None
    if not all(exprs.equal(a, b) or n == 1 for n, a, b in zip(sizes, stride, exprs.contiguous_strides(size))):
        return None
    align = max(1, PAD_ALIGNMENT_BYTES // itemsize)
    out: list[int] = [0] * len(sizes)
    step, changed = 1, False
    for k in range(len(sizes) - 1, -1, -1):
        out[k] = step
        n = sizes[k]
        assert n is not None
        step *= n
        if step >= min_stride and step % align:
            step = -(-step // align) * align
            # only a dimension of more than one element outside this one makes it take space
            changed = changed or any(m != 1 for m in sizes[:k])
    return [sympy.Integer(s) for s in out] if changed else None
