"""PassManager: runs named IR -> IR functions and records what each one did.

A pass is a function ``program -> program`` (it may mutate and return its argument, or return a
new Program). Its name is the function's ``__name__``. The manager records, per pass, whether
the program changed (by comparing a structural fingerprint before and after) and the time it
took, and can verify after every pass to catch the one that broke the IR.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from fireclay_ir.model import GraphRef, IRError, Program, Value

Pass = Callable[[Program], Program]


@dataclass
class PassRecord:
    name: str
    changed: bool
    seconds: float
    nodes_before: int
    nodes_after: int


def _atom_key(a: Any, ids: dict[int, int]) -> Any:
    if isinstance(a, Value):
        return ("%", ids.setdefault(id(a), len(ids)))
    if isinstance(a, (list, tuple)):
        return (type(a).__name__, tuple(_atom_key(x, ids) for x in a))
    if isinstance(a, dict):
        return ("dict", tuple((k, _atom_key(v, ids)) for k, v in a.items()))
    if isinstance(a, slice):
        return ("slice", _atom_key((a.start, a.stop, a.step), ids))
    if isinstance(a, GraphRef):
        return ("graph", a.name)
    return (type(a).__name__, repr(a))


def fingerprint(program: Program) -> tuple[Any, ...]:
    """A hashable summary of the program's structure: equal before and after a pass iff the
    pass changed no graph, node, argument, type, output or meta."""
    ids: dict[int, int] = {}
    graphs = []
    for name, g in sorted(program.graphs.items()):
        inputs = tuple((_atom_key(v, ids), v.name, v.type) for v in g.inputs)
        nodes = tuple(
            (n.op, _atom_key(n.args, ids), _atom_key(n.kwargs, ids),
             tuple((_atom_key(o, ids), o.name, o.type) for o in n.outputs), repr(sorted(n.meta.items())))
            for n in g.nodes)
        graphs.append((name, inputs, tuple(g.input_specs), nodes, _atom_key(g.outputs, ids)))
    return (program.entry, tuple(graphs), tuple(sorted(program.weights)))


def _node_count(program: Program) -> int:
    return sum(len(g.nodes) for g in program.graphs.values())


class PassManager:
    """Run ``passes`` in order: ``PassManager([dead_code_elimination, ...]).run(program)``."""

    def __init__(self, passes: Sequence[Pass], *, verify: bool = False):
        self.passes = list(passes)
        self.verify = verify
        self.records: list[PassRecord] = []

    def run(self, program: Program) -> Program:
        from fireclay_ir.verifier import VerificationError, verify

        for p in self.passes:
            name = getattr(p, "__name__", repr(p))
            before, count = fingerprint(program), _node_count(program)
            start = time.perf_counter()
            result = p(program)
            seconds = time.perf_counter() - start
            if not isinstance(result, Program):
                raise IRError(f"pass {name} returned {type(result).__name__}, not a Program")
            program = result
            self.records.append(PassRecord(name, fingerprint(program) != before, seconds, count,
                                           _node_count(program)))
            if self.verify:
                try:
                    verify(program)
                except VerificationError as exc:
                    raise VerificationError(f"after pass {name}: {exc}", exc.node, exc.graph) from None
        return program

    __call__ = run

    def report(self) -> str:
        """One line per pass run: name, changed or not, node counts, milliseconds."""
        lines = [f"{'pass':<36} {'changed':<8} {'nodes':>13} {'ms':>9}"]
        for r in self.records:
            lines.append(f"{r.name:<36} {('yes' if r.changed else 'no'):<8} "
                         f"{r.nodes_before:>6}->{r.nodes_after:<6} {r.seconds * 1e3:>9.3f}")
        return "\n".join(lines)
