"""SymbolicNode: torch's SymNode protocol implemented over a fireclay ShapeEnv.

``torch.SymInt(node)`` accepts any Python object with the SymNode methods (the C++ side calls
them through ``PythonSymNodeImpl``; the Python side through the magic methods torch installs on
SymInt). Every ``torch.SymInt`` made here therefore carries a sympy expression over our
symbols, and every decision torch's kernels take on it (``guard_bool``, ``guard_int``, ...)
is answered by our ShapeEnv, which records the guard.

Floats are not symbolic here: an int that flows into float arithmetic (``sym_float``, true
division) is specialised to its value, with a guard. Shapes almost never need more.
"""

from __future__ import annotations

import math
import weakref

import sympy
import torch

from .._env import ShapeEnv
from .._expr import FloorDiv, Max, Min, Mod, dumps


class SymbolicNode:
    """One int, bool or (concrete) float value of a trace, as torch's SymNode protocol."""

    __slots__ = ("_raw", "env", "pytype", "_float")

    def __init__(self, expr, env: ShapeEnv, pytype: type, float_value: float | None = None):
        self._raw = expr
        self.env = env
        self.pytype = pytype
        self._float = float_value

    @property
    def expr(self):
        """The expression with what the env has learnt since applied (replacements, ranges);
        cached by the env, so reading it is cheap."""
        if self.pytype is float or self._raw.is_Atom:
            return self._raw
        return self.env.simplify(self._raw)

    # ----------------------------------------------------------------- identity, hints

    @property
    def shape_env(self) -> TorchShapeEnvView:
        """What torch's helpers (``guard_or_false``, ``statically_known_true``) ask for."""
        return TorchShapeEnvView.of(self.env)

    @property
    def _expr(self):
        return self.expr

    @property
    def _hint(self):
        return self.hint

    def is_int(self) -> bool:
        return self.pytype is int

    def is_bool(self) -> bool:
        return self.pytype is bool

    def is_float(self) -> bool:
        return self.pytype is float

    def is_nested_int(self) -> bool:
        return False

    def nested_int(self):
        return None

    def is_symbolic(self) -> bool:
        return not self.is_constant()

    def is_constant(self) -> bool:
        # Floats say no: torch's user-level magic only unwraps int/bool constants.
        return self.pytype is not float and (self.expr.is_Integer or self.expr in (sympy.true, sympy.false))

    def has_hint(self) -> bool:
        return self.pytype is float or self.env.has_hint(self.expr)

    @property
    def hint(self):
        if self.pytype is float:
            return self._float
        if not self.has_hint():
            return None
        return self.pytype(self.env.hint(self.expr))

    def maybe_as_int(self) -> int | None:
        return int(self.expr) if self.pytype is int and self.expr.is_Integer else None

    def maybe_as_bool(self) -> bool | None:
        if self.expr is sympy.true:
            return True
        if self.expr is sympy.false:
            return False
        return None

    def maybe_as_float(self) -> float | None:
        return self._float

    def str(self) -> str:
        if self.pytype is float:
            return repr(self._float)
        return dumps(self.expr)

    _graph_repr = str

    def __str__(self) -> str:
        return self.str()

    def __repr__(self) -> str:
        return f"SymbolicNode({self.str()}, {self.pytype.__name__})"

    def clone(self) -> SymbolicNode:
        return self

    def with_shape_env(self, env: ShapeEnv) -> SymbolicNode:
        return SymbolicNode(self.expr, env, self.pytype, self._float)

    # ----------------------------------------------------------------- wrapping constants

    def wrap_int(self, num: int) -> SymbolicNode:
        return SymbolicNode(sympy.Integer(num), self.env, int)

    def wrap_bool(self, num: bool) -> SymbolicNode:
        return SymbolicNode(sympy.true if num else sympy.false, self.env, bool)

    def wrap_float(self, num: float) -> SymbolicNode:
        return _float(self.env, num)

    # ----------------------------------------------------------------- arithmetic

    def _int_op(self, other: SymbolicNode, fn) -> SymbolicNode:
        if self.pytype is float or other.pytype is float:
            return _float(self.env, fn.concrete(self._value(), other._value()))
        e = fn.symbolic(_as_int(self.expr), _as_int(other.expr))
        if fn is _MAX or fn is _MIN:
            e = self.env.simplify(e)  # Max(1, s0) -> s0 when s0 >= 1 is known: strides stay readable
        return SymbolicNode(e, self.env, int)

    def add(self, other):
        return self._int_op(other, _ADD)

    def sub(self, other):
        return self._int_op(other, _SUB)

    def mul(self, other):
        return self._int_op(other, _MUL)

    def mod(self, other):
        return self._int_op(other, _MOD)

    def floordiv(self, other):
        return self._int_op(other, _FLOORDIV)

    int_floordiv = floordiv

    def sym_max(self, other):
        return self._int_op(other, _MAX)

    def sym_min(self, other):
        return self._int_op(other, _MIN)

    def truediv(self, other):
        return _float(self.env, self._value() / other._value())

    int_truediv = truediv
    float_truediv = truediv

    def pow(self, other):
        if self.pytype is int and other.pytype is int and other.expr.is_Integer and int(other.expr) >= 0:
            return SymbolicNode(self.expr ** int(other.expr), self.env, int)
        if self.pytype is int and other.pytype is int and other._value() >= 0:
            return SymbolicNode(sympy.Integer(self._value() ** other._value()), self.env, int)
        return _float(self.env, float(self._value()) ** other._value())

    pow_by_natural = pow

    def float_pow(self, other):
        return _float(self.env, float(self._value()) ** other._value())

    def neg(self):
        if self.pytype is float:
            return _float(self.env, -self._float)
        return SymbolicNode(-self.expr, self.env, self.pytype if self.pytype is int else int)

    def pos(self):
        return self

    def abs(self):
        if self.pytype is float:
            return _float(self.env, abs(self._float))
        return self if self.env.guard_bool(self.expr >= 0) else self.neg()

    def sym_float(self):
        return _float(self.env, float(self._value()))

    def sym_int(self):
        return self.wrap_int(int(self._value()))

    def floor(self):
        return self if self.pytype is int else self.wrap_int(math.floor(self._float))

    def ceil(self):
        return self if self.pytype is int else self.wrap_int(math.ceil(self._float))

    def trunc(self):
        return self if self.pytype is int else self.wrap_int(math.trunc(self._float))

    def round(self, ndigits=None):
        if self.pytype is int:
            return self
        return _float(self.env, round(self._float, ndigits)) if ndigits is not None else self.wrap_int(round(self._float))

    def is_integer(self):
        return self.wrap_bool(self.pytype is int or float(self._float).is_integer())

    # ----------------------------------------------------------------- comparisons, logic

    def _compare(self, other, rel, concrete):
        if self.pytype is float or other.pytype is float:
            return self.wrap_bool(concrete(self._value(), other._value()))
        return SymbolicNode(rel(_as_int(self.expr), _as_int(other.expr)), self.env, bool)

    def eq(self, other):
        if self.pytype is bool and other.pytype is bool:
            return SymbolicNode(sympy.Equivalent(self.expr, other.expr), self.env, bool)
        return self._compare(other, sympy.Eq, lambda a, b: a == b)

    def ne(self, other):
        return self.eq(other).sym_not()

    def lt(self, other):
        return self._compare(other, sympy.Lt, lambda a, b: a < b)

    def le(self, other):
        return self._compare(other, sympy.Le, lambda a, b: a <= b)

    def gt(self, other):
        return self._compare(other, sympy.Gt, lambda a, b: a > b)

    def ge(self, other):
        return self._compare(other, sympy.Ge, lambda a, b: a >= b)

    def sym_and(self, other):
        return SymbolicNode(sympy.And(self.expr, other.expr), self.env, bool)

    def sym_or(self, other):
        return SymbolicNode(sympy.Or(self.expr, other.expr), self.env, bool)

    def sym_not(self):
        return SymbolicNode(sympy.Not(self.expr), self.env, bool)

    def sym_ite(self, then_node, else_node):
        return then_node if self.env.guard_bool(self.expr) else else_node

    # ----------------------------------------------------------------- decisions

    def _value(self):
        """The concrete value, specialising (with a guard) if symbolic."""
        if self.pytype is float:
            return self._float
        if self.pytype is bool:
            return self.env.guard_bool(self.expr)
        return self.env.guard_int(self.expr)

    def guard_int(self, file=None, line=None) -> int:
        return int(self._value())

    def guard_bool(self, file=None, line=None) -> bool:
        return bool(self._value())

    def guard_float(self, file=None, line=None) -> float:
        return float(self._value())

    def int_(self) -> int:
        return self.guard_int()

    def bool_(self) -> bool:
        return self.guard_bool()

    def expect_true(self, file=None, line=None) -> bool:
        # torch._check(cond): on data-dependent sizes the condition becomes an assumption.
        if self.env.has_hint(self.expr):
            return self.guard_bool()
        self.env.assume(self.expr)
        return True

    def expect_size(self, file=None, line=None) -> bool:
        if not self.env.has_hint(self.expr):
            self.env.assume(sympy.Ge(self.expr, 0))
        return True

    def statically_known_true(self, file=None, line=None) -> bool:
        return self.env.static_value(self.expr) is True

    def guard_or_false(self, file=None, line=None) -> bool:
        known = self.env.static_value(self.expr)
        if known is not None:
            return bool(known)
        return self.guard_bool() if self.env.has_hint(self.expr) else False

    def guard_or_true(self, file=None, line=None) -> bool:
        known = self.env.static_value(self.expr)
        if known is not None:
            return bool(known)
        return self.guard_bool() if self.env.has_hint(self.expr) else True

    def guard_size_oblivious(self, file=None, line=None) -> bool:
        # Sizes are >= 2 for backed symbols already; data-dependent sizes are treated the
        # same way for this question only, as torch's size-oblivious reasoning does.
        known = self.env.static_value(self.expr)
        if known is not None:
            return bool(known)
        if self.env.has_hint(self.expr):
            return self.guard_bool()
        return self.env.decide_size_oblivious(self.expr)

    def sym_sum(self, args):
        return SymbolicNode(sympy.Add(*[_as_int(a.expr) for a in args]), self.env, int)

    # ----------------------------------------------------------------- layout predicates

    def is_contiguous(self, sizes, strides):
        return self.wrap_bool(_strides_match(self.env, sizes, strides, list(range(len(sizes)))[::-1]))

    def is_channels_last_contiguous_2d(self, sizes, strides):
        return self.wrap_bool(len(sizes) == 4 and _strides_match(self.env, sizes, strides, [1, 3, 2, 0]))

    def is_channels_last_contiguous_3d(self, sizes, strides):
        return self.wrap_bool(len(sizes) == 5 and _strides_match(self.env, sizes, strides, [1, 4, 3, 2, 0]))

    def is_channels_last_strides_2d(self, sizes, strides):
        return self.wrap_bool(len(sizes) == 4 and _channels_last_strides(self.env, sizes, strides, [1, 3, 2, 0]))

    def is_channels_last_strides_3d(self, sizes, strides):
        return self.wrap_bool(len(sizes) == 5 and _channels_last_strides(self.env, sizes, strides, [1, 4, 3, 2, 0]))

    def is_non_overlapping_and_dense(self, sizes, strides):
        return self.wrap_bool(_non_overlapping_and_dense(self.env, sizes, strides))

    def is_non_overlapping_and_dense_indicator(self, sizes, strides):
        return self.wrap_int(int(_non_overlapping_and_dense(self.env, sizes, strides)))


