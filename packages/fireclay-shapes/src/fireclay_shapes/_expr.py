"""The expression language: sympy integers plus the integer functions shapes need, and the
string form that fireclay-ir stores.

Integer semantics are Python's: ``FloorDiv(a, b)`` rounds toward minus infinity and
``Mod(a, b)`` takes the sign of ``b``. sympy's own ``floor(a/b)`` and ``Mod`` are avoided on
purpose: they go through rationals and heavy automatic rewriting, which is slow on the index
expressions of codegen and prints ambiguously.

String form (what ``dumps`` writes and ``parse`` reads)::

    expr    := or
    or      := "Or(" bool ("," bool)* ")" | ...   (And / Or / Not are written as calls)
    compare := arith ("==" | "!=" | "<" | "<=" | ">" | ">=") arith
    arith   := term (("+" | "-") term)*
    term    := unary (("*") unary)*
    unary   := "-" unary | power
    power   := atom ("**" INT)?
    atom    := INT | NAME | "(" expr ")" | FUNC "(" expr ("," expr)* ")"
    FUNC    := FloorDiv | Mod | Max | Min | And | Or | Not

``parse`` is a small hand-written parser (never ``eval`` or ``sympy.sympify``), so that
expressions read from a stranger's file cannot run code.
"""

from __future__ import annotations

import re
from functools import lru_cache

import sympy
from sympy.printing.str import StrPrinter


class ShapeError(Exception):
    """Base of the errors fireclay-shapes raises."""


class ExprParseError(ShapeError, ValueError):
    """A string is not a well-formed symbolic expression."""


# --------------------------------------------------------------------------- functions


def _is_int(x: sympy.Basic) -> bool:
    return isinstance(x, sympy.Integer)


def _split_multiples(expr: sympy.Expr, divisor: int) -> tuple[sympy.Expr, sympy.Expr]:
    """Split ``expr`` into (terms whose integer coefficient ``divisor`` divides, the rest)."""
    terms = sympy.Add.make_args(expr)
    multiples, rest = [], []
    for term in terms:
        coeff, _ = term.as_coeff_Mul()
        if _is_int(coeff) and int(coeff) % divisor == 0:
            multiples.append(term)
        else:
            rest.append(term)
    return sympy.Add(*multiples), sympy.Add(*rest)


def _split_symbolic_multiples(expr: sympy.Expr, divisor: sympy.Expr) -> tuple[sympy.Expr, sympy.Expr]:
    """Split ``expr`` into (sum of quotients of the terms that ``divisor`` divides as
    polynomials, the remaining terms)."""
    quotients, rest = [], []
    for term in sympy.Add.make_args(expr):
        q = term / divisor
        if q.is_polynomial() and sympy.denom(q) == 1 and all(c.is_Integer for c in q.as_coefficients_dict().values()):
            quotients.append(q)
        else:
            rest.append(term)
    return sympy.Add(*quotients), sympy.Add(*rest)


