"""The wrapper text every code generator of a scheduled program writes the same way: Python
text of sizes and literals; the wrapper's namespace of aten ops and constants; the binding of
symbolic sizes at the top of the wrapper; the arguments of an extern call. Each generator keeps
its own decisions (where buffers live, how kernels launch): only text that follows from the
scheduled program alone is here. Imports no torch.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import sympy

from fireclay_loops.ir import ExternNode, LoopProgram, TensorArg
from fireclay_shapes import python_code


def py_expr(e: Any) -> str:
    """Python text of a size expression (an int, a symbol name or a sympy expression)."""
    return python_code(sympy.sympify(e))


def constant_size(expr: Any) -> int | None:
    """A size (an int or a sympy expression) as an ``int`` when it is a constant of the program,
    else None (it depends on size symbols, known at run time)."""
    e = sympy.sympify(expr)
    return int(e) if e.is_Integer else None


def py_shape(items: Sequence[Any]) -> str:
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
