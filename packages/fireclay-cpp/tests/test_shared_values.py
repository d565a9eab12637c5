"""A fused kernel computes each value once: nodes of one kernel that repeat a load or the same
math on the same inputs share it (a GELU recomputed for the backward and the GELU gradient take
erf of the same input once). Results are checked against eager."""

from __future__ import annotations

import pytest
import torch
from aten_builder import AtenBuilder
from batch import SEED

import fireclay_cpp

GEN = torch.Generator().manual_seed(SEED)


def _gelu_and_its_gradient(b, x, g):
    """GELU, and its gradient written out as the autograd stage decomposes it (with the other
    spelling of 1/sqrt(2))."""
    cdf = b.call("mul.Tensor", b.call("add.Tensor", b.call("erf.default", b.call("mul.Tensor", x, 0.7071067811865476)),
                                      1.0), 0.5)
    pdf = b.call("mul.Tensor", b.call("exp.default", b.call("mul.Tensor", b.call("mul.Tensor", x, x), -0.5)),
                 0.3989422804014327)
    grad = b.call("mul.Tensor", g, b.call("add.Tensor", cdf, b.call("mul.Tensor", x, pdf)))
    return b.call("gelu.default", x), grad


def _sigmoid_twice_with_scales(b, x, g):
    """Two spellings of one constant (0.1 as float32) and one sigmoid: shared."""
    s = b.call("sigmoid.default", x)
    return b.call("mul.Tensor", s, 0.1), b.call("mul.Tensor", b.call("sigmoid.default", x), 0.10000000149011612)


# (id, builder, call that must appear once in the fused kernel, dtype). The two spellings of
# 1/sqrt(2) are one float32 but two float64 values, and a bfloat16 program rounds the gradient's
# intermediates where GELU's own stay float: the erf is shared in float32 only.
CASES = [("gelu_and_gradient", _gelu_and_its_gradient, "fc_erf(", torch.float32)] + [
    ("sigmoid_twice", _sigmoid_twice_with_scales, "fc_sigmoid<", dtype)
    for dtype in (torch.float32, torch.float64, torch.bfloat16)]


@pytest.mark.parametrize("cid,build,once,dtype", CASES, ids=[f"{c[0]}-{c[3]}" for c in CASES])
def test_repeated_math_in_a_kernel_is_computed_once(cid, build, once, dtype):
    x, g = (torch.randn(33, 70, generator=GEN, dtype=torch.float64).to(dtype) for _ in range(2))
    b = AtenBuilder()
    program = b.output(*build(b, b.input(x, "x"), b.input(g, "g")))
    compiled = fireclay_cpp.compile_program(program)
    source = compiled.cpp_sources[0]
    assert source.count('extern "C" void kernel') == 1, source
    kernel = source[source.index('extern "C" void kernel'):]
    kernel = kernel[:kernel.index("\n}\n")]
    assert kernel.count(once) == 1, kernel
    tol = {"atol": 2e-2, "rtol": 2e-2} if dtype == torch.bfloat16 else {"atol": 1e-6, "rtol": 1e-5}
    for got, want in zip(compiled(x, g), b.eager(x, g)):
        torch.testing.assert_close(got, want, **tol)
