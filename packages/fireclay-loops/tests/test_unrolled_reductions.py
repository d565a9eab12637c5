"""Reductions over a few points (``config.unroll_reductions``, a static count of at least 2) are
lowered as pointwise code that combines each point's value in turn, unless a read walks the
reduced points contiguously (a short row): the key and value gradients
of grouped-query attention (3 heads summed per key head), a mean over a short axis. Every case
runs in the reference executor against eager on fresh inputs (NaN included for max and min), and
the schedule holds no reduction loop exactly where the count is small enough."""

import pytest

torch = pytest.importorskip("torch")

from aten_builder import AtenBuilder  # noqa: E402

from fireclay_loops import lower, schedule  # noqa: E402
from fireclay_loops.config import config as loops_config  # noqa: E402
from fireclay_loops.reference import run  # noqa: E402

# (aten op, extra args, input dtype)
OPS = [
    ("sum.dim_IntList", (False,), torch.float32),
    ("sum.dim_IntList", (True,), torch.bfloat16),
    ("mean.dim", (False,), torch.float32),
    ("amax.default", (True,), torch.float32),
    ("amin.default", (False,), torch.float16),
    ("prod.dim_int", (False,), torch.float32),
    ("any.dim", (False,), torch.bool),
    ("all.dim", (True,), torch.bool),
    ("sum.dim_IntList", (False,), torch.int32),
]
# (input shape, reduced dims, unrolled)
SHAPES = [((4, 3, 16, 8), [1], True), ((2, 8, 5), [1], True), ((6, 2, 2, 7), [1, 2], True), ((4, 9, 8), [1], False),
          ((5, 3), [0], True), ((3, 40), [1], False),
          ((6, 5), [1], False)]  # a short row read contiguously stays a reduction (its consumers fuse with it)


def _fresh(shape, dtype, gen):
    if dtype == torch.bool:
        return torch.rand(shape, generator=gen) > 0.3
    if not dtype.is_floating_point:
        return torch.randint(-4, 5, shape, generator=gen, dtype=dtype)
    x = torch.randn(shape, generator=gen)
    x[torch.rand(shape, generator=gen) < 0.05] = float("nan")
    return x.to(dtype)


def _reduction_loops(scheduled) -> int:
    return sum(1 for k in scheduled.kernels if k.rsizes)


@pytest.mark.parametrize("shape, dims, unrolled", SHAPES, ids=str)
@pytest.mark.parametrize("op, extra, dtype", OPS, ids=lambda v: str(v))
def test_short_reductions_are_pointwise_and_match_eager(op, extra, dtype, shape, dims, unrolled):
    if op.endswith("dim_int") or op in ("any.dim", "all.dim"):
        if len(dims) > 1:
            pytest.skip("the op reduces one dimension")
        dim_arg = dims[0]
    else:
        dim_arg = dims
    if op == "mean.dim" and not dtype.is_floating_point:
        pytest.skip("mean of integers is an error in eager")
    gen = torch.Generator().manual_seed(len(shape) * 7 + sum(dims))
    b = AtenBuilder()
    x = b.input(_fresh(shape, dtype, gen))
    program = b.output(b.call(op, x, dim_arg, *extra))
    scheduled = schedule(lower(program))
    assert (_reduction_loops(scheduled) == 0) == unrolled, str(scheduled)
    for seed in (1, 2):
        inputs = [_fresh(shape, dtype, torch.Generator().manual_seed(seed))]
        (got,), (want,) = run(scheduled, *inputs), b.eager(*inputs)
        assert got.dtype == want.dtype and got.shape == want.shape
        tol = 1e-5 if dtype == torch.float32 else 2e-2
        torch.testing.assert_close(got, want, atol=tol, rtol=tol, equal_nan=True)


def test_the_count_is_a_setting():
    b = AtenBuilder()
    program = b.output(b.call("sum.dim_IntList", b.input(torch.randn(4, 3, 8)), [1]))
    assert _reduction_loops(schedule(lower(program))) == 0
    with loops_config.patch(unroll_reductions=2):
        assert _reduction_loops(schedule(lower(program))) == 1
