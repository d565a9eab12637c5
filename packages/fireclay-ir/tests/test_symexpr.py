"""The interpreter's evaluator for symbolic size expressions: arithmetic yes, anything else no."""

from __future__ import annotations

import pytest

from fireclay_ir import IRError
from fireclay_ir.interpreter import evaluate_symexpr


@pytest.mark.parametrize("expr, env, expected", [
    ("s0", {"s0": 5}, 5),
    ("2*s0 + 1", {"s0": 5}, 11),
    ("s0*s1 - (s0 // 2)", {"s0": 7, "s1": 3}, 18),
    ("FloorDiv(s0, 4) + Mod(s1, 3)", {"s0": 9, "s1": 5}, 4),
    ("CeilDiv(s0, 4)", {"s0": 9}, 3),
    ("Max(s0, 3) * Min(s1, 2)", {"s0": 1, "s1": 8}, 6),
    ("ModularIndexing(s0, 2, 3)", {"s0": 11}, 2),
    ("floor(s0/2)", {"s0": 7}, 3),
    ("ceiling(s0/2)", {"s0": 7}, 4),
    ("s0**2", {"s0": 6}, 36),
    ("-s0", {"s0": 6}, -6),
    ("Eq(s0, 6)", {"s0": 6}, True),
    ("s0 < s1 and s1 <= 8", {"s0": 1, "s1": 8}, True),
    ("s0/2", {"s0": 8}, 4),
])
def test_symexpr_evaluation(expr, env, expected):
    value = evaluate_symexpr(expr, env)
    assert value == expected and type(value) is type(expected)


@pytest.mark.parametrize("expr", [
    "__import__('os').system('true')", "s0.__class__", "open('x')", "[s0]", "lambda: 1", "s0 if s0 else 1",
    "s9 + 1", "s0 +", "x" * 20_000,
])
def test_symexpr_rejects_anything_else(expr):
    with pytest.raises(IRError):
        evaluate_symexpr(expr, {"s0": 1})
