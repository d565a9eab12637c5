"""Range-aware simplification keeps values within the ranges, and does simplify."""

import random

import pytest
import sympy
from exprgen import concrete, random_tree, random_values, ranges_fn, sympy_value, to_sympy
from hypothesis import given, settings
from hypothesis import strategies as st

from fireclay_shapes import FloorDiv, Max, Min, Mod, ShapeEnv, ValueRange, bound, simplify_with_ranges, symbol

RANGES_FN = ranges_fn()
p0, p1, n0 = symbol("p0"), symbol("p1"), symbol("n0")
x = symbol("x")  # an index variable in [0, 15]
SMALL = ranges_fn({"p0": (1, 30), "p1": (1, 30), "n0": (-30, 30), "x": (0, 15)})


@given(st.integers(0, 2**32))
@settings(max_examples=200, deadline=None)
def test_simplification_preserves_values_in_range(seed):
    rng = random.Random(seed)
    tree = random_tree(rng)
    expr = to_sympy(tree)
    simple = simplify_with_ranges(expr, RANGES_FN)
    r = bound(expr, RANGES_FN)
    for _ in range(8):
        values = random_values(rng)
        want = concrete(tree, values)
        assert sympy_value(simple, values) == want, (expr, simple)
        assert r.lo <= want <= r.hi, (expr, r)


@pytest.mark.parametrize("expr,expected", [
    (FloorDiv(x, 16), 0),
    (Mod(x, 16), x),
    (FloorDiv(16 * p0 + x, 16), p0),
    (Mod(16 * p0 + x, 16), x),
    (FloorDiv(x - 16, 16), -1),
    (Mod(x, 32), x),
    (FloorDiv(x, 8), FloorDiv(x, 8)),
    (Max(p0, 0), p0),
    (Max(p0, p0 + 1, 1), p0 + 1),
    (Min(x, 15), x),
    (Min(x, 16, p0 + 20), x),
    (Max(n0, 0), Max(n0, 0)),
    (sympy.Lt(x, 16), sympy.true),
    (sympy.Ge(p0, 1), sympy.true),
    (sympy.Eq(p0, 0), sympy.false),
    (sympy.Lt(p0, p1), sympy.Lt(p0, p1)),
    (sympy.And(sympy.Lt(x, 20), sympy.Lt(p0, p1)), sympy.Lt(p0, p1)),
    (Mod(x, 16) + FloorDiv(x, 16) * 16, x),
])
def test_range_rules(expr, expected):
    assert simplify_with_ranges(sympy.sympify(expr), SMALL) == expected


def test_singleton_ranges_become_constants():
    assert simplify_with_ranges(p0 * 2 + 1, lambda s: ValueRange(3, 3)) == 7


def test_env_simplify_is_cached_and_sees_new_facts():
    env = ShapeEnv()
    s = env.create_symbol(10, "n")
    e = FloorDiv(s, 64)
    assert env.simplify(e) == e
    assert env.simplify(e) is env.simplify(e)
    assert bool(env.wrap(s) < 64)
    assert env.simplify(e) == 0
