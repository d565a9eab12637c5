"""Reductions over dimensions of extent 1 have no loop of their own (the lowering drops such
dimensions), but they are reductions all the same: fused with a neighbour that reduces over
other dimensions, their outer loops must stay outer loops. ConvNeXt and FocalNet pool a 1x1
feature map and then layer-normalise the channels; the pooling once ran as the channel loop of the
layer norm, and the kernel read that loop's variable after the loop ended (a C++ build error).
Results are checked against eager."""

from __future__ import annotations

import pytest
import torch
from aten_builder import AtenBuilder
from batch import SEED

import fireclay_cpp

GEN = torch.Generator().manual_seed(SEED)


def _pool_then_layer_norm(b, x, w, bias):
    pooled = b.call("mean.dim", x, [-2, -1])
    return b.call("native_layer_norm.default", pooled, [x.meta.shape[1]], w, bias, 1e-6)[:1]


def _sum_then_softmax(b, x, w, bias):
    s = b.call("sum.dim_IntList", x, [2, 3], True)  # [N, C, 1, 1]
    return (b.call("_softmax.default", b.call("mul.Tensor", s, 2.0), 1, False),)


def _max_then_mean_of_rows(b, x, w, bias):
    m = b.call("amax.default", x, [3])  # [N, C, 1]
    scaled = b.call("add.Tensor", b.call("mul.Tensor", m, 1.5), 1.0)
    return (b.call("mean.dim", scaled, [1], True), scaled)


def _var_over_one_then_sum(b, x, w, bias):
    v = b.call("var_mean.correction", x, [2, 3], correction=0, keepdim=False)  # all zeros, means = x
    return (b.call("sum.dim_IntList", b.call("add.Tensor", v[1], v[0]), [1]),)


CASES = [("pool_then_layer_norm", _pool_then_layer_norm), ("sum_then_softmax", _sum_then_softmax),
         ("max_then_mean_of_rows", _max_then_mean_of_rows), ("var_over_one_then_sum", _var_over_one_then_sum)]


@pytest.mark.parametrize("cid,build", CASES, ids=[c[0] for c in CASES])
def test_a_reduction_over_extent_one_dims_fused_with_another_builds_and_matches_eager(cid, build):
    x = torch.randn(2, 64, 1, 1, generator=GEN)
    w, bias = torch.randn(64, generator=GEN), torch.randn(64, generator=GEN)
    b = AtenBuilder()
    program = b.output(*build(b, b.input(x, "x"), b.input(w, "w"), b.input(bias, "b")))
    compiled = fireclay_cpp.compile_program(program)
    got, want = compiled(x, w, bias), b.eager(x, w, bias)
    assert len(got) == len(want)
    for g, e in zip(got, want):
        torch.testing.assert_close(g, e, atol=1e-5, rtol=1e-5)
