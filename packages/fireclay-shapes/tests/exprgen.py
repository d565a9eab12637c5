"""Random integer expression trees for the property tests.

A tree is nested tuples: ``("const", 3)``, ``("sym", "p0")``, ``(op, a, b)`` with op one of
OPS. The same tree is evaluated on Python ints (the oracle), on SymbolicInts, and as a sympy
expression (for simplification and the printers).
"""

from __future__ import annotations

import random

import sympy

from fireclay_shapes import FloorDiv, Max, Min, Mod, sym_max, sym_min, symbol

POSITIVE = ("p0", "p1", "p2")  # range [1, 30]
ANY = ("n0", "n1")  # range [-30, 30]
RANGES = {**{n: (1, 30) for n in POSITIVE}, **{n: (-30, 30) for n in ANY}}
OPS = ("add", "sub", "mul", "floordiv", "mod", "max", "min", "neg")


def random_tree(rng: random.Random, depth: int = 3):
    if depth == 0 or rng.random() < 0.2:
        if rng.random() < 0.3:
            return ("const", rng.randint(-9, 9))
        return ("sym", rng.choice(POSITIVE + ANY))
    op = rng.choice(OPS)
    if op == "neg":
        return ("neg", random_tree(rng, depth - 1))
    a = random_tree(rng, depth - 1)
    b = random_divisor(rng) if op in ("floordiv", "mod") else random_tree(rng, depth - 1)
    return (op, a, b)


def random_divisor(rng: random.Random):
    """Never zero on the values of RANGES: a nonzero constant, or a positive symbol plus >= 0."""
    r = rng.random()
    if r < 0.4:
        return ("const", rng.choice([-7, -3, -2, -1, 1, 2, 3, 4, 8, 16]))
    if r < 0.8:
        return ("sym", rng.choice(POSITIVE))
    return ("add", ("sym", rng.choice(POSITIVE)), ("const", rng.randint(0, 5)))


def random_values(rng: random.Random) -> dict[str, int]:
    return {n: rng.randint(lo, hi) for n, (lo, hi) in RANGES.items()}


def evaluate(tree, leaf, *, floordiv, mod, maximum, minimum):
    kind = tree[0]
    if kind == "const":
        return tree[1]
    if kind == "sym":
        return leaf(tree[1])
    if kind == "neg":
        return -evaluate(tree[1], leaf, floordiv=floordiv, mod=mod, maximum=maximum, minimum=minimum)
    a = evaluate(tree[1], leaf, floordiv=floordiv, mod=mod, maximum=maximum, minimum=minimum)
    b = evaluate(tree[2], leaf, floordiv=floordiv, mod=mod, maximum=maximum, minimum=minimum)
    return {
        "add": lambda: a + b, "sub": lambda: a - b, "mul": lambda: a * b,
        "floordiv": lambda: floordiv(a, b), "mod": lambda: mod(a, b),
        "max": lambda: maximum(a, b), "min": lambda: minimum(a, b),
    }[kind]()


def concrete(tree, values: dict[str, int]) -> int:
    return evaluate(tree, values.__getitem__, floordiv=lambda a, b: a // b, mod=lambda a, b: a % b,
                    maximum=max, minimum=min)


def to_sympy(tree) -> sympy.Expr:
    return sympy.sympify(_to_sympy(tree))


def _to_sympy(tree):
    return evaluate(tree, symbol, floordiv=FloorDiv, mod=Mod, maximum=Max, minimum=Min)


def symbolic(tree, leaves: dict):
    return evaluate(tree, leaves.__getitem__, floordiv=lambda a, b: a // b, mod=lambda a, b: a % b,
                    maximum=sym_max, minimum=sym_min)


def sympy_value(expr, values: dict[str, int]) -> int:
    out = expr.xreplace({symbol(n): sympy.Integer(v) for n, v in values.items()})
    assert isinstance(out, sympy.Integer), out
    return int(out)


def ranges_fn(name_ranges=RANGES):
    from fireclay_shapes import ValueRange

    table = {symbol(n): ValueRange(lo, hi) for n, (lo, hi) in name_ranges.items()}
    return lambda s: table.get(s, ValueRange())
