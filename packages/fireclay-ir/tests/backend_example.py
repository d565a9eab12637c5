"""A custom backend written only against fireclay-ir's public API (docs/writing-a-backend.md).

Two backends for aten-dialect programs, standard library only:

* ``count_flops(program)`` — a cost model: walks the entry graph and counts floating-point
  operations from each node's result types, evaluating symbolic sizes at their hints;
* ``compile_to_lists(program)`` — an executor: turns the graph into a Python closure that runs
  on nested lists, for the handful of ops it supports, and refuses the rest up front.
"""

from __future__ import annotations

import math

from fireclay_ir import Program, TensorMeta
from fireclay_ir.dialects import lookup_op
from fireclay_ir.interpreter import evaluate_symexpr
from fireclay_ir.passes import PassManager, common_subexpression_elimination, dead_code_elimination
from fireclay_ir.verifier import verify

# ---------------------------------------------------------------- 1. a cost model

POINTWISE_FLOPS = {"aten::add.Tensor": 1, "aten::mul.Tensor": 1, "aten::relu.default": 1,
                   "aten::sigmoid.default": 4, "aten::gelu.default": 8}


def numel(meta: TensorMeta, hints: dict[str, int]) -> int:
    """Elements of a tensor; symbolic sizes (``"s0"``, ``"2*s0"``) take their hints."""
    return math.prod(d if isinstance(d, int) else evaluate_symexpr(d, hints) for d in meta.shape)


def count_flops(program: Program) -> dict[str, int]:
    """FLOPs per op of the entry graph, at the symbols' hints."""
    verify(program)  # backends should refuse malformed input early and clearly
    hints = {name: s.hint for name, s in program.symbols.items() if s.hint is not None}
    flops: dict[str, int] = {}
    for node in program.main.nodes:
        op = lookup_op(node.op)  # raises for ops no registry knows
        if node.op in ("aten::mm.default", "aten::addmm.default"):
            a, b = (v.meta for v in node.inputs()[-2:])
            m, k = (numel(TensorMeta(a.dtype, (d,)), hints) for d in a.shape)
            n = numel(TensorMeta(b.dtype, (b.shape[1],)), hints)
            cost = 2 * m * k * n
        elif node.op in POINTWISE_FLOPS:
            cost = POINTWISE_FLOPS[node.op] * numel(node.outputs[0].meta, hints)
        elif op.is_view or not op.returns:
            cost = 0
        else:
            raise NotImplementedError(f"no cost rule for {node.op}")
        flops[node.op] = flops.get(node.op, 0) + cost
    return flops


# ---------------------------------------------------------------- 2. an executor


def _zip(f, a, b):
    if isinstance(a, list):
        return [_zip(f, x, y if isinstance(b, list) else b) for x, y in zip(a, b if isinstance(b, list) else a)]
    return f(a, b)


def _map(f, a):
    return [_map(f, x) for x in a] if isinstance(a, list) else f(a)


def _mm(a, b):
    return [[sum(x * y for x, y in zip(row, col)) for col in zip(*b)] for row in a]


LIST_KERNELS = {
    "aten::add.Tensor": lambda a, b, alpha=1: _zip(lambda x, y: x + alpha * y, a, b),
    "aten::mul.Tensor": lambda a, b: _zip(lambda x, y: x * y, a, b),
    "aten::relu.default": lambda a: _map(lambda x: max(x, 0.0), a),
    "aten::sigmoid.default": lambda a: _map(lambda x: 1.0 / (1.0 + math.exp(-x)), a),
    "aten::mm.default": _mm,
    "aten::t.default": lambda a: [list(col) for col in zip(*a)],
}


def compile_to_lists(program: Program):
    """A Python callable running ``program`` on nested lists."""
    program = PassManager([common_subexpression_elimination, dead_code_elimination]).run(program)
    verify(program)
    graph = program.main
    unsupported = sorted({n.op for n in graph.nodes if n.op not in LIST_KERNELS})
    if unsupported:
        raise NotImplementedError(f"the list backend cannot run {', '.join(unsupported)}")
    steps = [(LIST_KERNELS[n.op], n) for n in graph.nodes]

    def run(*inputs):
        env = dict(zip(graph.inputs, inputs))

        def value(a):
            return env[a] if a in env else a

        for kernel, node in steps:
            args = [value(a) for a in node.args]
            kwargs = {k: value(v) for k, v in node.kwargs.items()}
            env[node.outputs[0]] = kernel(*args, **kwargs)
        return tuple(value(o) for o in graph.outputs)

    return run
