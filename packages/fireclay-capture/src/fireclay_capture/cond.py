"""``cond(pred, true_fn, false_fn, operands)``: a data-dependent branch kept inside the graph as
one ``hop::cond`` node whose two branches are sub-graphs of the program."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from fireclay_capture.errors import Unsupported
from fireclay_capture.variables.base import ConstVar, Var
from fireclay_capture.variables.containers import ListVar, TupleVar
from fireclay_capture.variables.tensor import TensorVar, meta_of
from fireclay_ir import Graph, GraphRef


def cond(pred: Any, true_fn: Callable, false_fn: Callable, operands: Sequence[Any] = ()) -> Any:
    """``true_fn(*operands)`` if ``pred`` else ``false_fn(*operands)``. Eagerly that is all it
    does; captured, both branches become sub-graphs and ``pred`` may depend on tensor data.
    The branches take tensors only through ``operands``, return tensors (one, or a tuple/list
    of them with the same shapes and dtypes in both), and mutate nothing."""
    return true_fn(*operands) if bool(pred) else false_fn(*operands)


class CondVar(Var):
    """The ``cond`` function (ours or ``torch.cond``) seen by the trace."""

    def __init__(self, fn: Any, source=None):
        self.fn, self.source = fn, source

    def identity(self):
        return self.fn

    def call(self, tx, args: list[Var], kwargs: dict[str, Var]) -> Var:
        names = ["pred", "true_fn", "false_fn", "operands"]
        bound = dict(zip(names, args))
        bound.update(kwargs)
        if set(bound) - set(names) or len(bound) < 3:
            raise Unsupported("cond(pred, true_fn, false_fn, operands) called with other arguments")
        pred, true_fn, false_fn = bound["pred"], bound["true_fn"], bound["false_fn"]
        operands = bound.get("operands", TupleVar([])).unpack(tx)
        if isinstance(pred, ConstVar):  # known at trace time: only one branch exists
            chosen = true_fn if bool(pred.value) else false_fn
            return chosen.call(tx, list(operands), {})
        if not isinstance(pred, TensorVar) or pred.fake.numel() != 1:
            raise Unsupported("cond() needs a bool or a one-element tensor as its predicate")
        tensors = [o for o in operands if isinstance(o, TensorVar)]
        if len(tensors) != len(operands):
            raise Unsupported("cond() operands must be tensors")
        n_subgraphs = len(tx.subgraphs)
        try:
            true_graph, true_out, true_seq = _branch(tx, "true", true_fn, tensors)
            false_graph, false_out, false_seq = _branch(tx, "false", false_fn, tensors)
        except Unsupported:
            del tx.subgraphs[n_subgraphs:]  # a graph break drops the half-made branches
            raise
        if true_seq != false_seq:
            raise Unsupported("one cond() branch returns a tensor, the other a sequence")
        true_metas = [meta_of(v.fake, v.device) for v in true_out]
        false_metas = [meta_of(v.fake, v.device) for v in false_out]
        if [(m.dtype, m.shape) for m in true_metas] != [(m.dtype, m.shape) for m in false_metas]:
            raise Unsupported("cond() branches return tensors of different shapes or dtypes")
        results = tx.graph.call("hop::cond", [pred.value, GraphRef(true_graph.name), GraphRef(false_graph.name),
                                              [o.value for o in tensors]], {}, out=true_metas,
                                meta=tx.node_meta())
        outs = [TensorVar(value, v.fake, v.device) for value, v in zip(results, true_out)]
        return TupleVar(outs) if true_seq else outs[0]


def _branch(tx, which: str, fn: Var, operands: list[TensorVar]) -> tuple[Graph, list[TensorVar], bool]:
    """Trace one branch into its own graph; its inputs stand for the operands."""
    outer = tx.graph
    graph = Graph(f"cond_{which}_{len(tx.subgraphs)}")
    inner_operands: list[Var] = []
    for i, o in enumerate(operands):
        value = graph.add_input(f"operand{i}", meta_of(o.fake, o.device))
        inner_operands.append(TensorVar(value, o.fake, o.device))
    writes_before = tx.side_effects.version
    tx.graph = graph
    try:
        result = fn.call(tx, inner_operands, {})
    finally:
        tx.graph = outer
    if tx.side_effects.version != writes_before:
        raise Unsupported("a cond() branch changes objects outside it (branches must not have side effects)")
    if isinstance(result, TensorVar):
        outs, is_sequence = [result], False
    elif isinstance(result, (TupleVar, ListVar)) and all(isinstance(i, TensorVar) for i in result.items):
        outs, is_sequence = [i for i in result.items if isinstance(i, TensorVar)], True
    else:
        raise Unsupported("a cond() branch must return a tensor or a tuple of tensors")
    own = set(map(id, graph.inputs)) | {id(v) for n in graph.nodes for v in n.outputs}
    for node in graph.nodes:
        if any(id(v) not in own for v in node.inputs()):
            raise Unsupported("a cond() branch reads a tensor it was not given: pass it in operands")
    if any(id(v.value) not in own for v in outs):
        raise Unsupported("a cond() branch returns a tensor it was not given: pass it in operands")
    graph.set_outputs([v.value for v in outs])
    tx.subgraphs.append(graph)
    return graph, outs, is_sequence
