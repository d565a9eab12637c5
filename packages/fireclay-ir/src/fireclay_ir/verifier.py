"""The verifier: is a program well formed, and does every node agree with its dialect?

Checks, per graph: values are defined once, before use, inside the graph that reads them;
names are unique; sub-graph references resolve; every op is known to its dialect's registry
and passes that dialect's own checks (aten arguments against schemas, hop sub-graph arity);
tensor values carry TensorMeta. Errors show the offending node with the lines around it, in
the printer's text form.

Stages call :func:`check_boundary` when they hand a program on; it verifies only in debug mode
(``FIRECLAY_VERIFY=1`` in the environment, or :func:`verify_at_boundaries(True)`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from fireclay_ir.config import config
from fireclay_ir.model import (
    Device,
    DType,
    Graph,
    GraphRef,
    IRError,
    Layout,
    MemoryFormat,
    Node,
    Program,
    ScalarType,
    SymExpr,
    TensorMeta,
    Value,
)

WINDOW = 4  # lines of context shown on each side of the offending node


class VerificationError(IRError):
    """A program breaks an IR rule; ``node`` and ``graph`` say where (when known)."""

    def __init__(self, message: str, node: Node | None = None, graph: Graph | None = None):
        super().__init__(message)
        self.node = node
        self.graph = graph


_ATOMS = (type(None), bool, int, float, complex, str, type(Ellipsis), SymExpr, DType, Device, Layout,
          MemoryFormat, GraphRef)


def verify(program: Program) -> Program:
    """Raise :class:`VerificationError` for the first broken rule; return ``program`` when fine."""
    from fireclay_ir.dialects import get_dialect

    if program.entry not in program.graphs:
        raise VerificationError(f"entry graph {program.entry!r} is not among the graphs "
                                f"{sorted(program.graphs)}")
    owner: dict[int, str] = {}
    for gname, graph in program.graphs.items():
        if graph.name != gname:
            raise VerificationError(f"graph stored as {gname!r} is named {graph.name!r}", graph=graph)
        for v in graph.values():
            if id(v) in owner:
                raise VerificationError(f"value %{v.name} of graph {gname!r} also belongs to graph "
                                        f"{owner[id(v)]!r}", graph=graph)
            owner[id(v)] = gname
    for graph in program.graphs.values():
        _verify_graph(program, graph, get_dialect)
    return program


def _fail(graph: Graph, node: Node | None, message: str) -> VerificationError:
    where = f"graph {graph.name!r}"
    if node is not None:
        src = node.source
        if src:
            where += f", from {src.get('file', '?')}:{src.get('line', '?')}: {str(src.get('text', '')).strip()}"
        text = render_window(graph, node)
        return VerificationError(f"{message}\n  in {where}\n{text}", node, graph)
    return VerificationError(f"{message}\n  in {where}", None, graph)


def _verify_graph(program: Program, graph: Graph, get_dialect: Callable[[str], Any]) -> None:
    defined: set[int] = set()
    names: set[str] = set()

    def define(v: Value, node: Node | None) -> None:
        if v.name in names:
            raise _fail(graph, node, f"value name %{v.name} is defined twice")
        names.add(v.name)
        defined.add(id(v))
        _check_value_type(graph, node, v)

    if len(graph.inputs) != len(graph.input_specs):
        raise _fail(graph, None, f"{len(graph.inputs)} inputs but {len(graph.input_specs)} input specs")
    for v, spec in zip(graph.inputs, graph.input_specs):
        if v.node is not None:
            raise _fail(graph, None, f"input %{v.name} claims to be produced by {v.node!r}")
        if spec.target is not None and spec.target not in program.weights:
            raise _fail(graph, None, f"input %{v.name} is the {spec.kind} {spec.target!r}, "
                                     "which Program.weights does not hold")
        define(v, None)
    for node in graph.nodes:
        if node.graph is not graph:
            raise _fail(graph, node, "node is listed in this graph but belongs to another")
        for v in _values_in(node.args, node.kwargs):
            if id(v) not in defined:
                where = "later in this graph" if v.node is not None and v.node.graph is graph else \
                    "in no visible place (another graph, or erased)"
                raise _fail(graph, node, f"reads %{v.name} before it is defined (it is defined {where})")
            if node not in v._users:
                raise _fail(graph, node, f"use-def links are stale: %{v.name} does not list this "
                                         "reader (mutate nodes with Graph.set_args)")
        _check_atoms(graph, node, node.args)
        for key, value in node.kwargs.items():
            if not isinstance(key, str) or not key.isidentifier():
                raise _fail(graph, node, f"keyword argument name {key!r} is not an identifier")
            _check_atoms(graph, node, value)
        for ref in _graph_refs((node.args, node.kwargs)):
            if ref.name not in program.graphs:
                raise _fail(graph, node, f"refers to graph {ref.name!r}, which the program does not have")
            if ref.name == graph.name:
                raise _fail(graph, node, f"graph {graph.name!r} refers to itself")
        try:
            dialect = get_dialect(node.dialect)
            op = dialect.lookup(node.target)
        except IRError as exc:
            raise _fail(graph, node, str(exc)) from None
        problems = dialect.verify_node(node, op, program)
        if problems:
            raise _fail(graph, node, "; ".join(problems))
        for i, out in enumerate(node.outputs):
            if out.node is not node or out.index != i:
                raise _fail(graph, node, f"output %{out.name} does not point back at its node/index")
            define(out, node)
    for v in _values_in(graph.outputs, None):
        if id(v) not in defined:
            raise _fail(graph, None, f"graph output %{v.name} is not defined in graph {graph.name!r}")


def _values_in(args: Any, kwargs: Any) -> Iterator[Value]:
    from fireclay_ir.model import iter_values

    yield from iter_values(args)
    if kwargs:
        yield from iter_values(kwargs)


def _graph_refs(arg: Any) -> Iterator[GraphRef]:
    if isinstance(arg, GraphRef):
        yield arg
    elif isinstance(arg, (list, tuple)):
        for a in arg:
            yield from _graph_refs(a)
    elif isinstance(arg, dict):
        for a in arg.values():
            yield from _graph_refs(a)


def _check_atoms(graph: Graph, node: Node, arg: Any) -> None:
    if isinstance(arg, (list, tuple)):
        for a in arg:
            _check_atoms(graph, node, a)
    elif isinstance(arg, slice):
        for a in (arg.start, arg.stop, arg.step):
            _check_atoms(graph, node, a)
    elif not isinstance(arg, (Value, *_ATOMS)):
        raise _fail(graph, node, f"argument {arg!r} of type {type(arg).__name__} is not an IR value")


def _check_value_type(graph: Graph, node: Node | None, v: Value) -> None:
    if not isinstance(v.type, (TensorMeta, ScalarType)):
        raise _fail(graph, node, f"%{v.name} has no type (TensorMeta or ScalarType), got {v.type!r}")


# --------------------------------------------------------------------------- rendering


def _simple_lines(graph: Graph) -> tuple[list[str], dict[int, int]]:
    """One line per node; used when the printer cannot render the graph."""
    lines = [f"graph {graph.name}({', '.join('%' + v.name for v in graph.inputs)}):"]
    where: dict[int, int] = {}
    for node in graph.nodes:
        outs = ", ".join(f"%{o.name}" for o in node.outputs)
        args = ", ".join([repr(a) for a in node.args] + [f"{k}={v!r}" for k, v in node.kwargs.items()])
        where[id(node)] = len(lines)
        lines.append(f"  {outs + ' = ' if outs else ''}{node.op}({args})")
    lines.append(f"  return {graph.outputs!r}")
    return lines, where


def _printed_lines(graph: Graph, node: Node) -> tuple[list[str], int] | None:
    try:
        from fireclay_ir.printer import INDENT, format_node, graph_lines
    except ImportError:
        return None
    try:
        lines = graph_lines(graph)
        target = INDENT + format_node(node)
    except Exception:  # a graph broken enough to fail verification may not print
        return None
    for i, line in enumerate(lines):
        if line == target:
            return lines, i
    return None


def render_window(graph: Graph, node: Node, window: int = WINDOW) -> str:
    """The node's line with ``window`` lines either side, the node's marked with ``>>``."""
    printed = _printed_lines(graph, node)
    if printed is None:
        lines, where = _simple_lines(graph)
        at = where.get(id(node))
        if at is None:
            return "  (node not in the graph's node list)"
    else:
        lines, at = printed
    lo, hi = max(0, at - window), min(len(lines), at + window + 1)
    return "\n".join((">> " if i == at else "   ") + lines[i] for i in range(lo, hi))


# --------------------------------------------------------------------------- debug mode

def verify_at_boundaries(enable: bool | None = None) -> bool:
    """Whether stages verify programs they hand on (``fireclay_ir.config.verify``, from
    ``FIRECLAY_VERIFY``); pass a bool to switch it for the process."""
    if enable is not None:
        config.verify = bool(enable)
    return bool(config.verify)


def check_boundary(program: Program, stage: str) -> Program:
    """Verify ``program`` as ``stage`` hands it on, when boundary verification is on."""
    if verify_at_boundaries():
        try:
            verify(program)
        except VerificationError as exc:
            raise VerificationError(f"{stage} produced an invalid program: {exc}", exc.node, exc.graph) from None
    return program
