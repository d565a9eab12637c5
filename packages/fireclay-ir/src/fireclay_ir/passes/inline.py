"""Sub-graph inlining: replace a higher-order call by the body it calls."""

from __future__ import annotations

from fireclay_ir.model import GraphRef, IRError, Program
from fireclay_ir.passes.basic import prune_unused_graphs
from fireclay_ir.passes.rewrite import copy_graph_into

INLINABLE = ("hop::checkpoint",)


def inline_subgraphs(program: Program, ops: tuple[str, ...] = INLINABLE) -> Program:
    """Inline every call of ``ops`` (default ``hop::checkpoint``: as a forward computation, a
    checkpointed region is just its body) and drop the graphs no longer referenced.

    Bodies are inlined recursively: a checkpoint inside a checkpoint ends up flat.
    """
    from fireclay_ir.dialects.hop import bind

    changed = True
    while changed:
        changed = False
        for graph in program.graphs.values():
            for node in list(graph.nodes):
                if node.op not in ops:
                    continue
                if node.op != "hop::checkpoint":
                    raise IRError(f"inline_subgraphs knows how to inline hop::checkpoint, not {node.op}")
                bound = bind(node)
                ref = bound["body"]
                if not isinstance(ref, GraphRef) or ref.name not in program.graphs:
                    raise IRError(f"{node!r} refers to a missing body graph {ref!r}")
                body = program.graphs[ref.name]
                with graph.inserting_before(node):
                    results = copy_graph_into(graph, body, list(bound["operands"]), meta=node.meta)
                if len(results) != len(node.outputs):
                    raise IRError(f"{node!r}: body {ref.name!r} returns {len(results)} values for "
                                  f"{len(node.outputs)} outputs")
                for old, new in zip(node.outputs, results):
                    graph.replace_all_uses(old, new)
                graph.erase(node)
                changed = True
    return prune_unused_graphs(program)
