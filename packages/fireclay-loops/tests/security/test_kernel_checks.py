"""The kernel checks as lowered (``ops.check_bounds``, ``ops.check_nonzero``), run by the reference
executor against eager over the check table (``check_cases``); the backends' ``tests/security``
run the same table through generated code."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from check_cases import (  # noqa: E402
    DIVISION_OPS,
    INDEX_OPS,
    INDEX_VALUES,
    check_against_eager,
    division_inputs,
    division_program,
    index_inputs,
    index_program,
)

from fireclay_loops import IndexOutOfBounds, IntegerDivisionByZero, config, lower, schedule  # noqa: E402
from fireclay_loops.reference import run  # noqa: E402


def _reference(program):
    scheduled = schedule(lower(program))
    return lambda *inputs: run(scheduled, *inputs)


@pytest.mark.parametrize("value", list(INDEX_VALUES))
@pytest.mark.parametrize("op", INDEX_OPS, ids=lambda o: o.name)
def test_indirect_index_matches_eager(op, value):
    builder, program = index_program(op)
    error = check_against_eager(_reference(program), builder, index_inputs(op, value), op.atol)
    if error is not None:
        assert isinstance(error, IndexOutOfBounds) and f"with size {op.size}" in str(error)


@pytest.mark.parametrize("op", DIVISION_OPS, ids=lambda o: o.name)
def test_integer_division_by_zero_matches_eager(op):
    builder, program = division_program(op)
    error = check_against_eager(_reference(program), builder, division_inputs(op, True))
    assert (error is not None) == (not op.dtype.is_floating_point)
    if error is not None:
        assert isinstance(error, IntegerDivisionByZero)


def test_checks_are_loop_body_ops_and_can_be_turned_off(monkeypatch):
    program = index_program(INDEX_OPS[3])[1]
    names = {op.name for n in lower(program).nodes if hasattr(n, "body") for op in n.body.ops}
    assert "check_bounds" in names
    monkeypatch.setattr(config, "kernel_checks", False)
    names = {op.name for n in lower(program).nodes if hasattr(n, "body") for op in n.body.ops}
    assert "check_bounds" not in names
    division = division_program(DIVISION_OPS[0])[1]
    assert not any(op.name == "check_nonzero" for n in lower(division).nodes if hasattr(n, "body")
                   for op in n.body.ops)