class TorchShapeEnvView:
    """The few ShapeEnv methods that torch's Python helpers call through ``node.shape_env``
    (``guard_or_false`` calls ``evaluate_sym_node``, ``statically_known_true`` calls
    ``_maybe_evaluate_static``), answered by our ShapeEnv."""

    _views: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    def __init__(self, env: ShapeEnv):
        self.env = env

    @classmethod
    def of(cls, env: ShapeEnv) -> TorchShapeEnvView:
        view = cls._views.get(env)
        if view is None:
            view = cls._views[env] = cls(env)
        return view

    def evaluate_sym_node(self, node, size_oblivious: bool = False, fallback_value=None):
        known = self.env.static_value(node.expr)
        if known is not None:
            return known
        if self.env.has_hint(node.expr):
            return self.env.evaluate(node.expr)
        if size_oblivious:
            return self.env.decide_size_oblivious(node.expr)
        if fallback_value is not None:
            return fallback_value
        return self.env.evaluate(node.expr)  # raises DataDependentError

    def _maybe_evaluate_static(self, expr, **_):
        v = self.env.static_value(expr)
        if v is None:
            return None
        return (sympy.true if v else sympy.false) if isinstance(v, bool) else sympy.Integer(v)

    def is_unbacked_symint(self, sym) -> bool:
        info = self.env.symbols.get(str(sym))
        return info is not None and info.unbacked

    def optimization_hint(self, expr, fallback=None):
        e = expr.node.expr if isinstance(expr, torch.SymInt) else sympy.sympify(expr)
        return self.env.hint(e) if self.env.has_hint(e) else fallback

    def guarding_hint_or_throw(self, expr):
        return self.env.hint(expr)

    def _suppress_guards_enter(self):
        pass

    def _suppress_guards_exit(self):
        pass

    def __getattr__(self, name):
        raise AttributeError(
            f"torch asked the fireclay ShapeEnv for {name!r}, which its torch adapter does not provide; "
            f"please report the op that triggered it")


