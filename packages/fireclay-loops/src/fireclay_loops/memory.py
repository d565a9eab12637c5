"""Memory planning: buffer lifetimes over the ordered steps, and reuse of dead buffers' memory.

Rules:

* a graph input's memory is never reused, unless the input is donated
  (``LoopProgram.donated``) and the program does not return it;
* an output's memory is never reused: it leaves the program;
* a buffer may take over the allocation of a buffer whose last reader ran in an earlier step,
  on the same device, when the allocation is at least as large (sizes compared symbolically,
  or by value when both are static); the smallest allocation that fits is taken;
* buffers internal to a kernel get no memory at all.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

import sympy

from fireclay_loops import exprs
from fireclay_loops.ir import ExternNode, LoopProgram
from fireclay_loops.kernel import Kernel


@dataclass
class Allocation:
    name: str
    nbytes: sympy.Expr
    device: str
    from_input: str | None = None  # the donated input whose memory this is


@dataclass
class MemoryPlan:
    allocations: dict[str, Allocation] = field(default_factory=dict)
    buffer_allocation: dict[str, str] = field(default_factory=dict)
    allocate_before: dict[int, list[str]] = field(default_factory=dict)  # step -> buffers
    free_after: dict[int, list[str]] = field(default_factory=dict)  # step -> buffers
    reuses: list[tuple[str, str, str]] = field(default_factory=list)  # (buffer, previous owner, allocation)
    lifetimes: dict[str, tuple[int, int]] = field(default_factory=dict)  # buffer -> (first, last step)
    peak_bytes: int = 0


def _fits(need: sympy.Expr, have: sympy.Expr) -> bool:
    if exprs.equal(need, have):
        return True
    n, h = exprs.to_static(need), exprs.to_static(have)
    return n is not None and h is not None and n <= h


@functools.cache
def returns_views(op: str) -> bool:
    """Whether the aten op ``op`` (``aten::name.overload``, or ``aten::ns::name.overload`` for a
    custom op) returns a view of an argument rather than new memory (its schema's alias
    annotations); ops torch does not know are taken to return new memory."""
    try:
        import torch

        path = op.split("::")
        namespace, (name, _, overload) = (path[1], path[2].partition(".")) if len(path) == 3 else \
            ("aten", path[-1].partition("."))
        schema = getattr(getattr(getattr(torch.ops, namespace), name), overload or "default")._schema
    except (AttributeError, RuntimeError, ImportError, IndexError):
        return False
    return not schema.is_mutable and any(r.alias_info is not None for r in schema.returns)


def plan_memory(program: LoopProgram, steps: list[Kernel | ExternNode]) -> MemoryPlan:
    plan = MemoryPlan()
    outputs = program.output_buffers()
    never = len(steps)  # "after the last step": outputs and inputs live past the program
    first: dict[str, int] = {b: -1 for b in program.inputs}
    last: dict[str, int] = {}
    for k, s in enumerate(steps):
        for b in s.write_buffers():
            first.setdefault(b, k)
            last[b] = max(last.get(b, k), k)
        for b in s.read_buffers():
            last[b] = max(last.get(b, -1), k)
    ends = {b: never if b in outputs or (b in program.inputs and b not in program.donated) else last.get(b, first[b])
            for b in first}
    # A library call returning a view of its operand (a bit cast, a view op no lowering makes
    # index arithmetic) leaves a result in the operand's memory: the operand lives as long as it.
    for s in reversed(steps):
        if isinstance(s, ExternNode) and returns_views(s.op):
            longest = max((ends.get(r, -1) for r in s.write_buffers()), default=-1)
            for b in s.read_buffers():
                if b in ends:
                    ends[b] = max(ends[b], longest)
    ending: dict[int, list[str]] = {}  # step -> buffers whose lifetime ends there, in lifetime order
    for b in first:
        plan.lifetimes[b] = (first[b], ends[b])
        ending.setdefault(plan.lifetimes[b][1], []).append(b)

    free_pool: list[tuple[str, str]] = []  # (allocation, last owner)
    owner: dict[str, str] = {}
    for b in program.inputs:
        buf = program.buffers[b]
        alloc = Allocation(f"mem_{b}", buf.nbytes, buf.device, from_input=b)
        plan.allocations[alloc.name] = alloc
        plan.buffer_allocation[b] = alloc.name
        owner[alloc.name] = b
    live_bytes = sum(program.hint(a.nbytes) for a in plan.allocations.values())
    peak = live_bytes
    planned = 0  # allocations made for intermediates so far: mem0, mem1, ...
    for k, s in enumerate(steps):
        fresh = [b for b in s.write_buffers() if first.get(b) == k and b not in plan.buffer_allocation]
        for b in fresh:
            buf = program.buffers[b]
            fits = [(a, prev) for a, prev in free_pool
                    if plan.allocations[a].device == buf.device and _fits(buf.nbytes, plan.allocations[a].nbytes)]
            if fits:
                a, prev = min(fits, key=lambda p: program.hint(plan.allocations[p[0]].nbytes))
                free_pool.remove((a, prev))
                plan.reuses.append((b, prev, a))
                live_bytes += program.hint(plan.allocations[a].nbytes)
            else:
                a = f"mem{planned}"
                planned += 1
                plan.allocations[a] = Allocation(a, buf.nbytes, buf.device)
                live_bytes += program.hint(buf.nbytes)
            plan.buffer_allocation[b] = a
            owner[a] = b
            plan.allocate_before.setdefault(k, []).append(b)
        peak = max(peak, live_bytes)
        for b in ending.get(k, ()):
            if b in plan.buffer_allocation:
                a = plan.buffer_allocation[b]
                if owner.get(a) == b:
                    free_pool.append((a, b))
                    live_bytes -= program.hint(plan.allocations[a].nbytes)
                    plan.free_after.setdefault(k, []).append(b)
    plan.peak_bytes = peak
    return plan
