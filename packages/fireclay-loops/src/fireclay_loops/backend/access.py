"""How a kernel's memory accesses move along its loop variables, whatever the target: what
decides whether a reduction reads its memory along rows or along columns (and so which loop a
renderer puts innermost)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import sympy


def index_step(index: sympy.Expr, var: sympy.Symbol, hint: Callable[[sympy.Expr], int]) -> int | None:
    """How far ``index`` moves when loop variable ``var`` grows by one: a constant, or for
    floor divisions and remainders the move seen at two sample points when both agree (a
    reshaped view moves by its inner stride except at the edges); else None."""
    names = {s.name: s for s in index.free_symbols if isinstance(s, sympy.Symbol)}
    if var.name not in names:
        return 0
    v = names[var.name]
    step = sympy.expand(index.xreplace({v: v + 1}) - index)
    if step.is_Integer:
        return int(step)
    loop_vars = [s for n, s in names.items() if n[0] in "xr" and n[1:].isdigit()]
    seen = set()
    for at in (0, 3):
        point: dict[sympy.Basic, sympy.Basic] = {s: sympy.Integer(at) for s in loop_vars}
        moved = index.xreplace({**point, v: sympy.Integer(at + 1)}) - index.xreplace(point)
        try:
            seen.add(int(hint(moved)))
        except (TypeError, ValueError, KeyError):  # (an indirect index: no fixed step)
            return None
    return seen.pop() if len(seen) == 1 else None


def reads_columns(accesses: list[Any], xvars: list[sympy.Symbol], rvars: list[sympy.Symbol],
                  hint: Callable[[sympy.Expr], int]) -> bool:
    """Whether a reduction's memory runs along the innermost kept dim rather than the innermost
    reduced one: some access is contiguous in ``x`` (last) and none in ``r`` (last). An access
    that ``x`` does not move (a per-row mean or scale of a layer-norm weight gradient) is one
    value per reduction step for a whole block, so it does not count."""
    if not rvars or not xvars:
        return False
    x, r = xvars[-1], rvars[-1]
    rnames = {v.name for v in rvars}
    along_x = along_r = 0
    for index in accesses:
        index = sympy.sympify(index)
        if not any(s.name in rnames for s in index.free_symbols):
            continue  # read once per kept point, whatever the loop order
        if index_step(index, x, hint) == 0:
            continue  # read once per reduction step, whatever the loop order
        if index_step(index, r, hint) == 1:
            along_r += 1
        elif index_step(index, x, hint) == 1:
            along_x += 1
    return along_x > 0 and along_r == 0