class _Op:
    def __init__(self, symbolic, concrete):
        self.symbolic = symbolic
        self.concrete = concrete


_ADD = _Op(lambda a, b: a + b, lambda a, b: a + b)
_SUB = _Op(lambda a, b: a - b, lambda a, b: a - b)
_MUL = _Op(lambda a, b: a * b, lambda a, b: a * b)
_MOD = _Op(Mod, lambda a, b: a % b)
_FLOORDIV = _Op(FloorDiv, lambda a, b: a // b)
_MAX = _Op(Max, max)
_MIN = _Op(Min, min)


def _as_int(e):
    # Python adds True + True == 2; sympy booleans are not numbers.
    if e is sympy.true:
        return sympy.Integer(1)
    if e is sympy.false:
        return sympy.Integer(0)
    if isinstance(e, sympy.logic.boolalg.Boolean) and not isinstance(e, sympy.Symbol):
        raise TypeError(f"cannot use the condition {dumps(e)} as an integer")
    return e


def _float(env: ShapeEnv, value: float) -> SymbolicNode:
    return SymbolicNode(sympy.Float(value), env, float, float(value))


# --------------------------------------------------------------------------- layouts
# These take the decisions torch's C++ would take on concrete sizes, on symbolic ones:
# each comparison asked of the ShapeEnv is answered from facts or guarded.


def _g(env: ShapeEnv, cond) -> bool:
    return env.guard_bool(cond)


def _expr(node) -> sympy.Expr:
    return node.expr


def _strides_match(env, sizes, strides, order) -> bool:
    """Dense in the given dim order (innermost first), ignoring size-1 dims; empty tensors
    count as contiguous, as in c10."""
    sizes = [_expr(s) for s in sizes]
    strides = [_expr(s) for s in strides]
    numel = sympy.Mul(*sizes) if sizes else sympy.Integer(1)
    if _g(env, sympy.Eq(numel, 0)):
        return True
    expected = sympy.Integer(1)
    for d in order:
        if not _g(env, sympy.Eq(sizes[d], 1)):
            if not _g(env, sympy.Eq(strides[d], expected)):
                return False
            expected = expected * sizes[d]
    return True


def _channels_last_strides(env, sizes, strides, order) -> bool:
    # c10::is_channels_last_strides_2d_s4: strides non-increasing along NHWC order, with
    # the tie-breaks c10 uses for size-1 dims.
    sizes = [_expr(s) for s in sizes]
    strides = [_expr(s) for s in strides]
    minimum = sympy.Integer(0)
    if _g(env, sympy.Eq(strides[1], 0)):
        return False
    for d in order:
        if _g(env, sympy.Eq(sizes[d], 0)):
            return False
        if _g(env, sympy.Lt(strides[d], minimum)):
            return False
        if d == 0 and _g(env, sympy.Eq(minimum, strides[1])):
            return False
        minimum = strides[d]
        if _g(env, sympy.Gt(sizes[d], 1)):
            minimum = minimum * sizes[d]
    return True


def _non_overlapping_and_dense(env, sizes, strides) -> bool:
    # c10's compute_non_overlapping_and_dense, with each comparison guarded.
    sizes = [_expr(s) for s in sizes]
    strides = [_expr(s) for s in strides]
    if len(sizes) == 1:
        return _g(env, sympy.Lt(sizes[0], 2)) or _g(env, sympy.Eq(strides[0], 1))

    def before(a, b) -> bool:  # the comparator of c10's sort: small dims last, then by stride
        if _g(env, sympy.Lt(sizes[a], 2)):
            return False
        if _g(env, sympy.Lt(sizes[b], 2)):
            return True
        return _g(env, sympy.Lt(strides[a], strides[b]))

    perm = list(range(len(sizes)))
    for i in range(1, len(perm)):
        j = i
        while j > 0 and before(perm[j], perm[j - 1]):
            perm[j], perm[j - 1] = perm[j - 1], perm[j]
            j -= 1
    expected = sympy.Integer(1)
    for d in perm:
        if _g(env, sympy.Lt(sizes[d], 2)):
            return True
        if not _g(env, sympy.Eq(strides[d], expected)):
            return False
        expected = expected * sizes[d]
    return True


def make_symint(env: ShapeEnv, expr) -> torch.SymInt | int:
    """A ``torch.SymInt`` for an integer expression of ``env`` (a plain int if constant)."""
    e = sympy.sympify(expr)
    if e.is_Integer:
        return int(e)
    return torch.SymInt(SymbolicNode(e, env, int))


def make_symbool(env: ShapeEnv, expr) -> torch.SymBool | bool:
    e = sympy.sympify(expr)
    if e in (sympy.true, sympy.false):
        return e is sympy.true
    return torch.SymBool(SymbolicNode(e, env, bool))


def expr_of(x) -> sympy.Basic:
    """The sympy expression of a torch.SymInt/SymBool made here, or of a plain int/bool."""
    if isinstance(x, (torch.SymInt, torch.SymBool)):
        node = x.node
        if not isinstance(node, SymbolicNode):
            raise TypeError(f"{x!r} is a torch SymInt not made by fireclay_shapes")
        return node.expr
    if isinstance(x, bool):
        return sympy.true if x else sympy.false
    return sympy.Integer(int(x))
