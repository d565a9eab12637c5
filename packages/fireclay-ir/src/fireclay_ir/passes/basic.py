"""Generic clean-up passes: dead code elimination, common subexpression elimination,
topological re-sort, pruning unreferenced sub-graphs."""

from __future__ import annotations

import heapq
from typing import Any

from fireclay_ir.model import Graph, IRError, Node, Program, Value, iter_values
from fireclay_ir.passes.effects import has_side_effects, is_pure


def dead_code_elimination(program: Program) -> Program:
    """Remove nodes whose outputs nobody reads, unless they have side effects."""
    for graph in program.graphs.values():
        outputs = {id(v) for v in iter_values(graph.outputs)}
        for node in reversed(list(graph.nodes)):
            if any(o._users or id(o) in outputs for o in node.outputs):
                continue
            if has_side_effects(node, program):
                continue
            graph.erase(node)
    return program


def _key(a: Any) -> Any:
    # Types are part of the key: 1, 1.0 and True hash alike; 0.0 and -0.0 compare equal.
    if isinstance(a, Value):
        return ("%", id(a))
    if isinstance(a, (list, tuple)):
        return (type(a).__name__, tuple(_key(x) for x in a))
    if isinstance(a, dict):
        return ("dict", tuple(sorted((k, _key(v)) for k, v in a.items())))
    if isinstance(a, slice):
        return ("slice", _key((a.start, a.stop, a.step)))
    if isinstance(a, float):
        return ("float", repr(a))
    return (type(a).__name__, a)


def common_subexpression_elimination(program: Program) -> Program:
    """Merge pure nodes with the same op, arguments and output types into the first one.

    Any node with side effects ends the region in which earlier results may be reused: a
    mutation may change what an identical later call would compute.
    """
    for graph in program.graphs.values():
        seen: dict[Any, Node] = {}
        for node in list(graph.nodes):
            if not is_pure(node, program):
                if has_side_effects(node, program):
                    seen.clear()
                continue
            try:
                key = (node.op, _key(node.args), _key(node.kwargs), tuple(o.type for o in node.outputs))
                hash(key)
            except TypeError:
                continue
            first = seen.get(key)
            if first is None:
                seen[key] = node
                continue
            for old, new in zip(node.outputs, first.outputs):
                graph.replace_all_uses(old, new)
            graph.erase(node)
    return program


def topological_sort(program: Program) -> Program:
    """Reorder each graph's nodes so that every value is defined before it is read.

    The order is stable: a node moves only when a value it reads is defined later. Nodes with
    side effects keep their order among themselves and with the readers of their arguments.
    """
    for graph in program.graphs.values():
        graph.nodes[:] = _stable_order(graph, program)
    return program


def _stable_order(graph: Graph, program: Program) -> list[Node]:
    nodes = list(graph.nodes)
    index = {id(n): i for i, n in enumerate(nodes)}
    deps: dict[int, set[int]] = {i: set() for i in range(len(nodes))}
    for i, n in enumerate(nodes):
        for v in n.inputs():
            if v.node is not None and id(v.node) in index:
                deps[i].add(index[id(v.node)])
    # Effect ordering: a side-effecting node stays after earlier readers of what it touches and
    # before later ones, and after the previous side-effecting node.
    last_effect = None
    for i, n in enumerate(nodes):
        if not has_side_effects(n, program):
            continue
        touched = set(n.inputs())
        for j, m in enumerate(nodes):
            if j != i and touched & set(m.inputs()):
                (deps[i] if j < i else deps[j]).add(j if j < i else i)
        if last_effect is not None:
            deps[i].add(last_effect)
        last_effect = i
    users: dict[int, list[int]] = {i: [] for i in deps}
    missing = {i: len(d) for i, d in deps.items()}
    for i, d in deps.items():
        for j in d:
            users[j].append(i)
    ready = [i for i, c in missing.items() if c == 0]
    heapq.heapify(ready)
    order: list[Node] = []
    while ready:
        i = heapq.heappop(ready)
        order.append(nodes[i])
        for u in users[i]:
            missing[u] -= 1
            if missing[u] == 0:
                heapq.heappush(ready, u)
    if len(order) != len(nodes):
        stuck = [nodes[i] for i, c in missing.items() if c > 0][:3]
        raise IRError(f"graph {graph.name!r} has a dependency cycle through {stuck}")
    return order


def prune_unused_graphs(program: Program) -> Program:
    """Drop graphs that the entry graph does not reach through GraphRefs."""
    reached, todo = set(), [program.entry]
    while todo:
        name = todo.pop()
        if name in reached or name not in program.graphs:
            continue
        reached.add(name)
        todo.extend(program.graphs[name].subgraph_refs())
    for name in list(program.graphs):
        if name not in reached:
            del program.graphs[name]
    return program

