"""Kernels whose adjacent loops fireclay-loops merged (fireclay_loops.merge_loops), compiled to
C++ and checked against eager: the table of fireclay-loops' tests/merge_programs.py."""

from __future__ import annotations

import pytest
from merge_programs import (
    PARAMS,
    SYMBOLIC_PARAMS,
    assert_results_match,
    assert_symbolic_matches,
    build,
    build_symbolic,
    schedule_with,
    space,
)

import fireclay_cpp


@pytest.mark.parametrize("case", PARAMS)
def test_merged_kernels_match_eager(case):
    b, program, tensors = build(case, seed=1)
    scheduled = schedule_with(program, True)
    assert [space(k) for k in scheduled.kernels] == case.spaces
    got = fireclay_cpp.compile_program(scheduled)(*tensors)
    # random numbers are drawn per flat element: the unmerged kernels must draw the same ones
    want = fireclay_cpp.compile_program(schedule_with(program, False))(*tensors) if case.random else b.eager(*tensors)
    assert_results_match(case, got, want)


@pytest.mark.parametrize("case", SYMBOLIC_PARAMS)
def test_merged_symbolic_kernels_match_eager(case):
    scheduled = schedule_with(build_symbolic(case), True)
    assert [space(k) for k in scheduled.kernels] == case.spaces
    assert_symbolic_matches(fireclay_cpp.compile_program(scheduled), case, seed=1)


def test_a_merged_pointwise_kernel_is_one_loop():
    case = next(p.values[0] for p in PARAMS if p.id == "pointwise_3d_gelu")
    _, program, _ = build(case)

    def kernel_text(merge: bool) -> str:
        src = fireclay_cpp.compile_program(schedule_with(program, merge)).cpp_sources[0]
        start = src.index("void kernel0(")
        return src[start:src.index('extern "C"', start)]

    merged, kept = kernel_text(True), kernel_text(False)
    assert merged.count("for (") == 1 and "x0 < 240" in merged and "in_x0[x0]" in merged
    assert kept.count("for (") == 3
