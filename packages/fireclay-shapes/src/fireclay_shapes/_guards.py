"""GuardSet: the facts a trace assumed about its symbolic sizes, as one checkable condition."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping

import sympy

from ._expr import as_expr, dumps
from ._printers import python_code
from ._ranges import SymbolRanges, ValueRange, decide


def conjuncts(expr) -> list[sympy.Basic]:
    """``And(a, And(b, c))`` as ``[a, b, c]``; anything else as ``[expr]``."""
    if isinstance(expr, sympy.And):
        out: list[sympy.Basic] = []
        for a in expr.args:
            out.extend(conjuncts(a))
        return out
    return [expr]


class GuardSet:
    """An ordered, duplicate-free set of boolean expressions that must all hold.

    Guards are stored in the form they were recorded (already simplified by the recorder against
    what was known then). :meth:`simplified` drops those implied by the others and by symbol
    ranges; :meth:`render_python` and :meth:`evaluate` check them on concrete sizes.
    """

    def __init__(self, guards=()):
        self._guards: list[sympy.Basic] = []
        self._seen: set[sympy.Basic] = set()
        self._compiled: tuple[int, Callable] | None = None
        for g in guards:
            self.add(g)

    def add(self, guard) -> bool:
        """Record ``guard``; False when it was already present (or is trivially true)."""
        added = False
        for g in conjuncts(as_expr(guard)):
            if g is sympy.true or g in self._seen:
                continue
            if g is sympy.false:
                raise ValueError("a guard that is always False was recorded: the trace cannot hold for any sizes")
            self._seen.add(g)
            self._guards.append(g)
            added = True
        return added

    def __iter__(self) -> Iterator[sympy.Basic]:
        return iter(self._guards)

    def __len__(self) -> int:
        return len(self._guards)

    def __contains__(self, guard) -> bool:
        return as_expr(guard) in self._seen

    def __repr__(self) -> str:
        return f"GuardSet({self.dumps()})"

    def dumps(self) -> list[str]:
        """Each guard in the string form (what ``Program.guards`` holds)."""
        return [dumps(g) for g in self._guards]

    def simplified(self, ranges: Mapping[sympy.Symbol, ValueRange] | None = None) -> GuardSet:
        """A GuardSet without the guards that ``ranges`` and the remaining guards imply."""
        from ._env import narrow_ranges  # the range narrowing of ShapeEnv, shared

        base = dict(ranges or {})
        kept = list(self._guards)
        i = 0
        while i < len(kept):
            others = kept[:i] + kept[i + 1:]
            narrowed = narrow_ranges(base, others)
            if narrowed is not None and decide(kept[i], _lookup(narrowed)) is True:
                del kept[i]
            else:
                i += 1
        return GuardSet(kept)

    def render_python(self, names: Mapping[str, str] | None = None) -> str:
        """One Python boolean expression, ``names`` mapping symbol names to source text."""
        if not self._guards:
            return "True"
        return " and ".join(f"({python_code(g, names)})" for g in self._guards)

    def evaluate(self, values: Mapping[str, int]) -> bool:
        """Do all guards hold when each symbol takes ``values[name]``?"""
        if self._compiled is None or self._compiled[0] != len(self._guards):
            names = sorted({s.name for g in self._guards for s in g.free_symbols})
            body = self.render_python({n: f"v[{n!r}]" for n in names})
            # The code is printed by us from sympy trees, never taken from input text.
            fn = eval(f"lambda v: {body}", {"__builtins__": {"max": max, "min": min}})
            self._compiled = (len(self._guards), fn)
        return bool(self._compiled[1](values))


def _lookup(ranges: Mapping[sympy.Symbol, ValueRange]) -> SymbolRanges:
    from ._ranges import UNBOUNDED

    return lambda s: ranges.get(s, UNBOUNDED)
