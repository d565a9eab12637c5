"""Loops under a mask that does not change along them (a concatenation's part, a pad, a padded
window's row) are vectorised: a load under such a mask reads at a place inside the buffer where
the mask is false, and a select on it blends bits (``fc_blend``). Programs of every kind that
makes such masks (concatenations of several inputs, pads, pools, empty and one-element parts,
inputs that are views with an offset; float, half-precision and integer dtypes) are checked
against eager.

A value a kernel computes in one loop and again in a later one must come out the same bits in
both: a max's gradient compares the values with the stored max for equality and divides by how
many are equal. Vector math (glibc's libmvec) is not bitwise the scalar function, so once one
loop vectorised and the next did not, no value equalled the max and the gradient was 0/0 = NaN.
"""

from __future__ import annotations

import pytest
import torch
from aten_builder import AtenBuilder, random_maker

import fireclay_cpp
from fireclay_cpp.api import generate_kernels
from fireclay_loops import lower, schedule

GEN = torch.Generator().manual_seed(2211)


def _grad_of_max(b, values):
    """amax over the last dim, and its gradient for an upstream gradient of ones, as
    fireclay-autograd's decomposition writes it: equal positions share the gradient."""
    top = b.call("amax.default", values, [-1], True)
    hits = b.call("eq.Tensor", values, top)
    count = b.call("sum.dim_IntList", b.call("_to_copy.default", hits, dtype=values.meta.dtype), [-1], True)
    return [top, b.call("div.Tensor", b.call("_to_copy.default", hits, dtype=values.meta.dtype), count)]


def _max_of_cat(fn):
    def build(b, x, mean, rstd):
        norm = b.call("mul.Tensor", b.call("sub.Tensor", x, mean), rstd)
        return _grad_of_max(b, b.call("cat.default", [norm, b.call(fn, x)], 0))
    return build


def _max_of_padded(fn):
    def build(b, x, mean, rstd):
        del mean, rstd
        padded = b.call("constant_pad_nd.default", b.call(fn, x), [0, 0, 2, 1], 0.5)
        return _grad_of_max(b, padded)
    return build


MAX_GRAD_CASES = [
    ("cat_exp", _max_of_cat("exp.default")), ("cat_tanh", _max_of_cat("tanh.default")),
    ("cat_log1p_abs", _max_of_cat("erf.default")), ("padded_sin", _max_of_padded("sin.default")),
]


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=str)
@pytest.mark.parametrize("cid,build", MAX_GRAD_CASES, ids=[c[0] for c in MAX_GRAD_CASES])
@pytest.mark.parametrize("width", [4, 13])
def test_values_compared_with_their_max_are_the_same_bits_in_every_loop(cid, build, dtype, width):
    x = torch.randn(6, width, generator=GEN, dtype=torch.float64).to(dtype)
    mean, rstd = torch.randn(6, 1, generator=GEN, dtype=dtype), torch.rand(6, 1, generator=GEN, dtype=dtype) + 0.5
    b = AtenBuilder()
    program = b.output(*build(b, b.input(x, "x"), b.input(mean, "mean"), b.input(rstd, "rstd")))
    compiled = fireclay_cpp.compile_program(program)
    for _ in range(3):
        x = torch.randn(6, width, generator=GEN, dtype=torch.float64).to(dtype)
        got, want = compiled(x, mean, rstd), b.eager(x, mean, rstd)
        for g, w in zip(got, want):
            assert not g.isnan().any(), g
            torch.testing.assert_close(g, w)


# Programs whose loops run under masks that do not change along them. Each takes a random-input
# maker ``g(*shape)`` (in the case's dtype) and returns its inputs and outputs.
def _cat_of_three(b, g):
    xs = [b.input(g(*s), f"x{i}") for i, s in enumerate([(2, 3, 8), (2, 1, 8), (2, 4, 8)])]
    c = b.call("cat.default", xs, 1)
    return xs, [b.call("mul.Tensor", c, 3), b.call("sum.dim_IntList", c, [2])]


def _cat_with_empty_and_one_row(b, g):
    xs = [b.input(g(*s), f"x{i}") for i, s in enumerate([(3, 9), (0, 9), (1, 9)])]
    c = b.call("cat.default", xs, 0)
    return xs, [b.call("add.Tensor", c, c), b.call("amax.default", c, [1])]


def _cat_of_ones(b, g):
    xs = [b.input(g(1, 1, 1), f"x{i}") for i in range(3)]
    return xs, [b.call("cat.default", xs, 1)]


def _cat_of_offset_views(b, g):
    base = g(5, 12)
    x, y = b.input(base[1:4, 2:10], "x"), b.input(g(4, 3, 8)[2], "y")  # views with storage offsets
    c = b.call("cat.default", [b.call("neg.default", x), y], 0)
    return [x, y], [c, b.call("sum.dim_IntList", c, [1])]


def _pad_outer_dims(b, g):
    x = b.input(g(3, 5, 8), "x")
    p = b.call("constant_pad_nd.default", x, [0, 0, 2, 1, 1, 0], 2)
    return [x], [p, b.call("sum.dim_IntList", p, [2])]


def _pad_inner_dim(b, g):
    x = b.input(g(3, 4, 7), "x")
    return [x], [b.call("constant_pad_nd.default", x, [1, 2, 1, 1], -1)]


def _padded_max_pool(b, g):
    x = b.input(g(2, 4, 4, 8).permute(0, 3, 1, 2), "x")  # channels last: channels innermost
    out, _ = b.call("max_pool2d_with_indices.default", x, [3, 3], [2, 2], [1, 1])
    return [x], [out]


