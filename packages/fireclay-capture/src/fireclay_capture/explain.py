"""``explain(fn)(*args)``: capture ``fn`` once on these arguments and report what happened: the
graphs, where and why they were split, the ops in each, the guards and the time it took."""

from __future__ import annotations

import os
import time
import types
from dataclasses import dataclass, field
from typing import Any

from fireclay_ir import Program

# What to do about a break, by words of its reason (first match wins).
_SUGGESTIONS = [
    ("print()", "move print() out of the captured function, or print after it returns"),
    ("graph_break()", "remove the graph_break() call if the split is not wanted"),
    ("marked disable()", "the function is marked disable(): it runs eagerly by design"),
    ("item()", "keep the value a tensor: use tensor ops (torch.where, clamp) instead of a Python number"),
    ("tolist()", "keep the values in a tensor instead of a Python list"),
    ("numpy()", "replace the NumPy computation with the torch equivalent"),
    ("branch on a tensor", "make the branch a tensor op (torch.where) or use fireclay_capture.cond()"),
    ("data-dependent", "avoid Python control flow on tensor values; use torch.where or cond()"),
    ("mutating a list", "return the new values instead of mutating a list or dict passed in"),
    ("mutating a dict", "return the new values instead of mutating a list or dict passed in"),
    ("global", "return the value instead of assigning a global inside the captured function"),
]
_DEFAULT_SUGGESTION = "rewrite the line with torch operations, or move it into a function marked disable()"


def suggestion_for(reason: str) -> str:
    for words, fix in _SUGGESTIONS:
        if words in reason:
            return fix
    return _DEFAULT_SUGGESTION


@dataclass
class BreakReason:
    function: str
    reason: str
    file: str
    line: int
    text: str
    suggestion: str

    def __str__(self) -> str:
        return (f"{self.function} at {self.file}:{self.line}\n      {self.text}\n"
                f"    why: {self.reason}\n    fix: {self.suggestion}")


@dataclass
class Explanation:
    graphs: list[Program]
    break_reasons: list[BreakReason]
    ops_per_graph: list[list[str]]
    guards: list[str]
    eager_frames: list[str]  # functions (or resume functions) that ran eagerly, with the reason
    seconds: float
    result: Any = field(repr=False, default=None)

    @property
    def graph_count(self) -> int:
        return len(self.graphs)

    @property
    def break_count(self) -> int:
        return len(self.break_reasons)

    @property
    def op_count(self) -> int:
        return sum(len(ops) for ops in self.ops_per_graph)

    def __str__(self) -> str:
        lines = [f"Graphs: {self.graph_count}", f"Graph breaks: {self.break_count}", f"Ops: {self.op_count}"]
        for i, ops in enumerate(self.ops_per_graph):
            lines.append(f"  graph {i}: {len(ops)} ops: {', '.join(ops)}")
        if self.break_reasons:
            lines.append("Break reasons:")
            for i, b in enumerate(self.break_reasons, 1):
                lines.append(f"  {i}. {b}")
        if self.eager_frames:
            lines.append("Ran eagerly:")
            lines.extend(f"  {why}" for why in self.eager_frames)
        lines.append(f"Guards: {len(self.guards)}")
        lines.extend(f"  {g}" for g in self.guards)
        lines.append(f"Time: {self.seconds:.3f}s")
        return "\n".join(lines)


def explain(fn, **capture_options):
    """``explain(fn)(*args, **kwargs)`` captures ``fn`` afresh, runs it once and returns an
    :class:`Explanation`; ``str()`` of it is a readable report."""
    from fireclay_capture.api import capture

    def run(*args, **kwargs) -> Explanation:
        captured = capture(fn, **capture_options)
        start = time.perf_counter()
        result = captured(*args, **kwargs)
        seconds = time.perf_counter() - start
        graphs: list[Any] = []
        reasons: list[Any] = []
        ops: list[Any] = []
        guards: list[Any] = []
        eager: list[Any] = []
        for cf in _all_functions(captured):
            for entry in cf.cache.entries:
                if entry.program is not None:
                    nodes = entry.program.graphs[entry.program.entry].nodes
                    if nodes:
                        graphs.append(entry.program)
                        ops.append([n.op for n in nodes])
                    guards.extend(describe_guard(g) for g in entry.guards.guards)
                plan = entry.graph_break
                if plan is not None:
                    loc = plan.location or {}
                    reasons.append(BreakReason(cf.code.co_qualname, plan.reason, loc.get("file", "?"),
                                               loc.get("line", 0), loc.get("text", ""), suggestion_for(plan.reason)))
                if entry.reason:
                    eager.append(entry.reason.splitlines()[0])
        return Explanation(graphs, reasons, ops, guards, eager, seconds, result)

    return run


def describe_guard(guard) -> str:
    """One short line per guard: what it checks, on which value of the user's."""
    where = guard.source.name_hint() if guard.source is not None else ""
    if guard.kind == "tensor":
        _, dtype, device, shape, _, requires_grad, dynamic = guard.data
        dims = ", ".join("?" if i in dynamic else str(d) for i, d in enumerate(shape))
        what = f"{str(dtype).removeprefix('torch.')}[{dims}] on {device}" + (" requires_grad" if requires_grad else "")
    elif isinstance(guard.data, types.ModuleType):
        what = f"module {guard.data.__name__}"  # its repr names a file path that varies by install
    else:
        what = repr(guard.data)
        what = what if len(what) <= 60 else what[:57] + "..."
    return f"{guard.kind}({where}): {what}" if where else f"{guard.kind}: {what}"


def _all_functions(root):
    seen, order = set(), []

    def visit(cf):
        if id(cf) in seen:
            return
        seen.add(id(cf))
        order.append(cf)
        for child in cf.children:
            visit(child)

    visit(root)
    return order


def normalise_report(text: str) -> str:
    """The report with paths relative to the current directory and the time hidden (for goldens)."""
    import re

    text = text.replace(os.getcwd() + os.sep, "")
    text = re.sub(r"0x[0-9a-f]+", "0x?", text)
    return re.sub(r"Time: [0-9.]+s", "Time: <t>s", text)
