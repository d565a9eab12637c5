"""The kernel variants chosen from the loop structure and index analysis: online softmax in
looped reductions (the row read twice, not three times), and their edge values (-inf, +inf, NaN
rows), against eager. Interpreted runs on CPU; the same checks run on the GPU in test_gpu.py."""

import os

import pytest
import torch
from aten_builder import AtenBuilder

from fireclay_loops import lower, schedule
from fireclay_triton import Config, compile_program, generate_kernels

interpreted = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="runs in Triton's interpreter")


def softmax_like(op: str, dim: int):
    def build(b, x):
        if op == "logsumexp":
            m = b.call("amax.default", x, [dim], True)
            e = b.call("exp.default", b.call("sub.Tensor", x, m))
            return (b.call("add.Tensor", b.call("log.default", b.call("sum.dim_IntList", e, [dim], True)), m),)
        return (b.call(f"_{op}.default", x, dim, False),)
    return build


def program_of(build, x: torch.Tensor):
    b = AtenBuilder()
    outs = build(b, b.input(x, "x"))
    return b, b.output(*outs)


def special_rows(rows: int, cols: int, seed: int) -> torch.Tensor:
    """Random rows, then rows holding -inf entries, a whole -inf row, +inf, and NaN."""
    x = torch.randn(rows, cols, generator=torch.Generator().manual_seed(seed)) * 4
    if rows >= 5:
        x[1, ::3] = float("-inf")
        x[2] = float("-inf")
        x[3, cols // 2] = float("inf")
        x[4, cols - 1] = float("nan")
    return x


def looped_source(build, x: torch.Tensor) -> str:
    _, program = program_of(build, x)
    (k,) = generate_kernels(schedule(lower(program)), Config(persistent_limit=64), interpret=False)
    assert k.kind == "looped"
    return k.source


@pytest.mark.parametrize("op", ["softmax", "log_softmax", "logsumexp"])
def test_online_softmax_reads_the_row_twice(op):
    source = looped_source(softmax_like(op, 1), torch.empty(8, 1000))
    assert source.count("for roffset in range") == (2 if op != "logsumexp" else 1)
    assert source.count("tl.load(") == source.count("for roffset in range")
    assert "_seen" in source  # the running max / rescaled sum


def test_sum_of_exp_of_something_else_keeps_its_own_loop():
    def build(b, x):  # exp(x - max(x)) summed over a different value: no online form
        m = b.call("amax.default", x, [1], True)
        e = b.call("exp.default", b.call("sub.Tensor", b.call("mul.Scalar", x, 2.0), m))
        return (b.call("sum.dim_IntList", e, [1], True),)
    source = looped_source(build, torch.empty(8, 1000))
    assert source.count("for roffset in range") == 2 and "_seen" not in source


@interpreted
@pytest.mark.parametrize("op", ["softmax", "log_softmax", "logsumexp"])
@pytest.mark.parametrize("rows,cols,limit", [(6, 1000, 64), (7, 3001, 1024), (5, 130, 16)])
def test_online_softmax_matches_eager(op, rows, cols, limit):
    build = softmax_like(op, 1)
    b, program = program_of(build, torch.empty(rows, cols))
    compiled = compile_program(program, cfg=Config(persistent_limit=limit))
    assert [k.kind for k in compiled.kernels] == ["looped"]
    for seed in (0, 1):
        x = special_rows(rows, cols, seed)
        torch.testing.assert_close(compiled(x)[0], b.eager(x)[0], atol=1e-5, rtol=1e-5, equal_nan=True)


def _permute_add(perm):
    def build(b, x, y):
        return (b.call("add.Tensor", b.call("permute.default", x, perm), y),)
    return build


def _transpose_gelu(b, x, y):  # the transpose feeds math, the contiguous input is broadcast
    return (b.call("gelu.default", b.call("mul.Tensor", b.call("t.default", x), y)),)


# (builder, input shapes, whether a tiled kernel is expected)
TILED_CASES = [
    pytest.param(_permute_add([1, 0]), [(33, 70), (70, 33)], True, id="transpose_ragged"),
    pytest.param(_permute_add([1, 0]), [(64, 128), (128, 64)], True, id="transpose_even"),
    pytest.param(_permute_add([0, 2, 1]), [(3, 40, 17), (3, 17, 40)], True, id="batched_transpose"),
    pytest.param(_permute_add([2, 1, 0]), [(20, 3, 18), (18, 3, 20)], True, id="reverse_permute"),
    pytest.param(_permute_add([1, 0, 2]), [(20, 30, 18), (30, 20, 18)], False, id="inner_dim_kept"),
    pytest.param(_transpose_gelu, [(50, 40), (1, 50)], True, id="transpose_broadcast"),
    pytest.param(_permute_add([1, 0]), [(5, 70), (70, 5)], False, id="too_thin_to_tile"),
]


@pytest.mark.parametrize("build,shapes,tiled", TILED_CASES)
def test_transposing_pointwise_kernels_are_tiled(build, shapes, tiled):
    b = AtenBuilder()
    handles = [b.input(torch.empty(s, device="meta"), f"x{i}") for i, s in enumerate(shapes)]
    program = b.output(*build(b, *handles))
    kinds = [k.kind for k in generate_kernels(schedule(lower(program)), interpret=False)]
    assert kinds == (["tiled"] if tiled else ["pointwise"])


@interpreted
@pytest.mark.parametrize("build,shapes,tiled", TILED_CASES)
def test_tiled_kernels_match_eager(build, shapes, tiled):
    gen = torch.Generator().manual_seed(len(shapes[0]))
    xs = [torch.randn(s, generator=gen) for s in shapes]
    b = AtenBuilder()
    handles = [b.input(x, f"x{i}") for i, x in enumerate(xs)]
    compiled = compile_program(b.output(*build(b, *handles)), xs)
    for seed in (0, 1):
        xs = [torch.randn(s, generator=torch.Generator().manual_seed(seed)) for s in shapes]
        torch.testing.assert_close(compiled(*xs)[0], b.eager(*xs)[0], atol=1e-5, rtol=1e-5)


def _reduce(op, dims, **kw):
    def build(b, x):
        return (b.call(op, x, dims, **kw),)
    return build


# (builder, input shape, reduces columns, kind)
COLUMN_CASES = [
    pytest.param(_reduce("sum.dim_IntList", [0]), (3000, 40), True, "looped", id="sum_columns_long"),
    pytest.param(_reduce("sum.dim_IntList", [0]), (300, 40), True, "persistent", id="sum_columns_short"),
    pytest.param(_reduce("amax.default", [0]), (700, 33), True, "looped", id="amax_columns_ragged"),
    pytest.param(_reduce("mean.dim", [0, 1]), (30, 40, 19), True, "looped", id="mean_outer_dims"),
    pytest.param(_reduce("sum.dim_IntList", [1]), (700, 33), False, "persistent", id="sum_rows"),
    pytest.param(softmax_like("log_softmax", 0), (600, 24), True, "looped", id="log_softmax_columns"),
]


@pytest.mark.parametrize("build,shape,columns,kind", COLUMN_CASES)
def test_column_reductions_are_recognised(build, shape, columns, kind):
    _, program = program_of(build, torch.empty(shape, device="meta"))
    (k,) = generate_kernels(schedule(lower(program)), interpret=False)
    assert (k.columns, k.kind) == (columns, kind)


@interpreted
@pytest.mark.parametrize("build,shape,columns,kind", COLUMN_CASES)
def test_column_reductions_match_eager(build, shape, columns, kind):
    b, program = program_of(build, torch.empty(shape))
    compiled = compile_program(program)
    for seed in (0, 1):
        x = torch.randn(shape, generator=torch.Generator().manual_seed(seed))
        torch.testing.assert_close(compiled(x)[0], b.eager(x)[0], atol=1e-4, rtol=1e-4)


def _sums_columns(b, x):  # two sums of one input: both split, one finisher
    return (b.call("sum.dim_IntList", x, [0]), b.call("sum.dim_IntList", b.call("mul.Tensor", x, x), [0]))


def _column_sum_then_scale(b, x):  # code over the outputs after the sum: in the finisher
    return (b.call("mul.Scalar", b.call("sum.dim_IntList", x, [0]), 0.5),)


def _column_var_mean(b, x):  # Welford: partial (mean, m2, count) per chunk, merged by the finisher
    return b.call("var_mean.correction", x, [0], correction=1)


# (builder, input shape, dtype, split expected)
SPLIT_CASES = [
    pytest.param(_reduce("sum.dim_IntList", [0]), (5000, 40), torch.float32, True, id="sum_ragged"),
    pytest.param(_reduce("mean.dim", [0]), (4500, 33), torch.float32, True, id="mean_divides_in_the_finisher"),
    pytest.param(_sums_columns, (4100, 24), torch.float32, True, id="two_sums"),
    pytest.param(_reduce("sum.dim_IntList", [0, 1]), (70, 80, 9), torch.float32, True, id="sum_two_outer_dims"),
    pytest.param(_column_sum_then_scale, (5000, 40), torch.float32, True, id="sum_then_scale"),
    pytest.param(_reduce("amax.default", [0]), (5000, 40), torch.float32, True, id="amax"),
    pytest.param(_reduce("amin.default", [0]), (5000, 40), torch.float32, True, id="amin"),
    pytest.param(_column_var_mean, (5000, 40), torch.float32, True, id="var_mean_welford"),
    pytest.param(_reduce("argmax.default", 0), (5000, 40), torch.float32, False, id="argmax_not_split"),
    pytest.param(_reduce("sum.dim_IntList", [0]), (5000, 40), torch.float64, False, id="float64_not_split"),
    # contiguous rows, but so few that one program per row would leave the GPU idle
    pytest.param(_reduce("sum.dim_IntList", [1]), (3, 40000), torch.float32, True, id="few_long_rows"),
    pytest.param(_reduce("sum.dim_IntList", [0, 1]), (200, 300), torch.float32, True, id="sum_to_a_scalar"),
    pytest.param(_reduce("sum.dim_IntList", [1]), (100, 40000), torch.float32, False, id="many_long_rows"),
]


@pytest.mark.parametrize("build,shape,dtype,split", SPLIT_CASES)
def test_long_column_reductions_are_split(build, shape, dtype, split):
    _, program = program_of(build, torch.empty(shape, dtype=dtype, device="meta"))
    kernels = generate_kernels(schedule(lower(program)), interpret=False)
    assert [k.kind == "split" for k in kernels if k.kind != "pointwise"] == [split]


@interpreted
@pytest.mark.parametrize("build,shape,dtype,split", SPLIT_CASES)
def test_split_column_reductions_match_eager(build, shape, dtype, split):
    b, program = program_of(build, torch.empty(shape, dtype=dtype))
    compiled = compile_program(program)
    for seed in (0, 1):
        x = torch.randn(shape, generator=torch.Generator().manual_seed(seed)).to(dtype)
        for got, want in zip(compiled(x), b.eager(x)):
            torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
