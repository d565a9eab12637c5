"""A fused kernel can read a value it computes itself through a mask: a concatenation whose first
part is computed in the same kernel, at the same positions (partial rotary embeddings with nothing
left to pass through, `cat((q_embed, q[..., d:]))`, in Phi-3). Such reads must name the computed
value, whatever the dtype: a float32 value is kept as is, a half-precision one is rounded first.
Results are checked against eager."""

from __future__ import annotations

import pytest
import torch
from aten_builder import AtenBuilder
from batch import SEED

import fireclay_cpp

GEN = torch.Generator().manual_seed(SEED)


def _rotary_then_empty_pass_through(b, x, cos, sin):
    half = x.meta.shape[-1] // 2
    x1 = b.call("slice.Tensor", x, -1, 0, half)
    x2 = b.call("slice.Tensor", x, -1, half, 2 * half)
    rotated = b.call("cat.default", [b.call("neg.default", x2), x1], -1)
    embedded = b.call("add.Tensor", b.call("mul.Tensor", x, cos), b.call("mul.Tensor", rotated, sin))
    rest = b.call("slice.Tensor", x, -1, 2 * half, 2 * half)  # empty: the whole head is rotated
    return (b.call("cat.default", [embedded, rest], -1),)


CASES = [("rotary_empty_pass", _rotary_then_empty_pass_through)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("cid,build", CASES, ids=[c[0] for c in CASES])
def test_a_masked_read_of_a_value_computed_in_the_kernel_builds(cid, build, dtype):
    x = torch.randn(2, 4, 6, 8, generator=GEN, dtype=torch.float64).to(dtype)
    cos, sin = (torch.randn(6, 8, generator=GEN, dtype=torch.float64).to(dtype) for _ in range(2))
    b = AtenBuilder()
    program = b.output(*build(b, b.input(x, "x"), b.input(cos, "cos"), b.input(sin, "sin")))
    compiled = fireclay_cpp.compile_program(program)
    tol = {"atol": 2e-2, "rtol": 2e-2} if dtype == torch.bfloat16 else {"atol": 1e-6, "rtol": 1e-5}
    for got, want in zip(compiled(x, cos, sin), b.eager(x, cos, sin)):
        torch.testing.assert_close(got, want, **tol)
