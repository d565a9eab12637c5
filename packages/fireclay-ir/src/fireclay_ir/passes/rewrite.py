"""Pattern rewrite: find a small graph pattern, replace each match.

A pattern is a :class:`Graph` built with the ordinary builder (its types are placeholders): its inputs are wildcards (each
binds to whatever argument sits in that place, a Value or a constant, consistently across the
pattern), its nodes must match op for op and argument for argument, and its single output is
the root of the match. The replacement is either a Graph taking the same inputs (its nodes are
copied in before the match's root) or a function ``replace(match) -> value`` that builds the
new nodes itself (the insertion point is set before the root).

Matched nodes are not erased: their readers are redirected, and dead code elimination removes
what became unused (interior values read elsewhere stay, which keeps rewrites safe).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from fireclay_ir.model import Graph, IRError, Node, Program, Value, map_values
from fireclay_ir.passes.effects import is_pure


@dataclass
class Match:
    graph: Graph
    root: Node
    output: Value
    bindings: dict[str, Any] = field(default_factory=dict)  # pattern input name -> argument
    nodes: list[Node] = field(default_factory=list)
    mapping: dict[int, Node] = field(default_factory=dict, repr=False)  # id(pattern node) -> node


@dataclass
class Pattern:
    """A named rewrite rule: ``pattern`` graph -> ``replacement`` (graph or function)."""

    name: str
    pattern: Graph
    replacement: Graph | Callable[[Match], Any]

    def __post_init__(self) -> None:
        if len(self.pattern.outputs) != 1 or not isinstance(self.pattern.outputs[0], Value):
            raise IRError(f"pattern {self.name!r} must return exactly one value")
        root = self.pattern.outputs[0]
        if root.node is None:
            raise IRError(f"pattern {self.name!r} returns an input; there is nothing to match")
        if isinstance(self.replacement, Graph):
            if len(self.replacement.inputs) != len(self.pattern.inputs):
                raise IRError(f"pattern {self.name!r}: replacement takes {len(self.replacement.inputs)} "
                              f"inputs, the pattern {len(self.pattern.inputs)}")
            if len(self.replacement.outputs) != 1:
                raise IRError(f"pattern {self.name!r}: replacement must return exactly one value")


def _match_arg(p: Any, a: Any, m: Match, pattern_inputs: set[int]) -> bool:
    if isinstance(p, Value):
        if id(p) in pattern_inputs:
            if p.name in m.bindings:
                bound = m.bindings[p.name]
                return bound is a if isinstance(bound, Value) or isinstance(a, Value) else \
                    (type(bound) is type(a) and bound == a)
            m.bindings[p.name] = a
            return True
        if not isinstance(a, Value) or a.node is None or p.node is None or a.index != p.index:
            return False
        return _match_node(p.node, a.node, m, pattern_inputs)
    if isinstance(p, (list, tuple)):
        return isinstance(a, (list, tuple)) and len(p) == len(a) and \
            all(_match_arg(x, y, m, pattern_inputs) for x, y in zip(p, a))
    if isinstance(p, dict):
        return isinstance(a, dict) and p.keys() == a.keys() and \
            all(_match_arg(p[k], a[k], m, pattern_inputs) for k in p)
    return type(p) is type(a) and p == a


def _match_node(pn: Node, n: Node, m: Match, pattern_inputs: set[int]) -> bool:
    if pn.op != n.op or len(pn.args) != len(n.args) or pn.kwargs.keys() != n.kwargs.keys():
        return False
    if len(pn.outputs) != len(n.outputs):
        return False
    if id(pn) in m.mapping:
        return m.mapping[id(pn)] is n
    if n in m.nodes:
        return False  # two pattern nodes cannot match one graph node
    m.mapping[id(pn)] = n
    m.nodes.append(n)
    return _match_arg(list(pn.args), list(n.args), m, pattern_inputs) and \
        _match_arg(pn.kwargs, n.kwargs, m, pattern_inputs)


def find_matches(graph: Graph, pattern: Pattern) -> list[Match]:
    """Non-overlapping matches of ``pattern`` in ``graph``, in node order."""
    root_p = pattern.pattern.outputs[0]
    inputs = {id(v) for v in pattern.pattern.inputs}
    matches, used = [], set()
    for node in graph.nodes:
        if node.op != root_p.node.op or root_p.index >= len(node.outputs):
            continue
        m = Match(graph, node, node.outputs[root_p.index])
        if not _match_node(root_p.node, node, m, inputs):
            continue
        if any(n in used for n in m.nodes) or not all(is_pure(n) for n in m.nodes):
            continue
        used.update(m.nodes)
        matches.append(m)
    return matches


def _apply(pattern: Pattern, m: Match) -> None:
    graph = m.graph
    with graph.inserting_before(m.root):
        if callable(pattern.replacement) and not isinstance(pattern.replacement, Graph):
            new = pattern.replacement(m)
        else:
            # The pattern's types are placeholders: values typed like the pattern's root take
            # the matched root's type. Replacements that change shapes inside use a function.
            placeholder = pattern.pattern.outputs[0].type
            new = copy_graph_into(graph, pattern.replacement,
                                  [m.bindings[v.name] for v in pattern.pattern.inputs],
                                  meta=m.root.meta,
                                  retype=lambda ty: m.output.type if ty == placeholder else ty)[0]
    if isinstance(new, Value) and new.type != m.output.type:
        raise IRError(f"rewrite {pattern.name!r} replaced %{m.output.name} ({m.output.type}) with "
                      f"%{new.name} of a different type ({new.type})")
    graph.replace_all_uses(m.output, new)


def copy_graph_into(graph: Graph, body: Graph, inputs: list[Any], meta: dict[str, Any] | None = None,
                    retype: Callable[[Any], Any] | None = None) -> list[Any]:
    """Copy ``body``'s nodes into ``graph`` at its insertion point, its inputs bound to
    ``inputs``; returns what ``body`` returns, in ``graph``'s values. Nodes without a source
    take ``meta``'s (the node they stand for)."""
    if len(inputs) != len(body.inputs):
        raise IRError(f"graph {body.name!r} takes {len(body.inputs)} inputs, got {len(inputs)}")
    env: dict[Value, Any] = dict(zip(body.inputs, inputs))
    sub = lambda v: env[v]  # noqa: E731
    for n in body.nodes:
        node_meta = dict(n.meta)
        if meta and "source" not in node_meta and "source" in meta:
            node_meta["source"] = meta["source"]
        types = [retype(o.type) if retype else o.type for o in n.outputs]
        outs = graph.call(n.op, map_values(n.args, sub), map_values(n.kwargs, sub), out=types, meta=node_meta)
        for old, new in zip(n.outputs, outs):
            env[old] = new
    return [map_values(o, sub) for o in body.outputs]


