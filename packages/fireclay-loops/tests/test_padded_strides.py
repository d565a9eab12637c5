"""Intermediate buffers with long rows get padded row strides (fireclay_loops.layout.padded_strides;
``config.pad_strides``, forced on for the CPU here): every program of padded_programs.py runs in
the reference executor against eager, the buffers it pads are the ones it may pad, and the
padding itself follows the rule (rows a multiple of 128 bytes, only past the threshold)."""

import pytest

torch = pytest.importorskip("torch")

import padded_programs as programs  # noqa: E402

from fireclay_loops import layout, lower, schedule  # noqa: E402
from fireclay_loops.reference import run  # noqa: E402

SMALL = [1, 7, 1025]


@pytest.mark.parametrize("n", SMALL)
@pytest.mark.parametrize("case", programs.CASES, ids=[c.name for c in programs.CASES])
def test_padded_programs_match_eager(case, n):
    b, program = programs.build(case, n)
    with programs.padding_on():
        scheduled = schedule(lower(program))
    if case.padded:
        assert programs.padded_buffers(scheduled), str(scheduled)
    for seed in (1, 2):
        inputs = programs.fresh_inputs(b, seed)
        programs.check(case, n, run(scheduled, *inputs), b.eager(*inputs), padded_above=None)


def test_logits_gradient_rows_are_padded_and_matmuls_read_them_so():
    """The lm_head's backward in small: a [tokens, 50257] gradient our kernel writes is stored with
    rows of 50264 bf16 elements (128 bytes), and both matmuls read it through that stride."""
    b, program = programs.build(programs.CASES[0], 50257)
    gen = torch.Generator().manual_seed(0)
    b = programs.AtenBuilder()
    x, w, h = (b.input(torch.randn(s, generator=gen, dtype=torch.bfloat16)) for s in ((4, 50257), (50257, 8), (4, 8)))
    grad = b.call("mul.Tensor", x, 0.5)
    program = b.output(b.call("mm.default", grad, w), b.call("mm.default", b.call("t.default", grad), h))
    with programs.padding_on(min_stride=1024):
        scheduled = schedule(lower(program))
    (buf,) = programs.padded_buffers(scheduled)
    assert [int(s) for s in buf.stride] == [50304, 1]
    views = [t for call in scheduled.extern_calls for t in call.tensor_args() if t.buffer == buf.name]
    assert sorted(tuple(int(s) for s in t.stride) for t in views) == [(1, 50304), (50304, 1)]
    assert scheduled.program.hint(buf.nbytes) == (3 * 50304 + 50257) * 2
    inputs = programs.fresh_inputs(b, 1)
    inputs = [t.to(torch.bfloat16) for t in inputs]
    for g, want in zip(run(scheduled, *inputs), b.eager(*inputs)):
        torch.testing.assert_close(g, want, atol=0.5, rtol=2e-2)


def test_padding_is_off_by_default_on_the_cpu():
    b, program = programs.build(programs.CASES[0], 50257)
    assert not programs.padded_buffers(schedule(lower(program)))


@pytest.mark.parametrize("size,itemsize,min_stride,want", [
    ([3, 50257], 2, 1024, [50304, 1]),
    ([3, 50257], 4, 1024, [50272, 1]),
    ([3, 1000], 4, 1024, None),  # below the threshold
    ([3, 1024], 2, 1024, None),  # aligned already
    ([1, 50257], 2, 1024, None),  # one row: nothing to pad
    ([2, 3, 1025], 4, 1024, [3 * 1056, 1056, 1]),
    ([2, 3, 7], 4, 1, [3 * 32, 32, 1]),
    ([2, 37, 37], 4, 1024, [1376, 37, 1]),  # only the stride past the threshold
])
def test_padded_strides_rule(size, itemsize, min_stride, want):
    got = layout.padded_strides(size, [*(layout.exprs.contiguous_strides(size))], itemsize, min_stride)
    assert (None if got is None else [int(s) for s in got]) == want


# Attention scores of windows (Swin: [windows, heads, 49, 49]): with the threshold between the
# row length and the plane size, only the planes are padded (49 * 49 = 2401 -> 2432 float32
# elements), so the plane stride is no multiple of the row stride (49). A consumer that cannot
# share the producer's kernel (a flip, a transpose, a broadcast mask added through a view)
# recomputes the producer at positions recovered from the flat index it loads.
def _scores(b, x):
    return b.call("mul.Tensor", b.call("sub.Tensor", x, 0.25), 0.125)


def _flipped(b, x, mask):
    return (b.call("flip.default", _scores(b, x), [3]),)


def _transposed(b, x, mask):
    return (b.call("clone.default", b.call("transpose.int", _scores(b, x), 2, 3)),)


def _masked_softmax(b, x, mask):  # the shifted windows' mask, added through a view of the windows
    s = b.call("view.default", _scores(b, x), [2, 2, 3, 7, 7])
    s = b.call("add.Tensor", s, b.call("unsqueeze.default", mask, 1))
    return (b.call("_softmax.default", b.call("view.default", s, [4, 3, 7, 7]), -1, False),)


@pytest.mark.parametrize("consumer", [_flipped, _transposed, _masked_softmax], ids=lambda f: f.__name__[1:])
def test_consumers_of_planes_padded_past_unpadded_rows_match_eager(consumer):
    gen = torch.Generator().manual_seed(0)
    b = programs.AtenBuilder()
    x, mask = b.input(torch.randn(4, 3, 7, 7, generator=gen)), b.input(torch.randn(2, 7, 7, generator=gen))
    program = b.output(*consumer(b, x, mask))
    with programs.padding_on(min_stride=40):
        scheduled = schedule(lower(program))
    strides = [[int(s) for s in buf.stride] for buf in programs.padded_buffers(scheduled)]
    assert [192, 64, 7, 1] in strides or not strides, strides
    for seed in (1, 2):
        inputs = programs.fresh_inputs(b, seed)
        for got, want in zip(run(scheduled, *inputs), b.eager(*inputs)):
            torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
