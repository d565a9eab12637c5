"""Readable text for loop programs and schedules (golden-tested).

A body prints one op per line, ``%3 = add(%1, %2)``, with index expressions in kernel or node
variables; each node is headed by the aten ops it came from.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

import sympy

from fireclay_loops import exprs
from fireclay_loops.body import BodyValue, LoopBody
from fireclay_loops.ir import (
    Buffer,
    ComputeNode,
    Constant,
    ExternNode,
    InputBufferNode,
    LoopProgram,
    OutputBufferNode,
    TensorArg,
)
from fireclay_loops.kernel import Kernel


def natural(names: Iterable[str]) -> list[str]:
    """Names in human order: buf2 before buf10."""
    return sorted(names, key=lambda n: [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", n)])


def _dims(ds: Iterable[Any]) -> str:
    return ", ".join(exprs.to_str(d) for d in ds)


def format_buffer(b: Buffer) -> str:
    text = f"{b.name}: {b.dtype}[{_dims(b.size)}]"
    if b.size and [exprs.to_str(s) for s in b.stride] != [exprs.to_str(s) for s in exprs.contiguous_strides(b.size)]:
        text += f" strides=[{_dims(b.stride)}]"
    if not exprs.equal(b.offset, 0):
        text += f" offset={exprs.to_str(b.offset)}"
    if b.device != "cpu":
        text += f" {b.device}"
    return text


def _arg(a: Any, subs: dict[Any, Any] | None) -> str:
    if isinstance(a, BodyValue):
        return repr(a)
    if isinstance(a, sympy.Basic):
        return exprs.to_str(a.xreplace(subs) if subs else a)
    if isinstance(a, str):
        return a
    return repr(a)


def format_body(body: LoopBody, subs: dict[Any, Any] | None = None, indent: str = "  ") -> list[str]:
    lines = []
    for k, op in enumerate(body.ops):
        args = op.args
        if op.name == "indirect_indexing":
            lines.append(f"{indent}{args[2]} = indirect_indexing({_arg(args[0], subs)}, {_arg(args[1], subs)})")
            continue
        call = f"{op.name}({', '.join(_arg(a, subs) for a in args)})"
        lines.append(f"{indent}%{k} = {call}" if op.dtype is not None else f"{indent}{call}")
    return lines


def _origin(node: Any) -> str:
    origins = node.meta.get("origins") or []
    return f"  # {'; '.join(origins)}" if origins else ""


def _extern_args(args: Any) -> str:
    def one(a: Any) -> str:
        if isinstance(a, TensorArg):
            return f"{a.buffer}[{_dims(a.size)}; strides {_dims(a.stride)}" + (
                f"; offset {exprs.to_str(a.offset)}]" if not exprs.equal(a.offset, 0) else "]")
        if isinstance(a, (list, tuple)):
            return "[" + ", ".join(one(x) for x in a) + "]"
        if isinstance(a, sympy.Basic):
            return exprs.to_str(a)
        if hasattr(a, "name") and type(a).__name__ in ("DType", "Device", "Layout", "MemoryFormat"):
            return str(a.name)
        return repr(a)

    return ", ".join(one(a) for a in args)


def format_extern(n: ExternNode) -> str:
    kw = "".join(f", {k}={_extern_args([v])}" for k, v in n.kwargs.items())
    # an undefined (None) result of the op has no buffer: it prints as ``_``
    slots = ["_"] * (max(n.result_positions(), default=-1) + 1)
    for buf, k in zip(n.outputs, n.result_positions()):
        slots[k] = buf
    return f"{', '.join(slots)} = {n.kind} {n.op}({_extern_args(n.args)}{kw}){_origin(n)}"


def format_loop_program(p: LoopProgram) -> str:
    lines = ["buffers:"]
    lines += [f"  {format_buffer(b)}" + (" (input)" if b.is_input else "") for b in p.buffers.values()]
    for n in p.nodes:
        if isinstance(n, InputBufferNode):
            continue
        if isinstance(n, ComputeNode):
            b = n.body
            ranges = [f"{v} < {exprs.to_str(s)}" for v, s in zip(b.vars + b.reduction_vars, b.sizes + b.reduction_sizes)]
            lines.append(f"{n.name} = {n.kind}({', '.join(ranges)}):{_origin(n)}")
            lines += format_body(b)
        elif isinstance(n, ExternNode):
            lines.append(f"{n.name}: {format_extern(n)}")
        elif isinstance(n, OutputBufferNode):
            lines.append(f"return {_outputs(n.outputs)}")
        else:  # pragma: no cover - the node kinds are closed
            raise AssertionError(n)
    return "\n".join(lines)


def _outputs(outs: list[Any]) -> str:
    return "(" + ", ".join(repr(o.value) if isinstance(o, Constant) else o for o in outs) + ")"


def format_kernel(k: Kernel) -> list[str]:
    ranges = [f"{v} < {exprs.to_str(s)}" for v, s in zip(k.xvars + k.rvars, k.xsizes + k.rsizes)]
    lines = [f"def {k.name}({', '.join(ranges)}):  # {k.kind}"]
    if k.internal:
        lines.append(f"  # never stored: {', '.join(natural(k.internal))}")
    for kn in k.nodes:
        stage = f", loop {kn.stage}" if k.rsizes else ""
        lines.append(f"  # {kn.node.name} ({kn.node.kind}{stage}){_origin(kn.node)}")
        lines += format_body(kn.node.body, kn.var_map, indent="  ")
    return lines


def format_schedule(s: Any) -> str:
    prog = s.program
    plan = s.plan
    lines = ["buffers:"]
    for b in prog.buffers.values():
        where = plan.buffer_allocation.get(b.name)
        tag = " (input)" if b.is_input else ""
        lines.append(f"  {format_buffer(b)}{tag}" + (f" in {where}" if where else " (never stored)"))
    for k, step in enumerate(s.steps):
        allocs = plan.allocate_before.get(k, [])
        if allocs:
            lines.append(f"# allocate {', '.join(f'{b} in {plan.buffer_allocation[b]}' for b in allocs)}")
        if isinstance(step, Kernel):
            lines += format_kernel(step)
        else:
            lines.append(f"{step.name}: {format_extern(step)}")
        frees = plan.free_after.get(k, [])
        if frees:
            lines.append(f"# free {', '.join(frees)}")
    lines.append(f"return {_outputs(prog.outputs)}")
    return "\n".join(lines)
