"""What every code generator of a scheduled program does the same way: scheduling what it is
given; Python text of sizes and literals; the wrapper's namespace of aten ops and constants;
the binding of symbolic sizes at the top of the wrapper; the arguments of an extern call; and
what a kernel generator tracks about its kernel. Each generator keeps its own decisions (where
buffers live, how kernels launch): only text that follows from the scheduled program alone is
here. Imports no torch.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import sympy

from fireclay_loops.errors import check_failure
from fireclay_loops.ir import ExternNode, LoopProgram, TensorArg
from fireclay_loops.lowering.context import lower
from fireclay_loops.report import ScheduledProgram
from fireclay_loops.scheduler import schedule
from fireclay_shapes import ValueRange, python_code

UNBOUNDED = ValueRange()
NONNEGATIVE = ValueRange(0, math.inf)


def to_scheduled(program: Any, **schedule_options: Any) -> ScheduledProgram:
    """An aten-dialect ``fireclay_ir.Program``, a loops-dialect one (a saved schedule, read back
    with :func:`~fireclay_loops.from_program`), a ``LoopProgram`` or a ``ScheduledProgram``,
    scheduled (``schedule_options`` go to :func:`~fireclay_loops.schedule`; a program already
    scheduled is taken as it is)."""
    if isinstance(program, ScheduledProgram):
        return program
    if _is_loops_dialect(program):
        from fireclay_loops.dialect import from_program

        return from_program(program)
    if isinstance(program, LoopProgram):
        return schedule(program, **schedule_options)
    return schedule(lower(program), **schedule_options)


def _is_loops_dialect(program: Any) -> bool:
    graphs = getattr(program, "graphs", None)
    if not isinstance(graphs, dict):
        return False
    return any(node.dialect == "loops" for graph in graphs.values() for node in graph.nodes)


def py_expr(e: Any) -> str:
    """Python text of a size expression (an int, a symbol name or a sympy expression)."""
    return python_code(sympy.sympify(e))


def py_shape(items) -> str:
    """Python text of a shape or stride tuple."""
    inner = ", ".join(py_expr(x) for x in items)
    return f"({inner},)" if len(items) == 1 else f"({inner})"


class WrapperText:
    """Generated wrapper lines, plus the objects its namespace must hold: aten ops by variable,
    and constants no literal can spell."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.namespace_ops: dict[str, str] = {}  # variable -> aten op name
        self.constants: dict[str, Any] = {}

    def line(self, text: str, depth: int = 1) -> None:
        self.lines.append("    " * depth + text)

    def op(self, name: str) -> str:
        var = "op_" + name.replace("::", "_").replace(".", "_")
        self.namespace_ops[var] = name
        return var

    def constant(self, value: Any) -> str:
        var = f"const{len(self.constants)}"
        self.constants[var] = value
        return var

    def literal(self, a: Any) -> str:
        """Python text of an extern call's non-tensor argument or a constant output; what has
        no literal (a generator, say) becomes a namespace constant."""
        if isinstance(a, sympy.Basic):
            return py_expr(a)
        if a is None or isinstance(a, (bool, int, str)):
            return repr(a)
        if isinstance(a, float):
            return repr(a) if math.isfinite(a) else f"float({str(a)!r})"
        if isinstance(a, list):
            return "[" + ", ".join(self.literal(x) for x in a) + "]"
        if isinstance(a, tuple):
            return "(" + "".join(self.literal(x) + ", " for x in a) + ")"
        kind = type(a).__name__  # the IR's enum-like values, named as torch names them
        if kind == "DType":
            return f"torch.{a.name}"
        if kind == "Device":
            return f"torch.device({a.name!r})"
        if kind in ("Layout", "MemoryFormat"):
            return f"torch.{a.name}"
        return self.constant(a)

    def bind_sizes(self, prog: LoopProgram) -> None:
        """Lines binding each symbolic size: from the first input dimension that has it, else
        from its hint (a size no input carries)."""
        bound: set[str] = set()
        for name in prog.inputs:
            for d, s in enumerate(prog.buffers[name].size):
                if isinstance(s, sympy.Symbol) and s.name not in bound:
                    self.line(f"{s.name} = {name}.shape[{d}]")
                    bound.add(s.name)
        for s, hint in sorted(prog.symbols.items()):
            if s not in bound and hint is not None:
                self.line(f"{s} = {int(hint)}  # not an input size: its hint")
                bound.add(s)

    def extern_args(self, step: ExternNode, tensor: Callable[[TensorArg], str]) -> list[str]:
        """The argument texts of an extern call, positional then ``key=value``; ``tensor`` gives
        the text of a tensor argument (a view of its buffer, as the generator holds it)."""
        def arg(a: Any) -> str:
            if isinstance(a, TensorArg):
                return tensor(a)
            if isinstance(a, (list, tuple)):
                inner = [arg(x) for x in a]
                return "[" + ", ".join(inner) + "]" if isinstance(a, list) else "(" + "".join(x + ", " for x in inner) + ")"
            return self.literal(a)

        return [arg(a) for a in step.args] + [f"{k}={arg(v)}" for k, v in step.kwargs.items()]

    def call_extern(self, fn: str, args: list[str], step: ExternNode) -> None:
        """Lines calling an extern op and listing its results as ``results``."""
        self.line(f"result = {fn}({', '.join(args)})  # {step.kind} {step.name}")
        self.line("results = list(result) if isinstance(result, (tuple, list)) else [result]")

    def extern_results(self, fn: str, args: list[str], step: ExternNode, single: bool) -> list[str]:
        """Lines calling an extern op; returns the expression of each result position:
        ``result`` itself when ``single`` (the op returns one tensor, the step's only result),
        else ``results[i]`` of the listed results."""
        if single:
            self.line(f"result = {fn}({', '.join(args)})  # {step.kind} {step.name}")
            return ["result"]
        self.call_extern(fn, args, step)
        return [f"results[{i}]" for i in range(max(step.result_positions(), default=-1) + 1)]

    @property
    def text(self) -> str:
        return "\n".join(self.lines) + "\n"


