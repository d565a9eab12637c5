"""Trace a torch-dialect program to the aten dialect: forward only, or forward and backward.

:func:`trace_forward` runs the program once on fakes under :class:`AtenTracer` (the inference
path: nothing requires grad). :func:`trace_joint` does the same with grad enabled, then calls
``torch.autograd.grad`` on the differentiable outputs with one *tangent* input per output, still
under the tracer, so torch's own autograd writes the backward into the same graph. Both
results are functionalized.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils import _pytree as pytree

from fireclay_autograd.executor import run_graph
from fireclay_autograd.fake import FakeMode, FakeTensor, mode_for, torch_dim
from fireclay_autograd.functionalize import FunctionalGraph, functionalize
from fireclay_autograd.tracer import AUTOGRAD_META_KEY, CARRIED_META, AtenTracer
from fireclay_ir import Graph, InputSpec, IRError, Node, Program, RunLimits, Value
from fireclay_ir.stages import in_stage


@dataclass
class TracedGraph:
    """A functional aten graph and what the runtime needs to know about it.

    Graph inputs: the program's inputs in order, then lifted ``constants``, then (joint graphs
    only) one tangent per entry of ``tangent_outputs``. Graph outputs: the user outputs,
    the new values of ``functional.mutated_inputs``, then (joint graphs only) one gradient per
    entry of ``grad_inputs``.
    """

    functional: FunctionalGraph
    num_program_inputs: int
    constants: dict[str, torch.Tensor] = field(default_factory=dict)
    tangent_outputs: list[int] = field(default_factory=list)
    grad_inputs: list[int] = field(default_factory=list)
    output_requires_grad: list[bool] = field(default_factory=list)
    mode: FakeMode | None = None  # the trace's fake mode: its ShapeEnv holds the guards taken

    @property
    def graph(self) -> Graph:
        return self.functional.graph

    @property
    def num_forward_inputs(self) -> int:
        return self.num_program_inputs + len(self.constants)


def _start(program: Program, inputs: list[Any], name: str, grad: bool,
           mode: FakeMode | None) -> tuple[AtenTracer, list[Any]]:
    """A tracer over a fresh graph and the fakes of the program's inputs: with ``mode`` (a
    symbolic trace), of the program's input types; without, of the real inputs' sizes."""
    source = program.main
    if len(inputs) != len(source.inputs):
        raise IRError(f"program {program.entry!r} takes {len(source.inputs)} inputs, got {len(inputs)}")
    graph = Graph(name)
    tracer = AtenTracer(graph, mode=mode)
    fakes: list[Any] = []
    for v, spec, x in zip(source.inputs, source.input_specs, inputs):
        if isinstance(x, torch.Tensor):
            meta = v.meta if mode is not None and v.is_tensor and not v.meta.is_static else None
            fakes.append(tracer.add_input(v.name, x, spec, requires_grad=grad and x.requires_grad, meta=meta))
        else:
            raise IRError(f"input %{v.name} must be a tensor here, got {type(x).__name__}")
    return tracer, fakes


def _run(program: Program, tracer: AtenTracer, fakes: list[Any], *, tag_autograd: bool = False,
         limits: RunLimits | None = None) -> list[Any]:
    after = _tag_autograd_nodes if tag_autograd else None
    if tracer.mode.env.symbols:
        symbols: Any = lambda expr: torch_dim(expr, tracer.mode)  # noqa: E731
    else:
        # A static trace of a program with symbolic sizes: they take the inputs' sizes.
        from fireclay_autograd.executor import bind_symbols

        symbols = bind_symbols(program.main, fakes)
    return run_graph(program.main, fakes, on_node=lambda node: tracer.node_meta(node.meta), after_node=after,
                     symbols=symbols, limits=limits)


def _tag_autograd_nodes(node: Node, result: Any) -> None:
    """Label the autograd nodes a torch-dialect node created with its source, so the backward
    ops they later run are attributed to the user's line (see AtenTracer)."""
    carried = {k: node.meta[k] for k in CARRIED_META if k in node.meta}
    if not carried:
        return
    stack = [t.grad_fn for t in pytree.tree_leaves(result) if isinstance(t, torch.Tensor) and t.grad_fn is not None]
    while stack:
        fn = stack.pop()
        if fn is None or AUTOGRAD_META_KEY in fn.metadata:
            continue
        fn.metadata[AUTOGRAD_META_KEY] = carried
        stack.extend(next_fn for next_fn, _ in fn.next_functions)


