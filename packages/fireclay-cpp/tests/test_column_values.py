"""Values of a pointwise kernel that change along its innermost loop only (batch norm's
per-channel ``1 / sqrt(var + eps)`` over channels-last memory) are computed once per call, before
the loops, into an array the innermost loop reads. Batch norm (inference) with the activations
that follow it in CNNs, over a table of shapes: against eager, against the same kernels without
the arrays (the very bits), and the kernels' text."""

from __future__ import annotations

import re

import pytest
import torch
from aten_builder import AtenBuilder

import fireclay_cpp
from fireclay_cpp.kernel_codegen import CppKernelGen

SHAPES = [(2, 32, 8, 8), (3, 5, 7, 7), (1, 3, 1, 1), (4, 96, 5, 5)]
ACTIVATIONS = {
    "none": [],
    "relu": [("relu.default",)],
    "silu": [("silu.default",)],
    "hardswish": [("hardswish.default",)],
    "gelu": [("gelu.default",)],
}
TOLERANCE = {torch.float32: {"atol": 1e-4, "rtol": 1e-4}, torch.float64: {"atol": 1e-11, "rtol": 1e-11}}


def _batch_norm_program(shape, dtype, activation, eps=1e-3, between_convolutions=True):
    """Batch norm and ``activation`` over ``shape``; between two 1x1 convolutions (the layout pass
    runs them channels-last, so the batch norm's kernel reads and writes channels-last memory, the
    channel its innermost loop) or alone on the NCHW input."""
    gen = torch.Generator().manual_seed(sum(shape) + len(activation))
    n, c, h, w = shape

    def randn(*size):
        return torch.randn(size, generator=gen, dtype=torch.float64).to(dtype)

    inputs = [randn(n, 3, h, w), randn(c, 3, 1, 1), randn(4, c, 1, 1)] if between_convolutions else [randn(*shape)]
    params = [randn(c), randn(c), randn(c), randn(c).abs() + 0.1]
    b = AtenBuilder()
    handles = [b.input(t, f"in{k}") for k, t in enumerate(inputs + params)]
    y = handles[0]
    if between_convolutions:
        y = b.call("convolution.default", y, handles[1], None, [1, 1], [0, 0], [1, 1], False, [0, 0], 1)
    y = b.call("_native_batch_norm_legit_no_training.default", y, *handles[-4:], 0.1, eps)[0]
    for (op,) in ACTIVATIONS[activation]:
        y = b.call(op, y)
    if between_convolutions:
        y = b.call("convolution.default", y, handles[2], None, [1, 1], [0, 0], [1, 1], False, [0, 0], 1)
    return b, b.output(y), inputs + params


def _fresh(inputs, seed):
    """New values for the inputs (the variance, last, positive)."""
    gen = torch.Generator().manual_seed(seed)
    out = [torch.randn(t.shape, generator=gen, dtype=torch.float64).to(t.dtype) for t in inputs]
    out[-1] = out[-1].abs() + 0.1
    return out


def _kernels(compiled) -> list[str]:
    text = "\n".join(compiled.cpp_sources)
    return re.findall(r'extern "C" void kernel\d+\(.*?\n}\n', text, re.S)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("activation", sorted(ACTIVATIONS))
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_channels_last_batch_norm_matches_eager_and_the_unhoisted_kernel(shape, activation, dtype, monkeypatch):
    b, program, inputs = _batch_norm_program(shape, dtype, activation)
    compiled = fireclay_cpp.compile_program(program, inputs)
    with monkeypatch.context() as m:
        m.setattr(CppKernelGen, "_hoist_column_values", lambda self, *args: [])
        plain = fireclay_cpp.compile_program(program, inputs)
    for seed in range(2):
        fresh = _fresh(inputs, seed)
        (got,), (want,), (same,) = compiled(*fresh), b.eager(*fresh), plain(*fresh)
        torch.testing.assert_close(got, want, **TOLERANCE[dtype])
        assert torch.equal(got, same)  # the same arithmetic, done once per channel


@pytest.mark.parametrize("shape", [(2, 32, 8, 8), (3, 5, 7, 7)], ids=str)
def test_the_per_channel_scale_is_computed_before_the_loops(shape):
    _, program, inputs = _batch_norm_program(shape, torch.float32, "silu")
    (kernel,) = [k for k in _kernels(fireclay_cpp.compile_program(program, inputs)) if "fc_sqrt" in k]
    marker = "#pragma omp parallel" if "#pragma omp parallel" in kernel else "\n  for (int64_t x0"
    before, loops = kernel.split(marker, 1)
    assert re.search(rf"float fc_column\d+\[{shape[1]}\];", before)
    assert "fc_sqrt" in before and "fc_sqrt" not in loops
    assert re.search(r"= fc_column\d+\[x\d+\];", loops)


def test_channel_outer_layouts_and_cheap_values_are_left_alone():
    """NCHW: the channel is an outer loop, its scale is computed once per channel already. A
    per-channel value that is one load and one add is not worth an array."""
    _, program, inputs = _batch_norm_program((2, 8, 6, 6), torch.float32, "relu", between_convolutions=False)
    assert not any("fc_column" in k for k in _kernels(fireclay_cpp.compile_program(program, inputs)))
    b = AtenBuilder()
    gen = torch.Generator().manual_seed(0)
    inputs = [torch.randn(2, 3, 6, 6, generator=gen), torch.randn(8, 3, 1, 1, generator=gen),
              torch.randn(4, 8, 1, 1, generator=gen), torch.randn(8, 1, 1, generator=gen)]
    x, w1, w2, bias = (b.input(t, f"in{k}") for k, t in enumerate(inputs))
    y = b.call("convolution.default", x, w1, None, [1, 1], [0, 0], [1, 1], False, [0, 0], 1)
    y = b.call("add.Tensor", y, b.call("add.Tensor", bias, bias))
    y = b.call("convolution.default", y, w2, None, [1, 1], [0, 0], [1, 1], False, [0, 0], 1)
    compiled = fireclay_cpp.compile_program(b.output(y), inputs)
    assert not any("fc_column" in k for k in _kernels(compiled))
    torch.testing.assert_close(compiled(*inputs)[0], b.eager(*inputs)[0], **TOLERANCE[torch.float32])
