"""The ``loops`` dialect of fireclay-ir: a scheduled program as a fireclay_ir.Program.

Layout of the program (``to_program`` writes it, ``from_program`` reads it back):

* the entry graph ``main`` is the call list. Its inputs are the program's input buffers, with the
  source program's InputSpecs (parameters, buffers and constants name ``Program.weights``, which
  are kept); each other buffer is declared by ``%buf = loops::buffer(allocation=...)`` (typed by its TensorMeta;
  ``allocation`` None for buffers internal to a kernel); ``loops::kernel(...)`` runs a kernel,
  ``loops::view(%buf, size=, stride=, offset=)`` makes the strided view an extern call takes and
  ``loops::extern(op=, kind=, args=, kwarg_names=, kwarg_values=, writes=)`` calls a library op
  (``positions=``, when present, gives the op's result index each buffer of ``writes``
  receives: results the op leaves undefined have no buffer); the outputs are buffers (or Python scalars);
* every loop node's body is a graph of its own, named after the node, whose nodes are the body's
  ``ops.*`` calls (``loops::load``, ``loops::add``, ``loops::store``...) with index expressions
  as SymExpr and values typed as 0-d TensorMeta of their dtype; ``graph.meta`` holds the
  node's loop ranges (``loops.sizes``, ``loops.reduction_sizes``) and meta (``loops.meta``).

Importing :mod:`fireclay_loops` does not register the dialect; :func:`register` does (and
``to_program``/``from_program`` call it), so fireclay-ir can verify and load such programs.
"""

from __future__ import annotations

from typing import Any

import sympy

from fireclay_ir import Graph, GraphRef, IRError, Program, SymExpr, TensorMeta, Value
from fireclay_loops import exprs
from fireclay_loops.backend.program import ScheduledProgram
from fireclay_loops.body import BodyOp, BodyValue, LoopBody
from fireclay_loops.ir import (
    Buffer,
    ComputeNode,
    Constant,
    ExternNode,
    InputBufferNode,
    LoopProgram,
    OutputBufferNode,
    TensorArg,
)
from fireclay_loops.kernel import Kernel, KernelNode
from fireclay_loops.ops import CHECK_OPS, MATH_OPS, MEMORY_OPS, OPS

DIALECT_VERSION = "1"
CALL_OPS = {
    "buffer": "declare a buffer (TensorMeta of the output) in an allocation of the memory plan",
    "view": "a strided view of a buffer, as an extern call receives it",
    "kernel": "run a fused kernel: loop nodes (GraphRefs to their bodies) over xsizes x rsizes",
    "extern": "call a library op (extern) or an op without a lowering (fallback)",
}
_WRITES = {"store", "store_reduction", "store_add", "kernel", "extern"}


def _verify_loops_node(node: Any, program: Any) -> list[str]:
    """Problems with one ``loops::`` node (the dialect's own verifier rules)."""
    kw = node.kwargs
    if node.target == "kernel":
        refs = kw.get("nodes", [])
        problems = [f"kernel body {r!r} is not a GraphRef to a graph of the program" for r in refs
                    if not isinstance(r, GraphRef) or r.name not in program.graphs]
        if len(kw.get("var_maps", [])) != len(refs) or len(kw.get("stages", [])) != len(refs):
            problems.append("a kernel needs one var_map and one stage per node")
        for r in refs:
            g = program.graphs.get(getattr(r, "name", None))
            bad = [n.op for n in (g.nodes if g else []) if n.dialect != "loops" or n.target not in OPS]
            if bad:
                problems.append(f"kernel body {r.name!r} holds {bad[0]}, which is not a loop-body op")
        return problems
    if node.target in MEMORY_OPS:
        if not isinstance(node.args[0], str) or not isinstance(node.args[1], SymExpr):
            return [f"{node.op} takes a buffer name and an index expression"]
    if node.target in ("buffer", "view") and not (node.outputs and node.outputs[0].is_tensor):
        return [f"{node.op} must define one tensor value"]
    return []


def register() -> None:
    """Register the ``loops`` dialect with fireclay-ir (idempotent)."""
    from fireclay_ir.dialects import Dialect, OpDef, dialects, register_dialect

    if "loops" in dialects():
        return

    class LoopsDialect(Dialect):
        def verify_node(self, node: Any, op: Any, program: Any) -> list[str]:
            return _verify_loops_node(node, program)

    d = LoopsDialect("loops", DIALECT_VERSION)
    for name, doc in CALL_OPS.items():
        d.register(OpDef(dialect="loops", name=name, doc=doc, side_effects=name in _WRITES))
    for name in OPS:
        doc = f"loop-body op ops.{name}" + (f" ({MATH_OPS[name]} operands)" if name in MATH_OPS else "")
        # (a check raises: it is an effect, though its value is the value checked)
        d.register(OpDef(dialect="loops", name=name, doc=doc, side_effects=name in _WRITES or name in CHECK_OPS,
                         nondeterministic=name == "random"))
    register_dialect(d)


def _dim(e: Any) -> int | str:
    return exprs.to_dim(e)


