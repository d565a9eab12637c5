"""The reference interpreter against eager torch, over tables of programs and fresh inputs."""

from __future__ import annotations

import pytest
from irbuild import INT, src, t

from fireclay_ir import DType, Graph, GraphRef, InputSpec, Program, ScalarType, SymExpr, Weight
from fireclay_ir.interpreter import InterpreterError, interpret

torch = pytest.importorskip("torch")


def _aten_unary_chain():
    g = Graph("main")
    x = g.add_input("x", t("s0", 5))
    a = g.call("aten::sin.default", [x], out=t("s0", 5))
    b = g.call("aten::mul.Tensor", [a, x], out=t("s0", 5))
    c = g.call("aten::add.Tensor", [b, 1.5], {"alpha": 2}, out=t("s0", 5))
    g.set_outputs([c])
    return Program.single(g), lambda x: (torch.add(torch.sin(x) * x, 1.5, alpha=2),), [("s0", 5)]


def _aten_symbolic_view():
    g = Graph("main")
    x = g.add_input("x", t("s0", "s1"))
    v = g.call("aten::view.default", [x, [SymExpr("s0*s1")]], out=t("s0*s1"))
    n = g.call("aten::sym_size.int", [x, 1], out=INT)
    w = g.call("aten::view.default", [x, [-1, n]], out=t("s0", "s1"))
    e = g.call("aten::new_zeros.default", [x, [SymExpr("2*s0 + 1")]], {"dtype": DType("float64")},
               out=t("2*s0 + 1", dtype="float64"))
    g.set_outputs([v, w, e])
    return (Program.single(g),
            lambda x: (x.reshape(-1), x, torch.zeros(2 * x.shape[0] + 1, dtype=torch.float64)),
            [("s0", 3), ("s1", 4)])


def _multi_output_and_weights():
    g = Graph("main")
    x = g.add_input("x", t(4, 6))
    w = g.add_input("w", t(6), InputSpec("parameter", "ln.weight"))
    b = g.add_input("b", t(6), InputSpec("buffer", "ln.bias"))
    y, mean, rstd = g.call("aten::native_layer_norm.default", [x, [6], w, b, 1e-5],
                           out=[t(4, 6), t(4, 1), t(4, 1)])
    parts = g.call("aten::split.Tensor", [y, 2, 1], out=[t(4, 2), t(4, 2), t(4, 2)])
    s = g.call("aten::cat.default", [[parts[2], parts[0]], 1], out=t(4, 4))
    g.set_outputs([s, mean, rstd])
    weight, bias = torch.randn(6), torch.randn(6)
    p = Program.single(g, weights={"ln.weight": Weight(t(6), weight), "ln.bias": Weight(t(6), bias)})

    def ref(x):
        y = torch.nn.functional.layer_norm(x, [6], weight, bias, 1e-5)
        a, _, c = y.split(2, 1)
        mu = x.mean(1, keepdim=True)
        rstd = (x.var(1, unbiased=False, keepdim=True) + 1e-5).rsqrt()
        return torch.cat([c, a], 1), mu, rstd

    return p, ref, [None]


def _torch_dialect():
    g = Graph("main")
    x = g.add_input("x", t(3, 4))
    a = g.call("torch::torch.nn.functional.gelu", [x], {"approximate": "tanh"}, out=t(3, 4))
    b = g.call("torch::Tensor.view", [a, 4, 3], out=t(4, 3))
    tt = g.call("torch::Tensor.T", [b], out=t(3, 4))
    c = g.call("torch::operator.add", [tt, x], out=t(3, 4))
    d = g.call("torch::math.sqrt", [4.0], out=ScalarType("float"))
    e = g.call("torch::operator.mul", [c, d], out=t(3, 4))
    f = g.call("torch::Tensor.clone", [e], out=t(3, 4))
    g.call("torch::Tensor.mul_", [f, 3], out=t(3, 4))  # in place: f changes
    g.call("torch::operator.setitem", [f, (0, slice(None, 2)), 0.0], out=[])
    g.set_outputs([f, e])

    def ref(x):
        e = (torch.nn.functional.gelu(x, approximate="tanh").view(4, 3).T + x) * 2.0
        f = e.clone().mul_(3)
        f[0, :2] = 0.0
        return f, e

    return Program.single(g), ref, [None]