def rewrite(program: Program, patterns: list[Pattern], *, max_rounds: int = 10) -> Program:
    """Apply ``patterns`` to every graph until none matches (at most ``max_rounds`` sweeps)."""
    for graph in program.graphs.values():
        for _ in range(max_rounds):
            matches = [(p, m) for p in patterns for m in find_matches(graph, p)]
            if not matches:
                break
            for p, m in matches:
                if m.root.graph is graph and all(n.graph is graph for n in m.nodes):
                    _apply(p, m)
            _erase_dead_matches(graph, [m for _, m in matches])
    return program


def _erase_dead_matches(graph: Graph, matches: list[Match]) -> None:
    # Only the matched nodes, so that a rewrite pass does not double as DCE.
    for m in matches:
        for n in m.nodes:  # root first, then its producers: erase in that order
            if n.graph is graph and not any(o._users for o in n.outputs) and \
                    not any(o is v for o in n.outputs for v in _output_values(graph)):
                graph.erase(n)


def _output_values(graph: Graph) -> list[Value]:
    from fireclay_ir.model import iter_values

    return list(iter_values(graph.outputs))


def rewrite_pass(*patterns: Pattern, name: str = "pattern_rewrite") -> Callable[[Program], Program]:
    """A pass (for a PassManager) applying ``patterns``."""
    def run(program: Program) -> Program:
        return rewrite(program, list(patterns))

    run.__name__ = name
    return run