def _meta(b: Buffer) -> TensorMeta:
    return TensorMeta(b.dtype, tuple(_dim(s) for s in b.size), tuple(_dim(s) for s in b.stride),
                      _dim(b.offset), b.device)


def _sym(e: sympy.Expr) -> SymExpr:
    return SymExpr(exprs.to_str(e))


# --------------------------------------------------------------------------- writing


def _body_graph(node: ComputeNode) -> Graph:
    body = node.body
    g = Graph(node.name)
    g.meta = {"loops.sizes": [exprs.to_str(s) for s in body.sizes],
              "loops.reduction_sizes": [exprs.to_str(s) for s in body.reduction_sizes],
              "loops.meta": node.meta}
    values: list[Value | None] = []

    def arg(a: Any) -> Any:
        if isinstance(a, BodyValue):
            return values[a.index]
        if isinstance(a, sympy.Basic):
            return _sym(a)
        return a

    for op in body.ops:
        out = TensorMeta(op.dtype, ()) if op.dtype is not None else None
        v = g.call(f"loops::{op.name}", tuple(arg(a) for a in op.args), out=out)
        values.append(v if out is not None else None)
    return g


def to_program(scheduled: ScheduledProgram) -> Program:
    """The scheduled program as a fireclay-ir Program in the ``loops`` dialect."""
    register()
    prog, plan = scheduled.program, scheduled.plan
    main = Graph("main")
    program = Program.single(main, dialects={"loops": DIALECT_VERSION})
    program.producer = ("fireclay-loops", "0.1.0")
    for name, hint in prog.symbols.items():
        program.add_symbol(name, hint)
    values: dict[str, Value] = {}
    for b in prog.inputs:
        values[b] = main.add_input(b, _meta(prog.buffers[b]), prog.input_specs.get(b))
    program.weights = dict(prog.weights)
    for b, buf in prog.buffers.items():
        if not buf.is_input:
            values[b] = main.call("loops::buffer", (), {"allocation": plan.buffer_allocation.get(b)},
                                  out=_meta(buf), name=b)

    def extern_arg(a: Any) -> Any:
        if isinstance(a, TensorArg):
            base = prog.buffers[a.buffer]
            meta = TensorMeta(base.dtype, tuple(_dim(s) for s in a.size), tuple(_dim(s) for s in a.stride),
                              _dim(a.offset), base.device)
            return main.call("loops::view", (values[a.buffer],),
                             {"size": [_dim(s) for s in a.size], "stride": [_dim(s) for s in a.stride],
                              "offset": _dim(a.offset)}, out=meta)
        if isinstance(a, sympy.Basic):
            return _sym(a)
        if isinstance(a, (list, tuple)):
            return type(a)(extern_arg(x) for x in a)
        return a

    for step in scheduled.steps:
        if isinstance(step, Kernel):
            refs = []
            for kn in step.nodes:
                program.add_graph(_body_graph(kn.node))
                refs.append(GraphRef(kn.node.name))
            body_vars = [kn.node.body.vars + kn.node.body.reduction_vars for kn in step.nodes]
            main.call("loops::kernel", (), {
                "name": step.name,
                "reads": [values[b] for b in step.read_buffers()],
                "writes": [values[b] for b in step.write_buffers()],
                "xsizes": [_dim(s) for s in step.xsizes], "rsizes": [_dim(s) for s in step.rsizes],
                "nodes": refs,
                "var_maps": [[_sym(kn.var_map[v]) for v in vs] for kn, vs in zip(step.nodes, body_vars)],
                "stages": [kn.stage for kn in step.nodes],
                "internal": sorted(step.internal),
            })
        else:
            main.call("loops::extern", (), {
                "name": step.name, "op": step.op, "kind": step.kind,
                "args": list(extern_arg(list(step.args))),
                "kwarg_names": list(step.kwargs),
                "kwarg_values": [extern_arg(v) for v in step.kwargs.values()],
                "writes": [values[b] for b in step.outputs],
                **({} if step.positions is None else {"positions": list(step.positions)}),
            }, meta={"loops.meta": step.meta})
    main.set_outputs([values[o] if isinstance(o, str) else _sym(o.value) if isinstance(o.value, sympy.Basic)
                      else o.value for o in prog.outputs])
    program.metadata = {
        "loops.seed": prog.seed, "loops.donated": sorted(prog.donated),
        "loops.decisions": [vars(d) for d in scheduled.decisions],
    }
    return program


# --------------------------------------------------------------------------- reading


def _body_from_graph(g: Graph) -> ComputeNode:
    body = LoopBody([exprs.parse(s) for s in g.meta["loops.sizes"]],
                    [exprs.parse(s) for s in g.meta["loops.reduction_sizes"]])
    index_of: dict[Value, int] = {}

    def arg(a: Any) -> Any:
        if isinstance(a, Value):
            return BodyValue(index_of[a])
        if isinstance(a, SymExpr):
            return exprs.parse(a.expr)
        return a

    for k, n in enumerate(g.nodes):
        if n.dialect != "loops" or n.target not in OPS:
            raise IRError(f"loop body {g.name!r} holds {n.op}, which is not a loop-body op")
        dtype = n.outputs[0].meta.dtype if n.outputs else None
        body.ops.append(BodyOp(n.target, tuple(arg(a) for a in n.args), dtype))
        if n.outputs:
            index_of[n.outputs[0]] = k
    return ComputeNode(g.name, body, dict(g.meta.get("loops.meta") or {}))


