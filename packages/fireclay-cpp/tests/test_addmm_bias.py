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


def _heads_to_attention(b, y):  # q, k, v of one projection, split into heads, into attention
    q, k, v = (b.call("permute.default", b.call("view.default", t, [2, 3, 2, 4]), [0, 2, 1, 3])
               for t in b.call("split.Tensor", y, 8, 1))
    return b.call("_scaled_dot_product_flash_attention_for_cpu.default", q, k, v)[0]


def _transposed_into_mm(b, y):
    return b.call("mm.default", b.call("t.default", y), y)


def _sliced_output(b, y):
    return b.call("slice.Tensor", y, 1, 0, 12)


# readers through views: a library call, or the graph's output
LIBRARY_READERS = {"heads_to_attention": _heads_to_attention, "transposed_into_mm": _transposed_into_mm,
                   "sliced_output": _sliced_output}


@pytest.mark.parametrize("consumer", sorted(LIBRARY_READERS))
def test_bias_stays_in_the_library_call_when_a_library_reads_it(consumer, monkeypatch):
    """Through views, a library call (or the output) reads the result: a bias added by our kernel
    would be a pass of its own, so the addmm stays whole."""
    monkeypatch.setattr(loops_config, "unfuse_addmm_bias", ("cpu",))
    torch.manual_seed(0)
    b = AtenBuilder()
    bias = b.input(torch.randn(24), "bias")
    x = b.input(torch.randn(6, 16), "x")
    w = b.input(torch.randn(16, 24), "w")
    out = LIBRARY_READERS[consumer](b, b.call("addmm.default", bias, x, w))
    program = b.output(out)
    compiled = fireclay_cpp.compile_program(program)
    externs = [s.op for s in compiled.scheduled.steps if isinstance(s, ExternNode)]
    assert externs[0] == "aten::addmm.default" and "aten::mm.default" not in externs[:1]
    for seed in (1, 2):
        torch.manual_seed(seed)
        inputs = [torch.randn(h.meta.shape, dtype=h.meta.dtype) for h in b.inputs]
        for got, want in zip(compiled(*inputs), b.eager(*inputs)):
            torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
