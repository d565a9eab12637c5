"""Reductions whose memory runs along the kept dim (a bias gradient: the column sums of a
``[rows, cols]`` tensor) are generated with the kept dim in blocks and the reduced loop outside
(see kernel_codegen's docstring). Every case runs against eager on fresh random inputs, and the
table checks which loop order each kernel got, so a case cannot silently test the other one."""

from __future__ import annotations

import pytest
import torch
from aten_builder import AtenBuilder
from batch import SEED

import fireclay_cpp
from fireclay_cpp.column_loops import COLUMN_BLOCK

GEN = torch.Generator().manual_seed(SEED)
COLUMN_LOOP = "fc_xb += "  # the block loop of a column reduction


def _randn(*shape, dtype=torch.float32):
    return torch.randn(shape, generator=GEN, dtype=torch.float64).to(dtype)


def _gelu_grad_and_bias_grad(b, g, x):
    """What a Linear + GELU backward fuses: the GELU gradient, and its column sums."""
    dx = b.call("gelu_backward.default", g, x)
    return dx, b.call("sum.dim_IntList", dx, [0])


def _sum_rows_keepdim(b, x):
    return (b.call("sum.dim_IntList", x, [0], True),)


def _mean_and_max_of_middle(b, x):
    return b.call("mean.dim", x, [1]), b.call("amax.default", x, [1])


def _var_mean_columns(b, x):
    return b.call("var_mean.correction", x, [0], correction=1)


def _argmax_columns(b, x):
    return (b.call("argmax.default", x, 0),)


def _sum_of_scaled_plus_residual(b, x, y):
    """A pointwise output stored in the loop beside the reduction of the same values."""
    s = b.call("mul.Tensor", b.call("add.Tensor", x, y), 0.5)
    return s, b.call("sum.dim_IntList", s, [0])


def _column_sums_then_scale(b, x):
    """A second loop-free stage reading the sums: their epilogue."""
    s = b.call("sum.dim_IntList", x, [0])
    return (b.call("mul.Tensor", b.call("sigmoid.default", s), 3.0),)


def _concatenated_then_summed(b, x, y, z):
    """The gradient of a fused qkv projection: pieces concatenated along the kept dim (masks
    that do not change along the reduction: computed once per column), then its column sums."""
    cat = b.call("cat.default", [x, b.call("mul.Tensor", y, 2.0), z], 1)
    return cat, b.call("sum.dim_IntList", cat, [0])


