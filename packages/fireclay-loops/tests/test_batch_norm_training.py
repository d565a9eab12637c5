"""Training-mode batch norm with running statistics as loop code (lowering/reductions.py):
``_native_batch_norm_legit_functional``'s five results (output, batch mean, rstd, updated
running mean and variance) against eager on fresh random inputs, over a table of shapes and
layouts, through the reference executor."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from aten_builder import AtenBuilder  # noqa: E402

from fireclay_loops import ExternNode, lower, schedule  # noqa: E402
from fireclay_loops.reference import run  # noqa: E402

OP = "_native_batch_norm_legit_functional.default"

# (id, input shape, channels-last, affine)
SHAPES = [
    ("nchw", (4, 3, 5, 6), False, True),
    ("nhwc", (4, 3, 5, 6), True, True),
    ("no_affine", (2, 5, 3, 3), True, False),
    ("rows", (16, 7), False, True),
    ("sequence", (3, 4, 10), False, True),
    ("one_pixel", (6, 4, 1, 1), False, True),
]


def _tensors(shape, channels_last, gen, dtype):
    c = shape[1]
    x = torch.randn(shape, generator=gen, dtype=torch.float64).to(dtype) * 3 + 1
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    gamma, beta = torch.rand(c, generator=gen, dtype=dtype) + 0.5, torch.randn(c, generator=gen, dtype=dtype)
    mean, var = torch.randn(c, generator=gen, dtype=dtype), torch.rand(c, generator=gen, dtype=dtype) + 0.5
    return x, gamma, beta, mean, var


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("cid,shape,channels_last,affine", SHAPES, ids=[s[0] for s in SHAPES])
def test_batch_norm_training_matches_eager(cid, shape, channels_last, affine, dtype):
    gen = torch.Generator().manual_seed(sum(map(ord, cid)))
    x, gamma, beta, mean, var = _tensors(shape, channels_last, gen, dtype)
    b = AtenBuilder()
    hx, hm, hv = b.input(x, "x"), b.input(mean, "running_mean"), b.input(var, "running_var")
    hg, hb = (b.input(gamma, "gamma"), b.input(beta, "beta")) if affine else (None, None)
    outs = b.call(OP, hx, hg, hb, hm, hv, True, 0.1, 1e-5)
    scheduled = schedule(lower(b.output(*outs)))
    assert not any(isinstance(n, ExternNode) for n in scheduled.program.nodes), "batch norm fell back"
    tol = {"atol": 1e-4, "rtol": 1e-4} if dtype == torch.float32 else {"atol": 1e-10, "rtol": 1e-10}
    for _ in range(2):  # fresh inputs on the second run
        args = (x, mean, var) + ((gamma, beta) if affine else ())
        got, want = run(scheduled, *args), b.eager(*args)
        assert len(got) == len(want) == 5
        for k, (g, w) in enumerate(zip(got, want)):
            torch.testing.assert_close(g, w, **tol, msg=lambda m, k=k: f"{cid}, result {k}: {m}")
        x, gamma, beta, mean, var = _tensors(shape, channels_last, gen, dtype)

