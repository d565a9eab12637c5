"""split_program: a chain of pieces computes what the whole program computes."""

from __future__ import annotations

import pytest
from irbuild import t

from fireclay_ir import Graph, InputSpec, IRError, Program, Weight
from fireclay_ir.interpreter import Interpreter
from fireclay_ir.passes import split_program

torch = pytest.importorskip("torch")


def _mlp():
    """x -> linear(w1) -> relu -> linear(w2) -> + x-derived skip; outputs a value and a tuple."""
    g = Graph("main")
    x = g.add_input("x", t(3, 4))
    w1 = g.add_input("w1", t(5, 4), InputSpec("parameter", "l1.weight"))
    w2 = g.add_input("w2", t(4, 5), InputSpec("parameter", "l2.weight"))
    h = g.call("aten::mm.default", [x, g.call("aten::t.default", [w1], out=t(4, 5))], out=t(3, 5))
    r = g.call("aten::relu.default", [h], out=t(3, 5))
    o = g.call("aten::mm.default", [r, g.call("aten::t.default", [w2], out=t(5, 4))], out=t(3, 4))
    s = g.call("aten::add.Tensor", [o, x], out=t(3, 4))
    m = g.call("aten::mul.Tensor", [s, 2.0], out=t(3, 4))
    g.set_outputs([m, (h, 7)])
    weights = {"l1.weight": Weight(t(5, 4), torch.randn(5, 4)), "l2.weight": Weight(t(4, 5), torch.randn(4, 5))}
    return Program.single(g, weights=weights)


def _two_inputs():
    g = Graph("main")
    a = g.add_input("a", t(6))
    b = g.add_input("b", t(6))
    c = g.call("aten::sin.default", [a], out=t(6))
    d = g.call("aten::cos.default", [b], out=t(6))
    e = g.call("aten::mul.Tensor", [c, d], out=t(6))
    f = g.call("aten::add.Tensor", [e, a], out=t(6))
    g.set_outputs([f, c])
    return Program.single(g)


CASES = [
    (_mlp, [1], 1), (_mlp, [2, 4], 1), (_mlp, [1, 2, 3, 4, 5, 6], 1), (_mlp, [6], 1),
    (_two_inputs, [1], 2), (_two_inputs, [1, 2, 3], 2), (_two_inputs, [2], 2),
]


@pytest.mark.parametrize("make,cuts,n_inputs", CASES, ids=[f"{c[0].__name__}-{c[1]}" for c in CASES])
def test_split_chain_matches_whole_program(make, cuts, n_inputs):
    program = make()
    args = [torch.randn(*program.main.inputs[i].type.shape) for i in range(n_inputs)]
    expected = Interpreter(program).run(*args)
    split = split_program(program, cuts)
    assert len(split.pieces) == len(cuts) + 1
    assert sum(len(p.program.main.nodes) for p in split.pieces) == len(program.main.nodes)
    got = split.run([Interpreter(p.program).run for p in split.pieces], args)
    flat = lambda xs: [y for x in xs for y in (x if isinstance(x, tuple) else (x,))]  # noqa: E731
    for e, g in zip(flat(expected), flat(got), strict=True):
        if isinstance(e, torch.Tensor):
            torch.testing.assert_close(g, e)
        else:
            assert g == e


def test_pieces_carry_only_the_weights_and_values_they_read():
    split = split_program(_mlp(), [3])
    first, second = split.pieces
    assert set(first.program.weights) == {"l1.weight"}
    assert set(second.program.weights) == {"l2.weight"}
    # The second piece reads relu's result and the original input; the first gives the first
    # matmul's result too, because the whole program returns it.
    assert second.inputs == ["v2", "x"]
    assert first.outputs == ["v1", "v2"]
    assert [s.kind for s in second.program.main.input_specs] == ["user", "user", "parameter"]
    assert first.inputs == ["x"] and split.user_inputs == ["x"]


@pytest.mark.parametrize("cuts", [[0], [7], [3, 3], [4, 2], [-1]])
def test_bad_boundaries_are_refused(cuts):
    with pytest.raises(IRError, match="split boundaries"):
        split_program(_mlp(), cuts)
