"""A ``torch.library`` custom operator in an aten program is an extern call the Triton wrapper
makes, between generated kernels that read and write its results (in Triton's interpreter on CPU
tensors here; on a CUDA GPU the same test runs on the GPU). The case: fireclay-loops'
tests/custom_op_programs.py."""

import os

import pytest
import torch

from fireclay_triton import compile_program

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
pytestmark = pytest.mark.skipif(DEVICE == "cpu" and os.environ.get("TRITON_INTERPRET") != "1",
                                reason="runs kernels in Triton's interpreter (no CUDA GPU here)")
custom_op_programs = pytest.importorskip("custom_op_programs", reason="needs fireclay-loops' tests in the checkout")
CASE = custom_op_programs.mm_rowsum_case("fireclay_triton_test", DEVICE)


@pytest.mark.parametrize("seed, n, k, m", [(0, 7, 5, 3), (1, 33, 16, 9)])
def test_custom_op_between_kernels_matches_eager(seed, n, k, m):
    custom_op_programs.check_against_eager(compile_program, CASE, DEVICE, seed, n, k, m)
