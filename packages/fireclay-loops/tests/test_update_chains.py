"""Chains of updates of one tensor lower in work linear in their length, and match eager.

Functionalization writes an in-place update through a view, ``attn[..., i, :i] = row``, as a
copy into the view scattered back into the base (``select_scatter(a, slice_scatter(select(a),
copy(...)))``). Scatters are lazily computed values, so each link of a chain of such updates read
the previous link twice (once where the row is written, once elsewhere): the i-th link's load
recorded 2**i loads, and a loop over the 63 rows of a 64-row chunk (chunk_kda's delta rule in
bailing_hybrid) never finished lowering. The work is counted as recorded loop-body ops, not
wall time."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from aten_builder import AtenBuilder  # noqa: E402

from fireclay_loops import config, lower, schedule  # noqa: E402
from fireclay_loops.ir import ComputeNode  # noqa: E402
from fireclay_loops.reference import run  # noqa: E402


def row_updates(b, a, n):
    """``for i in 1..n-1: a[..., i, :i] = row + (row[:, None] * a[..., :i, :i]).sum(-2)`` with
    ``row = a[..., i, :i]``, as functionalization writes it (chunk_kda's triangular solve)."""
    for i in range(1, n):
        row = b.call("clone.default", b.call("slice.Tensor", b.call("select.int", a, 2, i), 2, 0, i))
        sub = b.call("clone.default", b.call("slice.Tensor", b.call("slice.Tensor", a, 2, 0, i), 3, 0, i))
        prod = b.call("mul.Tensor", b.call("unsqueeze.default", row, -1), sub)
        new = b.call("add.Tensor", row, b.call("sum.dim_IntList", prod, [-2]))
        target = b.call("slice.Tensor", b.call("select.int", a, 2, i), 2, 0, i)
        copied = b.call("copy.default", target, new)
        written = b.call("slice_scatter.default", b.call("select.int", a, 2, i), copied, 2, 0, i)
        a = b.call("select_scatter.default", a, written, 2, i)
    return b.call("mul.Tensor", a, 2.0)


def column_shifts(b, a, n):
    """``a[:, k + 1] = a[:, k] * 0.5 + a[:, k + 1]`` for each column: slice scatters alone."""
    for k in range(n - 1):
        left = b.call("slice.Tensor", a, 1, k, k + 1)
        right = b.call("slice.Tensor", a, 1, k + 1, k + 2)
        new = b.call("add.Tensor", b.call("mul.Tensor", left, 0.5), right)
        a = b.call("slice_scatter.default", a, new, 1, k + 1, k + 2)
    return b.call("neg.default", a)


def indexed_updates(b, a, n):
    """``a[idx_k] = a[idx_k] + 1`` for n index tensors: index_put, a library call per update."""
    for k in range(n):
        idx = b.call("remainder.Scalar", b.call("arange.default", 3, dtype=torch.int64, device="cpu"), n)
        idx = b.call("add.Tensor", idx, k % 2)
        rows = b.call("index.Tensor", a, [idx])
        a = b.call("index_put.default", a, [idx], b.call("add.Tensor", rows, 1.0))
    return b.call("mul.Tensor", a, 3.0)


CASES = [
    pytest.param(row_updates, lambda n: (2, 3, n, n), id="row_updates"),
    pytest.param(column_shifts, lambda n: (3, n), id="column_shifts"),
    pytest.param(indexed_updates, lambda n: (6, 4), id="index_put"),
]


def _lowered(build, shape, n):
    b = AtenBuilder()
    a = b.input(torch.randn(shape), "a")
    program = b.output(build(b, a, n))
    return b, lower(program)


def _body_ops(loops) -> tuple[int, int]:
    sizes = [len(node.body.ops) for node in loops.nodes if isinstance(node, ComputeNode)]
    return sum(sizes), max(sizes, default=0)


def _work(build, shape, n, limit):
    with config.patch(max_lazy_loads=limit):
        return _body_ops(_lowered(build, shape(n), n)[1])


@pytest.mark.parametrize("limit", [4, None], ids=["limit4", "default"])
@pytest.mark.parametrize("build,shape", CASES)
def test_update_chain_lowers_in_linear_work(build, shape, limit):
    """Twice the updates, about twice the work. A chain whose links add a load each (the column
    shifts) is quadratic up to the limit and linear past it: the small limit shows that part in
    a short chain; the row updates, whose loads double per link (2**6 times more work before),
    are linear at the default."""
    if limit is None and build is column_shifts:
        pytest.skip("32 links only reach the default limit")
    limit = limit or config.max_lazy_loads
    short, _ = _work(build, shape, 6, limit)
    long, largest = _work(build, shape, 12, limit)
    assert long <= 2.5 * short, (short, long)
    # no body grows with the chain: a lazy value is stored once its loads pass the limit
    assert largest <= 20 * limit + 40, largest


@pytest.mark.parametrize("build,shape", CASES)
def test_update_chain_matches_eager(build, shape):
    gen = torch.Generator().manual_seed(7)
    n = 10
    b, loops = _lowered(build, shape(n), n)
    scheduled = schedule(loops)
    for _ in range(2):
        a = torch.randn(shape(n), generator=gen) * 0.3
        torch.testing.assert_close(run(scheduled, a.clone())[0], b.eager(a.clone())[0], rtol=1e-5, atol=1e-5)


def test_short_chains_stay_lazy():
    """A cat's backward, a few scatters of gradient slices into zeros, is still recomputed in its
    reader (no stored intermediate): the limit only stops chains that grow."""
    b = AtenBuilder()
    x = b.input(torch.randn(4, 6), "x")
    zeros = b.call("zeros.default", [4, 12], dtype=torch.float32, device="cpu")
    left = b.call("slice_scatter.default", zeros, x, 1, 0, 6)
    both = b.call("slice_scatter.default", left, b.call("neg.default", x), 1, 6, 12)
    program = b.output(b.call("exp.default", both))
    loops = lower(program)
    # neg and exp only: the two scatters are computed inside exp's loop, not stored
    assert sum(isinstance(n, ComputeNode) for n in loops.nodes) == 2
    fresh = torch.randn(4, 6)
    torch.testing.assert_close(run(schedule(loops), fresh)[0], b.eager(fresh)[0])
