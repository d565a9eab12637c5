"""Kernels match eager on bad indices and zero divisors (issue 23, findings 4 and 5): an index read
from a tensor outside its dimension raises as eager raises (it read heap memory, or crashed the
process at 2**40), and integer ``//``, ``%``, ``fmod``, ``div(rounding_mode=)`` by zero raise as
eager does on the CPU (they returned 0). The table is fireclay-loops' ``check_cases``."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
check_cases = pytest.importorskip("check_cases", reason="fireclay-loops' tests hold the check table")

from aten_builder import AtenBuilder  # noqa: E402
from check_cases import (  # noqa: E402
    DIVISION_OPS,
    FALLBACK_INDEX_OPS,
    HUGE,
    INDEX_OPS,
    INDEX_VALUES,
    ROWS,
    IndexOp,
    check_against_eager,
    division_inputs,
    division_program,
    index_inputs,
    index_program,
)

from fireclay_cpp import compile_program  # noqa: E402
from fireclay_loops import IndexOutOfBounds, IntegerDivisionByZero, config  # noqa: E402

_COMPILED: dict[str, tuple] = {}


def _compiled(name: str, make):
    """Each op's program compiles once; the table's values are only inputs."""
    if name not in _COMPILED:
        builder, program = make()
        _COMPILED[name] = (builder, compile_program(program))
    return _COMPILED[name]


@pytest.mark.parametrize("value", list(INDEX_VALUES))
@pytest.mark.parametrize("op", INDEX_OPS, ids=lambda o: o.name)
def test_indirect_index_matches_eager(op, value):
    builder, compiled = _compiled(op.name, lambda: index_program(op))
    error = check_against_eager(compiled, builder, index_inputs(op, value), op.atol)
    if error is not None:
        assert isinstance(error, IndexOutOfBounds)
        bad = INDEX_VALUES[value](op.size)
        assert f"index {bad} is out of bounds for {op.site}" in str(error) and f"with size {op.size}" in str(error)


@pytest.mark.parametrize("zero", [False, True], ids=["nonzero", "zero"])
@pytest.mark.parametrize("op", DIVISION_OPS, ids=lambda o: o.name)
def test_integer_division_by_zero_matches_eager(op, zero):
    builder, compiled = _compiled(op.name, lambda: division_program(op))
    error = check_against_eager(compiled, builder, division_inputs(op, zero))
    if error is not None:
        assert isinstance(error, IntegerDivisionByZero) and str(error).startswith("ZeroDivisionError")
    assert (error is not None) == (not op.dtype.is_floating_point and (zero or op.divisor_is_zero))


def test_threads_report_the_first_bad_index():
    """An embedding large enough for OpenMP threads: a bad index raises, the next call (in range)
    runs normally."""
    w, ids = torch.randn(1000, 64), torch.randint(0, 1000, (64, 300))
    b = AtenBuilder()
    program = b.output(b.call("embedding.default", b.input(w, "w"), b.input(ids, "ids")))
    compiled = compile_program(program)
    bad = ids.clone()
    bad[40, 17] = 1000
    with pytest.raises(IndexError, match="index 1000 is out of bounds for dimension 0 of embedding with size 1000"):
        compiled(w, bad)
    torch.testing.assert_close(compiled(w, ids)[0], b.eager(w, ids)[0], rtol=0, atol=0)


def test_check_in_a_run_that_uses_the_arena():
    """An embedding whose result a matmul reads lives in the arena: its run takes the arena's
    address and the error slot after it (a failure names the right check)."""
    w, ids, m = torch.randn(50, 8), torch.randint(0, 50, (4, 6)), torch.randn(8, 3)
    b = AtenBuilder()
    e = b.call("embedding.default", b.input(w, "w"), b.input(ids, "ids"))
    program = b.output(b.call("mm.default", b.call("view.default", e, [24, 8]), b.input(m, "m")))
    compiled = compile_program(program)
    assert "fc_arena" in "".join(compiled.cpp_sources)
    torch.testing.assert_close(compiled(w, ids, m)[0], b.eager(w, ids, m)[0])
    bad = ids.clone()
    bad[2, 5] = -3
    with pytest.raises(IndexError, match="index -3 is out of bounds for dimension 0 of embedding with size 50"):
        compiled(w, bad, m)


def test_checks_can_be_turned_off(monkeypatch):
    """``config.kernel_checks`` off: no check in the kernels, in-range indices still right."""
    monkeypatch.setattr(config, "kernel_checks", False)
    op = INDEX_OPS[0]
    builder, program = index_program(op)
    compiled = compile_program(program)
    assert "fc_err)" not in "".join(compiled.cpp_sources)  # no kernel calls a check
    x, idx = index_inputs(op, "in_range")
    torch.testing.assert_close(compiled(x, idx)[0], builder.eager(x, idx)[0], rtol=0, atol=0)


def _kernels(compiled) -> str:
    return "".join(src.split('extern "C" void kernel', 1)[1] for src in compiled.cpp_sources
                   if 'extern "C" void kernel' in src)


def _strided_gather_then_sum(b, x, i):
    """A gather feeding a sum whose indices are every other one of a row: not one run of memory."""
    return b.call("sum.dim_IntList", b.call("gather.default", x, 1, b.call("slice.Tensor", i, 1, 0, 6, 2)), [1])


@pytest.mark.parametrize("layout", ["contiguous", "strided"])
def test_indices_read_in_a_loop_are_checked_before_it(layout, monkeypatch):
    """A gather feeding a sum: the loop over the gathered values holds no check per index (a
    branch and a call there keep the loop from vectorising); the indices are checked first, and
    one out of range raises, naming it. Indices that are one run of an int64 buffer are checked
    in place as 32-bit words (``fc_indices_ok``); others by a min/max scan of the loop's indices.
    (The strided sum of 3 would be pointwise code, fireclay-loops' ``unroll_reductions``: kept a
    loop here.)"""
    from fireclay_loops.config import config as loops_config

    monkeypatch.setattr(loops_config, "unroll_reductions", 0)
    op = next(o for o in INDEX_OPS if o.name == "gather_then_sum")
    if layout == "strided":
        op = IndexOp("strided_gather_then_sum", _strided_gather_then_sum, op.size, (ROWS, 6))
    builder, compiled = _compiled(op.name, lambda: index_program(op))
    kernels = _kernels(compiled)
    assert "fc_check_bounds(" not in kernels
    if layout == "contiguous":
        assert "fc_indices_ok(in_idx + (3*x0), 3, 5, " in kernels and "reduction(min: fc_low" not in kernels
    else:
        assert "fc_bounds_ok(" in kernels and "reduction(min: fc_low" in kernels and "fc_indices_ok(" not in kernels
    x, idx = index_inputs(op, "in_range")
    torch.testing.assert_close(compiled(x, idx)[0], builder.eager(x, idx)[0])
    for bad in (op.size, -1, HUGE, -HUGE, 2**32 + 1, -2**32):
        idx_bad = idx.clone()
        idx_bad[ROWS - 1, 2] = bad
        with pytest.raises(IndexError, match=f"index {bad} is out of bounds for dimension 1 of gather with size {op.size}"):
            compiled(x, idx_bad)


@pytest.mark.parametrize("count", [3, 4, 9])
def test_word_scan_of_every_run_length(count):
    """``fc_indices_ok`` reads the indices 8 words at a time, then the rest: every position of
    runs of several lengths is checked, high words (2**32 + 1) included."""
    b = AtenBuilder()
    x, i = torch.randn(2, 6), torch.randint(0, 6, (2, count))
    program = b.output(b.call("sum.dim_IntList", b.call("gather.default", b.input(x, "x"), 1, b.input(i, "idx")), [1]))
    compiled = compile_program(program)
    assert "fc_indices_ok(" in _kernels(compiled)
    torch.testing.assert_close(compiled(x, i)[0], b.eager(x, i)[0])
    for row in range(2):
        for col in range(count):
            for bad in (6, -1, 2**32 + 1):
                bad_i = i.clone()
                bad_i[row, col] = bad
                with pytest.raises(IndexError, match=f"index {bad} is out of bounds"):
                    compiled(x, bad_i)


@pytest.mark.parametrize("value", list(INDEX_VALUES))
@pytest.mark.parametrize("op", FALLBACK_INDEX_OPS, ids=lambda o: o.name)
def test_indices_of_ops_torch_runs_raise_as_in_eager(op, value):
    """Scatter, index_put, index_add and the like are calls into torch's kernels: a bad index
    raises what eager raises (its type; the message is torch's), a good one gives eager's result."""
    builder, compiled = _compiled(op.name, lambda: index_program(op))
    error = check_against_eager(compiled, builder, index_inputs(op, value), op.atol)
    if value == "in_range":
        assert error is None