@dataclass(frozen=True)
class CheckSite:
    """One check a generated kernel makes: the op (``check_bounds``, ``check_nonzero``) and
    what it guards, in the user's terms; :meth:`error` is what a failure raises."""

    op: str
    site: str

    def error(self, value: Any = None, size: Any = None) -> Exception:
        return check_failure(self.op, self.site, value, size)


class KernelGenState:
    """What a kernel generator tracks about the kernel it writes, whatever its target: the
    buffers it touches (and whether it writes them), the size symbols and indirect index values
    it uses, fresh names, and the range of each symbol an index may contain."""

    def __init__(self, kernel) -> None:
        self.kernel = kernel
        self.buffers: dict[str, bool] = {}  # name -> written
        self.symbols: set[str] = set()
        self.indirect: dict[str, Any] = {}  # indirect index name -> the generator's value of it
        self.counter = 0
        self.sizes = {v.name: s for v, s in zip(kernel.xvars + kernel.rvars, kernel.xsizes + kernel.rsizes)}
        self.rnames = {v.name for v in kernel.rvars}
        self.checks: list[CheckSite] = []  # the kernel's ops.check_* sites, by their number

    def add_check(self, op: str, site: str) -> int:
        """Number a check of the kernel (``op``: ``check_bounds`` or ``check_nonzero``); the
        generated code reports a failure by this number, the wrapper raises from :attr:`checks`."""
        self.checks.append(CheckSite(op=op, site=site))
        return len(self.checks) - 1

    def fresh(self, prefix: str) -> str:
        self.counter += 1
        return f"{prefix}{self.counter}"

    def use_buffer(self, buf: str, write: bool) -> None:
        self.buffers[buf] = self.buffers.get(buf, False) or write

    def symbol_range(self, s: sympy.Symbol) -> ValueRange:
        """A loop variable of static extent n is in [0, n - 1]; an indirect index or a size
        symbol is nonnegative; anything else is unknown."""
        name = s.name
        if name in self.sizes:
            n = self.sizes[name]
            return ValueRange(0, int(n) - 1) if n.is_Integer and int(n) > 0 else NONNEGATIVE
        if name in self.indirect or name.startswith(("s", "ind")):
            return NONNEGATIVE
        return UNBOUNDED
