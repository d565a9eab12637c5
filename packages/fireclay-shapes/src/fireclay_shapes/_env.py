"""ShapeEnv: the symbols of one trace, what is known about them, and the guards it took."""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import sympy

from ._expr import ShapeError, as_expr, dumps, is_bool_expr, parse, symbol
from ._guards import GuardSet, conjuncts
from ._printers import python_code
from ._ranges import INF, UNBOUNDED, ValueRange, decide
from ._simplify import simplify_with_ranges


class DataDependentError(ShapeError):
    """A decision needs the value of a size only known when the program runs (an unbacked
    symbol, e.g. the length of ``nonzero``'s result)."""


class GuardViolation(ShapeError):
    """A fact asserted about symbols contradicts what is already known about them."""


@dataclass
class SymbolInfo:
    """One symbol: its hint (None when unbacked), the range declared when it was made, and
    the source expressions (``L['x'].size()[0]``) of the sizes it stands for."""

    symbol: sympy.Symbol
    hint: int | None
    declared: ValueRange
    sources: list[str] = field(default_factory=list)

    @property
    def unbacked(self) -> bool:
        return self.hint is None


def narrow_ranges(ranges: Mapping[sympy.Symbol, ValueRange], facts: Iterable[sympy.Basic]):
    """``ranges`` tightened by the facts of the form ``c*s + k (op) 0``; None if they conflict."""
    out = dict(ranges)
    try:
        for fact in facts:
            for g in conjuncts(fact):
                for s, r in _bounds_from_fact(g):
                    out[s] = out.get(s, UNBOUNDED).intersect(r)
    except ValueError:
        return None
    return out