def _extern_op(name: Any, trusted: bool) -> str:
    """The op an extern step of a document calls: an aten op the aten dialect admits (never
    one that reads or writes files, shares storage or changes process state: a document is
    data). Other namespaces (ops of ``torch.library``) only in a program this process made
    (``trusted``)."""
    from fireclay_ir.dialects import lookup_op

    if not isinstance(name, str) or "::" not in name:
        raise IRError(f"loops::extern names no op ({name!r})")
    if name.startswith("aten::"):
        lookup_op(name)  # IRError for unknown and refused ops
    elif not trusted:
        raise IRError(f"loops::extern calls {name}, which is not an aten op; a loops document may call "
                      "aten ops only")
    return name


def from_program(program: Program, *, trusted: bool = False) -> ScheduledProgram:
    """Read a ``loops``-dialect Program back into a ScheduledProgram (the memory plan is
    recomputed: it is a deterministic function of the steps). Extern steps may call the aten ops
    the aten dialect admits; ``trusted`` (a program this process or its own cache made) admits
    other namespaces too."""
    from fireclay_loops.memory import plan_memory
    from fireclay_loops.scheduler import Decision

    main = program.main
    lp = LoopProgram(symbols={n: s.hint for n, s in program.symbols.items()},
                     seed=int(program.metadata.get("loops.seed", 0)),
                     donated=set(program.metadata.get("loops.donated", [])))
    names: dict[Value, str] = {}

    def buffer_of(v: Value, is_input: bool) -> Buffer:
        t = v.meta
        stride = t.strides if t.strides is not None else exprs.contiguous_strides(t.shape)
        return Buffer(v.name, t.dtype, t.device, list(t.shape), list(stride), t.storage_offset, is_input=is_input)

    lp.weights = dict(program.weights)
    for pos, (v, spec) in enumerate(zip(main.inputs, main.input_specs)):
        if spec.kind != "user":
            lp.input_specs[v.name] = spec
        lp.buffers[v.name] = buffer_of(v, True)
        lp.inputs.append(v.name)
        lp.nodes.append(InputBufferNode(f"input_{v.name}", v.name, pos))
        names[v] = v.name
    views: dict[Value, TensorArg] = {}
    steps: list[Kernel | ExternNode] = []

    def extern_arg(a: Any) -> Any:
        if isinstance(a, Value):
            return views[a]
        if isinstance(a, SymExpr):
            return exprs.parse(a.expr)
        if isinstance(a, (list, tuple)):
            return type(a)(extern_arg(x) for x in a)
        return a

    for n in main.nodes:
        if n.op == "loops::buffer":
            v = n.outputs[0]
            lp.buffers[v.name] = buffer_of(v, False)
            names[v] = v.name
        elif n.op == "loops::view":
            kw = n.kwargs
            views[n.outputs[0]] = TensorArg(names[n.args[0]], tuple(exprs.as_expr(s) for s in kw["size"]),
                                            tuple(exprs.as_expr(s) for s in kw["stride"]), exprs.as_expr(kw["offset"]))
        elif n.op == "loops::kernel":
            kw = n.kwargs
            kernel_nodes = []
            for ref, vm, stage in zip(kw["nodes"], kw["var_maps"], kw["stages"]):
                node = _body_from_graph(program.graphs[ref.name])
                body_vars = node.body.vars + node.body.reduction_vars
                kernel_nodes.append(KernelNode(node, dict(zip(body_vars, (exprs.parse(s.expr) for s in vm))), stage))
                lp.nodes.append(node)
            steps.append(Kernel(kw["name"], kernel_nodes, [exprs.as_expr(s) for s in kw["xsizes"]],
                                [exprs.as_expr(s) for s in kw["rsizes"]], set(kw["internal"])))
        elif n.op == "loops::extern":
            kw = n.kwargs
            ext = ExternNode(kw["name"], _extern_op(kw["op"], trusted), tuple(extern_arg(kw["args"])),
                             dict(zip(kw["kwarg_names"], (extern_arg(v) for v in kw["kwarg_values"]))),
                             [names[w] for w in kw["writes"]], kw["kind"], dict(n.meta.get("loops.meta") or {}),
                             kw.get("positions"))
            lp.nodes.append(ext)
            steps.append(ext)
        else:
            raise IRError(f"the loops call list cannot hold {n.op}")
    outs = [names[o] if isinstance(o, Value) else Constant(exprs.parse(o.expr) if isinstance(o, SymExpr) else o)
            for o in main.outputs]
    lp.nodes.append(OutputBufferNode("output", outs))
    decisions = [Decision(**d) for d in program.metadata.get("loops.decisions", [])]
    return ScheduledProgram(lp, steps, plan_memory(lp, steps), decisions)
