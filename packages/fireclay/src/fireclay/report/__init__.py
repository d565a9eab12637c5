"""The HTML compile report: one self-contained page of what a run compiled, as it ran: the
graphs drawn (captured, aten forward/backward, loops; repeated layers of large graphs
collapsed), graph breaks, guards, recompiles, generated kernels, each stage's time and a
timeline of the stages.

    from fireclay.report import recording, write_report
    with recording() as rec:                   # the run's compiles are recorded
        f = fireclay.compile(fn); f(x).sum().backward()
    write_report(rec, "report.html")

    write_report(program, "program.html")      # a Program (or several): its graphs only

``write_report`` takes a :class:`Recorder`, :class:`CompileEvents`, a ``Program`` or a list of
Programs. Sections a stage does not record yet say so on the page.
"""

from __future__ import annotations

import os
from typing import Any

from fireclay.report.collect import Recorder, describe_inputs, inspect_program, recording
from fireclay.report.events import (
    CompileEvents,
    GraphBreak,
    GraphEntry,
    GuardEntry,
    KernelEntry,
    Recompile,
    StageTime,
    TimelineEntry,
)
from fireclay.report.page import render, summary
from fireclay_ir import Program


def as_events(source: Any) -> CompileEvents:
    if isinstance(source, CompileEvents):
        return source
    if isinstance(source, Recorder):
        return source.events()
    if isinstance(source, Program):
        return CompileEvents.of_programs(source)
    if isinstance(source, (list, tuple)) and source and all(isinstance(p, Program) for p in source):
        return CompileEvents.of_programs(*source)
    raise TypeError("write_report takes a Recorder, CompileEvents, a fireclay_ir.Program or a list of Programs, "
                    f"got {type(source).__name__}")


def write_report(source: Any, path: str | os.PathLike) -> str:
    """Write the report page for ``source`` to ``path``; returns the path written."""
    text = render(as_events(source))
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
    return os.fspath(path)


__all__ = [
    "CompileEvents", "GraphBreak", "GraphEntry", "GuardEntry", "KernelEntry", "Recompile", "Recorder",
    "StageTime", "TimelineEntry", "as_events", "describe_inputs", "inspect_program", "recording", "render", "summary", "write_report",
]
