"""exp of float32 over its whole range: the generated code's own polynomial (no call into a
vector math library, whose vector path leaves for the scalar one on arguments past +-87.3, as a
masked softmax's are), against eager in float64, with the ops built on it."""

from __future__ import annotations

import re

import pytest
import torch
from aten_builder import AtenBuilder

import fireclay_cpp
from fireclay_cpp.prelude import PRELUDE

FLT_MIN = torch.finfo(torch.float32).tiny
SPECIALS = [float("-inf"), float("inf"), float("nan"), 0.0, -0.0, -87.33, -87.34, -87.5, -100.0, -103.9, -104.0,
            88.72, 88.7229, 88.73, 89.0, -3.4e38, 3.4e38, 1e-30, -1e-30]


def _compile_one(op: str, x: torch.Tensor, *args):
    b = AtenBuilder()
    xi = b.input(x, "x")
    program = b.output(b.call(op, xi, *args))
    return fireclay_cpp.compile_program(program, [x])


def test_float_exp_is_inline_arithmetic():
    body = re.search(r"static inline float fc_exp\(float x\) \{(.*?)\n\}", PRELUDE, re.S).group(1)
    assert "__builtin_exp" not in body and "expf(" not in body


# An odd length: the vectorised loop's tail runs the same function on its last elements.
@pytest.mark.parametrize("n", [4099])
def test_exp_matches_eager_over_the_whole_range(n):
    compiled = _compile_one("exp.default", torch.empty(n))
    for seed in range(2):
        gen = torch.Generator().manual_seed(seed)
        x = torch.empty(n).uniform_(-110.0, 95.0, generator=gen)
        x[:8] *= 1e-3
        x[-len(SPECIALS):] = torch.tensor(SPECIALS)
        got = compiled(x)[0]
        want = torch.exp(x.double())
        assert torch.equal(got.isnan(), want.isnan())
        ok = ~want.isnan()
        g, w = got[ok].double(), want[ok]
        tiny = w < FLT_MIN  # 0 where exp is subnormal
        assert ((g[tiny] - w[tiny]).abs() <= FLT_MIN).all()
        big = w > torch.finfo(torch.float32).max
        assert (g[big] == float("inf")).all()
        rest = ~tiny & ~big
        rel = ((g[rest] - w[rest]).abs() / w[rest]).max().item()
        assert rel < 2.5e-7  # within about 2 ulp of float32


@pytest.mark.parametrize("fill", [float("-inf"), torch.finfo(torch.float32).min])
def test_masked_softmax_matches_eager(fill):
    gen = torch.Generator().manual_seed(0)
    scores = torch.randn(3, 4, 33, 33, generator=gen) * 4
    causal = torch.ones(33, 33, dtype=torch.bool).tril()
    masked = scores.masked_fill(~causal, fill)
    compiled = _compile_one("_softmax.default", masked, -1, False)
    fresh = (torch.randn(3, 4, 33, 33, generator=gen) * 4).masked_fill(~causal, fill)
    torch.testing.assert_close(compiled(fresh)[0], torch.softmax(fresh, -1), atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("op", ["sigmoid.default", "silu.default"])
def test_sigmoid_family_at_large_inputs(op):
    x = torch.cat([torch.linspace(-120, 120, 1001), torch.tensor(SPECIALS)])
    compiled = _compile_one(op, x)
    fresh = x.flip(0).contiguous()
    eager = getattr(torch.ops.aten, op.split(".")[0]).default(fresh)
    torch.testing.assert_close(compiled(fresh)[0], eager, atol=1e-6, rtol=1e-5, equal_nan=True)
