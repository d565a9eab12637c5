"""Compile the backward for the memory layouts its inputs really have.

The partitioner types the backward's inputs with the strides the joint trace saw. What arrives
at run time is whatever the compiled forward returned (a code generator may hand a saved view
back as a compact copy, or the other way round) and tangents made contiguous. A backward
compiled for other strides than those would copy each such input into its compiled layout on
every call. So the backward is compiled at its first call, with its inputs' types rewritten to
the strides of the tensors it is then given (storage offset 0: the tensor's first element is
its origin). Later calls with other layouts stay correct: the compiled code conforms them, as
before.

An input whose storage a graph reads directly (``as_strided`` and its kin, on the input or on
anything computed from it) keeps its traced layout: there a different stride would change what
is read, not only how fast. The graph's other inputs still take the layouts they arrive in (a
Swin backward's ``as_strided`` of a zero-filled gradient buffer pinned every saved activation to
its traced layout, a copy of each on every call).

A forward compiler may return a callable that runs a stand-in (the interpreter) while its
kernels compile in the background, and exposes ``settled()``: False until a call has run the
code it keeps for good. The layouts the backward then sees come from the stand-in, not from the
compiled forward, so until the forward has settled the backward runs in this package's executor
and is not compiled; its first call after that compiles it for the layouts the settled forward
produces.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import torch

from fireclay_autograd.executor import run_program
from fireclay_ir import Graph, Program, TensorMeta, Value, map_values

# Ops whose result depends on the strides of their input, not only on its values.
STORAGE_OPS: frozenset[str] = frozenset({
    "aten::as_strided.default", "aten::as_strided_.default", "aten::as_strided_scatter.default",
    "aten::as_strided_copy.default",
})

Compiler = Callable[[Program, list[torch.Tensor]], Callable[..., Sequence[Any]]]


def _contiguous(shape: Sequence[int]) -> tuple[int, ...]:
    strides, step = [], 1
    for n in reversed(shape):
        strides.append(step)
        step *= max(int(n), 1)
    return tuple(reversed(strides))


def retypes(meta: TensorMeta, t: Any) -> TensorMeta | None:
    """``meta`` with the strides of tensor ``t`` (storage offset 0) when ``t`` has the same dtype,
    device type and static shape but other strides or offset; else None (nothing to change)."""
    if not isinstance(t, torch.Tensor) or not meta.is_static:
        return None
    if tuple(t.shape) != tuple(meta.shape) or t.dtype.is_complex:
        return None
    traced = meta.strides if meta.strides is not None else _contiguous(meta.shape)
    # (exact strides, those of extent-1 dims included: compiled code takes its fast path only then)
    if tuple(t.stride()) == tuple(traced) and meta.storage_offset == 0:
        return None
    if any(s < 0 for s in t.stride()):
        return None  # (library kernels take non-negative strides only)
    return meta.with_(strides=tuple(int(s) for s in t.stride()), storage_offset=0)


def storage_read_inputs(graph: Graph) -> set[Value]:
    """The inputs of ``graph`` a storage-reading op depends on: those it reads, directly or
    through any op computed from them (a computed buffer may take its layout from its inputs)."""
    producer = {out: node for node in graph.nodes for out in node.outputs}
    pinned: set[Value] = set()
    seen: set[Value] = set()
    stack = [v for n in graph.nodes if n.op in STORAGE_OPS for v in n.inputs()]
    while stack:
        v = stack.pop()
        if v in seen:
            continue
        seen.add(v)
        node = producer.get(v)
        if node is None:
            pinned.add(v)
        else:
            stack.extend(node.inputs())
    return pinned


def with_input_layouts(program: Program, inputs: Sequence[Any]) -> Program:
    """``program`` with its entry graph's input types given the layouts of ``inputs`` (see the
    module docstring); ``program`` itself when no input differs except those whose storage the
    graph reads."""
    graph = program.main
    if len(inputs) != len(graph.inputs):
        return program
    pinned = storage_read_inputs(graph)
    types = [retypes(v.meta, x) if v.is_tensor and v not in pinned else None for v, x in zip(graph.inputs, inputs)]
    if all(t is None for t in types):
        return program
    new = Graph(graph.name)
    env: dict[Value, Value] = {}
    for v, t in zip(graph.inputs, types):
        env[v] = new.add_input(v.name, t or v.type, graph.input_spec(v))
    for node in graph.nodes:
        copy = new.copy_node(node, env.__getitem__)
        env.update(zip(node.outputs, copy.outputs))
    new.set_outputs(map_values(list(graph.outputs), env.__getitem__))
    graphs = dict(program.graphs)
    graphs[graph.name] = new
    return dataclasses.replace(program, graphs=graphs)


class BackwardAtFirstCall:
    """A backward compiled on its first call for the layouts of that call's inputs (its first
    call after ``forward`` settled, when the forward has a ``settled()``: see the module docstring)."""

    def __init__(self, compiler: Compiler, program: Program, examples: Callable[[Program], list[torch.Tensor]],
                 forward: Any = None):
        self.compiler = compiler
        self.program = program  # as traced
        self.examples = examples
        self.compiled_program: Program | None = None  # what was compiled, once it was
        self._fn: Callable[..., Sequence[Any]] | None = None
        self._forward_settled: Callable[[], bool] | None = getattr(forward, "settled", None)
        self.interpreted_calls = 0  # calls run in the executor while the forward had not settled

    def __call__(self, *inputs: Any) -> Sequence[Any]:
        fn = self._fn
        if fn is None:
            if self._forward_settled is not None and not self._forward_settled():
                self.interpreted_calls += 1
                return run_program(self.program, *inputs)
            program = with_input_layouts(self.program, inputs)
            fn = self._fn = self.compiler(program, self.examples(program))
            self.compiled_program = program
        return fn(*inputs)
