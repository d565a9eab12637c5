"""Value ranges: closed integer intervals bounding what an expression can evaluate to.

Bounds are Python ints, or ``-INF`` / ``INF`` for open ends. The analysis is sound, not tight:
a range may be wider than the true set of values, never narrower. That is all the
simplifier and the guard decider need: they only act when a range proves something.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import sympy

from ._expr import FloorDiv, Max, Min, Mod, is_bool_expr

INF = math.inf


@dataclass(frozen=True)
class ValueRange:
    lo: int | float = -INF
    hi: int | float = INF

    def __post_init__(self) -> None:
        if self.lo > self.hi:
            raise ValueError(f"empty value range [{self.lo}, {self.hi}]")

    @property
    def is_singleton(self) -> bool:
        return self.lo == self.hi

    def __contains__(self, v: int) -> bool:
        return self.lo <= v <= self.hi

    def intersect(self, other: ValueRange) -> ValueRange:
        lo, hi = max(self.lo, other.lo), min(self.hi, other.hi)
        if lo > hi:
            raise ValueError(f"value ranges [{self.lo}, {self.hi}] and [{other.lo}, {other.hi}] do not meet")
        return ValueRange(lo, hi)

    def __str__(self) -> str:
        return f"[{self.lo}, {self.hi}]"


UNBOUNDED = ValueRange()
BOOL_TRUE = ValueRange(1, 1)
BOOL_FALSE = ValueRange(0, 0)
BOOL_UNKNOWN = ValueRange(0, 1)


def _mul(a, b):
    # inf * 0 is nan in floats; as bounds of integer sets it is 0.
    if a == 0 or b == 0:
        return 0
    return a * b


def _floordiv(a, b):
    if math.isinf(a) or math.isinf(b):
        if math.isinf(b):
            # b infinite only as a bound of a positive divisor range: quotient tends to 0 or -1.
            return 0 if a >= 0 else -1
        return a if b > 0 else -a
    return a // b


def _corners(op, x: ValueRange, y: ValueRange) -> ValueRange:
    vals = [op(a, b) for a in (x.lo, x.hi) for b in (y.lo, y.hi)]
    return ValueRange(min(vals), max(vals))


SymbolRanges = Callable[[sympy.Symbol], ValueRange]


def bound(expr: sympy.Basic, ranges: SymbolRanges, memo: dict | None = None) -> ValueRange:
    """A range holding every value ``expr`` takes when each symbol lies in ``ranges(symbol)``.
    Booleans are ranges within [0, 1]. ``memo`` caches sub-results across calls that share
    ``ranges`` (the simplifier asks about nested sub-expressions many times)."""
    if memo is None:
        return _bound(expr, ranges, None)
    hit = memo.get(expr)
    if hit is None:
        hit = memo[expr] = _bound(expr, ranges, memo)
    return hit


def _bound(expr: sympy.Basic, ranges: SymbolRanges, memo: dict | None) -> ValueRange:
    if isinstance(expr, sympy.Integer):
        v = int(expr)
        return ValueRange(v, v)
    if isinstance(expr, sympy.Symbol):
        return ranges(expr)
    if expr is sympy.true:
        return BOOL_TRUE
    if expr is sympy.false:
        return BOOL_FALSE
    if isinstance(expr, sympy.Add):
        lo = hi = 0
        for a in expr.args:
            r = bound(a, ranges, memo)
            lo, hi = lo + r.lo, hi + r.hi
        return ValueRange(lo, hi)
    if isinstance(expr, sympy.Mul):
        acc = ValueRange(1, 1)
        for a in expr.args:
            acc = _corners(_mul, acc, bound(a, ranges, memo))
        return acc
    if isinstance(expr, sympy.Pow):
        return _bound_pow(expr, ranges, memo)
    if isinstance(expr, FloorDiv):
        a, b = bound(expr.args[0], ranges, memo), bound(expr.args[1], ranges, memo)
        if b.lo > 0 or b.hi < 0:
            return _corners(_floordiv, a, b)
        return UNBOUNDED
    if isinstance(expr, Mod):
        a, b = bound(expr.args[0], ranges, memo), bound(expr.args[1], ranges, memo)
        if b.lo > 0:
            if a.lo >= 0 and a.hi < b.lo:
                return a
            return ValueRange(0, b.hi - 1) if a.lo < 0 or a.hi >= b.hi - 1 else ValueRange(0, a.hi)
        if b.hi < 0:
            return ValueRange(b.lo + 1, 0)
        return UNBOUNDED
    if isinstance(expr, Max):
        rs = [bound(a, ranges, memo) for a in expr.args]
        return ValueRange(max(r.lo for r in rs), max(r.hi for r in rs))
    if isinstance(expr, Min):
        rs = [bound(a, ranges, memo) for a in expr.args]
        return ValueRange(min(r.lo for r in rs), min(r.hi for r in rs))
    if isinstance(expr, sympy.core.relational.Relational):
        return _bound_relational(expr, ranges, memo)
    if isinstance(expr, sympy.And):
        rs = [bound(a, ranges, memo) for a in expr.args]
        return ValueRange(min(r.lo for r in rs), min(r.hi for r in rs))
    if isinstance(expr, sympy.Or):
        rs = [bound(a, ranges, memo) for a in expr.args]
        return ValueRange(max(r.lo for r in rs), max(r.hi for r in rs))
    if isinstance(expr, sympy.Not):
        r = bound(expr.args[0], ranges, memo)
        return ValueRange(1 - r.hi, 1 - r.lo)
    return UNBOUNDED


def _bound_pow(expr: sympy.Pow, ranges: SymbolRanges, memo=None) -> ValueRange:
    base, exp = expr.args
    if not isinstance(exp, sympy.Integer) or int(exp) < 0:
        return UNBOUNDED
    n = int(exp)
    b = bound(base, ranges, memo)
    vals = [b.lo ** n if not math.isinf(b.lo) else (INF if n % 2 == 0 else -INF),
            b.hi ** n if not math.isinf(b.hi) else INF]
    lo, hi = min(vals), max(vals)
    if n % 2 == 0 and b.lo <= 0 <= b.hi:
        lo = 0
    return ValueRange(lo, hi)


def _bound_relational(expr, ranges: SymbolRanges, memo=None) -> ValueRange:
    if is_bool_expr(expr.lhs) or is_bool_expr(expr.rhs):
        return BOOL_UNKNOWN
    d = bound(expr.lhs - expr.rhs, ranges, memo)
    op = expr.rel_op
    if op == "==":
        if d.lo == d.hi == 0:
            return BOOL_TRUE
        return BOOL_FALSE if (d.lo > 0 or d.hi < 0) else BOOL_UNKNOWN
    if op == "!=":
        if d.lo == d.hi == 0:
            return BOOL_FALSE
        return BOOL_TRUE if (d.lo > 0 or d.hi < 0) else BOOL_UNKNOWN
    if op == "<":
        return BOOL_TRUE if d.hi < 0 else BOOL_FALSE if d.lo >= 0 else BOOL_UNKNOWN
    if op == "<=":
        return BOOL_TRUE if d.hi <= 0 else BOOL_FALSE if d.lo > 0 else BOOL_UNKNOWN
    if op == ">":
        return BOOL_TRUE if d.lo > 0 else BOOL_FALSE if d.hi <= 0 else BOOL_UNKNOWN
    if op == ">=":
        return BOOL_TRUE if d.lo >= 0 else BOOL_FALSE if d.hi < 0 else BOOL_UNKNOWN
    return BOOL_UNKNOWN


def decide(expr: sympy.Basic, ranges: SymbolRanges, memo: dict | None = None) -> bool | None:
    """True or False when the ranges prove a boolean expression, else None."""
    r = bound(expr, ranges, memo)
    if r.lo >= 1:
        return True
    if r.hi <= 0:
        return False
    return None
