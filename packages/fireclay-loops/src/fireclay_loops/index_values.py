"""Indices computed from the loop variables alone: proven in range, and read directly.

A gather whose index tensor is itself computed from positions (``torch.roll``'s decomposition:
``index_select(x, d, fmod(arange(n) + shift, n))``) reaches the loop body, once the index's
producers are recomputed in their consumer (:mod:`fireclay_loops.inline`), as integer ops on
``index_expr`` values feeding ``check_bounds`` and ``indirect_indexing``. Left so, the generated
kernel computes the indices with integer division and selects in every loop, and first runs a
pass over them to check them.

:func:`fold_index_values` reads such a value as a sympy expression of the loop variables
(``fmod`` of a value proven non-negative is ``Mod``, ``where`` on a mask that the reading load
is under takes its branch), and where its value ranges prove it inside the dimension:

* a ``check_bounds`` of it is dropped (nothing to check: it cannot fail);
* an ``indirect_indexing`` of it is replaced by the expression in the indices that use the
  symbol (``buf[64*Mod(r0 + 30, 32)]`` rather than ``buf[64*ind4]``), as Inductor's lowering of
  ``roll`` indexes.

Indices read from memory, or not proven in range, keep their checks and stay indirect.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import replace
from typing import Any

import sympy

from fireclay_loops import exprs
from fireclay_loops.body import BodyOp, BodyValue, LoopBody
from fireclay_loops.ir import ComputeNode, LoopProgram
from fireclay_loops.ops import MATH_OPS
from fireclay_shapes import ValueRange, bound

# The integer dtypes an index value may have, with the values each holds: an expression whose
# range leaves its dtype's would wrap around in the ops it replaces, and is not used.
_INTEGER_LIMITS = {
    "int64": (-(1 << 63), (1 << 63) - 1), "int32": (-(1 << 31), (1 << 31) - 1),
    "int16": (-(1 << 15), (1 << 15) - 1), "int8": (-128, 127), "uint8": (0, 255),
}
_COMPARISONS = {"eq", "ne", "lt", "le", "gt", "ge"}
# Ops with no effect and no memory access: what is left unread once its index is folded goes.
_PURE = frozenset({"constant", "index_expr", "to_dtype", *MATH_OPS})
# Ops whose last argument is a mask (None: unmasked): the conditions their indices hold under.
_MASK_ARG = {"masked_load": 2, "check_bounds": 4, "check_nonzero": 2}
# A conjunction of conditions: comparisons as ``(op, lhs - rhs)``, other bool values by op index.
Conditions = frozenset[Any]
_NONE: Conditions = frozenset()


def fold_index_values(program: LoopProgram) -> LoopProgram:
    """``program`` with the checks and indirect indices of values computed from the loop
    variables alone folded (see the module docstring); nodes without any are kept as they are."""
    nodes = []
    for n in program.nodes:
        if isinstance(n, ComputeNode) and any(op.name in ("check_bounds", "indirect_indexing") for op in n.body.ops):
            body = _IndexFolder(n.body).fold()
            if body is not n.body:
                n = ComputeNode(n.name, body, dict(n.meta))
        nodes.append(n)
    return replace(program, nodes=nodes)


class _IndexFolder:
    """The analysis of one body: each integer value as an expression of the loop variables
    (None where it is not one), and the rewritten body."""

    def __init__(self, body: LoopBody):
        self.body = body
        self.ops = body.ops
        self.var_sizes = {v.name: s for v, s in zip(body.vars + body.reduction_vars, body.sizes + body.reduction_sizes)}
        self.ranges = {name: exprs.loop_range(s) for name, s in self.var_sizes.items()}
        for op in self.ops:
            if op.name == "indirect_indexing":  # lowerings guarantee 0 <= value < size
                self.ranges[op.args[2]] = exprs.loop_range(op.args[1])
        self.values: dict[tuple[int, Conditions], sympy.Expr | None] = {}
        self.narrowed: dict[Conditions, dict[str, ValueRange]] = {}
        self.index_subs: dict[int, dict[sympy.Symbol, sympy.Expr]] = {}  # op -> symbols replaced in its indices
        self.proven_checks: set[int] = set()
        self.folded: set[int] = set()  # indirect_indexing ops whose every use reads the expression

    def bound(self, e: sympy.Expr, assume: Conditions = _NONE) -> ValueRange:
        """The values ``e`` takes where the conditions ``assume`` hold."""
        ranges = self.narrowed.get(assume)
        if ranges is None:
            ranges = self.narrowed[assume] = self._narrow(assume)
        return bound(e, lambda s: ranges.get(s.name, exprs.UNBOUNDED))

    def _narrow(self, assume: Conditions) -> dict[str, ValueRange]:
        """The ranges of the variables where ``assume`` holds: a comparison of one variable
        with a constant (a concatenation's ``32 <= r0 < 64``) narrows that variable's."""
        ranges = dict(self.ranges)
        for c in assume:
            if not isinstance(c, tuple) or len(c[1].free_symbols) != 1:
                continue
            op_name: str = c[0]
            d: sympy.Expr = c[1]
            [v] = d.free_symbols
            coeff, rest = d.coeff(v), sympy.expand(d - d.coeff(v) * v)
            if v.name not in ranges or abs(coeff) != 1 or not rest.is_Integer:
                continue
            # the condition on v * coeff + rest, as a range of v
            c0 = -int(rest) * int(coeff)  # v compared with c0 (the comparison flips for coeff -1)
            flip = {"lt": "gt", "le": "ge", "gt": "lt", "ge": "le"}
            op_name = flip.get(op_name, op_name) if coeff == -1 else op_name
            lo, hi = {"eq": (c0, c0), "lt": (-math.inf, c0 - 1), "le": (-math.inf, c0),
                      "gt": (c0 + 1, math.inf), "ge": (c0, math.inf)}.get(op_name, (-math.inf, math.inf))
            r = ranges[v.name]
            lo, hi = max(r.lo, lo), min(r.hi, hi)
            if lo > hi:  # never holds: any range will do
                continue
            ranges[v.name] = ValueRange(lo, hi)
        return ranges

    def within(self, e: sympy.Expr, size: Any, negative: bool, assume: Conditions) -> bool:
        """Whether ``e`` lies in ``[0, size)`` (``[-size, size)`` where ``negative``) where
        ``assume`` holds."""
        n = exprs.to_static(size)
        if n is None:
            return False
        r = self.bound(e, assume)
        return (-n if negative else 0) <= r.lo and r.hi <= n - 1

    # -- conditions: conjunctions of comparisons, by a structural key

    def conjuncts(self, mask: Any) -> Conditions:
        """The conditions a (bool) value is the conjunction of: comparisons of index values as
        ``(op, lhs - rhs)``, other values by their op index."""
        if not isinstance(mask, BodyValue):
            return _NONE
        op = self.ops[mask.index]
        if op.name == "logical_and":
            return self.conjuncts(op.args[0]) | self.conjuncts(op.args[1])
        if op.name in _COMPARISONS:
            a, b = (self.value(x.index, _NONE) for x in op.args)
            if a is not None and b is not None:
                return frozenset({(op.name, sympy.expand(a - b))})
        return frozenset({mask.index})

    def decide(self, cond: Conditions, assume: Conditions) -> bool | None:
        """True or False where the value ranges (under ``assume``) decide every conjunct, else None."""
        truth: bool | None = True
        for c in cond:
            if not isinstance(c, tuple):
                return None
            name, d = c
            r = self.bound(d, assume)
            holds = {"eq": r.lo == r.hi == 0, "ne": r.lo > 0 or r.hi < 0, "lt": r.hi < 0, "le": r.hi <= 0,
                     "gt": r.lo > 0, "ge": r.lo >= 0}[name]
            fails = {"eq": r.lo > 0 or r.hi < 0, "ne": r.lo == r.hi == 0, "lt": r.lo >= 0, "le": r.lo > 0,
                     "gt": r.hi <= 0, "ge": r.hi < 0}[name]
            if fails:
                return False
            if not holds:
                truth = None
        return truth

    # -- values

    def value(self, k: int, assume: Conditions) -> sympy.Expr | None:
        """Op ``k``'s integer result as an expression of the loop variables where the
        conditions ``assume`` hold, or None."""
        key = (k, assume)
        if key not in self.values:
            self.values[key] = self._value(k, assume)
        return self.values[key]

    def _value(self, k: int, assume: Conditions) -> sympy.Expr | None:
        op = self.ops[k]
        if op.dtype not in _INTEGER_LIMITS:
            return None
        args = [self.value(a.index, assume) if isinstance(a, BodyValue) else a for a in op.args]
        e = self._expression(k, args, assume)
        if e is None:
            return None
        lo, hi = _INTEGER_LIMITS[op.dtype]
        r = self.bound(e, assume)
        if op.dtype != "int64" and not (lo <= r.lo and r.hi <= hi):
            return None
        return e

    def _expression(self, k: int, args: list[Any], assume: Conditions) -> sympy.Expr | None:
        op = self.ops[k]
        name = op.name
        if name == "constant":
            v = args[0]
            return sympy.Integer(int(v)) if isinstance(v, int) else None
        if name == "index_expr":
            return args[0].xreplace(self.index_subs.get(k, {}))
        if name == "check_bounds":  # the value itself (whether the check may go is decided apart)
            return args[0]
        if name == "to_dtype":
            src = self.ops[op.args[0].index].dtype
            return args[0] if src in _INTEGER_LIMITS else None
        if name == "where":
            cond = self.conjuncts(op.args[0])
            taken = True if cond <= assume else self.decide(cond, assume)
            return None if taken is None else args[1] if taken else args[2]
        if any(a is None for a in args):
            return None
        if name == "add":
            return args[0] + args[1]
        if name == "sub":
            return args[0] - args[1]
        if name == "mul":
            return sympy.expand(args[0] * args[1])
        if name == "neg":
            return -args[0]
        if name in ("floordiv", "remainder", "fmod"):
            a, d = args
            if not (d.is_Integer and int(d) > 0):
                return None
            if name == "floordiv":
                return exprs.FloorDiv(a, d)
            if name == "remainder":  # the sign of the divisor: Python's %
                return exprs.Mod(a, d)
            r = self.bound(a, assume)  # fmod: the sign of the dividend
            if r.lo >= 0:
                return exprs.Mod(a, d)
            if r.hi <= 0:
                return -exprs.Mod(-a, d)
        return None

    # -- uses of indirect symbols

    def _indices_of(self, op: BodyOp) -> list[sympy.Expr]:
        return [a for a in op.args if isinstance(a, sympy.Expr)]

    def _uses(self, k: int, symbol: sympy.Symbol) -> list[int]:
        return [j for j in range(k + 1, len(self.ops))
                if any(a.has(symbol) for a in self._indices_of(self.ops[j]))]

    def _checks_in(self, v: BodyValue) -> Iterable[int]:
        pending, seen = [v.index], set()
        while pending:
            j = pending.pop()
            if j in seen:
                continue
            seen.add(j)
            if self.ops[j].name == "check_bounds":
                yield j
            pending.extend(a.index for a in self.ops[j].args if isinstance(a, BodyValue))

    def analyse(self) -> None:
        for k, op in enumerate(self.ops):
            if op.name == "check_bounds":
                value, size, negative, _site, mask = op.args
                assume = self.conjuncts(mask)
                e = self.value(value.index, assume)
                if e is not None and self.within(e, size, negative, assume):
                    self.proven_checks.add(k)
            elif op.name == "indirect_indexing":
                self._fold_indirect(k, op)

    def _fold_indirect(self, k: int, op: BodyOp) -> None:
        value, size, name = op.args
        if any(c not in self.proven_checks for c in self._checks_in(value)):
            return
        symbol = exprs.symbol(name)
        found: dict[int, sympy.Expr] = {}
        for j in self._uses(k, symbol):
            mask = self.ops[j].args[_MASK_ARG[self.ops[j].name]] if self.ops[j].name in _MASK_ARG else None
            assume = self.conjuncts(mask)
            e = self.value(value.index, assume)
            if e is None or not self.within(e, size, False, assume):
                return
            found[j] = e
        for j, e in found.items():
            self.index_subs.setdefault(j, {})[symbol] = e
        self.folded.add(k)

    # -- the new body

    def fold(self) -> LoopBody:
        self.analyse()
        if not self.proven_checks and not self.folded:
            return self.body
        alias: dict[int, int] = {}  # a proven check's result is its value
        for k in sorted(self.proven_checks):
            v = self.ops[k].args[0].index
            alias[k] = alias.get(v, v)
        keep = self._live(alias)
        var_sizes = dict(self.var_sizes)
        var_sizes.update({self.ops[k].args[2]: self.ops[k].args[1] for k in keep
                          if self.ops[k].name == "indirect_indexing"})
        body = LoopBody(self.body.sizes, self.body.reduction_sizes)
        renumber: dict[int, int] = {}
        for k in keep:
            op = self.ops[k]
            subs = self.index_subs.get(k)
            args = []
            for a in op.args:
                if isinstance(a, BodyValue):
                    a = BodyValue(renumber[alias.get(a.index, a.index)])
                elif subs and isinstance(a, sympy.Expr):
                    a = exprs.simplify(a.xreplace(subs), var_sizes)
                args.append(a)
            renumber[k] = len(body.ops)
            body.ops.append(BodyOp(op.name, tuple(args), op.dtype))
        return body

    def _live(self, alias: dict[int, int]) -> list[int]:
        """The ops kept, in order: all but the pure ones nothing kept reads, the proven checks
        and the folded indirect indices."""
        droppable = self.proven_checks | self.folded
        live: set[int] = set()
        pending = [k for k, op in enumerate(self.ops) if op.name not in _PURE and k not in droppable]
        while pending:
            k = pending.pop()
            if k in live:
                continue
            live.add(k)
            for a in self.ops[k].args:
                if isinstance(a, BodyValue):
                    pending.append(alias.get(a.index, a.index))
        return sorted(live)
