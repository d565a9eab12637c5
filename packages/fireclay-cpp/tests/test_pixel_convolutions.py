"""Convolutions over a one-pixel image with a 1 x 1 kernel (squeeze-and-excitation layers) lower to
matrix products on the CPU (fireclay_loops.lowering.pixel_convolutions): a table of forward and
backward programs, alone and inside channels-last programs, compiled and run against eager in
float32 and float64, with the output strides eager gives; the calls the wrapper makes are mm /
addmm, and the convolutions that are not of that kind (padded, grouped, transposed, a 3 x 3
kernel, an image of more than one pixel) stay library convolutions."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch
from aten_builder import AtenBuilder
from conv_programs import same_strides, tolerance

import fireclay_cpp

CL = torch.channels_last


def _conv(b, x, w, bias=None, stride=1, padding=0, dilation=1, transposed=False, groups=1):
    return b.call("convolution.default", x, w, bias, [stride] * 2, [padding] * 2, [dilation] * 2, transposed,
                  [0, 0], groups)


def _backward(b, grad, x, w, bias_size, mask, padding=0, groups=1, transposed=False):
    return b.call("convolution_backward.default", grad, x, w, bias_size, [1, 1], [padding] * 2, [1, 1], transposed,
                  [0, 0], groups, mask)


@dataclass
class Case:
    name: str
    build: object
    pixel: bool  # whether every convolution of the program is one of a one-pixel image


def squeeze_excite(bias: bool, batch: int = 4, channels: int = 24, reduced: int = 8, stride: int = 1):
    """Global mean -> 1x1 conv -> relu -> 1x1 conv -> sigmoid, scaling a channels-last activation
    made by a 3x3 convolution (so the program is channels-last)."""
    def build(b, g):
        x = b.input(g(batch, channels, 6, 6), "x")
        w0 = b.input(g(channels, channels, 3, 3), "w0")
        w1, w2 = b.input(g(reduced, channels, 1, 1), "w1"), b.input(g(channels, reduced, 1, 1), "w2")
        b1 = b.input(g(reduced), "b1") if bias else None
        b2 = b.input(g(channels), "b2") if bias else None
        h = _conv(b, x, w0, padding=1)
        s = b.call("mean.dim", h, [2, 3], True)
        s = b.call("relu.default", _conv(b, s, w1, b1, stride=stride, dilation=2))
        s = b.call("sigmoid.default", _conv(b, s, w2, b2))
        return [b.call("mul.Tensor", h, s), s]
    return build


def pixel_input(batch: int, channels: int, out: int, layout=None):
    """A one-pixel program input (channels-last or not) through a 1x1 convolution with a bias."""
    def build(b, g):
        x = g(batch, channels, 1, 1)
        x = b.input(x.contiguous(memory_format=layout) if layout is not None else x, "x")
        w, bias = b.input(g(out, channels, 1, 1), "w"), b.input(g(out), "bias")
        return [_conv(b, x, w, bias)]
    return build


def pixel_backward(mask, bias_size, batch: int = 4, channels: int = 16, out: int = 12):
    """convolution_backward of a one-pixel image, for one output mask, beside a 3x3 backward."""
    def build(b, g):
        grad = b.input(g(batch, out, 1, 1), "grad")
        x, w = b.input(g(batch, channels, 1, 1), "x"), b.input(g(out, channels, 1, 1), "w")
        results = [r for r, wanted in zip(_backward(b, grad, x, w, bias_size, mask), mask) if wanted]
        return [b.call("mul.Tensor", r, 2.0) if k == 0 else r for k, r in enumerate(results)]
    return build


def se_backward(batch: int = 2, channels: int = 8, reduced: int = 4):
    """The gradient through a squeeze-and-excitation gate as a training step's backward has it:
    1x1 backward of the expanding conv (with a bias), its input's gradient through relu, then the
    reducing conv's backward, beside a 3x3 convolution's backward (a channels-last program)."""
    def build(b, g):
        x = b.input(g(batch, channels, 5, 5).contiguous(memory_format=CL), "x")
        w0 = b.input(g(channels, channels, 3, 3), "w0")
        s = b.input(g(batch, channels, 1, 1), "s")
        r = b.input(g(batch, reduced, 1, 1, positive=True), "r")
        w1, w2 = b.input(g(reduced, channels, 1, 1), "w1"), b.input(g(channels, reduced, 1, 1), "w2")
        grad_gate = b.input(g(batch, channels, 1, 1), "grad_gate")
        d_r, d_w2, d_b2 = _backward(b, grad_gate, r, w2, [channels], [True, True, True])
        d_r = b.call("threshold_backward.default", d_r, r, 0)
        d_s, d_w1, d_b1 = _backward(b, d_r, s, w1, [reduced], [True, True, True])
        grad = b.input(g(batch, channels, 5, 5).contiguous(memory_format=CL), "grad")
        grad = b.call("add.Tensor", grad, b.call("div.Scalar", b.call("expand.default", d_s, [batch, channels, 5, 5]), 25))
        d_x, d_w0, _ = _backward(b, grad, x, w0, [0], [True, True, False], padding=1)
        return [d_x, d_w0, d_w2, d_b2, d_w1, d_b1]
    return build


def not_pixel(kind: str):
    """Convolutions a matrix product does not stand for: they stay library calls."""
    def build(b, g):
        if kind == "3x3":
            x, w = b.input(g(2, 4, 1, 1), "x"), b.input(g(6, 4, 3, 3), "w")
            return [_conv(b, x, w, padding=1)]
        if kind == "padded":
            x, w = b.input(g(2, 4, 1, 1), "x"), b.input(g(6, 4, 1, 1), "w")
            return [_conv(b, x, w, padding=1)]
        if kind == "grouped":
            x, w = b.input(g(2, 4, 1, 1), "x"), b.input(g(6, 2, 1, 1), "w")
            return [_conv(b, x, w, groups=2)]
        if kind == "transposed":
            x, w = b.input(g(2, 4, 1, 1), "x"), b.input(g(4, 6, 1, 1), "w")
            return [_conv(b, x, w, transposed=True)]
        x, w = b.input(g(2, 4, 2, 2), "x"), b.input(g(6, 4, 1, 1), "w")  # two pixels a side
        return [_conv(b, x, w)]
    return build


CASES = [
    Case("se_bias", squeeze_excite(True), False),
    Case("se_no_bias", squeeze_excite(False), False),
    Case("se_strided_batch1", squeeze_excite(True, batch=1, stride=2), False),
    Case("input_contiguous", pixel_input(3, 10, 7), True),
    Case("input_channels_last", pixel_input(3, 10, 7, CL), True),
    Case("input_one_channel", pixel_input(5, 1, 3), True),
    Case("backward_all", pixel_backward([True, True, True], [12]), True),
    Case("backward_no_bias", pixel_backward([True, True, False], [0]), True),
    Case("backward_weight_only", pixel_backward([False, True, True], [12]), True),
    Case("backward_input_only", pixel_backward([True, False, False], [0]), True),
    Case("se_backward", se_backward(), False),
]
NOT_PIXEL = ["3x3", "padded", "grouped", "transposed", "two_pixels"]


def _build(build, dtype, seed):
    gen = torch.Generator().manual_seed(seed)
    made = []

    def g(*shape, positive=False):
        t = torch.rand(shape, generator=gen, dtype=torch.float64) + 0.5 if positive else \
            torch.randn(shape, generator=gen, dtype=torch.float64)
        made.append(positive)
        return t.to(dtype)

    b = AtenBuilder()
    program = b.output(*build(b, g))
    layouts = [(h.meta.shape, h.meta.stride()) for h in b.inputs]

    def make_inputs():
        out = []
        for positive, (shape, stride) in zip(made, layouts):
            t = torch.rand(shape, generator=gen, dtype=torch.float64) + 0.5 if positive else \
                torch.randn(shape, generator=gen, dtype=torch.float64)
            out.append(torch.empty_strided(shape, stride, dtype=dtype).copy_(t))
        return out

    return program, b, make_inputs


def _check(compiled, b, make_inputs, dtype):
    for _ in range(2):
        inputs = make_inputs()
        got, want = compiled(*inputs), b.eager(*inputs)
        assert len(got) == len(want)
        for k, (g, w) in enumerate(zip(got, want)):
            torch.testing.assert_close(g, w, **tolerance(dtype))
            assert same_strides(g, w.stride()), (k, g.stride(), w.stride())


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["float32", "float64"])
@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_pixel_convolution_matches_eager(case, dtype):
    program, b, make_inputs = _build(case.build, dtype, seed=3 + sum(map(ord, case.name)))
    compiled = fireclay_cpp.compile_program(program)
    calls = [line for line in compiled.wrapper_source.splitlines() if "_aten_" in line and "(" in line]
    products = [c for c in calls if "aten_mm_default(" in c or "aten_addmm_default(" in c]
    convolutions = [c for c in calls if "convolution" in c]
    assert products, compiled.wrapper_source
    assert bool(convolutions) is not case.pixel, convolutions
    _check(compiled, b, make_inputs, dtype)


@pytest.mark.parametrize("kind", NOT_PIXEL)
def test_other_convolutions_stay_library_convolutions(kind):
    program, b, make_inputs = _build(not_pixel(kind), torch.float32, seed=17)
    compiled = fireclay_cpp.compile_program(program)
    assert "op_aten_convolution_default(" in compiled.wrapper_source
    assert "aten_mm_default(" not in compiled.wrapper_source and "aten_addmm_default(" not in compiled.wrapper_source
    _check(compiled, b, make_inputs, torch.float32)
