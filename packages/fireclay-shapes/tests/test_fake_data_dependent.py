"""Data-dependent sizes: ops whose output shape depends on values make unbacked symbols, and
what user code tells torch about them (torch._check) becomes runtime assertions."""

import pytest

torch = pytest.importorskip("torch")

from fireclay_shapes import DataDependentError, ShapeEnv  # noqa: E402
from fireclay_shapes.torch import FakeMode, FakeTensor, expr_of  # noqa: E402

PROGRAMS = [
    ("nonzero", lambda x: x.nonzero(), lambda n, u: [u, 2]),
    ("mask_all", lambda x: x[x > 0], lambda n, u: [u]),
    ("mask_rows", lambda x: x[x[:, 0] > 0], lambda n, u: [u, 4]),
    ("mask_rows_slice", lambda x: x[x[:, 0] > 0, 1:], lambda n, u: [u, 3]),
    ("nonzero_then_index", lambda x: x[x[:, 1].nonzero()[:, 0]], lambda n, u: [u, 4]),
    ("nonzero_reduce", lambda x: x.nonzero().sum(0), lambda n, u: [2]),
]


@pytest.mark.parametrize("name,program,shape", PROGRAMS, ids=[p[0] for p in PROGRAMS])
def test_data_dependent_outputs_have_unbacked_sizes(name, program, shape):
    env = ShapeEnv()
    mode = FakeMode(env)
    real = torch.randn(6, 4)
    x = mode.from_real(real, dynamic_dims=[0])
    with mode:
        out = program(x)
    assert isinstance(out, FakeTensor)
    unbacked = [s for s in env.symbols.values() if s.unbacked]
    got = [str(expr_of(d)) for d in out.shape]
    want = [str(d) for d in shape("s0", unbacked[-1].symbol.name if unbacked else None)]
    assert got == want
    eager = program(real)
    assert out.dim() == eager.dim() and out.dtype == eager.dtype
    for d, e in zip(out.shape, eager.shape):
        if isinstance(d, int):
            assert d == e
    assert len(env.guards) == 0  # nothing was decided on the data


def test_torch_check_on_item_becomes_runtime_asserts():
    env = ShapeEnv()
    mode = FakeMode(env)
    x = mode.from_real(torch.randn(6, 4))
    with mode:
        n = x.sum().int().item()
        torch._check(n >= 0)
        torch._check(n < 100)
        y = torch.zeros(n, 3)
    assert str(y.shape[0]) == "u0"
    assert env.runtime_asserts.dumps() == ["u0 >= 0", "u0 < 100"]
    assert bool(y.shape[0] < 200)  # decided by the assumed range, no guard needed
    with pytest.raises(DataDependentError):
        bool(y.shape[0] < 50)
    assert len(env.guards) == 0


def test_repeat_interleave_without_output_size():
    mode = FakeMode()
    with mode:
        out = torch.repeat_interleave(torch.tensor([1, 2, 3]))
    assert out.dtype == torch.int64 and str(out.shape[0]).startswith("u")
