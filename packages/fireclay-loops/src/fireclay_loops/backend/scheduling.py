"""The scheduling entry point of code generators: whatever program they are given, scheduled."""

from __future__ import annotations

from typing import Any

from fireclay_loops.backend.program import ScheduledProgram
from fireclay_loops.ir import LoopProgram
from fireclay_loops.lowering.driver import lower
from fireclay_loops.scheduler import schedule


def to_scheduled(program: Any, **schedule_options: Any) -> ScheduledProgram:
    """An aten-dialect ``fireclay_ir.Program``, a loops-dialect one (a saved schedule, read back
    with :func:`~fireclay_loops.from_program`), a ``LoopProgram`` or a ``ScheduledProgram``,
    scheduled (``schedule_options`` go to :func:`~fireclay_loops.schedule`; a program already
    scheduled is taken as it is)."""
    if isinstance(program, ScheduledProgram):
        return program
    if _is_loops_dialect(program):
        from fireclay_loops.dialect import from_program

        scheduled: ScheduledProgram = from_program(program)
        return scheduled
    scheduled = schedule(program if isinstance(program, LoopProgram) else lower(program), **schedule_options)
    return scheduled


def _is_loops_dialect(program: Any) -> bool:
    graphs = getattr(program, "graphs", None)
    if not isinstance(graphs, dict):
        return False
    return any(node.dialect == "loops" for graph in graphs.values() for node in graph.nodes)