class FloorDiv(sympy.Function):
    """Integer division rounding toward minus infinity (Python's ``//``)."""

    is_integer = True
    nargs = 2

    @classmethod
    def eval(cls, a, b):
        if b == 0:
            raise ZeroDivisionError(f"symbolic floor division by zero: FloorDiv({a}, {b})")
        if _is_int(a) and _is_int(b):
            return sympy.Integer(int(a) // int(b))
        if b == 1:
            return a
        if b == -1:
            return -a
        if a == 0:
            return sympy.Integer(0)
        if a == b:
            return sympy.Integer(1)
        if _is_int(b) and int(b) > 0:
            d = int(b)
            # (d*k*x + r) // d == k*x + r // d holds for every integer x: exact, range-free.
            multiples, rest = _split_multiples(a, d)
            if multiples != 0:
                return sympy.expand(multiples / d) + cls(rest, b)
            if isinstance(a, FloorDiv) and _is_int(a.args[1]) and int(a.args[1]) > 0:
                # (x // m) // d == x // (m*d) for positive m, d.
                return cls(a.args[0], sympy.Integer(int(a.args[1]) * d))
        elif not _is_int(b):
            # (b*q + r) // b == q + r // b for a symbolic b and polynomial q.
            multiples, rest = _split_symbolic_multiples(a, b)
            if multiples != 0:
                return multiples + cls(rest, b)
        return None


class Mod(sympy.Function):
    """Integer remainder with the sign of the divisor (Python's ``%``)."""

    is_integer = True
    nargs = 2

    @classmethod
    def eval(cls, a, b):
        if b == 0:
            raise ZeroDivisionError(f"symbolic modulo by zero: Mod({a}, {b})")
        if _is_int(a) and _is_int(b):
            return sympy.Integer(int(a) % int(b))
        if b == 1 or b == -1 or a == 0 or a == b:
            return sympy.Integer(0)
        if _is_int(b) and int(b) > 0:
            d = int(b)
            multiples, rest = _split_multiples(a, d)
            if multiples != 0:
                return cls(rest, b)
            if isinstance(a, Mod) and _is_int(a.args[1]) and int(a.args[1]) % d == 0 and int(a.args[1]) > 0:
                # (x % (k*d)) % d == x % d
                return cls(a.args[0], b)
        elif not _is_int(b):
            multiples, rest = _split_symbolic_multiples(a, b)
            if multiples != 0:
                return cls(rest, b)
        return None


class _Extremum(sympy.Function):
    """Max/Min of integers, kept cheap: constants fold, nesting flattens, duplicates go,
    arguments sort into one canonical order. (sympy's Max/Min consult the assumptions system
    on every construction, which dominates the cost of index arithmetic.)"""

    is_integer = True
    _pick = max

    @classmethod
    def eval(cls, *args):
        if not args:
            raise TypeError(f"{cls.__name__} needs at least one argument")
        flat: list[sympy.Basic] = []
        for a in args:
            flat.extend(a.args if isinstance(a, cls) else (a,))
        consts = [int(a) for a in flat if _is_int(a)]
        rest = {a for a in flat if not _is_int(a)}
        new = sorted(rest, key=sympy.default_sort_key)
        if consts:
            new.insert(0, sympy.Integer(cls._pick(consts)))
        if len(new) == 1:
            return new[0]
        if tuple(new) != tuple(args):
            return cls(*new)
        return None


class Max(_Extremum):
    """The largest of its integer arguments."""

    _pick = max


class Min(_Extremum):
    """The smallest of its integer arguments."""

    _pick = min

FUNCTIONS: dict[str, object] = {
    "FloorDiv": FloorDiv, "Mod": Mod, "Max": Max, "Min": Min,
    "And": sympy.And, "Or": sympy.Or, "Not": sympy.Not,
}

_SYMBOL_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@lru_cache(maxsize=4096)
def symbol(name: str) -> sympy.Symbol:
    """The sympy symbol called ``name`` as fireclay-shapes makes them (integer-valued)."""
    if not _SYMBOL_NAME.match(name) or name in FUNCTIONS or name in ("True", "False"):
        raise ShapeError(f"{name!r} cannot name a symbol; use letters, digits and '_'")
    return sympy.Symbol(name, integer=True)


def as_expr(x) -> sympy.Basic:
    """An int, bool, sympy expression or string form as a sympy expression."""
    if isinstance(x, bool):
        return sympy.true if x else sympy.false
    if isinstance(x, int):
        return sympy.Integer(x)
    if isinstance(x, str):
        return parse(x)
    if isinstance(x, sympy.Basic):
        return x
    node = getattr(x, "expr", None)
    if isinstance(node, sympy.Basic):
        return node
    raise ShapeError(f"cannot use {x!r} (a {type(x).__name__}) as a symbolic expression")


# --------------------------------------------------------------------------- string form


class _FormPrinter(StrPrinter):
    """sympy's str printer, with comparisons and logic spelled the way ``parse`` reads them."""

    _RELOPS = {"==": "==", "!=": "!=", "<": "<", "<=": "<=", ">": ">", ">=": ">="}

    def _print_Relational(self, expr):
        return f"{self._print(expr.lhs)} {expr.rel_op} {self._print(expr.rhs)}"

    def _print_Equality(self, expr):
        return self._print_Relational(expr)

    def _print_Unequality(self, expr):
        return self._print_Relational(expr)

    def _print_And(self, expr):
        return "And(" + ", ".join(self._print(a) for a in _sorted_args(expr)) + ")"

    def _print_Or(self, expr):
        return "Or(" + ", ".join(self._print(a) for a in _sorted_args(expr)) + ")"

    def _print_Not(self, expr):
        return f"Not({self._print(expr.args[0])})"

    def _print_BooleanTrue(self, expr):
        return "True"

    def _print_BooleanFalse(self, expr):
        return "False"

    def _print_Symbol(self, expr):
        return expr.name


def _sorted_args(expr) -> list:
    return sorted(expr.args, key=sympy.default_sort_key)


_FORM = _FormPrinter({"order": None})


def dumps(expr) -> str:
    """The string form of a symbolic expression (``"2*s0 + 1"``, ``"FloorDiv(s0, 2)"``)."""
    e = as_expr(expr)
    return _FORM.doprint(e)


_TOKEN = re.compile(r"\s*(?:(\d+)|([A-Za-z_][A-Za-z0-9_]*)|(\*\*|==|!=|<=|>=|[-+*(),<>]))")
_MAX_LEN = 100_000
_MAX_DEPTH = 64
# Sizes fit 64 bits: a literal, exponent or constant power far beyond that is a hostile or broken
# string, refused before sympy spends seconds (or all memory) on the number.
_MAX_DIGITS = 40
_MAX_EXPONENT = 1024
_MAX_POWER_BITS = 4096


@lru_cache(maxsize=8192)
def parse(text: str) -> sympy.Basic:
    """Read the string form back into a sympy expression (inverse of :func:`dumps`)."""
    if not isinstance(text, str):
        raise ExprParseError(f"expected an expression string, got {text!r}")
    if len(text) > _MAX_LEN:
        raise ExprParseError(f"expression of {len(text)} characters is longer than the limit {_MAX_LEN}")
    return _Parser(text).parse()


class _Parser:
    def __init__(self, text: str):
        self.text = text
        self.tokens: list[tuple[str, str, int]] = []
        pos = 0
        while pos < len(text):
            if text[pos:].strip() == "":
                break
            m = _TOKEN.match(text, pos)
            if not m:
                self._fail(f"unexpected character {text[pos:].lstrip()[:1]!r}", pos)
            kind = "int" if m.group(1) else "name" if m.group(2) else "op"
            self.tokens.append((kind, m.group(m.lastindex), m.start(m.lastindex)))
            pos = m.end()
        self.i = 0
        self.depth = 0

    def _fail(self, what: str, pos: int | None = None):
        where = len(self.text) if pos is None else pos
        raise ExprParseError(f"cannot parse symbolic expression {self.text!r}: {what} at column {where}")

    def _peek(self) -> tuple[str, str, int] | None:
        return self.tokens[self.i] if self.i < len(self.tokens) else None

    def _take(self, value: str | None = None) -> tuple[str, str, int]:
        tok = self._peek()
        if tok is None:
            self._fail(f"expected {value!r}" if value else "unexpected end")
        if value is not None and tok[1] != value:
            self._fail(f"expected {value!r}, found {tok[1]!r}", tok[2])
        self.i += 1
        return tok

    def _int(self, tok: tuple[str, str, int]) -> int:
        if len(tok[1]) > _MAX_DIGITS:
            self._fail(f"an integer of {len(tok[1])} digits is longer than the limit {_MAX_DIGITS}", tok[2])
        return int(tok[1])

    def parse(self) -> sympy.Basic:
        if not self.tokens:
            self._fail("empty expression")
        e = self._compare()
        tok = self._peek()
        if tok is not None:
            self._fail(f"unexpected {tok[1]!r}", tok[2])
        # Each `**` is within the limit, but sympy folds powers of powers and products of powers
        # ((s0**1000)**1000 is s0**1000000): what evaluating the result would take is what counts.
        for power in e.atoms(sympy.Pow) if isinstance(e, sympy.Basic) else ():
            if power.exp.is_Integer and abs(int(power.exp)) > _MAX_EXPONENT:
                self._fail(f"the power {power} has an exponent larger than the limit {_MAX_EXPONENT}")
        return e

    def _enter(self):
        self.depth += 1
        if self.depth > _MAX_DEPTH:
            self._fail(f"nesting deeper than {_MAX_DEPTH}")

    def _compare(self) -> sympy.Basic:
        lhs = self._arith()
        tok = self._peek()
        if tok and tok[1] in ("==", "!=", "<", "<=", ">", ">="):
            self.i += 1
            rhs = self._arith()
            return {"==": sympy.Eq, "!=": sympy.Ne, "<": sympy.Lt, "<=": sympy.Le,
                    ">": sympy.Gt, ">=": sympy.Ge}[tok[1]](lhs, rhs)
        return lhs

    def _arith(self) -> sympy.Basic:
        terms = [self._term()]
        while (tok := self._peek()) and tok[1] in ("+", "-"):
            self.i += 1
            t = self._term()
            terms.append(t if tok[1] == "+" else -t)
        return terms[0] if len(terms) == 1 else sympy.Add(*terms)

    def _term(self) -> sympy.Basic:
        # Signs are gathered into one coefficient and the product built in one Mul, as sympy
        # itself builds ``-a*b``; building (-a)*b would distribute the sign into a sum ``a``
        # and give a structurally different (if equal) expression.
        sign, factors = self._signed_power()
        while (tok := self._peek()) and tok[1] == "*":
            self.i += 1
            s, f = self._signed_power()
            sign *= s
            factors.extend(f)
        if sign == 1 and len(factors) == 1:
            return factors[0]
        return sympy.Mul(*([sympy.Integer(-1)] if sign < 0 else []), *factors)

    def _signed_power(self) -> tuple[int, list[sympy.Basic]]:
        sign = 1
        while (tok := self._peek()) and tok[1] == "-":
            self.i += 1
            sign = -sign
        return sign, [self._power()]

    def _power(self) -> sympy.Basic:
        base = self._atom()
        tok = self._peek()
        if tok and tok[1] == "**":
            self.i += 1
            exp = self._take()
            if exp[0] != "int":
                self._fail("an exponent must be a non-negative integer", exp[2])
            n = self._int(exp)
            if n > _MAX_EXPONENT:
                self._fail(f"the exponent {n} is larger than the limit {_MAX_EXPONENT}", exp[2])
            if isinstance(base, sympy.Integer) and abs(int(base)) > 1 and int(base).bit_length() * n > _MAX_POWER_BITS:
                self._fail(f"{base}**{n} has more than {_MAX_POWER_BITS} bits", exp[2])
            return base ** n
        return base

    def _atom(self) -> sympy.Basic:
        tok = self._take()
        kind, value, pos = tok
        if kind == "int":
            return sympy.Integer(self._int(tok))
        if value == "(":
            self._enter()
            e = self._compare()
            self._take(")")
            self.depth -= 1
            return e
        if kind == "name":
            if value == "True":
                return sympy.true
            if value == "False":
                return sympy.false
            if value in FUNCTIONS:
                self._take("(")
                self._enter()
                args = [self._compare()]
                while self._peek() and self._peek()[1] == ",":
                    self.i += 1
                    args.append(self._compare())
                self._take(")")
                self.depth -= 1
                fn = FUNCTIONS[value]
                if fn in (FloorDiv, Mod) and len(args) != 2:
                    self._fail(f"{value} takes 2 arguments, got {len(args)}", pos)
                if fn is sympy.Not and len(args) != 1:
                    self._fail(f"Not takes 1 argument, got {len(args)}", pos)
                return fn(*args)
            return symbol(value)
        self._fail(f"unexpected {value!r}", pos)


BOOL_TYPES = (sympy.core.relational.Relational, sympy.And, sympy.Or, sympy.Not,
              sympy.logic.boolalg.BooleanAtom)


def is_bool_expr(e) -> bool:
    """Is ``e`` a condition (sympy symbols also count as Booleans to sympy; not here)."""
    return isinstance(e, BOOL_TYPES)


def free_symbol_names(expr) -> set[str]:
    return {s.name for s in as_expr(expr).free_symbols}
