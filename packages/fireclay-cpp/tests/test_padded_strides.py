"""Intermediate buffers with long rows get padded row strides (fireclay_loops.layout.padded_strides;
on for CUDA by default, forced on for the CPU here): the C++ kernels and the library calls of the
generated program read and write them through their strides, against eager, on the programs of
fireclay-loops' tests/padded_programs.py; results the caller receives keep eager's strides, saved
outputs come back padded, and the generated wrapper allocates the padded layout."""

import pytest

import fireclay_cpp

programs = pytest.importorskip("padded_programs", reason="needs fireclay-loops' tests in the checkout")

# rows of 7 (padded to 32 with a threshold of 1) and a vocabulary's 50257 (padded to 50272)
WIDTHS = [(7, 1), (50257, 1024)]


@pytest.mark.parametrize("n,min_stride", WIDTHS, ids=[str(n) for n, _ in WIDTHS])
@pytest.mark.parametrize("case", programs.CASES, ids=[c.name for c in programs.CASES])
def test_padded_programs_match_eager(case, n, min_stride):
    b, program = programs.build(case, n)
    with programs.padding_on(min_stride):
        compiled = fireclay_cpp.compile_program(program)
    if case.padded:
        assert programs.padded_buffers(compiled.scheduled), str(compiled.scheduled)
    inputs = programs.fresh_inputs(b, 1)
    programs.check(case, n, compiled(*inputs), b.eager(*inputs))


def test_generated_program_allocates_the_padded_rows():
    b, program = programs.build(programs.CASES[0], 50257)
    with programs.padding_on(1024):
        compiled = fireclay_cpp.compile_program(program)
    (mm,) = compiled.scheduled.extern_calls
    a = mm.tensor_args()[0]
    assert [int(s) for s in a.stride] == [50272, 1]
    assert compiled.scheduled.program.buffers[a.buffer] in programs.padded_buffers(compiled.scheduled)
    assert "50272" in compiled.wrapper_source
    inputs = programs.fresh_inputs(b, 2)
    programs.check(programs.CASES[0], 50257, compiled(*inputs), b.eager(*inputs))