def _bounds_from_fact(fact) -> list[tuple[sympy.Symbol, ValueRange]]:
    if not isinstance(fact, sympy.core.relational.Relational) or fact.rel_op == "!=":
        return []
    d = sympy.expand(fact.lhs - fact.rhs)
    syms = d.free_symbols
    if len(syms) != 1:
        return []
    (s,) = syms
    a = d.coeff(s)
    b = d - a * s
    if not (isinstance(a, sympy.Integer) and isinstance(b, sympy.Integer)) or a == 0:
        return []
    a, b = int(a), int(b)
    op = fact.rel_op
    # Everything as a*s + b <= 0 (integers: x < 0 is x + 1 <= 0).
    forms = {"<": [(a, b + 1)], "<=": [(a, b)], ">": [(-a, -b + 1)], ">=": [(-a, -b)],
             "==": [(a, b), (-a, -b)]}[op]
    out = []
    for a2, b2 in forms:
        if a2 > 0:
            out.append((s, ValueRange(-INF, (-b2) // a2)))
        else:  # a2*s <= -b2 with a2 < 0: s >= ceil(b2 / -a2)
            out.append((s, ValueRange(-((-b2) // (-a2)), INF)))
    return out


class ShapeEnv:
    """Symbols with hints and ranges, and the guards recorded by decisions taken on them.

    ``duck_sizing``: sizes with equal hints share one symbol (and the guards say they are
    equal). ``specialize_zero_one``: sizes 0 and 1 stay constants, since broadcasting and empty
    tensors behave differently there; dynamic sizes then range over ``[2, inf)``.
    """

    def __init__(self, *, duck_sizing: bool = True, specialize_zero_one: bool = True):
        self.duck_sizing = duck_sizing
        self.specialize_zero_one = specialize_zero_one
        self.symbols: dict[str, SymbolInfo] = {}
        self.guards = GuardSet()
        self.runtime_asserts = GuardSet()  # assumed facts on unbacked symbols, checked when run
        self.constant_sources: list[tuple[str, int]] = []  # sizes specialised to a constant
        self._by_symbol: dict[sympy.Symbol, SymbolInfo] = {}
        self._duck: dict[int, sympy.Symbol] = {}
        self._ranges: dict[sympy.Symbol, ValueRange] = {}
        # symbol -> expression, and a few compound expressions -> constants (see _learn_equality)
        self._replacements: dict[sympy.Basic, sympy.Expr] = {}
        self._replacement_symbols: set[sympy.Symbol] = set()
        self._facts: set[sympy.Basic] = set()
        # Bounds learnt for expressions of several symbols (``s0 - s1`` from ``s1 < s0``).
        self._form_bounds: dict[sympy.Basic, ValueRange] = {}
        self._cache: dict[sympy.Basic, sympy.Basic] = {}
        self._backed_ids = itertools.count()
        self._unbacked_ids = itertools.count()

    # ------------------------------------------------------------------ making symbols

    def create_symbol(self, hint: int, source: str | None = None, *, dynamic: bool = True,
                      min: int | None = None, max: int | None = None, duck: bool | None = None) -> sympy.Expr:
        """A symbolic size whose current value is ``hint``; returns a sympy expression, which is
        the constant ``hint`` itself when the size is static or specialised (0 or 1).

        ``min``/``max`` are ``mark_dynamic``-style bounds; a size with bounds gets its own
        symbol (no duck sizing). ``source`` is the Python text of where the size comes from,
        used when guards are rendered.
        """
        if isinstance(hint, bool) or not isinstance(hint, int):
            raise ShapeError(f"the hint of a size must be an int, got {hint!r}")
        if min is not None and hint < min or max is not None and hint > max:
            raise ShapeError(f"size {hint}{f' of {source}' if source else ''} is outside its declared "
                             f"range [{min}, {max}]")
        if not dynamic or (self.specialize_zero_one and hint in (0, 1)):
            if source is not None:
                self.constant_sources.append((source, hint))
            return sympy.Integer(hint)
        bounded = min is not None or max is not None
        if (duck if duck is not None else self.duck_sizing) and not bounded and hint in self._duck:
            s = self._duck[hint]
            if source is not None:
                self._by_symbol[s].sources.append(source)
            return self._resolve(s)
        # A size is >= 0, and >= 2 once 0 and 1 are specialised; an explicit ``min`` overrides
        # that (for symbolic ints that are not sizes, e.g. a dynamic Python int argument).
        lo = (2 if self.specialize_zero_one else 0) if min is None else min
        declared = ValueRange(lo, INF if max is None else max)
        if hint not in declared:
            raise ShapeError(f"size {hint}{f' of {source}' if source else ''} is outside the range "
                             f"{declared} of its symbol; pass min= to allow it")
        s = symbol(f"s{next(self._backed_ids)}")
        self._register(SymbolInfo(s, hint, declared, [source] if source is not None else []))
        if not bounded:
            self._duck.setdefault(hint, s)
        return s

    def create_unbacked_symbol(self, min: int = 0, max: int | None = None) -> sympy.Symbol:
        """A size known only at run time (``nonzero``, ``.item()``): no hint, so any decision
        that its range cannot answer raises :class:`DataDependentError`."""
        s = symbol(f"u{next(self._unbacked_ids)}")
        self._register(SymbolInfo(s, None, ValueRange(min, INF if max is None else max)))
        return s

    def _register(self, info: SymbolInfo) -> None:
        self.symbols[info.symbol.name] = info
        self._by_symbol[info.symbol] = info
        self._ranges[info.symbol] = info.declared

    def create_symint(self, hint: int, source: str | None = None, **kwargs):
        """Like :meth:`create_symbol`, wrapped as a :class:`SymbolicInt` (or a plain int)."""
        return self.wrap(self.create_symbol(hint, source, **kwargs))

    def wrap(self, expr):
        """A plain int/bool for constant expressions, else a SymbolicInt / SymbolicBool."""
        from ._symbolic import SymbolicBool, SymbolicInt

        e = as_expr(expr)
        if isinstance(e, sympy.Integer):
            return int(e)
        if e is sympy.true or e is sympy.false:
            return e is sympy.true
        if is_bool_expr(e):
            return SymbolicBool(e, self)
        return SymbolicInt(e, self)

    # ------------------------------------------------------------------ knowledge

    def info(self, sym) -> SymbolInfo:
        s = sym if isinstance(sym, sympy.Symbol) else symbol(str(sym))
        try:
            return self._by_symbol[s]
        except KeyError:
            raise ShapeError(f"symbol {s} does not belong to this ShapeEnv") from None

    def range_of_symbol(self, s: sympy.Symbol) -> ValueRange:
        """The current range of a symbol: declared, then narrowed by guards. Pass this method as
        ``ranges=`` to the printers."""
        return self._ranges.get(s, UNBOUNDED)

    def range_of(self, expr) -> ValueRange:
        from ._ranges import bound

        return bound(self.simplify(expr), self.range_of_symbol)

    def hint(self, expr):
        """The value of ``expr`` at the symbols' hints (int or bool)."""
        e = as_expr(expr).xreplace(self._hint_map(as_expr(expr)))
        if isinstance(e, sympy.Integer):
            return int(e)
        if e is sympy.true or e is sympy.false:
            return e is sympy.true
        raise ShapeError(f"cannot evaluate {dumps(expr)} at the hints: it still depends on {sorted(map(str, e.free_symbols))}")

    def has_hint(self, expr) -> bool:
        return all(not self._by_symbol[s].unbacked for s in as_expr(expr).free_symbols if s in self._by_symbol)

    def _hint_map(self, e) -> dict:
        out = {}
        for s in e.free_symbols:
            info = self._by_symbol.get(s)
            if info is None:
                raise ShapeError(f"symbol {s} does not belong to this ShapeEnv")
            if info.unbacked:
                raise DataDependentError(_data_dependent_message(e, info))
            out[s] = sympy.Integer(info.hint)
        return out

    def simplify(self, expr) -> sympy.Basic:
        """``expr`` simplified with the ranges and equalities known now (cached)."""
        e = as_expr(expr)
        hit = self._cache.get(e)
        if hit is not None:
            return hit
        out = e
        if self._replacements and not self._replacement_symbols.isdisjoint(e.free_symbols):
            out = out.xreplace(self._replacements)
        out = simplify_with_ranges(out, self.range_of_symbol)
        self._cache[e] = out
        return out

    def static_value(self, expr):
        """The value of ``expr`` if what is known already decides it (no guard), else None."""
        e = self.simplify(expr)
        if isinstance(e, sympy.Integer):
            return int(e)
        if e is sympy.true or e is sympy.false:
            return e is sympy.true
        if is_bool_expr(e):
            e = canonical(e)
            if e in self._facts:
                return True
            if _negate(e) in self._facts:
                return False
            decided = decide(e, self.range_of_symbol)
            if decided is None and self._form_bounds:
                decided = self._decide_from_forms(e)
            return decided
        return None

    def _decide_from_forms(self, e) -> bool | None:
        split = _split_relation(e)
        if split is None:
            return None
        form, k, sign = split
        known = self._form_bounds.get(form)
        if known is None:
            return None
        r = known if sign > 0 else ValueRange(-known.hi, -known.lo)
        # e is (sign * form) + k (op) 0
        from ._ranges import _bound_relational

        shifted = ValueRange(r.lo + k, r.hi + k)
        res = _bound_relational(type(e)(sympy.Symbol("_d", integer=True), 0), lambda _: shifted)
        return None if res.lo != res.hi else bool(res.lo)

    # ------------------------------------------------------------------ decisions

    def evaluate(self, expr):
        """Decide ``expr`` (bool) or pick its value (int) as the trace must: from what is known
        when possible, else from the hints, recording the guard that makes the choice safe."""
        known = self.static_value(expr)
        if known is not None:
            return known
        e = self.simplify(expr)
        value = self.hint(e)  # raises DataDependentError for unbacked symbols
        if isinstance(value, bool):
            self._record(e if value else _negate(e))
        else:
            self._record(sympy.Eq(e, value))
        return value

    def decide_size_oblivious(self, expr) -> bool:
        """Decide ``expr`` treating data-dependent sizes as if they were at least 2 (the
        question "does this hold for any size but 0 and 1?"); raises if that does not decide it."""
        e = self.simplify(expr)

        def ranges(s):
            r = self.range_of_symbol(s)
            info = self._by_symbol.get(s)
            if info is not None and info.unbacked and r.lo < 2 <= r.hi:
                return ValueRange(2, r.hi)
            return r

        d = decide(e, ranges)
        if d is None:
            unbacked = next(self._by_symbol[s] for s in e.free_symbols if self._by_symbol[s].unbacked)
            raise DataDependentError(_data_dependent_message(e, unbacked))
        return d

    def guard_int(self, expr) -> int:
        """Specialise an integer expression to its hint (recording ``expr == hint``)."""
        v = self.evaluate(expr)
        if isinstance(v, bool):
            raise ShapeError(f"{dumps(expr)} is a condition, not an integer")
        return v

    def guard_bool(self, expr) -> bool:
        v = self.evaluate(expr)
        if not isinstance(v, bool):
            return v != 0
        return v

    def assume(self, expr, message: str | None = None) -> None:
        """Take ``expr`` as true without checking a hint (``torch._check`` on data-dependent
        sizes). It becomes a runtime assertion; on backed symbols, a guard."""
        e = self.simplify(expr)
        known = self.static_value(e)
        if known is True:
            return
        if known is False:
            raise GuardViolation(message or f"assumed {dumps(expr)}, but it is known to be false")
        if self.has_hint(e):
            if self.hint(e) is not True:
                raise GuardViolation(message or f"assumed {dumps(expr)}, but it is false for the current sizes")
            self._record(e)
        else:
            self.runtime_asserts.add(canonical(e))
            self._learn(e)

    def _record(self, guard: sympy.Basic) -> None:
        guard = canonical(guard)
        self.guards.add(guard)
        self._learn(guard)

    def _learn(self, fact: sympy.Basic) -> None:
        for g in conjuncts(fact):
            g = canonical(g)
            self._facts.add(g)
            narrowed = narrow_ranges(self._ranges, [g])
            if narrowed is None:
                raise GuardViolation(f"{dumps(g)} contradicts the known ranges of its symbols")
            self._ranges = narrowed
            self._learn_form_bound(g)
            self._learn_equality(g)
        self._cache.clear()

    def _learn_form_bound(self, g) -> None:
        split = _split_relation(g)
        if split is None or g.rel_op == "!=":
            return
        form, k, sign = split
        # sign*form + k (op) 0  ->  a range of sign*form, then of form
        lo, hi = {"<": (-INF, -k - 1), "<=": (-INF, -k), ">": (-k + 1, INF), ">=": (-k, INF),
                  "==": (-k, -k)}[g.rel_op]
        r = ValueRange(lo, hi) if sign > 0 else ValueRange(-hi, -lo)
        try:
            self._form_bounds[form] = self._form_bounds.get(form, ValueRange()).intersect(r)
        except ValueError:
            raise GuardViolation(f"{dumps(g)} contradicts earlier guards") from None

    def _learn_equality(self, g) -> None:
        # s_a == s_b + k: the later symbol is replaced by the earlier one everywhere.
        # f(s..) == c for a compound f (FloorDiv(5*s0, FloorDiv(5*s0, 4)) == 4, from a view):
        # that exact sub-expression becomes c wherever it appears again.
        if not isinstance(g, sympy.Eq):
            return
        for side, other in ((g.lhs, g.rhs), (g.rhs, g.lhs)):
            if isinstance(other, sympy.Integer) and not side.is_Atom and not isinstance(side, (sympy.Add, sympy.Mul)):
                self._replacements[side] = other
                self._replacement_symbols |= side.free_symbols
                return
        d = sympy.expand(g.lhs - g.rhs)
        syms = sorted(d.free_symbols, key=_symbol_order)
        if len(syms) != 2:
            return
        keep, drop = syms
        c = d.coeff(drop)
        rest = d - c * drop
        if abs(c) != 1 or rest.coeff(keep) not in (1, -1) or not (rest - rest.coeff(keep) * keep).is_Integer:
            return
        value = sympy.expand(-rest / c)
        self._replacements = {k: v.xreplace({drop: value}) for k, v in self._replacements.items()}
        self._replacements[drop] = value
        self._replacement_symbols.add(drop)

    def _resolve(self, s: sympy.Symbol) -> sympy.Expr:
        return self._replacements.get(s, s)

    # ------------------------------------------------------------------ to and from programs

    def symbol_records(self) -> list[dict]:
        """One record per symbol, ``{"name", "hint", "min", "max"}`` (open bounds as None), in
        creation order: what ``fireclay_ir.Program.add_symbol`` takes."""
        out = []
        for name, info in self.symbols.items():
            r = info.declared
            out.append({"name": name, "hint": info.hint,
                        "min": None if r.lo == -INF else int(r.lo), "max": None if r.hi == INF else int(r.hi)})
        return out

    @classmethod
    def restore(cls, symbols: Iterable[Mapping], guards: Iterable[str] = (), **options) -> ShapeEnv:
        """A ShapeEnv holding named symbols (records as :meth:`symbol_records` writes them,
        e.g. read from a program) and guards in string form, taken as already checked. Later
        stages use it to make symbolic fakes from a program's tensor types."""
        env = cls(**options)
        for rec in symbols:
            name, hint = rec["name"], rec.get("hint")
            lo = rec.get("min")
            hi = rec.get("max")
            declared = ValueRange(-INF if lo is None else lo, INF if hi is None else hi)
            if hint is not None and hint not in declared:
                raise ShapeError(f"symbol {name}: hint {hint} is outside its range {declared}")
            env._register(SymbolInfo(symbol(name), hint, declared))
            counter = "_unbacked_ids" if hint is None else "_backed_ids"
            if name[1:].isdigit():
                # new symbols must not reuse a restored name
                taken = int(name[1:]) + 1
                current = getattr(env, counter)
                nxt = next(current)
                setattr(env, counter, itertools.count(max(nxt, taken)))
        for text in guards:
            guard = parse(text)
            env.guards.add(canonical(guard))
            env._learn(guard)
        return env

    # ------------------------------------------------------------------ guards out

    def symbol_sources(self) -> dict[str, str]:
        """Symbol name -> the source expression that defines it (its first source)."""
        return {name: info.sources[0] for name, info in self.symbols.items() if info.sources}

    def produce_guards(self) -> GuardSet:
        """Every condition the trace relied on, over symbols: declared ranges of backed
        symbols, then the recorded guards with those implied by the rest removed."""
        declared = {info.symbol: info.declared for info in self.symbols.values() if not info.unbacked}
        return self.guards.simplified(declared)

    def render_guards(self, sources: Mapping[str, str] | None = None) -> str:
        """The whole guard as one Python boolean expression over the input sizes.

        Each symbol is printed as its first source (or ``sources[name]``); it checks the sizes
        specialised to constants, the duck-sized sizes equal to their symbol's first source,
        the declared ranges, and the recorded guards."""
        names = {**self.symbol_sources(), **(sources or {})}
        parts = [f"{src} == {value}" for src, value in self.constant_sources]
        for name, info in self.symbols.items():
            if info.unbacked:
                continue
            head = names.get(name, name)
            parts.extend(f"{other} == {head}" for other in info.sources[1:])
            if info.declared.lo > -INF:
                parts.append(f"{head} >= {info.declared.lo}")
            if info.declared.hi < INF:
                parts.append(f"{head} <= {info.declared.hi}")
        rendered = self.produce_guards().render_python(names)
        if rendered != "True":
            parts.append(rendered)
        return " and ".join(parts) if parts else "True"

    def check(self, values: Mapping[str, int]) -> bool:
        """Do the guards hold for symbol values ``values`` (symbol name -> int)?"""
        for name, info in self.symbols.items():
            if info.unbacked:
                continue
            if values[name] not in info.declared:
                return False
        return self.produce_guards().evaluate(values)

    def python_code(self, expr) -> str:
        """``expr`` as Python over the symbols' sources."""
        return python_code(self.simplify(expr), self.symbol_sources())


def _symbol_order(s: sympy.Symbol) -> tuple[str, int]:
    return (s.name[0], int(s.name[1:]) if s.name[1:].isdigit() else 0)


def _split_relation(e):
    """A relation of two or more symbols as (form, k, sign) with ``lhs - rhs == sign*form + k``
    and ``form`` in a canonical sign, so that ``a < b`` and ``b - a > 3`` share a form."""
    if not isinstance(e, sympy.core.relational.Relational):
        return None
    d = sympy.expand(e.lhs - e.rhs)
    k, form = d.as_coeff_Add()
    if not isinstance(k, sympy.Integer) or len(form.free_symbols) < 2:
        return None
    first = min(sympy.Add.make_args(form), key=lambda t: sympy.default_sort_key(t.as_coeff_Mul()[1]))
    sign = -1 if first.as_coeff_Mul()[0].is_negative else 1
    return (form if sign > 0 else -form), int(k), sign


def canonical(e: sympy.Basic) -> sympy.Basic:
    """One spelling per relation, so that equal facts compare equal: a constant side goes
    right (``u0 > 4``, not ``4 < u0``); otherwise ``>`` becomes ``<`` (``s1 < s0``)."""
    if not isinstance(e, sympy.core.relational.Relational):
        return e
    if e.rel_op in ("==", "!="):
        if isinstance(e.lhs, sympy.Integer) and not isinstance(e.rhs, sympy.Integer):
            return e.reversed
        if not isinstance(e.rhs, sympy.Integer) and sympy.default_sort_key(e.rhs) < sympy.default_sort_key(e.lhs):
            return e.reversed
        return e
    if isinstance(e.lhs, sympy.Integer) != isinstance(e.rhs, sympy.Integer):
        return e.reversed if isinstance(e.lhs, sympy.Integer) else e
    return e.reversed if e.rel_op in (">", ">=") else e


def _negate(e: sympy.Basic) -> sympy.Basic:
    if isinstance(e, sympy.core.relational.Relational):
        return canonical(e.negated)
    return sympy.Not(e)


def _data_dependent_message(expr, info: SymbolInfo) -> str:
    return (f"cannot decide {dumps(expr)}: it depends on the data-dependent size {info.symbol.name}, "
            f"whose value is only known when the program runs (a size produced by an op such as "
            f"nonzero or .item()). Tell the tracer what holds with ShapeEnv.assume(...) (torch._check "
            f"in user code), or avoid branching on this size.")
