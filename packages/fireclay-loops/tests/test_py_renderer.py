"""A third renderer on fireclay-loops' kernel-emission kit (py_renderer.py, the one
docs/writing-a-backend.md builds): programs rendered as plain Python loops, run, and compared
with eager on fresh random inputs."""

import pytest

torch = pytest.importorskip("torch")

from aten_builder import AtenBuilder  # noqa: E402
from py_renderer import compile_python  # noqa: E402


def _pointwise(b, x, y):
    return (b.call("relu.default", b.call("add.Tensor", x, y)),)


def _gelu(b, x, y):
    return (b.call("gelu.default", b.call("mul.Tensor", x, y)),)


def _softmax(b, x, y):
    return (b.call("_softmax.default", x, 1, False),)


def _layer_norm(b, x, y):
    out, mean, rstd = b.call("native_layer_norm.default", x, [7], y, None, 1e-5)
    return out, mean, rstd


def _column_sum(b, x, y):
    return (b.call("sum.dim_IntList", x, [0]), b.call("amax.default", x, [1]))


def _prod_any_all_min(b, x, y):
    positive = b.call("gt.Scalar", x, 0.0)
    return (b.call("prod.dim_int", x, 1), b.call("any.dim", positive, 0), b.call("all.dim", positive, 1),
            b.call("amin.default", x, [0]))


PROGRAMS = {"pointwise_broadcast": _pointwise, "gelu": _gelu, "softmax": _softmax, "layer_norm": _layer_norm,
            "sums_and_max": _column_sum, "prod_any_all_min": _prod_any_all_min}


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_python_renderer_matches_eager(name):
    gen = torch.Generator().manual_seed(sum(map(ord, name)))
    xt, yt = torch.randn(5, 7, generator=gen), torch.randn(7, generator=gen)
    b = AtenBuilder()
    x, y = b.input(xt, "x"), b.input(yt, "y")
    program = b.output(*PROGRAMS[name](b, x, y))
    source, run = compile_python(program)
    assert "def " in source and "for x0 in range(" in source
    got, want = run(xt, yt), b.eager(xt, yt)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, atol=1e-5, rtol=1e-5)


def test_python_renderer_says_what_it_cannot_render():
    b = AtenBuilder()
    x = b.input(torch.randn(3, 4), "x")
    with pytest.raises(NotImplementedError, match="no ops.atan2|extern|no "):
        compile_python(b.output(b.call("atan2.default", x, x)))
