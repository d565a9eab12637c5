"""The string form: dumps/parse round trips, canonical text, and clear errors on bad input."""

import random

import pytest
import sympy
from exprgen import random_tree, to_sympy
from hypothesis import given, settings
from hypothesis import strategies as st

from fireclay_shapes import ExprParseError, FloorDiv, Max, Min, Mod, dumps, parse, symbol

s0, s1, s2 = symbol("s0"), symbol("s1"), symbol("s2")

ROUND_TRIP = [
    (s0, "s0"),
    (2 * s0 + 1, "2*s0 + 1"),
    (s0 * s1 - 3, "s0*s1 - 3"),
    (-s0, "-s0"),
    (s0**2 * s1, "s0**2*s1"),
    (FloorDiv(s0, 2), "FloorDiv(s0, 2)"),
    (Mod(s0 + s1, 3), "Mod(s0 + s1, 3)"),
    (FloorDiv(s0, s1) + Mod(s2, 4), "FloorDiv(s0, s1) + Mod(s2, 4)"),
    (Max(s0, s1) - Min(s1, 7), "Max(s0, s1) - Min(7, s1)"),
    (sympy.Eq(s0, s1), "s0 == s1"),
    (sympy.Ne(s0, 2 * s1), "s0 != 2*s1"),
    (sympy.Lt(s0, 5), "s0 < 5"),
    (sympy.Le(s0 + 1, s1), "s0 + 1 <= s1"),
    (sympy.And(sympy.Lt(s0, 5), sympy.Eq(s1, 3)), "And(s1 == 3, s0 < 5)"),
    (sympy.Or(sympy.Lt(s0, 5), sympy.Eq(s1, 3)), "Or(s1 == 3, s0 < 5)"),
    (sympy.true, "True"),
    (sympy.Integer(-12), "-12"),
]


@pytest.mark.parametrize("expr,text", ROUND_TRIP, ids=[t for _, t in ROUND_TRIP])
def test_round_trip_table(expr, text):
    assert dumps(expr) == text
    assert parse(text) == expr
    assert dumps(parse(text)) == text


@given(st.integers(0, 2**32))
@settings(max_examples=150, deadline=None)
def test_round_trip_random(seed):
    rng = random.Random(seed)
    expr = to_sympy(random_tree(rng, 4))
    text = dumps(expr)
    assert parse(text) == expr
    assert dumps(parse(text)) == text


@pytest.mark.parametrize("text", [
    "(s0 + 1) * (s1 - 2)", "FloorDiv(2*s0 + 5, 2)", "-(s0 - s1)", "s0 -  - 3", "Max(s0, s1, s2)",
])
def test_parse_accepts_hand_written_forms(text):
    expr = parse(text)
    assert parse(dumps(expr)) == expr


@pytest.mark.parametrize("text,message", [
    ("", "empty expression"),
    ("s0 +", "unexpected end"),
    ("s0 $ 1", "unexpected character '$'"),
    ("__import__('os')", "unexpected character"),
    ("os(s0)", "unexpected '('"),
    ("FloorDiv(s0)", "FloorDiv takes 2 arguments"),
    ("s0 ** s1", "exponent must be a non-negative integer"),
    ("(s0 + 1", "expected ')'"),
    ("s0 1", "unexpected '1'"),
    ("(" * 300 + "s0" + ")" * 300, "nesting deeper"),
])
def test_parse_errors_say_what_and_where(text, message):
    with pytest.raises(ExprParseError) as err:
        parse(text)
    assert message in str(err.value)
    assert "cannot parse symbolic expression" in str(err.value)


def test_integer_semantics_are_pythons():
    for a in range(-12, 13):
        for b in (-5, -3, -1, 1, 2, 7):
            assert FloorDiv(sympy.Integer(a), sympy.Integer(b)) == a // b
            assert Mod(sympy.Integer(a), sympy.Integer(b)) == a % b


@pytest.mark.parametrize("expr,expected", [
    (FloorDiv(4 * s0 + 3, 2), 2 * s0 + FloorDiv(3, 2)),
    (FloorDiv(FloorDiv(s0, 2), 3), FloorDiv(s0, 6)),
    (Mod(6 * s0 + s1, 3), Mod(s1, 3)),
    (Mod(Mod(s0, 12), 4), Mod(s0, 4)),
    (FloorDiv(s0 * s1 + s1, s1), s0 + 1),
    (Mod(s0 * s1 + 2, s1), Mod(2, s1)),
    (FloorDiv(s0, 1), s0),
    (Mod(s0, 1), 0),
])
def test_exact_rewrites_in_constructors(expr, expected):
    assert expr == expected
