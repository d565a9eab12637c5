"""Scatter-adds (fireclay-loops' ``ops.store_add``) in Triton: ``tl.atomic_add`` into a buffer the
wrapper clears before the launch (in Triton's interpreter on CPU tensors here; on a CUDA GPU the
same test runs on the GPU). The cases: fireclay-loops' tests/scatter_programs.py."""

import os

import pytest
import torch

from fireclay_triton import compile_program

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
pytestmark = pytest.mark.skipif(DEVICE == "cpu" and os.environ.get("TRITON_INTERPRET") != "1",
                                reason="runs kernels in Triton's interpreter (no CUDA GPU here)")
scatter_programs = pytest.importorskip("scatter_programs", reason="needs fireclay-loops' tests in the checkout")


@pytest.mark.parametrize("name", ["index_put_into_zeros", "index_put_into_x", "embedding_backward"])
def test_scatter_add_matches_eager_on_every_call(name):
    builder, program, values = scatter_programs.build(name, DEVICE)
    compiled = compile_program(program, values)
    assert "tl.atomic_add(" in compiled.kernel_source and ".zero_()" in compiled.wrapper_source
    for _ in range(2):  # the second call finds the buffer holding the first call's sums
        torch.testing.assert_close(compiled(*values)[0], builder.eager(*values)[0], atol=1e-5, rtol=1e-5)
