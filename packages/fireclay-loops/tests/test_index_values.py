"""Indices computed from the loop variables alone (``fold_index_values``): ``torch.roll``
decomposes to ``index_select(x, d, fmod(arange(n) + shift, n))``; once the index is recomputed
in its consumer it is proven in range, so the kernel neither checks it nor reads it indirectly
(Swin's shifted windows spent a whole pass over the indices checking them). Indices read from
memory, or not proven in range, stay checked."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from aten_builder import AtenBuilder  # noqa: E402

from fireclay_loops import IndexOutOfBounds, lower, schedule  # noqa: E402
from fireclay_loops.index_values import fold_index_values  # noqa: E402
from fireclay_loops.reference import run  # noqa: E402

CPU = torch.device("cpu")


def _op_names(scheduled) -> set[str]:
    return {op.name for k in scheduled.kernels for kn in k.nodes for op in kn.node.body.ops}


def _rolled(b, x, shift, dim=1):
    n = x.meta.shape[dim]
    idx = b.call("fmod.Scalar", b.call("add.Tensor", b.call("arange.start_step", 0, n, device=CPU), shift), n)
    return b.call("index_select.default", x, dim, idx)


def shifted_window_merge(b, x):
    # a roll of two dimensions, then every other row of it concatenated (Swin's patch merging)
    y = _rolled(b, _rolled(b, x, 30, 1), 29, 2)
    halves = [b.call("slice.Tensor", y, 1, k, 32, 2) for k in (0, 1)]
    return b.call("sum.dim_IntList", b.call("cat.default", halves, 2), [2])


def rolled_back(b, x):
    return b.call("mul.Tensor", _rolled(b, x, -3 + 32, 1), 2.0)


@pytest.mark.parametrize("build", [shifted_window_merge, rolled_back])
def test_rolled_indices_are_direct_and_unchecked(build):
    b = AtenBuilder()
    x = b.input(torch.randn(2, 32, 32), "x")
    scheduled = schedule(lower(b.output(build(b, x))))
    names = _op_names(scheduled)
    assert "check_bounds" not in names and "indirect_indexing" not in names
    gen = torch.Generator().manual_seed(0)
    for _ in range(2):
        fresh = torch.randn(2, 32, 32, generator=gen)
        torch.testing.assert_close(run(scheduled, fresh)[0], b.eager(fresh)[0])


def test_indices_that_may_be_negative_stay_checked():
    # fmod keeps the dividend's sign: arange(8) - 6 gives -6..1, which index_select refuses
    b = AtenBuilder()
    x = b.input(torch.randn(4, 8), "x")
    idx = b.call("fmod.Scalar", b.call("sub.Tensor", b.call("arange.start_step", 0, 8, device=CPU), 6), 8)
    scheduled = schedule(lower(b.output(b.call("index_select.default", x, 1, idx))))
    assert "check_bounds" in _op_names(scheduled)
    with pytest.raises(RuntimeError, match="out of"):
        b.eager(torch.randn(4, 8))
    with pytest.raises(IndexOutOfBounds):
        run(scheduled, torch.randn(4, 8))


def test_indices_past_the_dimension_stay_checked():
    # remainder by 8 of a dimension of 6: in [0, 8), not proven in [0, 6)
    b = AtenBuilder()
    x = b.input(torch.randn(4, 6), "x")
    idx = b.call("remainder.Scalar", b.call("add.Tensor", b.call("arange.start_step", 0, 6, device=CPU), 3), 8)
    scheduled = schedule(lower(b.output(b.call("index_select.default", x, 1, idx))))
    assert "check_bounds" in _op_names(scheduled)
    with pytest.raises(IndexOutOfBounds):
        run(scheduled, torch.randn(4, 6))


def test_indices_read_from_memory_stay_checked_and_indirect():
    b = AtenBuilder()
    x, i = b.input(torch.randn(4, 8), "x"), b.input(torch.zeros(3, dtype=torch.int64), "i")
    program = lower(b.output(b.call("index_select.default", x, 1, i)))
    assert fold_index_values(program).nodes == program.nodes  # nothing to fold: the same nodes
    names = _op_names(schedule(program))
    assert {"check_bounds", "indirect_indexing"} <= names