def _padded_avg_pool(b, g):
    x = b.input(g(2, 5, 5, 8).permute(0, 3, 1, 2), "x")
    return [x], [b.call("avg_pool2d.default", x, [3, 3], [1, 1], [1, 1], False, False)]


def _max_pool_one_pixel(b, g):
    x = b.input(g(1, 1, 1, 8).permute(0, 3, 1, 2), "x")
    out, _ = b.call("max_pool2d_with_indices.default", x, [3, 3], [1, 1], [1, 1])
    return [x], [out]


FLOAT_ONLY = {"padded_max_pool", "padded_avg_pool", "max_pool_one_pixel"}
MASKED_PROGRAMS = [
    ("cat_of_three", _cat_of_three), ("cat_with_empty_and_one_row", _cat_with_empty_and_one_row),
    ("cat_of_ones", _cat_of_ones), ("cat_of_offset_views", _cat_of_offset_views),
    ("pad_outer_dims", _pad_outer_dims), ("pad_inner_dim", _pad_inner_dim),
    ("padded_max_pool", _padded_max_pool), ("padded_avg_pool", _padded_avg_pool),
    ("max_pool_one_pixel", _max_pool_one_pixel),
]
DTYPES = [torch.float32, torch.float64, torch.bfloat16, torch.int64, torch.int32]


def _random(dtype):
    return random_maker(dtype, GEN)


def _fresh_like(t: torch.Tensor) -> torch.Tensor:
    """New random values in ``t``'s layout (its strides and storage offset)."""
    storage = _random(t.dtype)(t.untyped_storage().nbytes() // t.element_size())
    return storage.as_strided(t.shape, t.stride(), t.storage_offset())


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("cid,build", MASKED_PROGRAMS, ids=[c[0] for c in MASKED_PROGRAMS])
def test_programs_under_invariant_masks_match_eager(cid, build, dtype):
    if cid in FLOAT_ONLY and not dtype.is_floating_point:
        pytest.skip("eager pools floating-point tensors only")
    b, made = AtenBuilder(), []
    take = b.input
    b.input = lambda t, name: made.append(t) or take(t, name)
    _, outs = build(b, _random(dtype))
    compiled = fireclay_cpp.compile_program(b.output(*outs))
    tol = {"atol": 2e-2, "rtol": 2e-2} if dtype == torch.bfloat16 else {}
    for inputs in (made, [_fresh_like(t) for t in made]):
        for got, want in zip(compiled(*inputs), b.eager(*inputs)):
            torch.testing.assert_close(got, want, **tol)


@pytest.mark.parametrize("cid", ["cat_of_three", "cat_of_offset_views"])
def test_concatenations_load_in_the_buffer_and_blend(cid):
    """The table's concatenations take the vectorised form: in the loop, loads at an offset and
    bit blends, no ``?:`` (GCC keeps a loop scalar for one on a loop-invariant condition)."""
    build = dict(MASKED_PROGRAMS)[cid]
    b = AtenBuilder()
    _, outs = build(b, _random(torch.float32))
    sources = [k.source for k in generate_kernels(schedule(lower(b.output(*outs))))]
    loops = [s.rsplit("#pragma omp simd", 1)[1] for s in sources if "fc_blend(" in s]
    assert loops, sources
    for loop in loops:
        assert " ? " not in loop, loop


# A max pool's backward then ReLU's and batch norm's per-channel sums, over channels-last
# memory (resnet's stem in training): a column kernel, whose vectorised loop runs along the
# channels. Which window positions a row takes from does not change along the channels: those
# masks are computed once per row, before the loop over the channels, and the loop loads inside
# the buffer and blends bits. (batch, channels, size, kernel, stride, padding)
POOL_BACKWARD_CASES = [(2, 16, 16, 3, 2, 1), (1, 8, 5, 3, 1, 1), (2, 24, 7, 2, 2, 0), (3, 16, 1, 3, 1, 1)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("case", POOL_BACKWARD_CASES, ids=lambda c: "x".join(map(str, c)))
def test_pool_backward_column_sums_match_eager(case, dtype):
    n, c, size, k, s, p = case
    out = (size + 2 * p - k) // s + 1

    def inputs():
        x = torch.randn(n, c, size, size, generator=GEN, dtype=dtype).to(memory_format=torch.channels_last)
        grad = torch.randn(n, c, out, out, generator=GEN, dtype=dtype).to(memory_format=torch.channels_last)
        return x, grad, torch.ops.aten.max_pool2d_with_indices(x, [k, k], [s, s], [p, p])[1]

    b = AtenBuilder()
    x, grad, indices = (b.input(t, name) for t, name in zip(inputs(), ("x", "grad", "indices")))
    spread = b.call("max_pool2d_with_indices_backward.default", grad, x, [k, k], [s, s], [p, p], [1, 1], False,
                    indices)
    relu_grad = b.call("where.self", b.call("le.Scalar", x, 0), b.call("zeros_like.default", spread), spread)
    program = b.output(b.call("sum.dim_IntList", relu_grad, [0, 2, 3]),
                       b.call("sum.dim_IntList", b.call("mul.Tensor", relu_grad, x), [0, 2, 3]))
    sources = [kernel.source for kernel in generate_kernels(schedule(lower(program)))]
    if size > 1:
        assert any("fc_xb" in src and "fc_blend(" in src for src in sources), sources
    compiled = fireclay_cpp.compile_program(program)
    for _ in range(2):
        args = inputs()
        for got, want in zip(compiled(*args), b.eager(*args)):
            torch.testing.assert_close(got, want)
