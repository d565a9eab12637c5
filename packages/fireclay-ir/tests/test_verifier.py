"""The verifier: SSA rules, known ops, aten schemas, hop arity, and readable errors."""

from __future__ import annotations

import pytest
from irbuild import INT, src, t

from fireclay_ir import DType, Graph, GraphRef, InputSpec, IRError, Program, ScalarType, SymExpr, Weight
from fireclay_ir.verifier import (
    VerificationError,
    check_boundary,
    render_window,
    verify,
    verify_at_boundaries,
)


def mlp() -> Program:
    g = Graph("main")
    x = g.add_input("x", t(4, 8))
    w = g.add_input("w", t(8, 3), InputSpec("parameter", "fc.weight"))
    y = g.call("aten::mm.default", [x, w], out=t(4, 3), meta=src(10, "y = x @ w"))
    z = g.call("aten::relu.default", [y], out=t(4, 3), meta=src(11, "z = y.relu()"))
    s = g.call("aten::sum.dim_IntList", [z, [1]], {"keepdim": False}, out=t(4), meta=src(12))
    g.set_outputs([s, z])
    return Program.single(g, weights={"fc.weight": Weight(t(8, 3))})


def test_valid_programs_verify():
    p = mlp()
    assert verify(p) is p


def _break(kind: str) -> Program:
    p = mlp()
    g = p.main
    mm, relu, sm = g.nodes
    if kind == "use before def":
        g.nodes[0], g.nodes[1] = g.nodes[1], g.nodes[0]
    elif kind == "unknown op":
        g.call("aten::frobnicate.default", [relu.output], out=t(4, 3))
    elif kind == "too many args":
        g.call("aten::relu.default", [relu.output, relu.output], out=t(4, 3))
    elif kind == "scalar for tensor":
        g.call("aten::relu.default", ["x"], out=t(4, 3))
    elif kind == "bad kwarg":
        g.call("aten::relu.default", [relu.output], {"inplace": True}, out=t(4, 3))
    elif kind == "missing arg":
        g.call("aten::mm.default", [relu.output], out=t(4, 3))
    elif kind == "tensor for int list":
        g.call("aten::sum.dim_IntList", [relu.output, [relu.output]], out=t(4))
    elif kind == "wrong dtype atom":
        g.call("aten::_to_copy.default", [relu.output], {"dtype": "float32"}, out=t(4, 3))
    elif kind == "output count":
        g.call("aten::native_layer_norm.default", [relu.output, [3], None, None, 1e-5], out=t(4, 3))
    elif kind == "scalar output for tensor":
        g.call("aten::relu.default", [relu.output], out=INT)
    elif kind == "foreign value":
        other = Graph("other")
        v = other.add_input("v", t(4, 3))
        g.call("aten::relu.default", [v], out=t(4, 3))
    elif kind == "missing weight":
        del p.weights["fc.weight"]
    elif kind == "dangling graph ref":
        g.call("hop::checkpoint", [GraphRef("nowhere"), [relu.output]], out=t(4, 3))
    elif kind == "bad entry":
        p.entry = "nope"
    elif kind == "output undefined":
        other = Graph("other")
        g.set_outputs([other.add_input("v", t(1))])
    elif kind == "non-IR argument":
        g.call("aten::relu.default", [object()], out=t(4, 3))
    elif kind == "method without self":
        g.call("torch::Tensor.view", [], {"size": [12]}, out=t(12))
    elif kind == "stale use-def":
        relu.args = (g.inputs[0],)
    return p


BREAKS = {
    "use before def": "before it is defined",
    "unknown op": "unknown op aten::frobnicate.default",
    "too many args": "at most 1 positional",
    "scalar for tensor": "expects Tensor, got str 'x'",
    "bad kwarg": "has no argument 'inplace'",
    "missing arg": "missing argument 'mat2'",
    "tensor for int list": "expects int[1]?",
    "wrong dtype atom": "expects ScalarType?",
    "output count": "returns 3 values but the node defines 1",
    "scalar output for tensor": "returns a tensor but",
    "foreign value": "before it is defined",
    "missing weight": "Program.weights does not hold",
    "dangling graph ref": "refers to graph 'nowhere'",
    "bad entry": "entry graph 'nope'",
    "output undefined": "graph output %v is not defined",
    "non-IR argument": "is not an IR value",
    "stale use-def": "use-def links are stale",
    "method without self": "is a Tensor method",
}


@pytest.mark.parametrize("kind", sorted(BREAKS))
def test_broken_programs_fail_with_a_clear_message(kind):
    with pytest.raises(VerificationError, match=BREAKS[kind]) as info:
        verify(_break(kind))
    assert isinstance(info.value, IRError)


