"""``addmm`` lowered as ``mm`` plus a fused bias (fireclay_loops.lowering.matmul; on by default for
CUDA only, switched on for the CPU here) computes what eager computes."""

import pytest
import torch
from aten_builder import AtenBuilder

import fireclay_cpp
from fireclay_loops import ExternNode
from fireclay_loops.config import config as loops_config


def _gelu(b, y):
    return b.call("gelu.default", y)


def _residual_norm(b, y):
    r = b.input(torch.randn(6, 24, dtype=y.meta.dtype), "r")
    s = b.call("add.Tensor", y, r)
    return b.call("native_layer_norm.default", s, [24], None, None, 1e-5)[0]


def _view_relu(b, y):
    return b.call("relu.default", b.call("view.default", y, [2, 3, 24]))


def _sum_rows(b, y):
    return b.call("sum.dim_IntList", b.call("mul.Tensor", y, y), [1])


CONSUMERS = {"gelu": _gelu, "residual_norm": _residual_norm, "view_relu": _view_relu, "sum_rows": _sum_rows}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("consumer", sorted(CONSUMERS))
def test_unfused_bias_matches_eager(consumer, dtype, monkeypatch):
    monkeypatch.setattr(loops_config, "unfuse_addmm_bias", ("cpu",))
    torch.manual_seed(0)
    b = AtenBuilder()
    bias = b.input(torch.randn(24, dtype=dtype), "bias")
    x = b.input(torch.randn(6, 16, dtype=dtype), "x")
    w = b.input(torch.randn(16, 24, dtype=dtype), "w")
    out = CONSUMERS[consumer](b, b.call("addmm.default", bias, x, w))
    program = b.output(out)
    compiled = fireclay_cpp.compile_program(program)
    externs = [s.op for s in compiled.scheduled.steps if isinstance(s, ExternNode)]
    assert externs == ["aten::mm.default"]
    for seed in (1, 2):
        torch.manual_seed(seed)
        inputs = [torch.randn(h.meta.shape, dtype=h.meta.dtype) for h in b.inputs]
        for got, want in zip(compiled(*inputs), b.eager(*inputs)):
            torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
