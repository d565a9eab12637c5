"""Index expressions: string form round trip, safe parsing, simplification, evaluation."""

import pytest
import sympy

from fireclay_loops import exprs

CASES = ["0", "x0", "8*x0 + r0", "s0*x1 + 3*x0 + 2", "FloorDiv(i0, 4)", "Mod(FloorDiv(i0 + 8*i1, 2), 4)",
         "-x0 + 7", "s0**2*x0"]


@pytest.mark.parametrize("text", CASES)
def test_string_form_round_trips(text):
    e = exprs.parse(text)
    assert exprs.equal(exprs.parse(exprs.to_str(e)), e)


@pytest.mark.parametrize("bad", ["__import__('os')", "x0; 1", "lambda: 0", "x0[1]", "open('f')", "1 +", "(x0",
                                 "x0.__class__"])
def test_parse_refuses_anything_but_expressions(bad):
    with pytest.raises(ValueError):
        exprs.parse(bad)


def test_floordiv_pulls_out_exact_multiples():
    i0, i1 = exprs.symbol("i0"), exprs.symbol("i1")
    assert exprs.equal(exprs.FloorDiv(8 * i0 + i1, 4), 2 * i0 + exprs.FloorDiv(i1, 4))
    assert exprs.FloorDiv(sympy.Integer(17), 5) == 3
    assert exprs.modular_indexing(sympy.Integer(17), 2, 5) == 3


def test_loop_ranges_fold_reshape_arithmetic():
    # flattening [4, 8] and splitting it back is the identity once 0 <= i1 < 8 is known
    i0, i1 = exprs.symbol("i0"), exprs.symbol("i1")
    flat = 8 * i0 + i1
    assert exprs.simplify(exprs.FloorDiv(flat, 8), {"i0": 4, "i1": 8}) == i0
    assert exprs.simplify(exprs.modular_indexing(flat, 1, 8), {"i0": 4, "i1": 8}) == i1
    assert exprs.simplify(exprs.FloorDiv(flat, 8)) != i0  # not without the ranges


def test_evaluate_on_ints_and_hints():
    e = exprs.parse("Mod(FloorDiv(x0 + 8*x1, 2), 4) + FloorDiv(x0, 3)")
    assert exprs.evaluate(e, {"x0": 7, "x1": 1}) == ((7 + 8) // 2) % 4 + 7 // 3
    assert exprs.hint("s0*4 + 1", {"s0": 3}) == 13


def test_symbols_are_fireclay_shapes_symbols():
    import fireclay_shapes

    s = exprs.symbol("s0")
    assert s.is_integer and s is fireclay_shapes.symbol("s0")
    assert exprs.parse("s0 + 1").free_symbols == {s}


def test_index_inside_one_period_folds():
    # a flipped column 7 - i1 offset by three whole rows
    i1 = exprs.symbol("i1")
    assert exprs.simplify(exprs.Mod(31 - i1, 8), {"i1": 8}) == 7 - i1
    assert exprs.simplify(exprs.FloorDiv(31 - i1, 8), {"i1": 8}) == 3
    assert exprs.simplify(exprs.Mod(31 - i1, 8), {"i1": 9}) != 7 - i1  # crosses a period


def test_split_and_joined_loops_compare_equal():
    x0, r0 = exprs.symbol("x0"), exprs.symbol("r0")
    split = 24 * exprs.FloorDiv(x0, 3) + 8 * exprs.Mod(x0, 3) + r0
    assert exprs.equal(split, 8 * x0 + r0)
    assert not exprs.equal(split, 8 * x0 + r0 + 1)
    assert not exprs.equal(24 * exprs.FloorDiv(x0, 3) + 4 * exprs.Mod(x0, 3), 8 * x0)


@pytest.mark.parametrize("a,b,expected", [
    (768, 768, True), (768, 769, False), ("s0*4", "4*s0", True), ("s0 + 1", "s0", False),
    ("i0*8 + i1", "8*i0 + i1", True), (0, "s0 - s0", True), ("2*s0", 6, False),
])
def test_equal_is_exact_on_static_and_symbolic_sizes(a, b, expected):
    assert exprs.equal(a, b) is expected
    assert exprs.equal(b, a) is expected


# (expression, loop sizes, what it simplifies to or None where it must stay as it is in value only)
DIGIT_CASES = [
    ("r0 + 50257*Mod(x0, 16) + 804112*FloorDiv(x0, 16)", {"x0": 32, "r0": 50257}, "r0 + 50257*x0"),
    ("r0 + 50257*Mod(x0, 16) + 804112*FloorDiv(r0 + 50257*x0, 804112)", {"x0": 32, "r0": 50257}, "r0 + 50257*x0"),
    ("Mod(r0 + 64*x0, 128)", {"x0": 6, "r0": 64}, "r0 + 64*Mod(x0, 2)"),
    ("FloorDiv(3*x0 + 1, 6)", {"x0": 20}, "FloorDiv(x0, 2)"),
    ("FloorDiv(r0 + 12*x0 + 2*x1, 24)", {"x0": 7, "x1": 3, "r0": 2}, "FloorDiv(x0, 2)"),
    ("Mod(8*x0 - 16*x1 + x2, 32)", {"x0": 9, "x1": 5, "x2": 8}, None),  # a negative multiple stays exact
    ("FloorDiv(r0 + 64*x0 + 7, 128)", {"x0": 5, "r0": 64}, None),  # the low part reaches past 64
    ("FloorDiv(r0 + 64*x0 - 1, 128)", {"x0": 5, "r0": 64}, None),  # and below 0
    ("Mod(FloorDiv(r0 + 10*x0, 5), 4) + FloorDiv(r0 + 10*x0, 20)", {"x0": 9, "r0": 10}, None),
]


@pytest.mark.parametrize("text, sizes, expected", DIGIT_CASES)
def test_low_digits_of_a_flat_index_drop_out_of_its_division(text, sizes, expected):
    """A flat index divided by a multiple of its row length reads the row number alone (no
    division in a kernel's inner loop); the result equals the original at every point of the ranges."""
    import itertools
    import random

    e = exprs.parse(text)
    simplified = exprs.simplify(e, sizes)
    names = list(sizes)
    points = list(itertools.product(*(range(sizes[n]) for n in names)))
    if len(points) > 4000:  # every corner of the ranges and a random sample
        rng = random.Random(0)
        points = [p for p in points if all(v in (0, sizes[n] - 1) for n, v in zip(names, p))] + \
            rng.sample(points, 4000)
    for point in points:
        env = dict(zip(names, point))
        assert exprs.evaluate(simplified, env) == exprs.evaluate(e, env), (env, simplified)
    if expected is not None:
        assert sympy.expand(simplified - exprs.parse(expected)) == 0, simplified
