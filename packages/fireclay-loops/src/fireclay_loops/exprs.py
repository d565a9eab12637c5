"""Index expressions: fireclay-loops' one door to sympy and fireclay-shapes.

Index expressions are sympy integer expressions over loop variables (``i0``, ``r0``: a loop
body's own; ``x0``, ``r0``: a kernel's) and size symbols (``s0``), built from fireclay-shapes'
symbols and its ``FloorDiv`` / ``Mod`` (Python semantics), printed and parsed in its string form
(the form fireclay-ir stores in SymExpr), so every stage reads the same expressions.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import sympy
from sympy import Expr

from fireclay_shapes import FloorDiv, Mod, ValueRange, bound, simplify_with_ranges
from fireclay_shapes import dumps as _dumps
from fireclay_shapes import parse as _parse
from fireclay_shapes import symbol as _symbol

__all__ = ["FloorDiv", "Mod", "modular_indexing", "symbol", "as_expr", "parse", "to_str", "simplify", "equal",
           "evaluate", "hint", "product", "contiguous_strides", "to_dim", "to_static"]

UNBOUNDED = ValueRange()

# Answers of the pure functions below, by their (hashable, structurally compared) arguments: a
# model of N identical layers asks the same questions N times. Dropped whole past the limit.
_MEMO_LIMIT = 1 << 16
_simplified: dict[Any, Expr] = {}
_equal: dict[tuple[Expr, Expr], bool] = {}
_strings: dict[Expr, str] = {}


def _remember(memo: dict[Any, Any], key: Any, value: Any) -> Any:
    if len(memo) >= _MEMO_LIMIT:
        memo.clear()
    memo[key] = value
    return value


def symbol(name: str) -> sympy.Symbol:
    """An integer symbol (loop variable or size), the same object fireclay-shapes makes."""
    return _symbol(name)


def modular_indexing(a: Any, divisor: Any, modulus: Any) -> Expr:
    """``(a // divisor) % modulus``: one digit of a flat index, which a reshape needs."""
    return Mod(FloorDiv(as_expr(a), as_expr(divisor)), as_expr(modulus))


def as_expr(d: Any) -> Expr:
    """An int, a sympy expression or a string form as a sympy expression."""
    if isinstance(d, sympy.Basic):
        return d
    if isinstance(d, bool):
        raise TypeError(f"a bool is not an index expression: {d!r}")
    if isinstance(d, int):
        return sympy.Integer(d)
    if isinstance(d, str):
        return parse(d)
    raise TypeError(f"not an index expression: {d!r}")


def parse(text: str) -> Expr:
    """Read the string form (never evaluated as Python: safe for files from strangers)."""
    return _parse(text)


def to_str(e: Any) -> str:
    e = as_expr(e)
    found = _strings.get(e)
    return found if found is not None else _remember(_strings, e, _dumps(e))


def simplify(e: Any, var_sizes: Mapping[str, Any] | None = None) -> Expr:
    """Expanded, and with ``FloorDiv``/``Mod`` folded where the loop variables' ranges
    (``0 <= v < size`` for each ``var_sizes`` entry) decide them."""
    e = as_expr(e)
    key = (e, tuple(var_sizes.items()) if var_sizes else ())
    try:
        found = _simplified.get(key)
    except TypeError:  # a size that is no expression (a caller's mistake): as_expr will say so
        return _simplify(e, var_sizes)
    return found if found is not None else _remember(_simplified, key, _simplify(e, var_sizes))


def _simplify(e: Expr, var_sizes: Mapping[str, Any] | None) -> Expr:
    e = sympy.expand(e)
    if var_sizes and e.has(FloorDiv, Mod):
        ranges = {name: loop_range(size) for name, size in var_sizes.items()}
        lookup = lambda s: ranges.get(s.name, UNBOUNDED)  # noqa: E731
        e = sympy.expand(_fold_digits(simplify_with_ranges(e, lookup), lookup))
        if e.has(FloorDiv, Mod):
            e = _recombine(e)
    return e


def _fold_digits(e: Expr, ranges: Callable[[Any], ValueRange]) -> Expr:
    """Each ``FloorDiv(a, d)`` and ``Mod(a, d)`` over the loop ranges, bottom up:

    * ``a`` inside one period ``[k*d, (k+1)*d)``: ``k`` and ``a - k*d`` (a flipped index
      ``31 - i`` with ``0 <= i < 8`` is ``3*8 + (7 - i)``);
    * ``a = m*q + r`` with ``m`` dividing ``d`` and ``0 <= r < m``: ``FloorDiv(q, d/m)`` and
      ``m*Mod(q, d/m) + r``. A flat index ``50257*x0 + r0`` divided by a multiple of its row
      length (a reshape of ``[2, 16, V]`` to ``[32, V]``) is a division of the row alone, and a
      kernel loads ``50257*x0 + r0`` rather than dividing in its inner loop."""
    if e.is_Atom:
        return e
    args = tuple(_fold_digits(a, ranges) for a in e.args)
    if args != e.args:
        e = e.func(*args)
    if not (isinstance(e, (FloorDiv, Mod)) and e.args[1].is_Integer and int(e.args[1]) > 0):
        return e
    d = int(e.args[1])
    r = bound(e.args[0], ranges)
    if r.lo != -float("inf") and r.hi != float("inf") and int(r.lo) // d == int(r.hi) // d:
        k = int(r.lo) // d
        return sympy.Integer(k) if isinstance(e, FloorDiv) else sympy.expand(e.args[0] - k * d)
    split = _split_at_multiple(e.args[0], d, ranges) if d > 1 else None
    if split is None:
        return e
    q, low, m = split
    k = d // m
    if isinstance(e, FloorDiv):
        return FloorDiv(q, sympy.Integer(k)) if k > 1 else q
    return (m * Mod(q, sympy.Integer(k)) if k > 1 else sympy.Integer(0)) + low


def _split_at_multiple(a: Expr, d: int, ranges: Callable[[Any], ValueRange]) -> tuple[Expr, Expr, int] | None:
    """``a`` as ``m*q + r`` with ``m > 1`` dividing ``d``, integer ``q`` and ``0 <= r < m``, the
    largest such ``m`` among the divisors its terms' coefficients share with ``d``; None if none."""
    terms = [(t, t.as_coeff_Mul()[0]) for t in sympy.Add.make_args(sympy.expand(a))]
    divisors = {math.gcd(abs(int(c)), d) for _, c in terms if c.is_Integer and c != 0}
    for m in sorted((m for m in divisors if m > 1), reverse=True):
        high = [t for t, c in terms if c.is_Integer and int(c) % m == 0]
        low = sympy.Add(*[t for t, c in terms if not (c.is_Integer and int(c) % m == 0)])
        r = bound(low, ranges)
        if r.lo >= 0 and r.hi < m:
            return sympy.expand(sympy.Add(*high) / m), low, m
    return None


def equal(a: Any, b: Any) -> bool:
    """Whether two index expressions are provably equal."""
    a, b = as_expr(a), as_expr(b)
    if a == b:  # the same expression (static sizes, most of the time): equal without algebra
        return True
    if a.is_Integer and b.is_Integer:
        return False
    found = _equal.get((a, b))
    return found if found is not None else _remember(_equal, (a, b), _provably_equal(a, b))


def _provably_equal(a: Expr, b: Expr) -> bool:
    diff = sympy.expand(a - b)
    if diff == 0:
        return True
    return bool(diff.has(FloorDiv, Mod) and _recombine(diff) == 0)


def _recombine(e: Expr) -> Expr:
    """Rewrite ``c*d*FloorDiv(a, d) + c*Mod(a, d)`` as ``c*a`` (true for every integer ``a``):
    what splitting a loop into two and joining it back leaves behind."""
    for _ in range(16):
        terms = sympy.Add.make_args(e)
        coeffs: dict[Any, Any] = {}
        for t in terms:
            c, rest = t.as_coeff_Mul()
            coeffs[rest] = coeffs.get(rest, 0) + c
        for m, c in coeffs.items():
            if isinstance(m, Mod) and m.args[1].is_Integer:
                a, d = m.args
                fd = FloorDiv(a, d)
                if coeffs.get(fd, 0) == c * d:
                    e = sympy.expand(e - c * m - c * d * fd + c * a)
                    break
        else:
            return e
    return e


def loop_range(size: Any) -> ValueRange:
    """The values a loop variable of extent ``size`` takes: ``[0, size - 1]`` for a known
    positive size, else the non-negative numbers."""
    n = to_static(size)
    return ValueRange(0, n - 1) if n is not None and n > 0 else ValueRange(0, float("inf"))


def to_static(e: Any) -> int | None:
    e = as_expr(e)
    return int(e) if e.is_Integer else None


def hint(e: Any, hints: Mapping[str, int]) -> int:
    """The value of an expression with every symbol replaced by its hint."""
    e = as_expr(e)
    if e.is_Integer:
        return int(e)
    return int(evaluate(e, {s.name: hints[s.name] for s in e.free_symbols}))


def product(items: Iterable[Any]) -> Expr:
    out = sympy.Integer(1)
    for x in items:
        out = out * as_expr(x)
    return out


def contiguous_strides(size: Sequence[Any]) -> list[Expr]:
    strides: list[Expr] = []
    acc = sympy.Integer(1)
    for d in reversed(list(size)):
        strides.append(acc)
        acc = acc * as_expr(d)
    return list(reversed(strides))


def to_dim(e: Any) -> int | str:
    """An expression as a fireclay-ir dimension: an int when static, else its string form."""
    e = as_expr(e)
    return int(e) if e.is_Integer else to_str(e)


def evaluate(e: Expr, env: Mapping[str, Any], bound: int | None = None) -> Any:
    """Evaluate with symbols bound to ints or to integer tensors (anything with Python
    arithmetic and ``//`` / ``%``), so the reference executor evaluates whole grids at once.
    ``bound``: an int result, or a partial one, beyond ``±bound`` raises OverflowError (a size
    of a document from someone else that would otherwise grow without limit)."""
    def fits(v: Any) -> Any:
        if bound is not None and isinstance(v, int) and abs(v) > bound:
            raise OverflowError(f"{e} is beyond {bound.bit_length()} bits")
        return v

    if e.is_Integer:
        return fits(int(e))
    if e.is_Symbol:
        return fits(env[e.name])
    if isinstance(e, sympy.Add):
        out = 0
        for a in e.args:
            out = fits(out + evaluate(a, env, bound))
        return out
    if isinstance(e, sympy.Mul):
        out = 1
        for a in e.args:
            out = fits(out * evaluate(a, env, bound))
        return out
    if isinstance(e, sympy.Pow) and e.exp.is_Integer and int(e.exp) >= 0:
        base = evaluate(e.base, env, bound)
        out = 1
        for _ in range(int(e.exp)):
            out = fits(out * base)
        return out
    if isinstance(e, FloorDiv):
        return evaluate(e.args[0], env, bound) // evaluate(e.args[1], env, bound)
    if isinstance(e, Mod):
        return evaluate(e.args[0], env, bound) % evaluate(e.args[1], env, bound)
    raise ValueError(f"cannot evaluate index expression {e} (unsupported {type(e).__name__})")
