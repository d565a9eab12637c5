"""The scheduled program, the object fireclay-loops hands to every code generator, and its
report: kernels, bytes moved, and the scheduler's decisions."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fireclay_loops.ir import ExternNode, LoopProgram
from fireclay_loops.kernel import Kernel
from fireclay_loops.memory import MemoryPlan
from fireclay_loops.printer import format_schedule, natural


@dataclass
class ScheduledProgram:
    """What code generators consume: the lowered program, the ordered steps (kernels and extern
    calls), the memory plan, and the decisions that led there."""

    program: LoopProgram
    steps: list[Kernel | ExternNode]
    plan: MemoryPlan
    decisions: list[Any]

    @property
    def kernels(self) -> list[Kernel]:
        return [s for s in self.steps if isinstance(s, Kernel)]

    @property
    def extern_calls(self) -> list[ExternNode]:
        return [s for s in self.steps if isinstance(s, ExternNode)]

    def step_bytes(self, step: Kernel | ExternNode) -> int:
        """Bytes a step reads and writes in memory (each buffer counted once per step)."""
        prog = self.program
        names = set(step.read_buffers()) | set(step.write_buffers())
        return sum(prog.hint(prog.buffers[b].nbytes) for b in names)

    @property
    def bytes_moved(self) -> int:
        return sum(self.step_bytes(s) for s in self.steps)

    def report(self) -> Report:
        return Report(self)

    def __str__(self) -> str:
        return format_schedule(self)


class Report:
    """Kernel count, bytes moved, memory, and the scheduler's decisions with their reasons."""

    def __init__(self, scheduled: ScheduledProgram):
        self.scheduled = scheduled
        self.kernel_count = len(scheduled.kernels)
        self.extern_count = sum(1 for s in scheduled.extern_calls if s.kind == "extern")
        self.fallback_count = sum(1 for s in scheduled.extern_calls if s.kind == "fallback")
        self.bytes_moved = scheduled.bytes_moved
        self.peak_bytes = scheduled.plan.peak_bytes
        self.decisions = list(scheduled.decisions)
        self.reuses = list(scheduled.plan.reuses)

    def __str__(self) -> str:
        s = self.scheduled
        lines = [f"kernels: {self.kernel_count}, extern calls: {self.extern_count}, "
                 f"fallbacks: {self.fallback_count}",
                 f"bytes moved: {self.bytes_moved}, peak memory: {self.peak_bytes} bytes"]
        for step in s.steps:
            if isinstance(step, Kernel):
                what = f"{step.kind} kernel over " + ", ".join(kn.node.name for kn in step.nodes)
                if step.internal:
                    what += f"; never stored: {', '.join(natural(step.internal))}"
            else:
                what = f"{step.kind} call {step.op}"
            lines.append(f"  {step.name}: {what} ({s.step_bytes(step)} bytes)")
        if self.decisions:
            lines.append("decisions:")
            lines.extend(f"  {d}" for d in self.decisions)
        if self.reuses:
            lines.append("memory reuse:")
            lines.extend(f"  {b} reuses {a} (last held by {prev})" for b, prev, a in self.reuses)
        return "\n".join(lines)
