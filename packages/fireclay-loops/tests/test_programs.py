"""Whole programs (several aten ops) through lowering, fusion and memory planning, against eager,
with fusion on and off."""

import math

import pytest

torch = pytest.importorskip("torch")

from aten_builder import AtenBuilder  # noqa: E402

from fireclay_loops import lower, schedule  # noqa: E402
from fireclay_loops.reference import run  # noqa: E402


def mlp(b, g):
    x, w1, b1, w2 = (b.input(t) for t in (g((8, 16)), g((16, 32)), g((32,)), g((32, 16))))
    h = b.call("addmm.default", b1, x, w1)
    h = b.call("gelu.default", h)
    return (b.call("mm.default", h, w2),)


def attention(b, g):
    q, k, v = (b.input(g((2, 6, 8))) for _ in range(3))
    kt = b.call("transpose.int", k, 1, 2)
    s = b.call("bmm.default", q, kt)
    s = b.call("mul.Tensor", s, 1 / math.sqrt(8))
    p = b.call("_softmax.default", s, -1, False)
    return (b.call("bmm.default", p, v),)


def residual_layer_norm(b, g):
    x, r, w, bias = (b.input(t) for t in (g((4, 6, 16)), g((4, 6, 16)), g((16,)), g((16,))))
    y = b.call("add.Tensor", x, r)
    out, mean, rstd = b.call("native_layer_norm.default", y, [16], w, bias, 1e-5)
    return out, mean, rstd


def rms_norm(b, g):
    x, w = b.input(g((4, 32))), b.input(g((32,)))
    sq = b.call("pow.Tensor_Scalar", x, 2)
    ms = b.call("mean.dim", sq, [-1], True)
    r = b.call("rsqrt.default", b.call("add.Tensor", ms, 1e-6))
    return (b.call("mul.Tensor", b.call("mul.Tensor", x, r), w),)


def cross_entropy(b, g):
    logits = b.input(g((6, 10)))
    target = b.input(torch.randint(0, 10, (6, 1)))
    lp = b.call("_log_softmax.default", logits, 1, False)
    picked = b.call("gather.default", lp, 1, target)
    return (b.call("neg.default", b.call("mean.default", picked)),)


def embedding_then_norm(b, g):
    table, ids = b.input(g((20, 8))), b.input(torch.randint(0, 20, (3, 5)))
    e = b.call("embedding.default", table, ids)
    v, m = b.call("var_mean.correction", e, [2], correction=0, keepdim=True)
    return (b.call("mul.Tensor", b.call("sub.Tensor", e, m), b.call("rsqrt.default", b.call("add.Tensor", v, 1e-5))),)


def transpose_reshape_chain(b, g):
    x = b.input(g((4, 6, 8)))
    p = b.call("permute.default", x, [2, 0, 1])
    e = b.call("exp.default", p)
    r = b.call("view.default", e, [8, 24])
    t = b.call("t.default", r)
    return (b.call("sum.dim_IntList", b.call("reshape.default", t, [4, 6, 8]), [1]),)


def conv_relu_pool(b, g):
    x, w = b.input(g((2, 3, 8, 8))), b.input(g((4, 3, 3, 3)))
    c = b.call("convolution.default", x, w, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1)
    r = b.call("relu.default", c)
    return (b.call("amax.default", r, [2, 3], True),)


def cat_pad_slice(b, g):
    x, y = b.input(g((4, 5))), b.input(g((4, 3)))
    c = b.call("cat.default", [b.call("exp.default", x), y], 1)
    p = b.call("constant_pad_nd.default", c, [1, 1, 0, 2], 0.0)
    s = b.call("slice.Tensor", p, 0, 1, 5, 2)
    return (b.call("add.Tensor", s, 1.0), b.call("sum.dim_IntList", p, [0]))


def shared_input_reductions(b, g):
    x = b.input(g((6, 12)))
    return (b.call("sum.dim_IntList", x, [1]), b.call("amax.default", x, [1]), b.call("argmin.default", x, 1),
            b.call("mul.Tensor", x, 2.0))


