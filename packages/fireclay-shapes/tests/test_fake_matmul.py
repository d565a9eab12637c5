"""matmul on fakes at every rank combination: fakes do it themselves (mm/bmm/reshape/expand,
never numel), so torch versions whose C++ matmul asks a symbolic tensor for its numel go the
same way as those that do not. Shapes and strides against eager at the trace's sizes and at
others; the decomposition's values against eager on real tensors."""

import operator

import pytest

torch = pytest.importorskip("torch")

from fireclay_shapes import ShapeEnv  # noqa: E402
from fireclay_shapes.torch import (  # noqa: E402
    FakeMode,
    _fake,  # noqa: E402
    expr_of,
)

# (shape of a, shape of b); letters are symbolic sizes, ints static.
RANKS = [
    (("k",), ("k",)),
    (("n", "k"), ("k",)),
    (("k",), ("k", "p")),
    (("n", "k"), ("k", "p")),
    (("b", "n", "k"), ("k", "p")),
    (("b", "n", "k"), ("k",)),
    (("k",), ("b", "k", "p")),
    (("n", "k"), ("b", "k", "p")),
    (("b", "n", "k"), ("b", "k", "p")),
    ((2, "b", "n", "k"), ("b", "k", "p")),
    (("b", 1, "n", "k"), (3, "k", "p")),
    (("b", "n", "k"), (1, "k", "p")),
    ((5, "n", "k"), ("k", 4)),
]
HINTS = {"k": 6, "n": 7, "p": 8, "b": 3}
OTHER = {"k": 9, "n": 11, "p": 5, "b": 4}
ENTRY_POINTS = {
    "torch.matmul": torch.matmul,
    "Tensor.matmul": lambda a, b: a.matmul(b),
    "operator.matmul": operator.matmul,
    "Tensor.__rmatmul__": lambda a, b: b.__rmatmul__(a),
}


def sizes(shape, values):
    return [values[d] if isinstance(d, str) else d for d in shape]


def fake_of(mode, shape):
    real = torch.randn(sizes(shape, HINTS))
    dims = [i for i, d in enumerate(shape) if isinstance(d, str)]
    return mode.from_real(real, dynamic_dims=dims)


@pytest.mark.parametrize("entry", list(ENTRY_POINTS), ids=list(ENTRY_POINTS))
@pytest.mark.parametrize("shapes", RANKS, ids=[f"{len(a)}x{len(b)}_{i}" for i, (a, b) in enumerate(RANKS)])
def test_symbolic_matmul_matches_eager(shapes, entry, monkeypatch):
    calls = []
    real_matmul = _fake.matmul
    monkeypatch.setattr(_fake, "matmul", lambda a, b: calls.append(1) or real_matmul(a, b))
    env = ShapeEnv()  # duck sizing: each letter is one symbol (the hints differ)
    mode = FakeMode(env)
    fa, fb = fake_of(mode, shapes[0]), fake_of(mode, shapes[1])
    # symbol of each letter, read off the fakes
    letters = {}
    for shape, f in zip(shapes, (fa, fb)):
        for d, size in zip(shape, f.shape):
            if isinstance(d, str):
                letters.setdefault(d, expr_of(size))
    with mode:
        out = ENTRY_POINTS[entry](fa, fb)
    assert calls, "the fake did not take its own matmul"
    for values in (HINTS, OTHER):
        subst = {letters[name]: v for name, v in values.items() if name in letters}
        if values is OTHER and not env.check({s.name: v for s, v in subst.items()}):
            continue  # the trace's guards exclude these sizes
        want = torch.matmul(torch.randn(sizes(shapes[0], values)), torch.randn(sizes(shapes[1], values)))
        shape = [int(expr_of(s).xreplace(subst)) for s in out.shape]
        assert shape == list(want.shape), (values, shape, list(want.shape))
        stride = [int(expr_of(s).xreplace(subst)) for s in out.stride()]
        assert stride == list(want.stride())


@pytest.mark.parametrize("shapes", RANKS, ids=[f"case{i}" for i in range(len(RANKS))])
def test_matmul_decomposition_values(shapes):
    torch.manual_seed(0)
    for values in (HINTS, OTHER):
        a = torch.randn(sizes(shapes[0], values), dtype=torch.float64, requires_grad=True)
        b = torch.randn(sizes(shapes[1], values), dtype=torch.float64, requires_grad=True)
        got, want = _fake.matmul(a, b), torch.matmul(a, b)
        torch.testing.assert_close(got, want)
        g = torch.randn_like(want)
        torch.testing.assert_close(torch.autograd.grad(got, (a, b), g), torch.autograd.grad(want, (a, b), g))


def test_matmul_of_scalars_is_refused_like_eager():
    mode = FakeMode(ShapeEnv())
    f = mode.from_real(torch.randn(()))
    with pytest.raises(RuntimeError, match="at least 1D"):
        torch.matmul(f, f)
