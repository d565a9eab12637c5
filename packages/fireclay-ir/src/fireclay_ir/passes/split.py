"""Splitting a program into a chain of programs at given node boundaries.

A compiler that wants pieces of one graph compiled and run separately (one autograd backward per
piece, so that some gradients are ready before the whole backward ends, as DDP's bucketed
all-reduce needs) cuts the entry graph at node indices. Each piece is a program of its own: its
user inputs are the original user inputs and the values of earlier pieces it reads, its
parameter/buffer/constant inputs are those its nodes read (same weights, by reference), and its
outputs are the values later pieces or the original outputs read. :class:`SplitProgram` records
the names that pass between pieces and runs the chain given one callable per piece.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from fireclay_ir.model import Graph, InputSpec, IRError, Node, Program, Value, iter_values, map_values
from fireclay_ir.passes.basic import prune_unused_graphs


@dataclass
class ProgramPiece:
    """One piece of a split program. ``inputs`` names, in order, the values its user inputs take
    (names in the original entry graph: an original user input or an earlier piece's output);
    ``outputs`` names what its outputs are, in order."""

    program: Program
    inputs: list[str] = field(default_factory=list)
    outputs: list[str] = field(default_factory=list)


@dataclass
class SplitProgram:
    """The pieces of a split program, in the order they run. ``user_inputs`` are the original
    entry graph's user input names (the order the chain is called with); ``outputs`` is the
    original output structure with each value replaced by its name."""

    pieces: list[ProgramPiece] = field(default_factory=list)
    user_inputs: list[str] = field(default_factory=list)
    outputs: list[Any] = field(default_factory=list)

    def run(self, callables: Sequence[Callable[..., Any]], args: Sequence[Any]) -> list[Any]:
        """Run the chain: ``callables[i]`` runs ``pieces[i]`` taking its user inputs positionally
        and returning its outputs as a sequence. Returns the original program's outputs."""
        if len(callables) != len(self.pieces):
            raise IRError(f"a split program of {len(self.pieces)} pieces got {len(callables)} callables")
        if len(args) != len(self.user_inputs):
            raise IRError(f"the split program takes {len(self.user_inputs)} inputs, got {len(args)}")
        # The last piece that reads each value: past it the chain drops its reference.
        last_read = {name: i for i, piece in enumerate(self.pieces) for name in piece.inputs}
        kept = _names_in(self.outputs)
        env: dict[str, Any] = dict(zip(self.user_inputs, args))
        for i, (piece, fn) in enumerate(zip(self.pieces, callables)):
            results = fn(*[env[name] for name in piece.inputs])
            if len(results) != len(piece.outputs):
                raise IRError(f"piece {i} should return {len(piece.outputs)} values, returned {len(results)}")
            env.update(zip(piece.outputs, results))
            for name in piece.inputs:
                if last_read[name] == i and name not in kept:
                    del env[name]
        return [_lookup_names(o, env) for o in self.outputs]


class _Name(str):
    """An output slot that names a value (a plain ``str`` in outputs is a constant string)."""


def _names_in(outputs: Any) -> set[str]:
    found: set[str] = set()

    def walk(o: Any) -> None:
        if isinstance(o, _Name):
            found.add(str(o))
        elif isinstance(o, (list, tuple)):
            for x in o:
                walk(x)

    walk(outputs)
    return found


def _lookup_names(o: Any, env: dict[str, Any]) -> Any:
    if isinstance(o, _Name):
        return env[str(o)]
    if isinstance(o, (list, tuple)):
        return type(o)(_lookup_names(x, env) for x in o)
    return o


def split_program(program: Program, boundaries: Sequence[int]) -> SplitProgram:
    """Cut ``program``'s entry graph before each node index in ``boundaries`` (sorted, distinct,
    strictly inside the node list); returns the pieces, each a self-contained program with the
    original's weights, symbols, guards, metadata and the sub-graphs its nodes refer to."""
    graph = program.main
    cuts = list(boundaries)
    if cuts != sorted(set(cuts)) or any(not 0 < c < len(graph.nodes) for c in cuts):
        raise IRError(f"split boundaries must be sorted distinct node indices in 1..{len(graph.nodes) - 1}, "
                      f"got {cuts}")
    spans = list(zip([0, *cuts], [*cuts, len(graph.nodes)]))
    piece_of: dict[Value, int] = {}
    for i, (start, end) in enumerate(spans):
        for node in graph.nodes[start:end]:
            for o in node.outputs:
                piece_of[o] = i
    # For every value, the last piece that reads it (-1: the outputs of the whole program).
    read_later: dict[Value, set[int]] = {}
    for i, (start, end) in enumerate(spans):
        for node in graph.nodes[start:end]:
            for v in node.inputs():
                read_later.setdefault(v, set()).add(i)
    output_values = list(iter_values(graph.outputs))
    specs = dict(zip(graph.inputs, graph.input_specs))
    user_inputs = [v for v in graph.inputs if specs[v].kind == "user"]
    pieces: list[ProgramPiece] = []
    for i, (start, end) in enumerate(spans):
        nodes = graph.nodes[start:end]
        reads: list[Value] = []
        for node in nodes:
            for v in node.inputs():
                if piece_of.get(v) != i and v not in reads:
                    reads.append(v)
        gives = [o for node in nodes for o in node.outputs
                 if any(j > i for j in read_later.get(o, ())) or any(o is v for v in output_values)]
        pieces.append(_piece(program, graph, nodes, reads, gives, specs, name=f"{graph.name}_part{i}"))
    return SplitProgram(pieces=pieces, user_inputs=[v.name for v in user_inputs],
                        outputs=map_values(graph.outputs, lambda v: _Name(v.name)))


def _piece(program: Program, graph: Graph, nodes: list[Node], reads: list[Value], gives: list[Value],
           specs: dict[Value, InputSpec], name: str) -> ProgramPiece:
    sub = Graph(graph.name)
    env: dict[Value, Value] = {}
    inputs: list[str] = []
    # Weights keep their own kind and target; everything else arrives as a user input.
    for v in reads:
        spec = specs.get(v, InputSpec())
        env[v] = sub.add_input(v.name, v.type, InputSpec(kind=spec.kind, target=spec.target))
        if spec.kind == "user":
            inputs.append(v.name)
    # Weight inputs go after the user inputs, as capture lays them out.
    order = [i for i, v in enumerate(reads) if specs.get(v, InputSpec()).kind == "user"]
    order += [i for i, v in enumerate(reads) if specs.get(v, InputSpec()).kind != "user"]
    sub.inputs = [sub.inputs[i] for i in order]
    sub.input_specs = [sub.input_specs[i] for i in order]
    for node in nodes:
        outs = sub.call(node.op, map_values(node.args, lambda v: env[v]), map_values(node.kwargs, lambda v: env[v]),
                        out=[o.type for o in node.outputs], meta=dict(node.meta))
        for old, new in zip(node.outputs, outs):
            env[old] = new
    sub.set_outputs([env[v] for v in gives])
    sub.meta = dict(graph.meta)
    used_weights = {specs[v].target for v in reads if specs.get(v, InputSpec()).kind != "user"}
    piece = Program(graphs={sub.name: sub}, entry=sub.name, symbols=dict(program.symbols),
                    guards=list(program.guards),
                    weights={k: w for k, w in program.weights.items() if k in used_weights},
                    metadata={**program.metadata, "split.piece": name}, producer=program.producer,
                    dialects=dict(program.dialects), format_version=program.format_version)
    for gname, g in program.graphs.items():
        if gname != program.entry:
            piece.graphs[gname] = g
    prune_unused_graphs(piece)
    return ProgramPiece(program=piece, inputs=inputs, outputs=[v.name for v in gives])
