"""Random programs (pointwise ops, broadcasts, keepdim reductions, softmax, transposes, flips,
views) checked against eager, fused and unfused: a property test of lowering, inlining, fusion
legality and memory planning together."""

import pytest

torch = pytest.importorskip("torch")
hypothesis = pytest.importorskip("hypothesis")

from aten_builder import AtenBuilder  # noqa: E402
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from fireclay_loops import lower, schedule  # noqa: E402
from fireclay_loops.reference import run  # noqa: E402

UNARY = ["tanh.default", "sin.default", "neg.default", "abs.default", "sigmoid.default", "relu.default"]
BINARY = ["add.Tensor", "mul.Tensor", "sub.Tensor", "maximum.default"]
REDUCE = ["sum.dim_IntList", "amax.default", "mean.dim"]


def broadcasts_to(small, big):
    return len(small) == len(big) and all(s in (1, b) for s, b in zip(small, big))


def build(data, b, tensors):
    """Draw a program; ``tensors`` receives the values of its inputs (index tensors included)."""
    gen = torch.Generator().manual_seed(0)
    tensors += [torch.randn(4, 6, generator=gen), torch.randn(4, 6, generator=gen), torch.randn(1, 6, generator=gen)]
    values = [b.input(t) for t in tensors]

    def index_input(high, shape):
        t = torch.randint(0, high, shape, generator=gen)
        tensors.append(t)
        return b.input(t, "idx")

    for _ in range(data.draw(st.integers(3, 9), label="length")):
        kind = data.draw(st.sampled_from(["unary", "binary", "reduce", "softmax", "view", "move"]), label="kind")
        x = data.draw(st.sampled_from(values), label="operand")
        shape = tuple(x.meta.shape)
        if kind == "unary":
            values.append(b.call(data.draw(st.sampled_from(UNARY)), x))
        elif kind == "binary":
            partners = [v for v in values if broadcasts_to(tuple(v.meta.shape), shape)]
            y = data.draw(st.sampled_from(partners), label="partner")
            values.append(b.call(data.draw(st.sampled_from(BINARY)), x, y))
        elif kind == "reduce":
            dim = data.draw(st.integers(0, 1), label="dim")
            values.append(b.call(data.draw(st.sampled_from(REDUCE)), x, [dim], True))
        elif kind == "softmax" and 1 not in shape:
            values.append(b.call("_softmax.default", x, data.draw(st.integers(0, 1)), False))
        elif kind == "view":
            choice = data.draw(st.sampled_from(["t", "flip", "reshape"]), label="view")
            if choice == "t":
                values.append(b.call("t.default", x))
            elif choice == "flip":
                values.append(b.call("flip.default", x, [data.draw(st.integers(0, 1))]))
            else:
                n = shape[0] * shape[1]
                values.append(b.call("reshape.default", x, [shape[1], shape[0]] if n > 1 else [1, 1]))
        elif kind == "move" and len(shape) == 2:
            choice = data.draw(st.sampled_from(["cat", "pad", "gather", "index_select"]), label="move")
            dim = data.draw(st.integers(0, 1), label="dim")
            if choice == "cat":
                values.append(b.call("cat.default", [x, x], dim))
            elif choice == "pad":
                values.append(b.call("constant_pad_nd.default", x, [1, 0, 0, 2], 0.5))
            elif choice == "gather":
                values.append(b.call("gather.default", x, dim, index_input(shape[dim], shape)))
            else:
                values.append(b.call("index_select.default", x, dim, index_input(shape[dim], (3,))))
    extra = data.draw(st.sampled_from(values[3:] or values), label="second output")
    return values[-1], extra


@settings(max_examples=25, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(st.data())
def test_random_program_matches_eager(data):
    b = AtenBuilder()
    inputs: list = []
    outs = build(data, b, inputs)
    program = b.output(*outs)
    want = b.eager(*inputs)
    for fusion in (True, False):
        got = run(schedule(lower(program), fusion=fusion), *inputs)
        for g, w in zip(got, want):
            torch.testing.assert_close(g, w, atol=1e-5, rtol=1e-5)
