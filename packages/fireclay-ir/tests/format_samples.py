"""Programs that exercise every part of the format, shared by the format tests and goldens.

Each builder is deterministic (goldens are generated from them) and takes options that vary
shapes and sizes, so tests can run the same checks over tables of programs.
"""

from __future__ import annotations

from fireclay_ir import (
    Device,
    DType,
    Graph,
    GraphRef,
    InputSpec,
    Layout,
    MemoryFormat,
    Program,
    ScalarType,
    SymExpr,
    TensorMeta,
    Weight,
)


def f32(*shape, **kw) -> TensorMeta:
    return TensorMeta("float32", tuple(shape), **kw)


def src(line: int, text: str, file: str = "/home/user/project/model.py") -> dict:
    return {"source": {"file": file, "line": line, "text": text}}


def mlp_aten(batch="s0", hidden=(16, 32, 8), *, with_data: bytes | None = None) -> Program:
    """A two-layer MLP in the aten dialect: parameters, addmm, relu, a symbolic batch size."""
    g = Graph("main")
    x = g.add_input("x", f32(batch, hidden[0]))
    params = {}
    for i, (a, b) in enumerate(zip(hidden, hidden[1:])):
        params[f"fc{i}.weight"] = f32(b, a)
        params[f"fc{i}.bias"] = f32(b)
    w = {name: g.add_input(name.replace(".", "_"), t, InputSpec("parameter", name)) for name, t in params.items()}
    h = x
    for i, (a, b) in enumerate(zip(hidden, hidden[1:])):
        wt = g.call("aten::t.default", [w[f"fc{i}.weight"]], out=f32(a, b, strides=(1, a)),
                    meta=src(10 + 2 * i, f"h = self.fc{i}(h)") | {"module": f"fc{i}"})
        h = g.call("aten::addmm.default", [w[f"fc{i}.bias"], h, wt], out=f32(batch, b),
                   meta=src(10 + 2 * i, f"h = self.fc{i}(h)") | {"module": f"fc{i}"})
        if i + 2 < len(hidden):
            h = g.call("aten::relu.default", [h], out=f32(batch, b), meta=src(11 + 2 * i, "h = torch.relu(h)"))
    g.set_outputs([h])
    weights = {name: Weight(t) for name, t in params.items()}
    prog = Program.single(g, weights=weights, producer=("fireclay-autograd", "0.1.0"), dialects={"aten": "1"})
    if isinstance(batch, str):
        prog.add_symbol(batch, hint=4, min=2, max=None)
        prog.guards.append(f"{batch} >= 2")
    return prog


def torch_dialect(n_extra: int = 1) -> Program:
    """A torch-dialect program: symbols, guards, source info and every argument kind."""
    g = Graph("forward")
    x = g.add_input("x", f32("s0", "s1", requires_grad=True))
    y = g.add_input("y", TensorMeta("bfloat16", ("s1",), device="cuda:0"))
    mask = g.add_input("mask", TensorMeta("bool", ("s0", "s1")))
    n = g.add_input("n", ScalarType("int"))
    a = g.call("torch::torch.nn.functional.gelu", [x], {"approximate": "tanh"}, out=f32("s0", "s1"),
               meta=src(3, "a = F.gelu(x, approximate='tanh')", "model.py"))
    b = g.call("torch::Tensor.view", [a, SymExpr("s0*s1")], out=f32("s0*s1"), meta=src(4, "b = a.view(-1)", "model.py"))
    c = g.call("torch::Tensor.to", [y], {"dtype": DType("float32"), "device": Device("cpu"),
                                         "memory_format": MemoryFormat("preserve_format")},
               out=f32("s1"), meta=src(5, "c = y.to(torch.float32, 'cpu')", "model.py"))
    d = g.call("torch::operator.getitem", [a, (Ellipsis, slice(None, SymExpr("s1 - 1"), 2), None)],
               out=f32("s0", "floor(s1/2)", 1, strides=("s1", 2, 1), storage_offset=0),
               meta=src(6, "d = a[..., :-1:2, None]", "model.py"))
    e = g.call("torch::torch.where", [mask, x, float("-inf")], out=f32("s0", "s1"),
               meta=src(7, "e = torch.where(mask, x, float('-inf'))", "model.py"))
    f = g.call("torch::torch.full", [[2, 3], float("nan")], {"dtype": DType("float16"), "layout": Layout("strided"),
                                                           "requires_grad": False, "pin_memory": None},
               out=TensorMeta("float16", (2, 3)), meta=src(8, "f = torch.full((2, 3), nan, dtype=torch.half)"))
    extra = []
    for i in range(n_extra):
        extra.append(g.call("torch::operator.add", [e, x], out=f32("s0", "s1"),
                            meta={"note": f"extra {i}", "stack": [src(20, "outer()")["source"],
                                                                src(30 + i, "e + x")["source"]]}))
    s = g.call("torch::Tensor.size", [x, 1], out=ScalarType("int"))
    m = g.call("torch::math.sqrt", [n], out=ScalarType("float"))
    g.set_outputs([b, c, d, f, s, m, *extra])
    g.meta["capture.graph_break"] = None
    prog = Program.single(g, producer=("fireclay-capture", "0.1.0"), dialects={"torch": "1"},
                          metadata={"model": "ToyBlock", "tags": ["unit", "test"], "scale": 0.5})
    prog.add_symbol("s0", hint=8, min=2, max=1024)
    prog.add_symbol("s1", hint=6, min=2, max=None)
    prog.guards.extend(["s0 >= 2", "Eq(Mod(s1, 2), 0)", "s0*s1 <= 65536"])
    return prog


def cond_program(width: int = 4) -> Program:
    """hop::cond with two sub-graphs, in the aten dialect."""
    prog = Program(producer=("fireclay-capture", "0.1.0"), dialects={"aten": "1", "hop": "1"})
    for name, op in (("true_branch", "aten::sin.default"), ("false_branch", "aten::cos.default")):
        sub = Graph(name)
        u = sub.add_input("u", f32(width))
        r = sub.call(op, [u], out=f32(width), meta=src(40 if "true" in name else 42, f"return u.{op[6:9]}()"))
        sub.set_outputs([r])
        prog.add_graph(sub)
    g = Graph("main")
    x = g.add_input("x", f32(width))
    total = g.call("aten::sum.default", [x], out=f32(), meta=src(50, "if x.sum() > 0:"))
    pred = g.call("aten::gt.Scalar", [total, 0], out=TensorMeta("bool", ()), meta=src(50, "if x.sum() > 0:"))
    (out,) = g.call("hop::cond", [pred, GraphRef("true_branch"), GraphRef("false_branch"), [x]], out=[f32(width)],
                    meta=src(50, "if x.sum() > 0:"))
    g.set_outputs([out])
    prog.add_graph(g)
    prog.entry = "main"
    return prog


SAMPLES = {
    "mlp_aten": mlp_aten,
    "torch_dialect": torch_dialect,
    "cond": cond_program,
}