def _cond_and_loop():
    p = Program()
    tg = p.add_graph(Graph("true_branch"))
    a = tg.add_input("a", t(4))
    tg.set_outputs([tg.call("aten::sin.default", [a], out=t(4))])
    fg = p.add_graph(Graph("false_branch"))
    a = fg.add_input("a", t(4))
    fg.set_outputs([fg.call("aten::cos.default", [a], out=t(4))])
    cg = p.add_graph(Graph("loop_cond"))
    i = cg.add_input("i", INT)
    cg.add_input("acc", t(4))
    cg.add_input("step", t(4))
    cg.set_outputs([cg.call("torch::operator.lt", [i, 3], out=ScalarType("bool"))])
    bg = p.add_graph(Graph("loop_body"))
    i = bg.add_input("i", INT)
    acc = bg.add_input("acc", t(4))
    step = bg.add_input("step", t(4))
    bg.set_outputs([bg.call("torch::operator.add", [i, 1], out=INT),
                    bg.call("aten::add.Tensor", [acc, step], out=t(4))])
    m = p.add_graph(Graph("main"))
    x = m.add_input("x", t(4))
    pred = m.call("aten::gt.Scalar", [m.call("aten::sum.default", [x], out=t()), 0], out=t(dtype="bool"))
    y = m.call("hop::cond", [pred, GraphRef("true_branch"), GraphRef("false_branch"), [x]], out=t(4))
    n, z = m.call("hop::while_loop", [GraphRef("loop_cond"), GraphRef("loop_body"), [0, y], [x]],
                  out=[INT, t(4)])
    m.set_outputs([z, n])

    def ref(x):
        y = torch.sin(x) if x.sum() > 0 else torch.cos(x)
        return y + 3 * x, 3

    return p, ref, [None]


CASES = {
    "aten unary chain": _aten_unary_chain,
    "aten symbolic view": _aten_symbolic_view,
    "multi output and weights": _multi_output_and_weights,
    "torch dialect": _torch_dialect,
    "cond and while_loop": _cond_and_loop,
}


def _inputs(program, dims):
    sizes = {name: size for name, size in [d for d in dims if d] }
    args = []
    for v in program.main.inputs:
        if program.main.input_spec(v).kind != "user":
            continue
        shape = [sizes[d] if isinstance(d, str) else d for d in v.meta.shape]
        args.append(torch.randn(*shape))
    return args


def _close(a, b):
    if isinstance(a, torch.Tensor):
        return a.shape == b.shape and a.dtype == b.dtype and torch.allclose(a, b, atol=1e-5, rtol=1e-5)
    return a == b


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_interpreter_matches_eager(case, seed):
    torch.manual_seed(seed)
    program, ref, dims = CASES[case]()
    from fireclay_ir.verifier import verify

    verify(program)
    args = _inputs(program, dims)
    got = interpret(program, *args)
    want = ref(*args)
    assert len(got) == len(want)
    assert all(_close(a, b) for a, b in zip(got, want)), (got, want)


def test_autograd_traces_through_the_interpreter():
    program, ref, dims = _aten_unary_chain()
    x = torch.randn(3, 5, requires_grad=True)
    (out,) = interpret(program, x)
    out.sum().backward()
    x2 = x.detach().clone().requires_grad_()
    ref(x2)[0].sum().backward()
    assert torch.allclose(x.grad, x2.grad)


