"""The call sequence: runs of kernels in one C++ entry, the per-call arena packed by lifetime,
extern ops writing into it through ``out=``, buffers recomputed instead of stored, the thread
count taken from torch; and the kernels this made faster (two-pass Welford, vector math, max
pooling). Every result is checked against eager on fresh random inputs."""

from __future__ import annotations

import random

import pytest
import torch
from aten_builder import AtenBuilder
from batch import SEED
from hypothesis import given, settings
from hypothesis import strategies as st

import fireclay_cpp
from fireclay_cpp.wrapper_codegen import ARENA_ALIGN, pack_arena

GEN = torch.Generator().manual_seed(SEED)


def _randn(*shape, dtype=torch.float32):
    return torch.randn(shape, generator=GEN, dtype=torch.float64).to(dtype)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 5000), st.integers(0, 12), st.integers(0, 6)), min_size=1, max_size=14))
def test_arena_never_overlaps_buffers_alive_together(specs):
    sizes = {f"b{i}": n for i, (n, _, _) in enumerate(specs)}
    lifetimes = {f"b{i}": (first, first + length) for i, (_, first, length) in enumerate(specs)}
    offsets, total = pack_arena(sizes, lifetimes)
    assert total % ARENA_ALIGN == 0 and total <= sum(-(-n // ARENA_ALIGN) * ARENA_ALIGN for n in sizes.values())
    for a in sizes:
        assert offsets[a] % ARENA_ALIGN == 0 and offsets[a] + sizes[a] <= total
        for b in sizes:
            if a < b and lifetimes[a][0] <= lifetimes[b][1] and lifetimes[b][0] <= lifetimes[a][1]:
                assert offsets[a] + sizes[a] <= offsets[b] or offsets[b] + sizes[b] <= offsets[a], (a, b)


def test_arena_reuses_bytes_of_buffers_that_died():
    offsets, total = pack_arena({"a": 4096, "b": 4096, "c": 4096}, {"a": (0, 1), "b": (1, 2), "c": (2, 3)})
    assert total == 2 * 4096 and offsets["a"] == offsets["c"]


def _mlp_program(rows: int, width: int, depth: int):
    """addmm -> gelu -> addmm -> ... -> softmax: externs with kernels between them."""
    b = AtenBuilder()
    xs = [_randn(rows, width)]
    h = b.input(xs[0], "x")
    for layer in range(depth):
        xs += [_randn(width, width) / width ** 0.5, _randn(width)]
        w, bias = b.input(xs[-2], f"w{layer}"), b.input(xs[-1], f"b{layer}")
        h = b.call("gelu.default", b.call("addmm.default", bias, h, w))
    return b.output(b.call("_softmax.default", h, 1, False)), b, xs


@pytest.mark.parametrize("rows,width,depth", [(5, 16, 1), (33, 64, 3), (128, 96, 2)])
def test_kernels_between_externs_run_in_one_entry_each(rows, width, depth):
    program, b, xs = _mlp_program(rows, width, depth)
    compiled = fireclay_cpp.compile_program(program)
    text = compiled.wrapper_source
    assert text.count("out_aten_addmm_default(") == depth  # written into the arena: no copy
    assert text.count("run") >= depth and "arena = torch.empty(" in text
    for _ in range(2):
        # weights scaled as the layer's fan-in asks: activations stay O(1), so float32 rounding
        # is not amplified by the softmax past the tolerance
        fresh = [torch.randn_like(t) / (t.shape[0] ** 0.5 if t.dim() == 2 and n else 1) for n, t in enumerate(xs)]
        for g, w in zip(compiled(*fresh), b.eager(*fresh)):
            torch.testing.assert_close(g, w, atol=1e-5, rtol=1e-5)


def test_a_program_without_externs_enters_cpp_once():
    x, y = _randn(64, 300), _randn(300)
    b = AtenBuilder()
    hx, hy = b.input(x, "x"), b.input(y, "y")
    s = b.call("_softmax.default", b.call("mul.Tensor", hx, hy), 1, False)
    t = b.call("sum.dim_IntList", b.call("exp.default", s), [0])
    program = b.output(s, b.call("tanh.default", t))
    compiled = fireclay_cpp.compile_program(program)
    assert compiled.wrapper_source.count("run0(packrun0(") == 1 and "run1(" not in compiled.wrapper_source
    for g, w in zip(compiled(x, y), b.eager(x, y)):
        torch.testing.assert_close(g, w, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("rows,cols", [(16, 128), (3, 1000), (200, 33)])
def test_scaled_softmax_recomputes_its_input_instead_of_storing_it(rows, cols):
    x, scale = _randn(rows, cols), _randn(1)[0]
    b = AtenBuilder()
    hx, hs = b.input(x, "x"), b.input(scale, "scale")
    program = b.output(b.call("_softmax.default", b.call("mul.Tensor", hx, hs), 1, False))
    compiled = fireclay_cpp.compile_program(program)
    assert "arena" not in compiled.wrapper_source  # the scaled input never reaches memory
    (got,) = compiled(x, scale)
    torch.testing.assert_close(got, torch.softmax(x * scale, 1), atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("threads", [1, 2])
def test_kernels_use_torchs_thread_count(threads):
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(threads)
        x = _randn(512, 700)
        b = AtenBuilder()
        program = b.output(b.call("sum.dim_IntList", b.call("exp.default", b.input(x, "x")), [1]))
        compiled = fireclay_cpp.compile_program(program)
        assert "get_num_threads()" in compiled.wrapper_source
        (got,) = compiled(x)
        torch.testing.assert_close(got, torch.exp(x).sum(1), atol=1e-3, rtol=1e-5)
    finally:
        torch.set_num_threads(before)


def test_inputs_in_another_layout_take_the_slow_path():
    x = _randn(40, 30)
    b = AtenBuilder()
    program = b.output(b.call("mul.Tensor", b.input(x, "x"), b.input(x, "y")))
    compiled = fireclay_cpp.compile_program(program)
    for a in (x, _randn(30, 40).t(), _randn(40, 60)[:, ::2]):
        (got,) = compiled(a, x)
        torch.testing.assert_close(got, a * x)
    with pytest.raises(fireclay_cpp.InputError, match="compile again"):
        compiled(x.double(), x)


@pytest.mark.parametrize("offset", [0.0, 1e3, -3e4])
def test_variance_is_two_pass_exact_far_from_zero(offset):
    x = _randn(64, 777) + offset
    b = AtenBuilder()
    program = b.output(b.call("var.correction", b.input(x, "x"), [1], correction=1))
    (got,) = fireclay_cpp.compile_program(program)(x)
    want = x.double().var(1)
    torch.testing.assert_close(got.double(), want, atol=1e-4 * (1 + abs(offset)) ** 0.5, rtol=1e-4)


@pytest.mark.parametrize("op", ["exp.default", "log.default", "tanh.default", "erf.default", "sigmoid.default",
                                "sin.default", "expm1.default", "log1p.default"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
def test_vector_math_is_accurate(op, dtype):
    x = _randn(1000, dtype=dtype) * 4
    if op.startswith("log"):
        x = x.abs() + 0.01
    x[:4] = torch.tensor([0.0, float("inf"), float("-inf"), float("nan")], dtype=dtype)
    if op.startswith("log"):
        x[2] = 0.0
    b = AtenBuilder()
    program = b.output(b.call(op, b.input(x, "x")))
    (got,) = fireclay_cpp.compile_program(program)(x)
    (want,) = b.eager(x)
    rtol = 4e-6 if dtype == torch.float32 else 1e-13
    torch.testing.assert_close(got, want, atol=rtol, rtol=rtol, equal_nan=True)


POOLS = [
    # (input shape, kernel, stride, padding, dilation, ceil_mode)
    ((2, 3, 8, 8), [2, 2], [2, 2], [0, 0], [1, 1], False),
    ((1, 4, 9, 7), [3, 3], [2, 2], [1, 1], [1, 1], True),
    ((2, 2, 11, 10), [3, 2], [1, 2], [1, 0], [2, 1], False),
    ((3, 13, 13), [2, 2], [], [0, 0], [1, 1], True),
    ((1, 2, 5, 5), [5, 5], [1, 1], [2, 2], [1, 1], False),
]


@pytest.mark.parametrize("shape,kernel,stride,padding,dilation,ceil_mode", POOLS)
def test_max_pool_matches_eager_with_nan_and_ties(shape, kernel, stride, padding, dilation, ceil_mode):
    rng = random.Random(SEED)
    x = torch.randint(-3, 4, shape, generator=GEN).to(torch.float32)  # many ties
    flat = x.view(-1)
    for _ in range(max(1, flat.numel() // 40)):
        flat[rng.randrange(flat.numel())] = rng.choice([float("nan"), float("-inf")])
    b = AtenBuilder()
    values, indices = b.call("max_pool2d_with_indices.default", b.input(x, "x"), kernel, stride, padding, dilation,
                             ceil_mode)
    program = b.output(values, indices)
    got = fireclay_cpp.compile_program(program)(x)
    want = torch.ops.aten.max_pool2d_with_indices(x, kernel, stride, padding, dilation, ceil_mode)
    torch.testing.assert_close(got[0], want[0], equal_nan=True)
    torch.testing.assert_close(got[1], want[1])