def _output_values(tracer: AtenTracer, outs: list[Any]) -> list[Any]:
    values = []
    for o in outs:
        if isinstance(o, FakeTensor):
            values.append(o.value)
        elif isinstance(o, torch.Tensor):
            values.append(tracer.lift_constant(o).value)
        elif o is None or isinstance(o, (bool, int, float, str)):
            values.append(o)
        else:
            raise IRError(f"a compiled program cannot return a {type(o).__name__}")
    return values


def trace_forward(program: Program, inputs: list[Any], *, regenerate_aliases: bool = True,
                  mode: FakeMode | None = None, limits: RunLimits | None = None) -> TracedGraph:
    """The inference path: the program as one functional aten graph, no autograd. With
    ``mode`` (see :func:`symbolic_mode`) the graph keeps the program's symbolic sizes;
    ``limits``: the program's nodes are counted against ``limits.max_steps``."""
    with in_stage("aten tracing"):
        tracer, fakes = _start(program, inputs, "forward", grad=False, mode=mode)
        with torch.no_grad(), tracer:
            outs = _run(program, tracer, fakes, limits=limits)
        tracer.graph.set_outputs(_output_values(tracer, outs))
    with in_stage("functionalization"):
        functional = functionalize(tracer.graph, len(outs), regenerate_aliases=regenerate_aliases, mode=tracer.mode)
    return TracedGraph(functional, len(fakes), dict(tracer.constants), output_requires_grad=[False] * len(outs),
                       mode=tracer.mode)


def _is_differentiable(o: Any) -> bool:
    return isinstance(o, FakeTensor) and o.requires_grad and (o.dtype.is_floating_point or o.dtype.is_complex)


def trace_joint(program: Program, inputs: list[Any], *, mode: FakeMode | None = None,
                alias_outputs: bool = True, limits: RunLimits | None = None) -> TracedGraph:
    """Forward and backward in one functional graph (see :class:`TracedGraph` for its layout).

    User outputs that view a common base, as in eager (``y, y.view(-1)``; ``y[0], y[1]``), are
    handed back as views of that base: the base is a differentiable output (added at the end,
    hidden from the user, when it is not one already) and the runtime makes the views outside
    the compiled function, so gradients flow through them as in eager (``alias_outputs``)."""
    with in_stage("aten tracing"):
        joint = _trace_joint(program, inputs, mode, alias_outputs, limits)
    tracer, outs, regenerated = joint.tracer, joint.outputs, joint.regenerated
    with in_stage("functionalization"):
        functional = functionalize(tracer.graph, len(outs), regenerate_aliases=False, mode=tracer.mode,
                                   output_bases=bool(regenerated))
    if any(functional.output_aliases[i] is None for i in regenerated):
        # Functionalization sees the aliasing differently: hand back separate tensors instead.
        return trace_joint(program, inputs, mode=mode, alias_outputs=False, limits=limits)
    functional.num_hidden_outputs = len(outs) - joint.num_user_outputs
    return TracedGraph(
        functional, joint.num_inputs, dict(tracer.constants), joint.tangent_outputs, joint.grad_inputs,
        output_requires_grad=[i in joint.tangent_outputs for i in range(len(outs))], mode=tracer.mode,
    )


@dataclass
class _JointTrace:
    """The joint graph as traced, before functionalization."""

    tracer: AtenTracer
    num_inputs: int
    outputs: list[Any]  # the user's outputs, then hidden bases of outputs remade as views
    num_user_outputs: int
    tangent_outputs: list[int]
    grad_inputs: list[int]
    regenerated: set[int]  # outputs the runtime remakes as views of a hidden base


