"""Max pooling's backward as loop code (lowering/pooling.py): a table of pooling shapes, each
program computing the indices with the forward and the gradient with the backward, run by the
reference executor against eager on fresh random inputs. Ties and NaNs decide which point of a
window gets the gradient, so inputs with repeated values and a NaN are in the table too."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from aten_builder import AtenBuilder  # noqa: E402

from fireclay_loops import ExternNode, lower, schedule  # noqa: E402
from fireclay_loops.reference import run  # noqa: E402

# (id, input shape, kernel, stride, padding, dilation, ceil_mode)
POOLS = [
    ("2x2_tiles", (2, 3, 8, 8), [2, 2], [2, 2], [0, 0], [1, 1], False),
    ("2x2_odd_edge", (2, 3, 7, 9), [2, 2], [2, 2], [0, 0], [1, 1], False),
    ("2x2_ceil", (1, 2, 7, 5), [2, 2], [2, 2], [0, 0], [1, 1], True),
    ("3x3_stride2_pad1", (2, 4, 9, 10), [3, 3], [2, 2], [1, 1], [1, 1], False),
    ("3x3_stride1_overlap", (1, 3, 6, 6), [3, 3], [1, 1], [1, 1], [1, 1], False),
    ("3x2_dilated", (2, 2, 10, 7), [3, 2], [1, 2], [1, 0], [2, 1], False),
    ("pad_ceil", (1, 2, 7, 9), [3, 3], [2, 2], [1, 1], [1, 1], True),
    ("no_batch", (3, 8, 6), [2, 2], [2, 2], [0, 0], [1, 1], False),
    ("1x1", (2, 3, 4, 4), [1, 1], [1, 1], [0, 0], [1, 1], False),
]


def _inputs(shape, gen, fill):
    if fill == "ties":  # few distinct values: windows with equal maxima
        return torch.randint(0, 3, shape, generator=gen).to(torch.float32)
    x = torch.randn(shape, generator=gen)
    if fill == "nan":
        x.view(-1)[5] = float("nan")
    return x


@pytest.mark.parametrize("fill", ["randn", "ties", "nan"])
@pytest.mark.parametrize("cid,shape,kernel,stride,padding,dilation,ceil", POOLS, ids=[p[0] for p in POOLS])
def test_max_pool_backward_matches_eager(cid, shape, kernel, stride, padding, dilation, ceil, fill):
    gen = torch.Generator().manual_seed(sum(map(ord, cid + fill)))
    x = _inputs(shape, gen, fill)
    pooled, _ = torch.ops.aten.max_pool2d_with_indices.default(x, kernel, stride, padding, dilation, ceil)
    grad = torch.randn(pooled.shape, generator=gen)
    b = AtenBuilder()
    hx, hg = b.input(x, "x"), b.input(grad, "grad")
    _, idx = b.call("max_pool2d_with_indices.default", hx, kernel, stride, padding, dilation, ceil)
    out = b.call("max_pool2d_with_indices_backward.default", hg, hx, kernel, stride, padding, dilation, ceil, idx)
    scheduled = schedule(lower(b.output(out)))
    assert not any(isinstance(n, ExternNode) for n in scheduled.program.nodes), "the backward fell back"
    for _ in range(2):  # fresh inputs on the second run
        (got,), (want,) = run(scheduled, x, grad), b.eager(x, grad)
        torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-6)
        x, grad = _inputs(shape, gen, fill), torch.randn(pooled.shape, generator=gen)


def test_backward_of_channels_last_input_is_channels_last_loop_code():
    """Around a convolution the gradient is laid out channels-last, and computed by loop code."""
    gen = torch.Generator().manual_seed(3)
    x, w = torch.randn(2, 3, 8, 8, generator=gen), torch.randn(4, 3, 3, 3, generator=gen)
    grad = torch.randn(2, 4, 4, 4, generator=gen)
    b = AtenBuilder()
    hx, hw, hg = b.input(x, "x"), b.input(w, "w"), b.input(grad, "grad")
    y = b.call("convolution.default", hx, hw, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1)
    _, idx = b.call("max_pool2d_with_indices.default", y, [2, 2], [2, 2])
    dy = b.call("max_pool2d_with_indices_backward.default", hg, y, [2, 2], [2, 2], [0, 0], [1, 1], False, idx)
    scheduled = schedule(lower(b.output(dy, y)))
    externs = [n for n in scheduled.program.nodes if isinstance(n, ExternNode)]
    assert [n.op for n in externs] == ["aten::convolution.default"]
    (got, _), (want, _) = run(scheduled, x, w, grad), b.eager(x, w, grad)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
