"""Pointwise kernels whose innermost loop reads an operand at a stride (a transposed operand: the
layer norm over channels of a ``[batch, channels, time]`` convolution output, the gradient of a
sliced or padded transposed tensor, a concatenation of a transposed tensor with another) gather
those reads into a row array first, so that the loop doing the math vectorises (GCC vectorises no
loop that reads at a stride along it, and so ran ``erf`` and ``exp`` one element at a time); and
where masks along that loop decide what is read (a pad, a concatenation), the loop runs in parts
split where they change, so that no select on them is left. The loop of a row reduction gathers
its strided reads the same way (a layer norm over the channels of a convolution's output). Each program is checked against eager
on fresh inputs, in every dtype that applies.
"""

from __future__ import annotations

import pytest
import torch
from aten_builder import AtenBuilder, random_maker

import fireclay_cpp
from fireclay_cpp.api import generate_kernels
from fireclay_loops import lower, schedule

GEN = torch.Generator().manual_seed(2212)


def _t(b, x):
    return b.call("transpose.int", x, 1, 2)


# Programs: each takes a random-input maker ``g(*shape)`` and a unary op name (``erf`` for the
# floating-point cases, ``neg`` for the integer ones) and returns its inputs and outputs.
def _transposed_unary(b, g, fn):
    x = b.input(g(2, 37, 16), "x")
    return [x], [b.call(f"{fn}.default", _t(b, x))]


def _transposed_padded(b, g, fn):
    x = b.input(g(2, 39, 8), "x")
    return [x], [b.call("constant_pad_nd.default", b.call(f"{fn}.default", _t(b, x)), [0, 1])]


def _transposed_padded_both_sides(b, g, fn):
    x = b.input(g(3, 21, 5), "x")
    y = b.input(g(3, 5, 24), "y")
    padded = b.call("constant_pad_nd.default", _t(b, x), [2, 1], 0)
    return [x, y], [b.call(f"{fn}.default", b.call("add.Tensor", padded, y))]


def _transposed_cat(b, g, fn):
    x, y = b.input(g(2, 11, 6), "x"), b.input(g(2, 6, 9), "y")
    return [x, y], [b.call(f"{fn}.default", b.call("cat.default", [_t(b, x), y], 2))]


def _normalized_over_channels(b, g, fn):
    """A layer norm's pointwise part over the channels of ``[batch, channels, time]``: the
    statistics per time step, the result in the conv's layout."""
    x = b.input(g(2, 8, 45), "x")
    mean, scale = b.input(g(2, 45, 1), "mean"), b.input(g(2, 45, 1), "scale")
    w = b.input(g(8), "w")
    norm = b.call("mul.Tensor", b.call("mul.Tensor", b.call("sub.Tensor", _t(b, x), mean), scale), w)
    return [x, mean, scale, w], [b.call(f"{fn}.default", _t(b, norm))]


def _long_rows(b, g, fn):
    """Rows longer than the gathered arrays may be: the loop reads memory as before."""
    x = b.input(g(1, 4100, 3), "x")
    return [x], [b.call(f"{fn}.default", _t(b, x))]


def _written_then_read_transposed(b, g, fn):
    """A buffer one kernel writes, read transposed by the next."""
    x = b.input(g(2, 12, 12), "x")
    y = b.call(f"{fn}.default", x)
    return [x], [y, b.call("add.Tensor", y, _t(b, y))]


def _row_sums_of_transposed(b, g, fn):
    """A row reduction whose loop reads one operand at a stride and another in order."""
    x, y = b.input(g(2, 40, 6), "x"), b.input(g(2, 6, 40), "y")
    z = b.call("mul.Tensor", b.call(f"{fn}.default", _t(b, x)), y)
    return [x, y], [b.call("sum.dim_IntList", z, [2]), z]


