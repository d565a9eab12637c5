"""Test helper: programs whose reductions have few outputs and long reductions, as a training
backward hands them over (batch norm's backward decomposed into its per-channel sums and the
input gradient; softmax's backward with the gradient of a scalar scale), built with
:class:`AtenBuilder` in a chosen layout and dtype. Shared by fireclay-loops' scheduling tests
(reference executor) and fireclay-triton's interpreted tests."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from aten_builder import AtenBuilder

CL = torch.channels_last


def _per_channel(b, v):  # [C] -> [1, C, 1, 1]
    return b.call("unsqueeze.default", b.call("unsqueeze.default", b.call("unsqueeze.default", v, 0), 2), 3)


def batch_norm_backward(b, x, relu_out, gamma, mean, rstd, grad):
    """ReLU's backward, then batch norm's (training) backward, as the decomposition writes it:
    two sums per channel, then the input gradient reading both (an epilogue over every element)."""
    n, _, h, w = x.meta.shape
    count = n * h * w
    zero = b.call("scalar_tensor.default", 0.0, dtype=grad.meta.dtype)
    dout = b.call("where.self", b.call("le.Scalar", relu_out, 0), zero, grad)
    sum_dout = b.call("sum.dim_IntList", dout, [0, 2, 3])
    centred = b.call("sub.Tensor", x, _per_channel(b, mean))
    sum_dout_centred = b.call("sum.dim_IntList", b.call("mul.Tensor", dout, centred), [0, 2, 3])
    k1 = _per_channel(b, b.call("mul.Tensor", sum_dout, 1.0 / count))
    k2 = _per_channel(b, b.call("mul.Tensor", b.call("mul.Tensor", sum_dout_centred, 1.0 / count),
                                b.call("mul.Tensor", rstd, rstd)))
    k3 = _per_channel(b, b.call("mul.Tensor", rstd, gamma))
    dx = b.call("mul.Tensor", b.call("sub.Tensor", b.call("sub.Tensor", dout, b.call("mul.Tensor", centred, k2)), k1),
                k3)
    return [dx, b.call("mul.Tensor", sum_dout_centred, rstd), sum_dout]


def batch_norm_training_forward(b, x, gamma, beta, running_mean, running_var):
    """Batch norm's training forward then ReLU: per-channel statistics (a Welford reduction
    over N*H*W, when lowered to loop code), then the normalisation over every element."""
    out, mean, rstd, new_mean, new_var = b.call("_native_batch_norm_legit_functional.default", x, gamma, beta,
                                                running_mean, running_var, True, 0.1, 1e-5)
    return [b.call("relu.default", out), mean, rstd, new_mean, new_var]


def softmax_backward_with_scale(b, x, y, grad, scale_grad_only=True):
    """softmax(x * s)'s backward: the row kernel's gradient, and the gradient of the scalar
    ``s``: a sum over everything of what the row kernel computes."""
    gy = b.call("mul.Tensor", grad, y)
    row = b.call("sum.dim_IntList", gy, [-1], True)
    dz = b.call("sub.Tensor", gy, b.call("mul.Tensor", y, row))
    ds = b.call("sum.dim_IntList", b.call("mul.Tensor", dz, x), [])
    return [ds] if scale_grad_only else [ds, b.call("mul.Tensor", dz, 0.125)]


def softmax_backward_both(b, x, y, grad):
    """The same, when ``x`` needs its gradient too: the row kernel stores it as well."""
    return softmax_backward_with_scale(b, x, y, grad, scale_grad_only=False)


def row_max_of_normalised(b, x, y, grad):
    """A max to a scalar of a row kernel's result (softmax's output here)."""
    return [b.call("amax.default", b.call("_softmax.default", x, -1, False), [0, 1, 2])]


def mean_of_normalised(b, x, y, grad):
    """A mean to a scalar (a loss) of a layer-norm-like row kernel's result."""
    centred = b.call("sub.Tensor", x, b.call("mean.dim", x, [-1], True))
    return [b.call("mean.default", b.call("mul.Tensor", centred, y))]


def layer_norm_weight_grad(b, grad, x, mean, rstd):
    """Layer norm's weight and bias gradients (a backward whose input needs no gradient): column
    sums over the rows, with each row's mean and rstd read beside the columns."""
    xhat = b.call("mul.Tensor", b.call("sub.Tensor", x, mean), rstd)
    return [b.call("sum.dim_IntList", b.call("mul.Tensor", grad, xhat), [0]), b.call("sum.dim_IntList", grad, [0])]


@dataclass
class Case:
    name: str
    build: object
    shapes: list  # input shapes
    channels_last: tuple = ()  # positions of 4-D inputs laid out channels-last
    positive: tuple = ()  # positions of inputs drawn in [0.5, 1.5)


def bn_case(name: str, n: int, c: int, h: int, w: int, channels_last: bool) -> Case:
    big = (n, c, h, w)
    return Case(name, batch_norm_backward, [big, big, (c,), (c,), (c,), big],
                (0, 1, 5) if channels_last else (), positive=(4,))


def bn_forward_case(name: str, n: int, c: int, h: int, w: int, channels_last: bool) -> Case:
    return Case(name, batch_norm_training_forward, [(n, c, h, w), (c,), (c,), (c,), (c,)],
                (0,) if channels_last else (), positive=(4,))


def ln_weight_grad_case(name: str, rows: int, cols: int) -> Case:
    return Case(name, layer_norm_weight_grad, [(rows, cols), (rows, cols), (rows, 1), (rows, 1)], positive=(3,))


def softmax_case(name: str, build, *shape: int) -> Case:
    return Case(name, build, [shape, shape, shape])


def build(case: Case, dtype: torch.dtype, device: str = "cpu", seed: int = 0):
    """``(builder, program, make_inputs)``: ``make_inputs()`` gives fresh random inputs in the
    layouts the program was built for."""
    gen = torch.Generator().manual_seed(seed)

    def make(k: int, shape: tuple) -> torch.Tensor:
        t = torch.rand(shape, generator=gen) + 0.5 if k in case.positive else torch.randn(shape, generator=gen)
        t = t.to(dtype)
        return t.contiguous(memory_format=CL) if k in case.channels_last else t

    b = AtenBuilder()
    handles = [b.input(make(k, s).to(device), f"x{k}") for k, s in enumerate(case.shapes)]
    program = b.output(*case.build(b, *handles))
    return b, program, lambda: [make(k, s) for k, s in enumerate(case.shapes)]
