"""A zero-padded matmul operand that our kernels compute is written in place
(fireclay_loops.lowering.matmul.padded_in_place; padding forced on for the CPU here): the C++
kernels write the operand into its producer's buffer and the pad's zeros beside it, the library
call reads the padded view, and other kernels read the operand through its own view, against
eager, on the programs of fireclay-loops' tests/padded_operand_programs.py."""

import pytest

import fireclay_cpp

torch = pytest.importorskip("torch")
programs = pytest.importorskip("padded_operand_programs", reason="needs fireclay-loops' tests in the checkout")

# K padded in float32 and bfloat16, and aligned (nothing padded)
SHAPES = [programs.SHAPES[0], programs.SHAPES[1], programs.SHAPES[3]]


@pytest.mark.parametrize("k,dtype,padded", SHAPES, ids=lambda v: str(v))
@pytest.mark.parametrize("case", programs.CASES, ids=[c.name for c in programs.CASES])
def test_computed_operands_are_padded_in_place(case, k, dtype, padded):
    if padded is None and case.in_place == 0:
        pytest.skip("nothing computed in place to compare with")
    b, program = programs.build(case, k, dtype)
    with programs.padding_on():
        compiled = fireclay_cpp.compile_program(program)
    want = (case.in_place, case.copied) if padded is not None else (0, 0)
    assert programs.padded_operands(compiled.scheduled) == want
    inputs = programs.fresh_inputs(b, 1)
    programs.check(compiled(*inputs), b.eager(*inputs), dtype)
