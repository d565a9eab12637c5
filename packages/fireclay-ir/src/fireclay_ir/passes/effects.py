"""Which nodes may be removed, merged or moved: the side-effect facts passes rely on.

A node is *pure* when its op writes no argument, has no side effect, and is deterministic
(taken from the op's registry entry: aten schemas' alias annotations, the torch dialect's
in-place methods and ``operator.setitem``). Unknown ops are treated as impure. A hop node is
pure when every op in its sub-graphs is.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from fireclay_ir.model import Graph, GraphRef, IRError, Node, Program


def _opdef(node: Node) -> Any:
    from fireclay_ir.dialects import lookup_op

    try:
        return lookup_op(node.op)
    except IRError:
        return None


# Torch-level calls whose effect is on autograd or stream state rather than on a result.
_TORCH_EFFECTS = frozenset({"Tensor.retain_grad", "Tensor.record_stream", "Tensor.requires_grad_",
                            "Tensor.detach_", "Tensor.set_", "Tensor.resize_"})


def has_side_effects(node: Node, program: Program | None = None) -> bool:
    """True when removing the node (even with unused outputs) could change behaviour."""
    op = _opdef(node)
    if op is None:
        return True
    if op.side_effects or op.mutates:
        return True
    if node.dialect == "torch" and (node.target in _TORCH_EFFECTS or "out" in node.kwargs):
        return True  # ``out=`` writes into a tensor the caller holds
    if node.dialect == "hop" and program is not None:
        return any(has_side_effects(n, program) for g in _subgraphs(node, program) for n in g.nodes)
    return False


def is_pure(node: Node, program: Program | None = None) -> bool:
    """True when the node can be removed if unused and merged with an identical node."""
    op = _opdef(node)
    if op is None or not op.is_pure or has_side_effects(node):
        return False
    if node.dialect == "hop" and program is not None:
        return all(is_pure(n, program) for g in _subgraphs(node, program) for n in g.nodes)
    return True


def _subgraphs(node: Node, program: Program) -> list[Graph]:
    def walk(a: Any) -> Iterator[Graph]:
        if isinstance(a, GraphRef):
            if a.name in program.graphs:
                yield program.graphs[a.name]
        elif isinstance(a, (list, tuple)):
            for x in a:
                yield from walk(x)
        elif isinstance(a, dict):
            for x in a.values():
                yield from walk(x)

    return list(walk((node.args, node.kwargs)))
