"""Test helper: a table of small convolution programs (forward chains as inference and training
run them, and backward chains), built with :class:`AtenBuilder` in a chosen dtype. Shared by the
channels-last tests of fireclay-loops (reference executor) and fireclay-cpp (compiled code)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from aten_builder import AtenBuilder

CL = torch.channels_last


def _conv(b, x, w, bias=None, stride=1, padding=1, dilation=1, transposed=False, output_padding=0, groups=1):
    return b.call("convolution.default", x, w, bias, [stride] * 2, [padding] * 2, [dilation] * 2, transposed,
                  [output_padding] * 2, groups)


def _bn_inference(b, x, mean, var, gamma, beta):
    return b.call("_native_batch_norm_legit_no_training.default", x, gamma, beta, mean, var, 0.1, 1e-5)[0]


def conv_bn_relu_pool(b, g):
    """Inference: conv -> batch norm -> relu -> max pool, twice, then a global mean."""
    x = b.input(g(4, 3, 12, 12), "x")
    outs = []
    h = x
    for k, (cin, cout) in enumerate(((3, 8), (8, 16))):
        w = b.input(g(cout, cin, 3, 3), f"w{k}")
        stats = [b.input(g(cout, positive=True), f"{n}{k}") for n in ("mean", "var", "gamma", "beta")]
        h = b.call("relu.default", _bn_inference(b, _conv(b, h, w), *stats))
        h, _ = b.call("max_pool2d_with_indices.default", h, [2, 2], [2, 2])
        outs.append(h)
    return outs + [b.call("mean.dim", h, [2, 3], True)]


def stem_padded_pool(b, g):
    """Inference, a ResNet stem: conv -> scale -> relu -> 3x3 max pool of stride 2 and padding 1
    (windows reach before the first row and column), then a 3x3 pool of stride 1 and padding 1
    (windows reach past the last ones too)."""
    x, w = b.input(g(2, 3, 16, 16), "x"), b.input(g(8, 3, 3, 3), "w")
    h = b.call("relu.default", b.call("mul.Tensor", _conv(b, x, w), 2.0))
    p, _ = b.call("max_pool2d_with_indices.default", h, [3, 3], [2, 2], [1, 1])
    q, _ = b.call("max_pool2d_with_indices.default", b.call("relu.default", b.call("neg.default", p)),
                  [3, 3], [1, 1], [1, 1])
    return [q]


def strided_conv_bias(b, g):
    x, w, bias = b.input(g(2, 4, 11, 11), "x"), b.input(g(6, 4, 3, 3), "w"), b.input(g(6), "bias")
    y = _conv(b, x, w, bias, stride=2)
    return [b.call("relu.default", y), b.call("sum.dim_IntList", y, [1])]


def grouped_and_depthwise(b, g):
    x, w1, w2 = b.input(g(2, 8, 9, 9), "x"), b.input(g(8, 4, 3, 3), "w1"), b.input(g(8, 1, 3, 3), "w2")
    y = b.call("hardtanh.default", _conv(b, x, w1, groups=2), -1.0, 1.0)
    return [_conv(b, y, w2, groups=8, padding=0)]


def pointwise_conv_residual(b, g):
    """1x1 convolutions and a residual add of the (contiguous) program input."""
    x, w1, w2 = b.input(g(3, 8, 7, 7), "x"), b.input(g(8, 8, 1, 1), "w1"), b.input(g(8, 8, 1, 1), "w2")
    y = b.call("relu.default", _conv(b, x, w1, padding=0))
    z = b.call("add.Tensor", _conv(b, y, w2, padding=0), x)
    return [b.call("relu.default", z), y]


def padded_dilated(b, g):
    x, w = b.input(g(2, 5, 10, 10), "x"), b.input(g(7, 5, 3, 3), "w")
    y = _conv(b, x, w, padding=3, dilation=2)
    return [b.call("sigmoid.default", b.call("avg_pool2d.default", y, [2, 2], [2, 2]))]


def transposed_conv(b, g):
    x, w, w2 = b.input(g(2, 6, 5, 5), "x"), b.input(g(6, 4, 3, 3), "w"), b.input(g(4, 4, 3, 3), "w2")
    y = _conv(b, x, w, stride=2, transposed=True, output_padding=1)
    return [_conv(b, b.call("gelu.default", y), w2)]


def one_channel_and_one_pixel(b, g):
    """Layouts that are both contiguous and channels-last: one input channel, a 1x1 output (a
    batch of 8: activations outweigh the 6x6 weight, which the CPU copies on every call)."""
    x, w1, w2 = b.input(g(8, 1, 6, 6), "x"), b.input(g(4, 1, 3, 3), "w1"), b.input(g(5, 4, 6, 6), "w2")
    y = b.call("relu.default", _conv(b, x, w1))
    return [_conv(b, y, w2, padding=0), y]


def heavy_weights(b, g):
    """ResNet's deep layers at a small batch: 3x3 weights of more elements than the activations
    they see (a channels-last CPU program would copy them on every call)."""
    x, w1, w2 = b.input(g(2, 8, 2, 2), "x"), b.input(g(16, 8, 3, 3), "w1"), b.input(g(16, 16, 3, 3), "w2")
    y = b.call("relu.default", _conv(b, x, w1))
    return [_conv(b, y, w2)]


def channels_last_input(b, g):
    """The caller's input is channels-last already: eager's outputs are channels-last too."""
    x, w = b.input(g(2, 6, 8, 8).contiguous(memory_format=CL), "x"), b.input(g(4, 6, 3, 3), "w")
    y = _conv(b, x, w)
    return [b.call("mul.Tensor", y, 2.0), b.call("add.Tensor", x, 1.0)]


def training_forward(b, g):
    """Training-mode forward: conv -> batch norm with batch statistics -> relu -> max pool with
    the indices a backward needs."""
    x, w = b.input(g(4, 3, 10, 10), "x"), b.input(g(6, 3, 3, 3), "w")
    gamma, beta = b.input(g(6, positive=True), "gamma"), b.input(g(6), "beta")
    rmean, rvar = b.input(g(6), "running_mean"), b.input(g(6, positive=True), "running_var")
    y = _conv(b, x, w)
    bn, mean, rstd, new_mean, new_var = b.call("_native_batch_norm_legit_functional.default", y, gamma, beta,
                                                rmean, rvar, True, 0.1, 1e-5)
    r = b.call("relu.default", bn)
    p, idx = b.call("max_pool2d_with_indices.default", r, [2, 2], [2, 2])
    return [p, idx, y, r, mean, rstd, new_mean, new_var]


def training_backward(b, g):
    """A backward as the partitioner hands it over: saved activations (channels-last, as the
    forward left them), then the gradient of the pooled output."""
    x = b.input(g(4, 3, 10, 10).contiguous(memory_format=CL), "x")
    w = b.input(g(6, 3, 3, 3), "w")
    gamma = b.input(g(6, positive=True), "gamma")
    y = b.input(g(4, 6, 10, 10).contiguous(memory_format=CL), "y")
    r = b.input(g(4, 6, 10, 10, positive=True).contiguous(memory_format=CL), "r")
    mean, rstd = b.input(g(6), "mean"), b.input(g(6, positive=True), "rstd")
    _, idx = b.call("max_pool2d_with_indices.default", r, [2, 2], [2, 2])
    grad = b.input(g(4, 6, 5, 5), "grad")
    dr = b.call("max_pool2d_with_indices_backward.default", grad, r, [2, 2], [2, 2], [0, 0], [1, 1], False, idx)
    dbn = b.call("threshold_backward.default", dr, r, 0)
    dy, dgamma, dbeta = b.call("native_batch_norm_backward.default", dbn, y, gamma, None, None, mean, rstd, True,
                               1e-5, [True, True, True])
    dx, dw, _ = b.call("convolution_backward.default", dy, x, w, [0], [1, 1], [1, 1], [1, 1], False, [0, 0], 1,
                       [True, True, False])
    return [dx, dw, dgamma, dbeta]


def avg_pool_backward(b, g):
    x, w = b.input(g(2, 4, 8, 8), "x"), b.input(g(4, 4, 3, 3), "w")
    y = _conv(b, x, w)
    grad = b.input(g(2, 4, 4, 4), "grad")
    dy = b.call("avg_pool2d_backward.default", grad, y, [2, 2], [2, 2], [0, 0], False, True, None)
    dx, dw, _ = b.call("convolution_backward.default", dy, x, w, [0], [1, 1], [1, 1], [1, 1], False, [0, 0], 1,
                       [True, True, False])
    return [dx, dw]


@dataclass
class ConvProgram:
    build: Callable
    # outputs a backward reads (``autograd.saved_outputs``): their layout is the compiler's choice
    saved: tuple[int, ...] = ()
    # torch's meta kernel of convolution gives a contiguous result for a channels-last input
    # where the CPU kernel gives a channels-last one: outputs follow the graph's metadata (what
    # a tracer over meta tensors records), so there the metadata, not eager, says the strides
    meta_strides_differ: bool = False

    @property
    def name(self) -> str:
        return self.build.__name__


PROGRAMS = [
    ConvProgram(conv_bn_relu_pool), ConvProgram(stem_padded_pool), ConvProgram(strided_conv_bias), ConvProgram(grouped_and_depthwise),
    ConvProgram(pointwise_conv_residual), ConvProgram(padded_dilated), ConvProgram(transposed_conv),
    ConvProgram(one_channel_and_one_pixel), ConvProgram(channels_last_input, meta_strides_differ=True),
    ConvProgram(heavy_weights),
    ConvProgram(training_forward, saved=(1, 2, 3, 4, 5)), ConvProgram(training_backward),
    ConvProgram(avg_pool_backward),
]


def build(case: ConvProgram, dtype: torch.dtype, seed: int, device: str | None = None):
    """``(program, builder, make_inputs)``: ``make_inputs()`` gives fresh random inputs with the
    layouts the program was built for; ``device`` types the graph for another device (planned,
    not run, here)."""
    gen = torch.Generator().manual_seed(seed)
    made: list[tuple] = []

    def g(*shape, positive=False):
        t = torch.rand(shape, generator=gen, dtype=torch.float64) + 0.5 if positive else \
            torch.randn(shape, generator=gen, dtype=torch.float64)
        made.append((shape, positive))
        return t.to(dtype)

    b = AtenBuilder(device)
    outs = case.build(b, g)
    program = b.output(*outs)
    if case.saved:
        program.main.meta["autograd.saved_outputs"] = list(case.saved)
    layouts = [(h.meta.shape, h.meta.stride()) for h in b.inputs]
    specs = list(made)

    def make_inputs():
        out = []
        for (shape, positive), (_, stride) in zip(specs, layouts):
            t = torch.rand(shape, generator=gen, dtype=torch.float64) + 0.5 if positive else \
                torch.randn(shape, generator=gen, dtype=torch.float64)
            out.append(torch.empty_strided(shape, stride, dtype=dtype).copy_(t))
        return out

    return program, b, make_inputs


def tolerance(dtype: torch.dtype) -> dict:
    return {"atol": 1e-4, "rtol": 1e-4} if dtype == torch.float32 else {"atol": 1e-9, "rtol": 1e-9}


def is_channels_last(t: torch.Tensor) -> bool:
    return t.dim() == 4 and t.is_contiguous(memory_format=CL) and not t.is_contiguous()


def same_strides(t: torch.Tensor, strides) -> bool:
    """Whether ``t`` has ``strides`` (those of dimensions of extent 1 never matter)."""
    return all(n <= 1 or a == b for n, a, b in zip(t.shape, t.stride(), strides))
