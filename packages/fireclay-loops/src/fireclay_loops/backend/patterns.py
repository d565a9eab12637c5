"""Patterns a renderer looks for among a kernel's values, whatever its target: the term of a
softmax's sum, ``exp(a - max(a))``, which a renderer may compute in the loop of the max (an
online softmax), and whether two values of different loops are the same computation.

They read :attr:`Value.op`, which a renderer records on the values it builds these from.
"""

from __future__ import annotations

import re

from fireclay_loops.backend.kernel import Value


def strip_casts(v: Value) -> Value:
    """``v`` without the casts between floating-point types around it."""
    while v.op[:1] == ("float_cast",):
        v = v.op[1]
    return v


def exp_of_difference(v: Value) -> tuple[Value, Value] | None:
    """``(a, m)`` when ``v`` is ``exp(a - m)`` up to floating-point casts (``m`` without its
    casts), else None: a softmax's term, whose ``m`` may be a max of ``a`` reduced already."""
    e = strip_casts(v)
    if e.op[:1] != ("exp",):
        return None
    d = strip_casts(e.op[1])
    if d.op[:1] != ("sub",):
        return None
    return d.op[1], strip_casts(d.op[2])


def canonical(v: Value, memo: dict[Value, str]) -> str:
    """The value's expression (its code after the first `` = ``) with its operands spelt out:
    equal for the same computation in two loops, whose statements have different names."""
    got = memo.get(v)
    if got is None:
        expr = v.code.split(" = ", 1)[1] if " = " in v.code and "\n" not in v.code else v.code
        names = {d.name: canonical(d, memo) for d in v.deps}
        got = re.sub(r"[A-Za-z_]\w*", lambda m: names.get(m.group(0), m.group(0)), expr)
        memo[v] = got
    return got
