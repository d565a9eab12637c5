"""A library call's result the program returns in another shape (a language model's logits:
``mm`` over [tokens, vocab] viewed as [batch, seq, vocab]) is returned as the library made it,
not copied by a kernel; returns that are not such a reshape still get their own buffer.
Every program also runs against eager, and returned tensors are checked for aliasing."""

import pytest

torch = pytest.importorskip("torch")

from aten_builder import AtenBuilder  # noqa: E402

from fireclay_loops import lower, schedule  # noqa: E402
from fireclay_loops.reference import run  # noqa: E402


def _logits(b, g):
    x, w = b.input(g((2, 5, 8))), b.input(g((12, 8)))
    y = b.call("mm.default", b.call("view.default", x, [10, 8]), b.call("t.default", w))
    return (b.call("view.default", y, [2, 5, 12]),)


def _logits_with_bias(b, g):
    x, w, bias = b.input(g((2, 5, 8))), b.input(g((12, 8))), b.input(g((12,)))
    y = b.call("addmm.default", bias, b.call("view.default", x, [10, 8]), b.call("t.default", w))
    return (b.call("view.default", y, [2, 5, 12]),)


def _batched_flattened(b, g):
    x, y = b.input(g((3, 4, 5))), b.input(g((3, 5, 6)))
    return (b.call("view.default", b.call("bmm.default", x, y), [12, 6]),)


def _returned_twice(b, g):
    """The same result in two shapes: one may take the result, the other needs its own buffer."""
    x, w = b.input(g((6, 4))), b.input(g((4, 8)))
    y = b.call("mm.default", x, w)
    return b.call("view.default", y, [3, 2, 8]), b.call("view.default", y, [48])


def _read_later_too(b, g):
    """The reshaped result is also read by a kernel: that kernel indexes storage, unaffected."""
    x, w = b.input(g((6, 4))), b.input(g((4, 8)))
    y = b.call("mm.default", x, w)
    return b.call("view.default", y, [3, 2, 8]), b.call("relu.default", y)


def _transposed(b, g):
    """A transposed result is not a reshape of its storage: it is copied."""
    x, w = b.input(g((6, 4))), b.input(g((4, 8)))
    return (b.call("t.default", b.call("mm.default", x, w)),)


def _part(b, g):
    """A slice of the result is not the whole result: it is copied."""
    x, w = b.input(g((6, 4))), b.input(g((4, 8)))
    return (b.call("slice.Tensor", b.call("mm.default", x, w), 0, 0, 3),)


# (builder, kernels the schedule has)
CASES = [(_logits, 0), (_logits_with_bias, 0), (_batched_flattened, 0), (_returned_twice, 1),
         (_read_later_too, 1), (_transposed, 1), (_part, 1)]


@pytest.mark.parametrize("build,kernels", CASES, ids=[c[0].__name__ for c in CASES])
def test_reshaped_library_results_are_returned_without_a_copy(build, kernels):
    gen = torch.Generator().manual_seed(3)
    b = AtenBuilder()
    program = b.output(*build(b, lambda shape: torch.randn(shape, generator=gen)))
    scheduled = schedule(lower(program))
    assert len(scheduled.kernels) == kernels, str(scheduled)
    fresh = [torch.randn(h.meta.shape, generator=gen) for h in b.inputs]
    got = run(scheduled, *fresh)
    for g, want in zip(got, b.eager(*fresh)):
        assert g.shape == want.shape
        if kernels == 0:  # returned as the library made it, in eager's layout
            assert g.stride() == want.stride()
        torch.testing.assert_close(g, want, atol=1e-5, rtol=1e-5)
    pointers = [g.untyped_storage().data_ptr() for g in got]
    assert len(set(pointers)) == len(pointers), "returned tensors share storage"
