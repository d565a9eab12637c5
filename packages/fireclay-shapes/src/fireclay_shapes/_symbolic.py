"""SymbolicInt and SymbolicBool: symbolic sizes that behave like Python ints and bools.

Arithmetic builds expressions; anything that needs a concrete answer (``bool()``, ``int()``,
indexing, ``if n > 2:``) asks the ShapeEnv, which answers from known facts or from the hints,
recording a guard.
"""

from __future__ import annotations

import operator

import sympy

from ._expr import FloorDiv, Max, Min, Mod, ShapeError, as_expr, dumps


def _unwrap(x, env):
    if isinstance(x, (SymbolicInt, SymbolicBool)):
        if x.env is not env:
            raise ShapeError("cannot combine symbolic values of two different ShapeEnvs")
        return x.expr
    if isinstance(x, bool):
        return sympy.true if x else sympy.false
    if isinstance(x, int):
        return sympy.Integer(x)
    return NotImplemented


class _Symbolic:
    __slots__ = ("expr", "env")

    def __init__(self, expr: sympy.Basic, env):
        self.expr = expr
        self.env = env

    def __repr__(self) -> str:
        return dumps(self.expr)

    __str__ = __repr__

    @property
    def hint(self):
        """The value at the current hints (no guard); raises for data-dependent values."""
        return self.env.hint(self.expr)

    def has_hint(self) -> bool:
        return self.env.has_hint(self.expr)

    def static_value(self):
        """The value if known without a guard, else None."""
        return self.env.static_value(self.expr)

    def __hash__(self):
        raise TypeError(f"symbolic value {self} is unhashable; use int() to specialise it, or its .expr")


def _binary(fn, reflected: bool = False):
    def method(self, other):
        o = _unwrap(other, self.env)
        if o is NotImplemented:
            return NotImplemented
        a, b = (o, self.expr) if reflected else (self.expr, o)
        e = fn(a, b)
        if fn in _RANGE_SENSITIVE:
            e = self.env.simplify(e)  # (n*k + 1) // k is n only because k >= 2
        return self.env.wrap(e)

    return method


_RANGE_SENSITIVE = (FloorDiv, Mod)


def _max(a, b):
    return Max(a, b)


def _min(a, b):
    return Min(a, b)


class SymbolicInt(_Symbolic):
    """An integer expression over the symbols of a ShapeEnv."""

    __slots__ = ()

    __add__ = _binary(operator.add)
    __radd__ = _binary(operator.add, True)
    __sub__ = _binary(operator.sub)
    __rsub__ = _binary(operator.sub, True)
    __mul__ = _binary(operator.mul)
    __rmul__ = _binary(operator.mul, True)
    __floordiv__ = _binary(FloorDiv)
    __rfloordiv__ = _binary(FloorDiv, True)
    __mod__ = _binary(Mod)
    __rmod__ = _binary(Mod, True)
    __eq__ = _binary(sympy.Eq)
    __ne__ = _binary(sympy.Ne)
    __lt__ = _binary(sympy.Lt)
    __le__ = _binary(sympy.Le)
    __gt__ = _binary(sympy.Gt)
    __ge__ = _binary(sympy.Ge)

    def __pow__(self, other):
        if isinstance(other, int) and not isinstance(other, bool) and other >= 0:
            return self.env.wrap(self.expr ** other)
        return int(self) ** other

    def __rpow__(self, other):
        return other ** int(self)

    def __neg__(self):
        return self.env.wrap(-self.expr)

    def __pos__(self):
        return self

    def __abs__(self):
        if self.env.evaluate(self.expr >= 0):
            return self
        return -self

    def __truediv__(self, other):
        # Exact division is a float in Python; floats are not symbolic here, so specialise.
        return int(self) / (int(other) if isinstance(other, SymbolicInt) else other)

    def __rtruediv__(self, other):
        return other / int(self)

    def __int__(self) -> int:
        return self.env.guard_int(self.expr)

    __index__ = __int__

    def __float__(self) -> float:
        return float(int(self))

    def __bool__(self) -> bool:
        return self.env.guard_bool(sympy.Ne(self.expr, 0))

    def __round__(self, ndigits=None):
        return self

    def __trunc__(self):
        return self

    __floor__ = __trunc__
    __ceil__ = __trunc__


class SymbolicBool(_Symbolic):
    """A condition over the symbols of a ShapeEnv."""

    __slots__ = ()

    def __and__(self, other):
        o = _unwrap(other, self.env)
        return NotImplemented if o is NotImplemented else self.env.wrap(sympy.And(self.expr, o))

    __rand__ = __and__

    def __or__(self, other):
        o = _unwrap(other, self.env)
        return NotImplemented if o is NotImplemented else self.env.wrap(sympy.Or(self.expr, o))

    __ror__ = __or__

    def __invert__(self):
        return self.env.wrap(sympy.Not(self.expr))

    def __bool__(self) -> bool:
        return self.env.guard_bool(self.expr)


def sym_max(a, b):
    """``max(a, b)`` without a guard when either side is symbolic."""
    env = _env_of(a, b)
    if env is None:
        return max(a, b)
    return env.wrap(env.simplify(_max(_unwrap(a, env), _unwrap(b, env))))


def sym_min(a, b):
    """``min(a, b)`` without a guard when either side is symbolic."""
    env = _env_of(a, b)
    if env is None:
        return min(a, b)
    return env.wrap(env.simplify(_min(_unwrap(a, env), _unwrap(b, env))))


def sym_not(a):
    if isinstance(a, SymbolicBool):
        return ~a
    return not a


def _env_of(*xs):
    for x in xs:
        if isinstance(x, _Symbolic):
            return x.env
    return None


def expr_of(x) -> sympy.Basic:
    """The sympy expression behind an int, bool or symbolic value."""
    return as_expr(x)
