"""A ``torch.library`` custom operator in an aten program is an extern call the C++ wrapper
makes, between generated kernels that read and write its results (the case: fireclay-loops'
tests/custom_op_programs.py)."""

import pytest

from fireclay_cpp import compile_program

custom_op_programs = pytest.importorskip("custom_op_programs", reason="needs fireclay-loops' tests in the checkout")

DEVICE = "cpu"
CASE = custom_op_programs.mm_rowsum_case("fireclay_cpp_test", DEVICE)


@pytest.mark.parametrize("seed, n, k, m", [(0, 7, 5, 3), (1, 33, 16, 9)])
def test_custom_op_between_kernels_matches_eager(seed, n, k, m):
    custom_op_programs.check_against_eager(compile_program, CASE, DEVICE, seed, n, k, m)
