"""Programs with complex tensors (FNet's Fourier mixing, rotary embeddings written with complex
products): the generated C++ has no complex arithmetic, so every op that reads or writes a
complex tensor is a library call, complex intermediates live in the arena beside the others, and
only the real-valued math around them becomes kernels. The program builds and matches eager,
complex inputs and outputs included."""

from __future__ import annotations

import pytest
import torch
from aten_builder import AtenBuilder
from batch import SEED

import fireclay_cpp

GEN = torch.Generator().manual_seed(SEED)


def _fourier_mixing(b, x):
    # FNet: fftn over (sequence, hidden), the real part, a residual add
    z = b.call("_to_copy.default", x, dtype=torch.complex64)
    f = b.call("_fft_c2c.default", z, [1, 2], 0, True)
    real = b.call("select.int", b.call("view_as_real.default", f), 3, 0)
    return (b.call("add.Tensor", real, x),)


def _complex_rotation(b, x):
    # rotary embeddings as a complex product: pairs of x as complex numbers, times unit phases
    pairs = b.call("view.default", b.call("mul.Tensor", x, 2.0), [2, 8, 8, 2])
    rotated = b.call("mul.Tensor", b.call("view_as_complex.default", pairs),
                     b.call("view_as_complex.default", pairs))
    out = b.call("view.default", b.call("view_as_real.default", rotated), [2, 8, 16])
    return (b.call("relu.default", out),)


def _complex_result(b, x):
    # a complex tensor returned, and its magnitude
    z = b.call("_to_copy.default", b.call("exp.default", x), dtype=torch.complex64)
    f = b.call("_fft_c2c.default", z, [2], 1, True)
    return f, b.call("sum.dim_IntList", b.call("abs.default", f), [2])


CASES = [("fourier_mixing", _fourier_mixing), ("complex_rotation", _complex_rotation),
         ("complex_result", _complex_result)]


@pytest.mark.parametrize("cid,build", CASES, ids=[c[0] for c in CASES])
def test_programs_with_complex_tensors_build_and_match_eager(cid, build):
    x = torch.randn(2, 8, 16, generator=GEN)
    b = AtenBuilder()
    program = b.output(*build(b, b.input(x, "x")))
    compiled = fireclay_cpp.compile_program(program)
    got, want = compiled(x), b.eager(x)
    assert len(got) == len(want)
    for g, e in zip(got, want):
        assert g.dtype == e.dtype
        torch.testing.assert_close(g, e, atol=1e-5, rtol=1e-5)