# (id, builder, input shapes, column order expected, atol, rtol)
CASES = [
    ("gelu_bias_grad", _gelu_grad_and_bias_grad, [(64, 256), (64, 256)], True, 1e-4, 1e-5),
    ("gelu_bias_grad_ragged", _gelu_grad_and_bias_grad, [(37, 3 * COLUMN_BLOCK + 5), (37, 3 * COLUMN_BLOCK + 5)],
     True, 1e-4, 1e-5),
    ("few_columns", _sum_rows_keepdim, [(5000, 3)], True, 1e-3, 1e-5),
    ("one_long_row", _sum_rows_keepdim, [(7, 1)], False, 1e-5, 1e-5),
    ("middle_dim", _mean_and_max_of_middle, [(3, 50, 70)], True, 1e-5, 1e-5),
    ("var_mean", _var_mean_columns, [(300, 130)], True, 1e-5, 1e-5),
    ("argmax", _argmax_columns, [(50, 70)], True, 0, 0),
    ("stored_beside", _sum_of_scaled_plus_residual, [(128, 96), (128, 96)], True, 1e-4, 1e-5),
    ("epilogue_stage", _column_sums_then_scale, [(200, 33)], True, 1e-5, 1e-5),
    ("concatenated", _concatenated_then_summed, [(96, 40), (96, 70), (96, 30)], True, 1e-4, 1e-5),
    ("rows_stay_rows", lambda b, x: (b.call("sum.dim_IntList", x, [1]),), [(64, 256)], False, 1e-4, 1e-5),
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("cid,build,shapes,column,atol,rtol", CASES, ids=[c[0] for c in CASES])
def test_column_reductions_match_eager(cid, build, shapes, column, atol, rtol, dtype):
    tensors = [_randn(*s, dtype=dtype) for s in shapes]
    b = AtenBuilder()
    handles = [b.input(t, f"x{i}") for i, t in enumerate(tensors)]
    program = b.output(*build(b, *handles))
    compiled = fireclay_cpp.compile_program(program)
    assert (COLUMN_LOOP in compiled.cpp_sources[0]) == column, compiled.cpp_sources[0]
    for _ in range(2):  # fresh inputs on the second call
        got, want = compiled(*tensors), b.eager(*tensors)
        for g, w in zip(got, want):
            torch.testing.assert_close(g, w, atol=atol, rtol=rtol, msg=lambda m: f"{cid} (seed {SEED}): {m}")
        tensors = [_randn(*s, dtype=dtype) for s in shapes]


def test_argmax_of_columns_keeps_the_first_of_ties():
    x = torch.randint(0, 3, (400, 70), generator=GEN).to(torch.float32)
    x[17, 5] = float("nan")  # NaN wins, as in eager
    b = AtenBuilder()
    program = b.output(b.call("argmax.default", b.input(x), 0))
    compiled = fireclay_cpp.compile_program(program)
    assert COLUMN_LOOP in compiled.cpp_sources[0]
    (got,) = compiled(x)
    torch.testing.assert_close(got, torch.argmax(x, 0))


@pytest.mark.parametrize("rows,cols", [(3, 5), (64, 32), (513, 257), (2, 1000)])
def test_symbolic_column_sums(rows, cols):
    from fireclay_ir import Graph, Program, TensorMeta

    g = Graph("main")
    x = g.add_input("x", TensorMeta("float32", ("s0", "s1")))
    s = g.call("aten::sum.dim_IntList", (x, [0]), out=TensorMeta("float32", ("s1",)))
    g.set_outputs([s])
    p = Program.single(g)
    p.add_symbol("s0", hint=64, min=2)
    p.add_symbol("s1", hint=32, min=2)
    compiled = fireclay_cpp.compile_program(p)
    assert COLUMN_LOOP in compiled.cpp_sources[0]
    x = _randn(rows, cols)
    (got,) = compiled(x)
    torch.testing.assert_close(got, x.sum(0), atol=1e-4, rtol=1e-5)


def _var_mean_batch_norm_like(b, x):
    """Variance and mean over every dim but the last (batch norm's statistics over channels-last
    activations), then the normalised values: a later loop over the rows reading them."""
    var, mean = b.call("var_mean.correction", x, [0, 1], correction=0, keepdim=True)
    return var, mean, b.call("mul.Tensor", b.call("sub.Tensor", x, mean), b.call("rsqrt.default", b.call("add.Tensor", var, 1e-5)))


# (id, input shape, offset added to the values): column Welford, computed in two passes (a sum for
# the mean, then the squared deviations from it), with one block of the kept dim or several
WELFORD_CASES = [
    ("one_vector_of_channels", (64, 256, 16), 0.0),
    ("few_channels", (3000, 1, 3), 0.0),
    ("ragged_channels", (40, 50, 24), 0.0),
    ("many_channels", (9, 7, 576), 0.0),
    ("large_mean", (128, 32, 16), 1000.0),
    ("odd_rows", (7, 3, 40), 0.0),
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("cid,shape,offset", WELFORD_CASES, ids=[c[0] for c in WELFORD_CASES])
def test_column_welford_in_two_passes_matches_eager(cid, shape, offset, dtype):
    b = AtenBuilder()
    x = _randn(*shape, dtype=dtype) + offset
    program = b.output(*_var_mean_batch_norm_like(b, b.input(x)))
    compiled = fireclay_cpp.compile_program(program)
    source = compiled.cpp_sources[0]
    assert COLUMN_LOOP in source and "_mean[fc_i]" in source and ".add(" not in source, source
    atol = 1e-4 * (1 + offset) if dtype == torch.float32 else 1e-9 * (1 + offset)
    for _ in range(2):
        for g, w in zip(compiled(x), b.eager(x)):
            torch.testing.assert_close(g, w, atol=atol, rtol=1e-4, msg=lambda m: f"{cid} (seed {SEED}): {m}")
        x = _randn(*shape, dtype=dtype) + offset
