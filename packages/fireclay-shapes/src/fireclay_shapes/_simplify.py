"""Range-aware simplification of integer and boolean expressions.

sympy's structural rules (and those in ``FloorDiv.eval`` / ``Mod.eval``) hold for every
integer; the rules here hold only for the values the symbols may take, so they need ranges:

* ``FloorDiv(a, b) -> 0`` and ``Mod(a, b) -> a`` when ``0 <= a < b``;
* ``FloorDiv(a, b) -> -1`` when ``-b <= a < 0``;
* ``Max`` / ``Min`` drop every argument another one dominates;
* comparisons, And/Or/Not that the ranges decide become True/False;
* an expression whose range is one value becomes that value.
"""

from __future__ import annotations

import sympy

from ._expr import FloorDiv, Max, Min, Mod, is_bool_expr
from ._ranges import SymbolRanges, bound, decide


def simplify_with_ranges(expr: sympy.Basic, ranges: SymbolRanges) -> sympy.Basic:
    """``expr`` rewritten by the rules above, for symbols ranging over ``ranges(symbol)``."""
    return _simplify(expr, ranges, {})


def _simplify(expr: sympy.Basic, ranges: SymbolRanges, memo: dict) -> sympy.Basic:
    if expr.is_Atom:
        if isinstance(expr, sympy.Symbol):
            r = ranges(expr)
            if r.is_singleton:
                return sympy.Integer(int(r.lo))
        return expr
    args = tuple(_simplify(a, ranges, memo) for a in expr.args)
    if args != expr.args:
        expr = expr.func(*args)
        if expr.is_Atom:
            return expr
    if isinstance(expr, FloorDiv):
        a, b = expr.args
        rb = bound(b, ranges, memo)
        if rb.lo > 0:
            ra = bound(a, ranges, memo)
            if ra.lo >= 0 and ra.hi < rb.lo:
                return sympy.Integer(0)
            if ra.hi < 0 and ra.lo >= -rb.lo:
                return sympy.Integer(-1)
        return expr
    if isinstance(expr, Mod):
        a, b = expr.args
        rb = bound(b, ranges, memo)
        if rb.lo > 0:
            ra = bound(a, ranges, memo)
            if ra.lo >= 0 and ra.hi < rb.lo:
                return a
        return expr
    if isinstance(expr, (Max, Min)):
        return _prune_extremum(expr, ranges, memo)
    if is_bool_expr(expr):
        d = decide(expr, ranges, memo)
        if d is None:
            return expr
        return sympy.true if d else sympy.false
    if isinstance(expr, (sympy.Add, sympy.Mul, sympy.Pow)):
        r = bound(expr, ranges, memo)
        if r.is_singleton:
            return sympy.Integer(int(r.lo))
    return expr


def _prune_extremum(expr, ranges: SymbolRanges, memo: dict) -> sympy.Basic:
    is_max = isinstance(expr, Max)

    def dominates(b, a) -> bool:  # b always wins over (or ties with) a
        r = bound(b - a, ranges, memo)
        return r.lo >= 0 if is_max else r.hi <= 0

    kept: list[sympy.Basic] = []
    for a in expr.args:
        if any(dominates(b, a) for b in kept):
            continue
        kept = [b for b in kept if not dominates(a, b)]
        kept.append(a)
    if len(kept) == len(expr.args):
        return expr
    return expr.func(*kept)
