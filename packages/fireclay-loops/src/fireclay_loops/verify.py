"""The verifier of scheduled programs, run at the end of :func:`~fireclay_loops.schedule` (and
by anyone handing a schedule to a code generator). On failure it names the broken rule and
prints the offending kernel or call in the same text the user sees."""

from __future__ import annotations

from typing import Any

from fireclay_loops import exprs
from fireclay_loops.errors import SchedulingError
from fireclay_loops.ir import ExternNode
from fireclay_loops.kernel import Kernel, KernelNode


def _fail(step: Any, message: str) -> SchedulingError:
    from fireclay_loops.printer import format_extern, format_kernel

    if isinstance(step, Kernel):
        text = "\n".join("    " + line for line in format_kernel(step))
    elif isinstance(step, ExternNode):
        text = "    " + format_extern(step)
    else:
        text = ""
    name = getattr(step, "name", "the program")
    return SchedulingError(f"invalid schedule: {message}\n  in {name}:\n{text}")


def _check_kernel(k: Kernel, available: set[str], internal: dict[str, str]) -> None:
    kvars = set(k.xvars) | set(k.rvars)
    sizes = dict(zip(k.xvars + k.rvars, k.xsizes + k.rsizes))
    written: dict[str, object] = {}
    for kn in k.nodes:
        body = kn.node.body
        for v, n in zip(body.vars + body.reduction_vars, body.sizes + body.reduction_sizes):
            target = kn.var_map.get(v)
            if target is None:
                raise _fail(k, f"{kn.node.name}: loop variable {v} is not mapped to the kernel's loops")
            if not target.free_symbols <= kvars:
                raise _fail(k, f"{kn.node.name}: {v} maps to {target}, which is not over the loops of {k.name}")
            if target in sizes and not exprs.equal(sizes[target], n):
                raise _fail(k, f"{kn.node.name}: {v} runs to {exprs.to_str(n)} but {target} runs to "
                               f"{exprs.to_str(sizes[target])}")
        if kn.node.kind == "reduction":
            _check_reduction_loops(k, kn)
        for buf, index, _ in kn.reads():
            if buf in written:
                if buf in k.internal and not exprs.equal(written[buf], index):
                    raise _fail(k, f"{kn.node.name} reads {buf} at {exprs.to_str(index)} but it is written at "
                                   f"{exprs.to_str(written[buf])}")
            elif buf in internal:
                raise _fail(k, f"{kn.node.name} reads {buf}, which lives only inside {internal[buf]}")
            elif buf not in available:
                raise _fail(k, f"{kn.node.name} reads {buf} before any step writes it")
        for buf, index, _ in kn.writes():
            written[buf] = index
    for buf in k.internal:
        if buf not in written:
            raise _fail(k, f"{buf} is listed as internal but no node of the kernel writes it")


def _check_reduction_loops(k: Kernel, kn: KernelNode) -> None:
    """A reduction node's accumulator runs over exactly the kernel's reduction loops: an outer
    loop of the node turned into one of them would be summed over."""
    body, rvars = kn.node.body, set(k.rvars)
    outer = set().union(*(kn.var_map[v].free_symbols for v in body.vars))
    inner = set().union(*(kn.var_map[v].free_symbols for v in body.reduction_vars))
    if outer & rvars:
        raise _fail(k, f"{kn.node.name}: an outer loop of this reduction runs as the kernel's reduction loop "
                       f"{', '.join(sorted(str(v) for v in outer & rvars))}")
    if inner != rvars:
        raise _fail(k, f"{kn.node.name}: its reduction runs over {sorted(str(v) for v in inner)} but the kernel's "
                       f"reduction loops are {sorted(str(v) for v in rvars)}")


def verify_schedule(scheduled: Any) -> None:
    """Raise :class:`SchedulingError` for the first broken rule."""
    prog, plan = scheduled.program, scheduled.plan
    available = set(prog.inputs)
    internal: dict[str, str] = {}
    for step in scheduled.steps:
        if isinstance(step, Kernel):
            _check_kernel(step, available, internal)
            for b in step.internal:
                internal[b] = step.name
        own = set(step.write_buffers()) if isinstance(step, Kernel) else set()
        for b in step.read_buffers():
            if b in internal:
                raise _fail(step, f"reads {b}, which lives only inside {internal[b]}")
            if b not in available and b not in own:
                raise _fail(step, f"reads {b} before any step writes it")
        available |= set(step.write_buffers())
    for o in prog.output_buffers():
        if o not in available:
            raise _fail(None, f"the output {o} is never written")
    # Memory: every stored buffer has memory, and no two live buffers share it.
    for b in available:
        if b not in plan.buffer_allocation:
            raise _fail(None, f"buffer {b} is stored but has no allocation")
    by_alloc: dict[str, list[str]] = {}
    for b, a in plan.buffer_allocation.items():
        by_alloc.setdefault(a, []).append(b)
    for a, bufs in by_alloc.items():
        spans = sorted((plan.lifetimes[b][0], plan.lifetimes[b][1], b) for b in bufs)
        for (_, end, b1), (start, _, b2) in zip(spans, spans[1:]):
            if start <= end:
                raise _fail(None, f"{b1} and {b2} share {a} while both are live (steps {start}..{end})")
