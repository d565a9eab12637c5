"""The ``hop`` dialect: higher-order ops whose arguments include sub-graphs.

Conventions (checked by :meth:`HopDialect.verify_node`, run by the interpreter):

* ``hop::cond(pred, true_graph, false_graph, operands)`` — ``pred`` a bool scalar or a
  one-element tensor; both GraphRefs take ``len(operands)`` inputs and return as many values
  as the node has outputs.
* ``hop::while_loop(cond_graph, body_graph, carried, additional)`` — both graphs take
  ``len(carried) + len(additional)`` inputs (carried first); ``cond_graph`` returns one bool
  (scalar or one-element tensor), ``body_graph`` returns ``len(carried)`` new carried values; the
  node's outputs are the final carried values.
* ``hop::checkpoint(body, operands)`` — ``body`` takes ``len(operands)`` inputs; its outputs
  are the node's outputs. Its activations are recomputed in the backward instead of saved; as
  a forward computation it is just a call, and the inlining pass may flatten it.
"""

from __future__ import annotations

from typing import Any

from fireclay_ir.dialects.registry import Argument, Dialect, OpDef, Return
from fireclay_ir.model import Graph, GraphRef, Node, Program

_SUBGRAPH = "Graph"
_LIST = "Any[]"

HOP_OPS: dict[str, tuple[tuple[Argument, ...], str]] = {
    "cond": ((Argument("pred", "Scalar"), Argument("true_graph", _SUBGRAPH),
              Argument("false_graph", _SUBGRAPH), Argument("operands", _LIST)),
             "if pred: true_graph(*operands) else false_graph(*operands)"),
    "while_loop": ((Argument("cond_graph", _SUBGRAPH), Argument("body_graph", _SUBGRAPH),
                    Argument("carried", _LIST), Argument("additional", _LIST, default=[])),
                   "while cond_graph(*carried, *additional): carried = body_graph(*carried, *additional)"),
    "checkpoint": ((Argument("body", _SUBGRAPH), Argument("operands", _LIST)),
                   "body(*operands), recomputed in the backward"),
}


def bind_arguments(target: str, args: Any, kwargs: dict[str, Any]) -> dict[str, Any]:
    """Arguments of hop op ``target`` by name (positional or keyword), defaults filled in."""
    params, _ = HOP_OPS[target]
    bound: dict[str, Any] = {p.name: a for p, a in zip(params, args)}
    bound.update(kwargs)
    for p in params:
        if p.name not in bound and p.has_default:
            bound[p.name] = list(p.default)
    return bound


def bind(node: Node) -> dict[str, Any]:
    """A hop node's arguments by name."""
    return bind_arguments(node.target, node.args, node.kwargs)


class HopDialect(Dialect):
    def __init__(self) -> None:
        super().__init__("hop", "1")
        for name, (params, doc) in HOP_OPS.items():
            self.register(OpDef(dialect="hop", name=name, arguments=params,
                                returns=(Return(None, "Any[]"),), doc=doc))

    def verify_node(self, node: Node, op: OpDef, program: Program) -> list[str]:
        params, _ = HOP_OPS[node.target]
        names = {p.name for p in params}
        problems = [f"{node.op} has no argument {k!r}" for k in node.kwargs if k not in names]
        if len(node.args) > len(params):
            problems.append(f"{node.op} takes {len(params)} arguments, got {len(node.args)}")
        if problems:
            return problems
        bound = bind(node)
        for p in params:
            if p.name not in bound:
                problems.append(f"{node.op} is missing argument {p.name!r}")
            elif p.type == _SUBGRAPH and not isinstance(bound[p.name], GraphRef):
                problems.append(f"{node.op} argument {p.name!r} must be a GraphRef, got {bound[p.name]!r}")
            elif p.type == _LIST and not isinstance(bound[p.name], (list, tuple)):
                problems.append(f"{node.op} argument {p.name!r} must be a list, got {bound[p.name]!r}")
        if problems:
            return problems

        def graph(ref: GraphRef) -> Graph | None:
            return program.graphs.get(ref.name)

        def arity(ref: GraphRef, n_in: int, n_out: int | None, role: str) -> None:
            g = graph(ref)
            if g is None:
                return  # the SSA check reports dangling references
            if len(g.inputs) != n_in:
                problems.append(f"{node.op} {role} graph {ref.name!r} takes {len(g.inputs)} inputs, "
                                f"expected {n_in}")
            if n_out is not None and len(g.outputs) != n_out:
                problems.append(f"{node.op} {role} graph {ref.name!r} returns {len(g.outputs)} values, "
                                f"expected {n_out}")

        n_out = len(node.outputs)
        if node.target == "cond":
            arity(bound["true_graph"], len(bound["operands"]), n_out, "true")
            arity(bound["false_graph"], len(bound["operands"]), n_out, "false")
        elif node.target == "while_loop":
            n_in = len(bound["carried"]) + len(bound["additional"])
            arity(bound["cond_graph"], n_in, 1, "cond")
            arity(bound["body_graph"], n_in, len(bound["carried"]), "body")
            if n_out != len(bound["carried"]):
                problems.append(f"{node.op} defines {n_out} outputs but carries {len(bound['carried'])} values")
        elif node.target == "checkpoint":
            arity(bound["body"], len(bound["operands"]), n_out, "body")
        return problems