def int_and_bool_mix(b, g):
    a = b.input(torch.randint(-5, 5, (4, 8)))
    m = b.input(torch.rand(4, 8) > 0.5)
    s = b.call("where.self", m, a, b.call("neg.default", a))
    c = b.call("gt.Scalar", s, 0)
    return (b.call("sum.dim_IntList", c, [1]), b.call("mul.Tensor", s, 3), b.call("any.dim", c, 0))


def max_with_indices_and_epilogue(b, g):
    x = b.input(g((5, 7)))
    v, i = b.call("max.dim", x, 1, True)
    return (b.call("sub.Tensor", x, v), i)


def views_around_layer_norm(b, g):
    x, r, w, bias = (b.input(t) for t in (g((2, 3, 8)), g((2, 3, 8)), g((8,)), g((8,))))
    v = b.call("view.default", b.call("add.Tensor", x, r), [6, 8])
    out, _, _ = b.call("native_layer_norm.default", v, [8], w, bias, 1e-5)
    e = b.call("exp.default", b.call("view.default", b.input(g((6, 8))), [2, 3, 8]))
    return (b.call("relu.default", b.call("view.default", out, [2, 3, 8])), b.call("sum.dim_IntList", e, [2]))


PROGRAMS = [views_around_layer_norm, mlp, attention, residual_layer_norm, rms_norm, cross_entropy, embedding_then_norm,
            transpose_reshape_chain, conv_relu_pool, cat_pad_slice, shared_input_reductions,
            int_and_bool_mix, max_with_indices_and_epilogue]


@pytest.mark.parametrize("fusion", [True, False], ids=["fused", "unfused"])
@pytest.mark.parametrize("build", PROGRAMS, ids=[p.__name__ for p in PROGRAMS])
def test_program_matches_eager(build, fusion):
    gen = torch.Generator().manual_seed(sum(map(ord, build.__name__)))
    b = AtenBuilder()

    def g(shape):
        return torch.randn(shape, generator=gen)

    tensors_at_build = []
    orig_input = b.input

    def input_(t, name="x"):
        tensors_at_build.append(t)
        return orig_input(t, name)

    b.input = input_
    outs = build(b, g)
    program = b.output(*outs)
    scheduled = schedule(lower(program), fusion=fusion)
    # fresh inputs of the same kinds as the ones the program was built with
    fresh = [torch.randn(t.shape, generator=gen) if t.dtype.is_floating_point else t for t in tensors_at_build]
    got = run(scheduled, *fresh)
    want = b.eager(*fresh)
    for gv, wv in zip(got, want):
        assert gv.dtype == wv.dtype and gv.shape == wv.shape
        torch.testing.assert_close(gv, wv, atol=1e-4, rtol=1e-4)


def test_fusion_reduces_kernels_and_traffic():
    b = AtenBuilder()
    outs = residual_layer_norm(b, lambda s: torch.randn(s))
    program = b.output(*outs)
    fused, unfused = schedule(lower(program)), schedule(lower(program), fusion=False)
    assert len(fused.kernels) == 1 < len(unfused.kernels)
    assert fused.bytes_moved < unfused.bytes_moved


def test_symbolic_batch_size():
    from fireclay_ir import Graph, Program, TensorMeta

    g = Graph("main")
    x = g.add_input("x", TensorMeta("float32", ("s0", 8)))
    m = g.call("aten::amax.default", (x, [1], True), out=TensorMeta("float32", ("s0", 1)))
    s = g.call("aten::sub.Tensor", (x, m), out=TensorMeta("float32", ("s0", 8)))
    e = g.call("aten::exp.default", (s,), out=TensorMeta("float32", ("s0", 8)))
    z = g.call("aten::sum.dim_IntList", (e, [1], True), out=TensorMeta("float32", ("s0", 1)))
    o = g.call("aten::div.Tensor", (e, z), out=TensorMeta("float32", ("s0", 8)))
    g.set_outputs([o])
    p = Program.single(g)
    p.add_symbol("s0", hint=4, min=2)
    scheduled = schedule(lower(p))
    assert len(scheduled.kernels) == 1
    assert str(scheduled.kernels[0].xsizes[0]) == "s0"
    for n in (3, 7):
        xv = torch.randn(n, 8)
        torch.testing.assert_close(run(scheduled, xv)[0], torch.softmax(xv, 1))