def test_error_shows_the_node_with_surrounding_lines_and_source():
    p = mlp()
    g = p.main
    relu = g.nodes[1]
    with g.inserting_after(relu):
        g.call("aten::relu.default", [relu.output, 2], out=t(4, 3), meta=src(42, "bad = z.relu(2)"))
    with pytest.raises(VerificationError) as info:
        verify(p)
    text = str(info.value)
    assert "model.py:42: bad = z.relu(2)" in text
    marked = [line for line in text.splitlines() if line.startswith(">> ")]
    assert len(marked) == 1 and "relu" in marked[0]
    # Neighbours on both sides are shown for context.
    assert "mm" in text and "sum" in text
    assert info.value.node is g.nodes[2]


def test_render_window_marks_exactly_one_line():
    p = mlp()
    for node in p.main.nodes:
        text = render_window(p.main, node, window=1)
        assert sum(line.startswith(">> ") for line in text.splitlines()) == 1


def test_symbolic_and_enum_arguments_pass():
    g = Graph("main")
    x = g.add_input("x", t("s0", 8))
    n = g.call("aten::sym_size.int", [x, 0], out=INT)
    v = g.call("aten::view.default", [x, [SymExpr("2*s0"), 4]], out=t("2*s0", 4))
    w = g.call("aten::view.default", [x, [n, -1]], out=t("s0", 8))
    c = g.call("aten::_to_copy.default", [v], {"dtype": DType("float16")}, out=t("2*s0", 4, dtype="float16"))
    g.set_outputs([c, w])
    verify(Program.single(g))


def test_hop_subgraph_arity_is_checked():
    p = Program()
    body = p.add_graph(Graph("body"))
    a = body.add_input("a", t(3))
    body.set_outputs([body.call("aten::sin.default", [a], out=t(3))])
    main = p.add_graph(Graph("main"))
    x = main.add_input("x", t(3))
    main.set_outputs([main.call("hop::checkpoint", [GraphRef("body"), [x]], out=t(3))])
    verify(p)
    main.call("hop::checkpoint", [GraphRef("body"), [x, x]], out=t(3))
    with pytest.raises(VerificationError, match="takes 1 inputs, expected 2"):
        verify(p)


def test_while_loop_conventions():
    p = Program()
    cond = p.add_graph(Graph("cond"))
    i = cond.add_input("i", INT)
    cond.set_outputs([cond.call("torch::operator.lt", [i, 3], out=ScalarType("bool"))])
    body = p.add_graph(Graph("body"))
    j = body.add_input("j", INT)
    body.set_outputs([body.call("torch::operator.add", [j, 1], out=INT)])
    main = p.add_graph(Graph("main"))
    n = main.add_input("n", INT)
    main.set_outputs([main.call("hop::while_loop", [GraphRef("cond"), GraphRef("body"), [n], []], out=INT)])
    verify(p)
    main.call("hop::while_loop", [GraphRef("cond"), GraphRef("body"), [n]], out=[INT, INT])
    with pytest.raises(VerificationError, match="defines 2 outputs but carries 1"):
        verify(p)


def test_boundary_checks_follow_the_debug_flag(monkeypatch):
    bad = _break("unknown op")
    saved = verify_at_boundaries()
    try:
        verify_at_boundaries(False)
        assert check_boundary(bad, "capture") is bad
        verify_at_boundaries(True)
        with pytest.raises(VerificationError, match="capture produced an invalid program"):
            check_boundary(bad, "capture")
    finally:
        verify_at_boundaries(saved)


def test_env_var_turns_boundary_checks_on():
    from fireclay_ir import SharedSettings

    assert SharedSettings.from_environment({"FIRECLAY_VERIFY": "1"}).verify
    assert not SharedSettings.from_environment({"FIRECLAY_VERIFY": "0"}).verify


def test_verifying_and_passes_do_not_import_torch():
    import subprocess
    import sys

    code = ("import sys\n"
            "from fireclay_ir import PassManager, GENERIC_PIPELINE, verify, format_program\n"
            "sys.path.insert(0, sys.argv[1])\n"
            "from test_verifier import mlp\n"
            "p = PassManager(GENERIC_PIPELINE, verify=True).run(verify(mlp()))\n"
            "print(format_program(p))\n"
            "assert 'torch' not in sys.modules\n")
    import pathlib

    out = subprocess.run([sys.executable, "-c", code, str(pathlib.Path(__file__).parent)],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert "aten.mm.default" in out.stdout


def test_tensor_properties_take_only_the_tensor():
    pytest.importorskip("torch")  # which names are properties is known from torch itself
    p = mlp()
    g = p.main
    g.call("torch::Tensor.T", [g.nodes[1].output, 1], out=t(3, 4))
    with pytest.raises(VerificationError, match="is a property"):
        verify(p)
