"""Printers from symbolic expressions to Python, C++ and Triton source text.

Python's ``//`` and ``%`` round toward minus infinity; C++'s ``/`` and ``%`` and Triton's
``//`` and ``%`` on integers truncate toward zero. The C++ and Triton printers therefore emit
plain operators only where value ranges prove both operands non-negative (the usual case for
index expressions, and the fast one), and otherwise a form that is right for negative values:
helper functions for C++ (:data:`CPP_PRELUDE`), an inline ``tl.where`` for Triton.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import sympy

from ._expr import FloorDiv, Max, Min, Mod, ShapeError, as_expr
from ._ranges import SymbolRanges, bound

CPP_PRELUDE = """\
#include <cstdint>
// Python semantics for integer division and modulo (floor rounding, sign of the divisor).
static inline int64_t fc_floordiv(int64_t a, int64_t b) {
  int64_t q = a / b, r = a % b;
  return (r != 0 && ((r < 0) != (b < 0))) ? q - 1 : q;
}
static inline int64_t fc_mod(int64_t a, int64_t b) {
  int64_t r = a % b;
  return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r;
}
static inline int64_t fc_max(int64_t a, int64_t b) { return a < b ? b : a; }
static inline int64_t fc_min(int64_t a, int64_t b) { return a < b ? a : b; }
"""

# precedence levels: higher binds tighter
_OR, _AND, _NOT, _CMP, _ADD, _MUL, _UNARY, _POW, _ATOM = range(9)


class _Printer:
    """Shared walk; subclasses say how each construct is spelt in their language."""

    def __init__(self, names: Mapping[str, str] | None = None, ranges: SymbolRanges | None = None):
        self.names = dict(names or {})
        self.ranges = ranges

    def doprint(self, expr) -> str:
        return self._p(as_expr(expr))[0]

    # -- helpers
    def _wrap(self, e, prec: int) -> str:
        s, p = self._p(e)
        return f"({s})" if p < prec else s

    def _nonneg(self, e) -> bool:
        if isinstance(e, sympy.Integer):
            return int(e) >= 0
        if self.ranges is None:
            return False
        return bound(e, self.ranges).lo >= 0

    def _positive(self, e) -> bool:
        if isinstance(e, sympy.Integer):
            return int(e) > 0
        return self.ranges is not None and bound(e, self.ranges).lo > 0

    # -- dispatch
    def _p(self, e) -> tuple[str, int]:
        if isinstance(e, sympy.Integer):
            v = int(e)
            return self.integer(v), (_ATOM if v >= 0 else _UNARY)
        if isinstance(e, sympy.Symbol):
            return self.names.get(e.name, e.name), _ATOM
        if e is sympy.true or e is sympy.false:
            return self.boolean(e is sympy.true), _ATOM
        if isinstance(e, sympy.Add):
            return self._add(e), _ADD
        if isinstance(e, sympy.Mul):
            return self._mul(e)
        if isinstance(e, sympy.Pow):
            return self._pow(e)
        if isinstance(e, FloorDiv):
            return self.floordiv(*e.args)
        if isinstance(e, Mod):
            return self.mod(*e.args)
        if isinstance(e, (Max, Min)):
            args = list(e.args)  # Max/Min sort their arguments on construction
            return self.minmax("max" if isinstance(e, Max) else "min", args), _ATOM
        if isinstance(e, sympy.core.relational.Relational):
            return f"{self._wrap(e.lhs, _ADD)} {e.rel_op} {self._wrap(e.rhs, _ADD)}", _CMP
        if isinstance(e, (sympy.And, sympy.Or)):
            args = sorted(e.args, key=sympy.default_sort_key)
            return self.logic("and" if isinstance(e, sympy.And) else "or", args)
        if isinstance(e, sympy.Not):
            return self.logic_not(e.args[0])
        raise ShapeError(f"cannot print {e!r} ({type(e).__name__}) as {self.language} source")

    def _add(self, e) -> str:
        # sympy keeps an Add's terms in a canonical order (numbers first); print the number
        # last. (as_ordered_terms computes float coefficients: most of the printing time.)
        terms = [t for t in e.args if not t.is_Number] + [t for t in e.args if t.is_Number]
        out = self._wrap(terms[0], _ADD)
        for t in terms[1:]:
            coeff, _ = t.as_coeff_Mul()
            if coeff.is_negative:
                out += " - " + self._wrap(-t, _MUL)
            else:
                out += " + " + self._wrap(t, _MUL)
        return out

    def _mul(self, e) -> tuple[str, int]:
        coeff, rest = e.as_coeff_Mul()
        if not isinstance(coeff, sympy.Integer):
            raise ShapeError(f"cannot print {e} as {self.language} integer arithmetic: it has a fractional coefficient")
        factors = sympy.Mul.make_args(rest)  # canonical order already
        body = "*".join(self._wrap(f, _UNARY) for f in factors)
        if coeff == 1:
            return body, _MUL
        if coeff == -1:
            return "-" + self._wrap(rest, _POW if len(factors) == 1 else _UNARY), _UNARY
        return f"{self._wrap(coeff, _UNARY)}*{body}", _MUL

    def _pow(self, e) -> tuple[str, int]:
        base, exp = e.args
        if not isinstance(exp, sympy.Integer) or int(exp) < 0:
            raise ShapeError(f"cannot print {e} as {self.language} integer arithmetic: exponent {exp}")
        return self.power(base, int(exp))

    # -- language hooks
    language = "?"

    def integer(self, v: int) -> str:
        return str(v)

    def boolean(self, v: bool) -> str:
        return "True" if v else "False"

    def power(self, base, n: int) -> tuple[str, int]:
        if n == 0:
            return "1", _ATOM
        b = self._wrap(base, _UNARY)
        return "*".join([b] * n), (_MUL if n > 1 else _ATOM)


class PythonPrinter(_Printer):
    language = "Python"

    def power(self, base, n):
        return f"{self._wrap(base, _ATOM)}**{n}", _POW

    def floordiv(self, a, b):
        return f"{self._wrap(a, _MUL)} // {self._wrap(b, _UNARY)}", _MUL

    def mod(self, a, b):
        return f"{self._wrap(a, _MUL)} % {self._wrap(b, _UNARY)}", _MUL

    def minmax(self, which, args):
        return f"{which}(" + ", ".join(self._p(a)[0] for a in args) + ")"

    def logic(self, which, args):
        prec = _AND if which == "and" else _OR
        return f" {which} ".join(self._wrap(a, prec + 1) for a in args), prec

    def logic_not(self, a):
        return f"not {self._wrap(a, _NOT)}", _NOT


class CppPrinter(_Printer):
    """C++ over ``int64_t`` variables; needs :data:`CPP_PRELUDE` in scope unless every
    division and modulo is proven non-negative."""

    language = "C++"

    def integer(self, v):
        return f"{v}LL" if abs(v) >= 2**31 else str(v)

    def boolean(self, v):
        return "true" if v else "false"

    def floordiv(self, a, b):
        if self._nonneg(a) and self._positive(b):
            return f"{self._wrap(a, _MUL)} / {self._wrap(b, _UNARY)}", _MUL
        return f"fc_floordiv({self._p(a)[0]}, {self._p(b)[0]})", _ATOM

    def mod(self, a, b):
        if self._nonneg(a) and self._positive(b):
            return f"{self._wrap(a, _MUL)} % {self._wrap(b, _UNARY)}", _MUL
        return f"fc_mod({self._p(a)[0]}, {self._p(b)[0]})", _ATOM

    def minmax(self, which, args):
        out = self._p(args[-1])[0]
        for a in reversed(args[:-1]):
            out = f"fc_{which}({self._p(a)[0]}, {out})"
        return out

    def logic(self, which, args):
        prec = _AND if which == "and" else _OR
        op = " && " if which == "and" else " || "
        return op.join(self._wrap(a, prec + 1) for a in args), prec

    def logic_not(self, a):
        return f"!({self._p(a)[0]})", _UNARY


class TritonPrinter(_Printer):
    """Triton (``tl``) source; integer ``//`` and ``%`` in Triton truncate like C."""

    language = "Triton"

    def floordiv(self, a, b):
        if self._nonneg(a) and self._positive(b):
            return f"{self._wrap(a, _MUL)} // {self._wrap(b, _UNARY)}", _MUL
        sa, sb = self._p(a)[0], self._p(b)[0]
        q = f"({sa}) // ({sb})"
        signs_differ = f"(({sa}) < 0)" if self._positive(b) else f"((({sa}) < 0) != (({sb}) < 0))"
        return f"tl.where((({sa}) % ({sb}) != 0) & {signs_differ}, {q} - 1, {q})", _ATOM

    def mod(self, a, b):
        if self._nonneg(a) and self._positive(b):
            return f"{self._wrap(a, _MUL)} % {self._wrap(b, _UNARY)}", _MUL
        sb = self._p(b)[0]
        r = f"({self._p(a)[0]}) % ({sb})"
        signs_differ = f"(({r}) < 0)" if self._positive(b) else f"((({r}) < 0) != (({sb}) < 0))"
        return f"tl.where((({r}) != 0) & {signs_differ}, {r} + ({sb}), {r})", _ATOM

    def minmax(self, which, args):
        fn = "tl.maximum" if which == "max" else "tl.minimum"
        out = self._p(args[-1])[0]
        for a in reversed(args[:-1]):
            out = f"{fn}({self._p(a)[0]}, {out})"
        return out

    def logic(self, which, args):
        # & and | bind tighter than comparisons in Python syntax: parenthesize every operand.
        op = " & " if which == "and" else " | "
        return op.join(f"({self._p(a)[0]})" for a in args), (_AND if which == "and" else _OR)

    def logic_not(self, a):
        return f"({self._p(a)[0]}) == 0", _CMP


def _make(cls) -> Callable[..., str]:
    def print_expr(expr, names: Mapping[str, str] | None = None, ranges: SymbolRanges | None = None) -> str:
        return cls(names, ranges).doprint(expr)

    print_expr.__name__ = f"{cls.language.lower().replace('+', 'p')}_code"
    print_expr.__doc__ = (f"``expr`` as {cls.language} source. ``names`` maps symbol names to the text to print "
                          "for them; ``ranges`` (e.g. ``ShapeEnv.range_of_symbol``) lets the printer use "
                          "cheaper operators where operands are proven non-negative.")
    return print_expr


python_code = _make(PythonPrinter)
cpp_code = _make(CppPrinter)
triton_code = _make(TritonPrinter)