def test_runs_under_a_dispatch_mode():
    from torch.utils._python_dispatch import TorchDispatchMode

    seen = []

    class Record(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            seen.append(str(func))
            return func(*args, **(kwargs or {}))

    program, ref, dims = _multi_output_and_weights()
    x = torch.randn(4, 6)
    with Record():
        got = interpret(program, x)
    assert "aten.native_layer_norm.default" in seen and "aten.cat.default" in seen
    assert all(_close(a, b) for a, b in zip(got, ref(x)))


def test_runs_on_meta_tensors():
    program, _, _ = _aten_symbolic_view()
    v, w, e = interpret(program, torch.empty(5, 7, device="meta"))
    assert v.shape == (35,) and w.shape == (5, 7) and e.shape == (11,) and e.device.type == "meta"


def test_errors_name_the_node_and_its_source():
    g = Graph("main")
    x = g.add_input("x", t(2, 3))
    g.set_outputs([g.call("aten::mm.default", [x, x], out=t(2, 3), meta=src(7, "y = x @ x"))])
    with pytest.raises(InterpreterError, match=r"(?s)mm\.default.*model\.py:7: y = x @ x"):
        interpret(Program.single(g), torch.randn(2, 3))


@pytest.mark.parametrize("shape, message", [
    ((3,), "expects rank 2"),
    ((2, 4), "dim 1 is 3 in the program"),
])
def test_input_shapes_are_checked(shape, message):
    g = Graph("main")
    x = g.add_input("x", t("s0", 3))
    g.set_outputs([g.call("aten::neg.default", [x], out=t("s0", 3))])
    with pytest.raises(InterpreterError, match=message):
        interpret(Program.single(g), torch.randn(*shape))


def test_inconsistent_symbol_bindings_are_reported():
    g = Graph("main")
    x = g.add_input("x", t("s0"))
    y = g.add_input("y", t("s0"))
    g.set_outputs([g.call("aten::add.Tensor", [x, y], out=t("s0"))])
    with pytest.raises(InterpreterError, match="bound to 3"):
        interpret(Program.single(g), torch.randn(3), torch.randn(4))


def test_missing_weight_and_wrong_arity():
    g = Graph("main")
    x = g.add_input("x", t(2))
    w = g.add_input("w", t(2), InputSpec("parameter", "w"))
    g.set_outputs([g.call("aten::add.Tensor", [x, w], out=t(2))])
    p = Program.single(g, weights={"w": Weight(t(2))})
    with pytest.raises(InterpreterError, match="weight 'w'"):
        interpret(p, torch.randn(2))
    with pytest.raises(InterpreterError, match="takes 1 user inputs"):
        interpret(p)


def test_weights_stored_as_raw_bytes():
    g = Graph("main")
    x = g.add_input("x", t(2, 2))
    w = g.add_input("w", t(2, 2), InputSpec("constant", "c"))
    g.set_outputs([g.call("aten::mm.default", [x, w], out=t(2, 2))])
    c = torch.randn(2, 2)
    p = Program.single(g, weights={"c": Weight(t(2, 2), bytes(c.view(torch.uint8).flatten().tolist()))})
    x = torch.randn(2, 2)
    assert torch.allclose(interpret(p, x)[0], x @ c)


def test_loops_dialect_needs_its_backend():
    from fireclay_ir.dialects import Dialect, OpDef, register_dialect

    d = Dialect("interp_test_dialect")
    d.register(OpDef(dialect="interp_test_dialect", name="kernel"))
    register_dialect(d)
    g = Graph("main")
    x = g.add_input("x", t(2))
    g.set_outputs([g.call("interp_test_dialect::kernel", [x], out=t(2))])
    with pytest.raises(InterpreterError, match="needs the backend"):
        interpret(Program.single(g), torch.randn(2))


def test_a_stage_can_teach_the_interpreter_its_dialect():
    from fireclay_ir.dialects import Dialect, OpDef, register_dialect
    from fireclay_ir.interpreter import Interpreter

    d = Dialect("interp_rule_dialect")
    d.register(OpDef(dialect="interp_rule_dialect", name="scale"))
    register_dialect(d)

    class Scaling(Interpreter):
        dialect_rules = {"interp_rule_dialect": lambda interp, node, args, kwargs: args[0] * kwargs["by"]}

    g = Graph("main")
    x = g.add_input("x", t(3))
    y = g.call("interp_rule_dialect::scale", [x], {"by": 3.0}, out=t(3))
    g.set_outputs([g.call("aten::add.Tensor", [y, x], out=t(3))])
    x = torch.randn(3)
    (got,) = Scaling(Program.single(g)).run(x)
    assert torch.allclose(got, 4 * x)