def _trace_joint(program: Program, inputs: list[Any], mode: FakeMode | None, alias_outputs: bool,
                 limits: RunLimits | None = None) -> _JointTrace:
    tracer, fakes = _start(program, inputs, "joint", grad=True, mode=mode)
    with torch.enable_grad(), tracer, tracer.node_meta({"autograd.phase": "forward"}):
        outs = _run(program, tracer, fakes, tag_autograd=True, limits=limits)
    num_outputs = len(outs)
    regenerated: set[int] = set()
    if alias_outputs:
        hidden, regenerated = _shared_bases(outs, fakes)
        outs = list(outs) + hidden
    out_values = _output_values(tracer, outs)
    tangent_outputs = [i for i, o in enumerate(outs) if _is_differentiable(o) and i not in regenerated]
    grad_inputs = [i for i, f in enumerate(fakes) if isinstance(f, FakeTensor) and f.requires_grad]
    tangents = []
    for i in tangent_outputs:
        o = outs[i]
        example = FakeTensor(torch.empty(o.shape, dtype=o.dtype, device="meta"), o.device, tracer.mode)
        tangents.append(tracer.add_input(f"tangent_{i}", example, InputSpec()))
    grads: list[Any] = [None] * len(grad_inputs)
    if tangent_outputs and grad_inputs:
        with torch.enable_grad(), tracer, tracer.node_meta({"autograd.phase": "backward"}):
            grads = list(torch.autograd.grad(
                [outs[i] for i in tangent_outputs], [fakes[i] for i in grad_inputs], tangents, allow_unused=True,
            ))
    grad_values: list[Value | None] = []
    for g in grads:
        grad_values.append(None if g is None else _output_values(tracer, [g])[0])
    tracer.graph.set_outputs(out_values + grad_values)
    # Program inputs, then lifted constants, then tangents.
    _inputs_in_order(tracer.graph, len(fakes), len(tangents))
    return _JointTrace(tracer=tracer, num_inputs=len(fakes), outputs=outs, num_user_outputs=num_outputs,
                       tangent_outputs=tangent_outputs, grad_inputs=grad_inputs, regenerated=regenerated)


def _shared_bases(outs: list[Any], inputs: list[Any]) -> tuple[list[Any], set[int]]:
    """Bases that several user outputs view (by autograd's view tracking), not inputs: those
    that are not outputs themselves, and the positions of the outputs to remake as views."""
    groups: dict[int, tuple[Any, list[int]]] = {}
    for i, o in enumerate(outs):
        if isinstance(o, FakeTensor):
            base = o._base if o._base is not None else o
            groups.setdefault(id(base), (base, []))[1].append(i)
    hidden: list[Any] = []
    regenerated: set[int] = set()
    for base, members in groups.values():
        if len(members) < 2 or any(base is x for x in inputs) or not _is_differentiable_type(base):
            continue
        if not any(outs[i] is base for i in members):
            hidden.append(base)
        regenerated.update(i for i in members if outs[i] is not base)
    # Two outputs that are the very same tensor: the second is remade from the first.
    seen: dict[int, int] = {}
    for i, o in enumerate(outs):
        if isinstance(o, FakeTensor) and id(o) in seen and _is_differentiable_type(o):
            regenerated.add(i)
        seen.setdefault(id(o), i)
    return hidden, regenerated


def _is_differentiable_type(o: Any) -> bool:
    return o.dtype.is_floating_point or o.dtype.is_complex


def symbolic_mode(program: Program, inputs: list[Any]) -> FakeMode:
    """A fake mode for a symbolic trace of ``program``: its symbols, with the sizes of
    ``inputs`` as hints (so the decisions taken during the trace hold for these inputs)."""
    from fireclay_autograd.executor import bind_symbols

    return mode_for(program, bind_symbols(program.main, inputs))


def _inputs_in_order(graph: Graph, num_program_inputs: int, num_tangents: int) -> None:
    """Program inputs, then lifted constants, then tangents (constants may be lifted before
    the tangents were added, or after, while the backward ran)."""
    n = num_program_inputs
    rest = list(zip(graph.inputs[n:], graph.input_specs[n:]))
    constants = [pair for pair in rest if pair[1].kind == "constant"]
    tangents = [pair for pair in rest if pair[1].kind != "constant"]
    if len(tangents) != num_tangents:
        raise IRError(f"internal: the joint graph has {len(tangents)} tangent inputs, expected {num_tangents}")
    graph.inputs[n:] = [v for v, _ in constants + tangents]
    graph.input_specs[n:] = [spec for _, spec in constants + tangents]