def _layer_norm_of_transposed(b, g, fn):
    """A layer norm over the channels of ``[batch, channels, time]`` (mean and variance, then
    the normalised row: loops after the reductions read the gathered row again)."""
    x = b.input(g(2, 24, 7), "x")
    w, bias = b.input(g(24), "w"), b.input(g(24), "bias")
    out, mean, rstd = b.call("native_layer_norm.default", b.call(f"{fn}.default", _t(b, x)), [24], w, bias, 1e-5)
    return [x, w, bias], [out, mean, rstd]


def _softmax_of_transposed_padded(b, g, fn):
    """A softmax over transposed rows padded at the end: a masked gathered read, three loops."""
    x = b.input(g(3, 17, 5), "x")
    padded = b.call("constant_pad_nd.default", b.call(f"{fn}.default", _t(b, x)), [0, 2], 0)
    return [x], [b.call("_softmax.default", padded, -1, False)]


FLOAT_ONLY = {"layer_norm_of_transposed", "softmax_of_transposed_padded"}
PROGRAMS = [
    ("transposed_unary", _transposed_unary), ("transposed_padded", _transposed_padded),
    ("transposed_padded_both_sides", _transposed_padded_both_sides), ("transposed_cat", _transposed_cat),
    ("normalized_over_channels", _normalized_over_channels), ("long_rows", _long_rows),
    ("written_then_read_transposed", _written_then_read_transposed),
    ("row_sums_of_transposed", _row_sums_of_transposed), ("layer_norm_of_transposed", _layer_norm_of_transposed),
    ("softmax_of_transposed_padded", _softmax_of_transposed_padded),
]
DTYPES = [torch.float32, torch.float64, torch.bfloat16, torch.int64]


def _random(dtype):
    return random_maker(dtype, GEN)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("cid,build", PROGRAMS, ids=[c[0] for c in PROGRAMS])
def test_programs_reading_rows_at_a_stride_match_eager(cid, build, dtype):
    if cid in FLOAT_ONLY and not dtype.is_floating_point:
        pytest.skip("eager normalises floating-point tensors only")
    if cid == "layer_norm_of_transposed" and dtype == torch.bfloat16:
        pytest.skip("the statistics' dtype in bfloat16 is another question than the loops' reads")
    fn = "erf" if dtype.is_floating_point else "neg"
    b, made = AtenBuilder(), []
    take = b.input
    b.input = lambda t, name: made.append(t) or take(t, name)
    _, outs = build(b, _random(dtype), fn)
    compiled = fireclay_cpp.compile_program(b.output(*outs))
    tol = {"atol": 2e-2, "rtol": 2e-2} if dtype == torch.bfloat16 else {}
    fresh = [_random(dtype)(*t.shape) for t in made]
    for inputs in (made, fresh):
        for got, want in zip(compiled(*inputs), b.eager(*inputs)):
            torch.testing.assert_close(got, want, **tol)


def _sources(build) -> list[str]:
    b = AtenBuilder()
    _, outs = build(b, _random(torch.float32), "erf")
    return [k.source for k in generate_kernels(schedule(lower(b.output(*outs))))]


def _vector_loops(source: str) -> list[str]:
    """The text of each ``omp simd`` loop of a kernel."""
    return [part.split("\n    }", 1)[0] for part in source.split("#pragma omp simd")[1:]]


def test_a_transposed_operand_is_gathered_before_the_loop():
    (source,) = _sources(_transposed_unary)
    assert "fc_gather" in source, source
    for loop in _vector_loops(source):
        assert "in_x[" not in loop, loop  # the vectorised loop reads the gathered row


def test_a_padded_transposed_row_runs_as_two_loops_split_where_the_mask_changes():
    (source,) = _sources(_transposed_padded)
    loops = _vector_loops(source)
    assert "x2 < 39" in loops[0] and "x2 = 39" in loops[1], source
    assert "in_x[" not in "".join(loops), source



def test_a_row_reduction_gathers_its_transposed_operand():
    sources = [s for s in _sources(_row_sums_of_transposed) if "acc" in s]
    assert sources and all("fc_gather" in s for s in sources), sources
    for source in sources:
        for loop in _vector_loops(source):
            assert "in_x[" not in loop, loop
