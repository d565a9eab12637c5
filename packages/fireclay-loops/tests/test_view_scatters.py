"""Writes through views, functionalized into scatters, are computed by kernels: the backward of a
strided slice (Swin's patch merging reads ``x[:, 0::2, 1::2]``) and a write through a dense
``as_strided`` view of a flat buffer (Swin's pooler gradient). Each ran as a library call that
cloned its base (60-140 us per call in a Swin training step). The values are checked against
eager in the op table; here, that no library call is left."""

import pytest

torch = pytest.importorskip("torch")

from aten_builder import AtenBuilder  # noqa: E402

from fireclay_loops import ExternNode, lower, schedule  # noqa: E402
from fireclay_loops.reference import run  # noqa: E402

END = 9223372036854775807


def _merge_backward(b, g):
    """The gradient of ``cat([x[:, r::2, c::2] for c in (0, 1) for r in (0, 1)], -1)`` for a
    (2, 8, 8, 4) ``x``, as the joint graph writes it: stepped slice_scatters into zeros, summed."""
    total = None
    for k, (r, c) in enumerate([(0, 0), (1, 0), (0, 1), (1, 1)]):
        part = b.call("slice.Tensor", g, 3, 2 * k, 2 * k + 2)
        cols = b.call("slice_scatter.default", b.call("new_zeros.default", g, [2, 4, 8, 2]), part, 2, c, END, 2)
        rows = b.call("slice_scatter.default", b.call("new_zeros.default", g, [2, 8, 8, 2]), cols, 1, r, END, 2)
        total = rows if total is None else b.call("add.Tensor", total, rows)
    return total


def _pooled_backward(b, g):
    zeros = b.call("new_zeros.default", g, [24])
    view = b.call("as_strided.default", zeros, [2, 12], [12, 1], 0)
    written = b.call("copy.default", view, g)
    return b.call("as_strided_scatter.default", zeros, written, [2, 12], [12, 1], 0)


CASES = [
    ("strided_slice_backward", _merge_backward, (2, 4, 4, 8)),
    ("dense_as_strided_write", _pooled_backward, (2, 12)),
]


@pytest.mark.parametrize("name,build,shape", CASES, ids=[c[0] for c in CASES])
def test_view_scatters_are_kernels(name, build, shape):
    b = AtenBuilder()
    g = torch.randn(*shape)
    out = build(b, b.input(g, "g"))
    scheduled = schedule(lower(b.output(out)))
    externs = [s.op for s in scheduled.steps if isinstance(s, ExternNode)]
    assert externs == [], externs
    torch.testing.assert_close(run(scheduled, g)[0], b.eager(g)[0])


def test_a_strided_as_strided_write_stays_a_library_call():
    b = AtenBuilder()
    g = torch.randn(3, 2)
    h = b.input(g, "g")
    out = b.call("as_strided_scatter.default", b.call("new_zeros.default", h, [12]), h, [3, 2], [1, 3], 0)
    scheduled = schedule(lower(b.output(out)))
    assert [s.op for s in scheduled.steps if isinstance(s, ExternNode)] == ["aten::as_strided_scatter.default"]
    torch.testing.assert_close(run(scheduled, g)[0], b.eager(g)[0])
