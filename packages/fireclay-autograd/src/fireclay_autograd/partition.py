"""Cut a joint forward/backward graph into a forward graph and a backward graph.

What the forward hands the backward (the *saved tensors*) is chosen by a minimum cut, as in
the PyTorch 2 paper's rematerialization: every tensor value ``v`` becomes an edge
``v_in -> v_out`` whose capacity is its size in bytes (the price of keeping it), its uses are
edges of infinite capacity, the forward's inputs and everything the forward must compute
anyway hang from the source, and everything that depends on a tangent hangs from the sink.
A minimum source/sink cut is then the cheapest set of tensors whose saving lets the backward
compute what it needs, recomputing the rest from them.

Only cheap ops may be recomputed: pointwise ops, views and a few others in
:data:`RECOMPUTABLE_OPS`. Anything else (matmuls, convolutions, reductions, random ops) is
pinned to the forward side, so the cut can only save it, never redo it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import networkx as nx
import torch

from fireclay_autograd.convert import nbytes
from fireclay_autograd.executor import aten_overload
from fireclay_ir import Graph, IRError, Node, Program, Value, iter_values, map_values

# Non-pointwise ops cheap enough to recompute in the backward rather than save. A scatter into a
# filled tensor is how a loss's backward spells a one-hot (nll_loss: -1 at each target): as large
# as the logits, but made from the targets alone.
RECOMPUTABLE_OPS: frozenset[str] = frozenset({
    "aten::scatter.value", "aten::scatter.src",
    "aten::view.default", "aten::alias.default", "aten::permute.default", "aten::expand.default",
    "aten::slice.Tensor", "aten::select.int", "aten::unsqueeze.default", "aten::squeeze.dim",
    "aten::squeeze.dims", "aten::diagonal.default", "aten::as_strided.default", "aten::clone.default",
    "aten::_to_copy.default", "aten::full.default", "aten::full_like.default", "aten::scalar_tensor.default",
    "aten::empty.memory_format", "aten::zeros_like.default", "aten::ones_like.default",
    "aten::split_with_sizes.default", "aten::split.Tensor", "aten::unbind.int",
})


# Ops whose result is a view of their input: the same bytes as the base, so saving the base costs
# as much. Ties go to the base, with the view redone in the backward: a saved view (a transposed
# weight, say) reaches the backward in whatever layout the forward's code generator gave it, and
# a backward compiled for the view's strides would have to copy it on every call.
VIEW_OPS: frozenset[str] = frozenset({
    "aten::view.default", "aten::alias.default", "aten::permute.default", "aten::expand.default",
    "aten::slice.Tensor", "aten::select.int", "aten::unsqueeze.default", "aten::squeeze.dim",
    "aten::squeeze.dims", "aten::diagonal.default", "aten::as_strided.default", "aten::t.default",
    "aten::transpose.int", "aten::split_with_sizes.default", "aten::split.Tensor", "aten::unbind.int",
})
_VIEW_PENALTY = 1.05


def is_recomputable(op: str) -> bool:
    """Whether the partitioner may redo ``op`` in the backward instead of saving its result."""
    if op in RECOMPUTABLE_OPS:
        return True
    try:
        overload = aten_overload(op)
    except IRError:
        return False
    tags = overload.tags
    return torch.Tag.pointwise in tags and torch.Tag.nondeterministic_seeded not in tags


@dataclass
class SavedTensor:
    """One tensor the forward keeps for the backward: its value name and size."""

    name: str
    nbytes: int


@dataclass
class Partition:
    """The forward and backward halves of a joint graph.

    ``forward`` (graph ``forward``) takes the joint graph's forward inputs and returns its
    forward outputs followed by the ``saved`` tensors. ``backward`` (graph ``backward``) takes
    the saved tensors followed by the tangents and returns the joint graph's backward outputs.
    ``recomputed`` lists the ops of the forward part that the backward redoes.
    """

    forward: Program
    backward: Program
    saved: list[SavedTensor]
    recomputed: list[str] = field(default_factory=list)

    @property
    def saved_bytes(self) -> int:
        return sum(s.nbytes for s in self.saved)


def partition(joint: Graph, num_forward_inputs: int, num_forward_outputs: int, *,
              strategy: str = "min_cut", hints: dict[str, int] | None = None) -> Partition:
    """Split ``joint`` whose first ``num_forward_inputs`` inputs are the forward's (the rest are
    tangents) and whose first ``num_forward_outputs`` outputs are the forward's (the rest are
    gradients). ``strategy`` is ``"min_cut"`` or ``"save_all"`` (keep every forward
    intermediate the backward reads: the naive baseline). ``hints``: symbol values at which
    symbolic sizes are weighed."""
    hints = hints or {}
    primals = joint.inputs[:num_forward_inputs]
    tangents = joint.inputs[num_forward_inputs:]
    fw_outputs = joint.outputs[:num_forward_outputs]
    bw_outputs = joint.outputs[num_forward_outputs:]

    tangent_dependent = _descendants(joint, tangents)
    fw_required = _ancestors(joint, list(iter_values(fw_outputs)))
    if strategy == "min_cut":
        saved = _min_cut(joint, primals, tangent_dependent, fw_required, list(iter_values(bw_outputs)), hints,
                         returned=set(iter_values(fw_outputs)))
    elif strategy == "save_all":
        saved = _save_all(joint, tangent_dependent, list(iter_values(bw_outputs)))
    else:
        raise ValueError(f"unknown partition strategy {strategy!r}; use 'min_cut' or 'save_all'")
    # Keep a deterministic order: graph order of the values.
    order = {v: i for i, v in enumerate(joint.values())}
    saved = sorted(saved, key=order.__getitem__)

    forward = _extract(joint, "forward", primals, list(fw_outputs) + saved)
    # Outputs only the backward reads: a code generator may return them in the layout it
    # computed them in, since the backward is compiled for the layouts it receives (layouts.py).
    forward.meta["autograd.saved_outputs"] = list(range(len(fw_outputs), len(fw_outputs) + len(saved)))
    # The backward's inputs are all handed over at run time (saved tensors, tangents), even
    # where a saved tensor is a parameter: they are plain inputs there.
    backward = _extract(joint, "backward", saved + tangents, list(bw_outputs), keep_specs=False)
    recomputed = [n.op for n in backward.nodes if n.meta.get("autograd.phase") == "forward"]
    return Partition(
        Program.single(forward), Program.single(backward),
        [SavedTensor(v.name, nbytes(v.meta, hints)) for v in saved], recomputed,
    )


def _descendants(graph: Graph, roots: list[Value]) -> set[Value]:
    reached: set[Value] = set(roots)
    for node in graph.nodes:
        if any(v in reached for v in node.inputs()):
            reached.update(node.outputs)
    return reached


def _ancestors(graph: Graph, roots: list[Value], stop: set[Value] | frozenset = frozenset()) -> set[Value]:
    """Values that ``roots`` are computed from, not looking past the ``stop`` values."""
    needed: set[Value] = set(roots)
    for node in reversed(graph.nodes):
        if any(o in needed and o not in stop for o in node.outputs):
            needed.update(node.outputs)
            needed.update(node.inputs())
    return needed


def _min_cut(graph: Graph, primals: list[Value], tangent_dependent: set[Value], fw_required: set[Value],
             bw_outputs: list[Value], hints: dict[str, int], returned: set[Value]) -> list[Value]:
    flow = nx.DiGraph()
    primal_set = set(primals)
    bw_needed = _ancestors(graph, bw_outputs)

    def add_value(v: Value, pinned_forward: bool, view: bool = False) -> None:
        # A value the forward computes anyway costs only its bytes to keep; one the forward
        # would compute just to save it costs a little more, so ties go to recomputing it. One
        # the forward returns is held by its caller too: of two equal sizes, that one is kept.
        penalty = 1.0 if (v in fw_required or v in primal_set) else 1.1
        if v in returned:
            penalty = 0.9
        if view:
            penalty *= _VIEW_PENALTY
        flow.add_edge(("in", v), ("out", v), capacity=float(max(nbytes(v.meta, hints), 1)) * penalty)
        if pinned_forward:
            flow.add_edge("source", ("in", v))
        if v in tangent_dependent or v in bw_outputs:
            flow.add_edge(("in", v), "sink")

    for v in primals:
        if v.is_tensor and v in bw_needed:
            add_value(v, True)
    readers = _readers(graph)
    for node in graph.nodes:
        tensors = [o for o in node.outputs if o.is_tensor and o in bw_needed]
        if not tensors:
            continue
        pinned = not is_recomputable(node.op) and not any(o in tangent_dependent for o in node.outputs)
        for o in tensors:
            # A value the forward computes anyway and the backward must hold in memory (a matmul
            # reads it) is saved: redoing it would write it out a second time in the backward.
            kept = pinned or (o in fw_required and node.op not in VIEW_OPS
                              and _materialized_in_backward(o, readers, fw_required))
            add_value(o, kept and o not in tangent_dependent, view=node.op in VIEW_OPS)
            for u in node.inputs():
                if u.is_tensor and u in bw_needed:
                    flow.add_edge(("out", u), ("in", o))
    if "sink" not in flow or "source" not in flow:
        return []
    try:
        _, (reachable, _) = nx.minimum_cut(flow, "source", "sink")
    except nx.NetworkXUnbounded:
        raise IRError("the backward needs a value the forward cannot provide; this is a fireclay bug") from None
    saved = []
    for u, v in flow.edges:
        if u in reachable and v not in reachable and isinstance(u, tuple) and u[0] == "in":
            saved.append(u[1])
    return saved


def _readers(graph: Graph) -> dict[Value, list[Node]]:
    """Value -> the nodes that read it, in graph order."""
    readers: dict[Value, list[Node]] = {}
    for node in graph.nodes:
        for v in node.inputs():
            readers.setdefault(v, []).append(node)
    return readers


# Ops every code generator hands to a library (matmuls, convolutions, fused attention): they read
# their operands from memory, where a kernel computing a pointwise op or a reduction can compute
# its operands inline.
LIBRARY_OPS: frozenset[str] = frozenset({
    "aten::mm.default", "aten::addmm.default", "aten::bmm.default", "aten::baddbmm.default",
    "aten::convolution.default", "aten::convolution_backward.default",
})


def _read_from_memory(op: str) -> bool:
    """Whether ``op`` reads its operands from memory (a library call), so that a value it reads
    must be materialized."""
    return op in LIBRARY_OPS or op.startswith(("aten::_scaled_dot_product", "aten::_flash_attention",
                                               "aten::_efficient_attention", "aten::_cudnn_attention"))


def _materialized_in_backward(value: Value, readers: dict[Value, list[Node]], fw_required: set[Value]) -> bool:
    """Whether a backward node reads ``value`` (directly or through views) from memory: then
    recomputing it in the backward is not free, it costs a second write of the whole tensor."""
    pending = [value]
    while pending:
        v = pending.pop()
        for node in readers.get(v, ()):
            if node.op in VIEW_OPS:
                pending.extend(node.outputs)
            elif _read_from_memory(node.op) and not all(o in fw_required for o in node.outputs):
                return True
    return False


def _save_all(graph: Graph, tangent_dependent: set[Value], bw_outputs: list[Value]) -> list[Value]:
    """Every non-tangent-dependent value that a tangent-dependent computation reads."""
    bw_needed = _ancestors(graph, bw_outputs)
    saved: dict[Value, None] = {}
    for node in graph.nodes:
        if any(o in tangent_dependent for o in node.outputs) and any(o in bw_needed for o in node.outputs):
            for u in node.inputs():
                if u not in tangent_dependent and u.is_tensor:
                    saved[u] = None
    for v in bw_outputs:
        if v not in tangent_dependent and v.is_tensor:
            saved[v] = None
    return list(saved)


def _extract(graph: Graph, name: str, inputs: list[Value], outputs: list[Any], keep_specs: bool = True) -> Graph:
    """A new graph computing ``outputs`` from ``inputs`` with copies of the needed nodes."""
    needed = _ancestors(graph, list(iter_values(outputs)), set(inputs))
    new = Graph(name)
    env: dict[Value, Value] = {}
    for v in inputs:
        spec = graph.input_spec(v) if keep_specs and v in graph.inputs else None
        env[v] = new.add_input(v.name, v.type, spec)
    inputs_set = set(inputs)
    for node in graph.nodes:
        if not any(o in needed and o not in inputs_set for o in node.outputs):
            continue
        _copy_node(new, node, env)
    new.set_outputs(map_values(list(outputs), lambda v: _lookup(env, v, name)))
    return new


def _copy_node(new: Graph, node: Node, env: dict[Value, Value]) -> None:
    copy = new.copy_node(node, lambda v: _lookup(env, v, new.name))
    for o, out in zip(node.outputs, copy.outputs):
        env.setdefault(o, out)


def _lookup(env: dict[Value, Value], v: Value, graph_name: str) -> Value:
    try:
        return env[v]
    except KeyError:
        raise IRError(f"the {graph_name} graph needs %{v.name}, which it is neither given nor computes") from None
