"""Scatter-adds (fireclay-loops' ``ops.store_add``) in C++: the kernel clears its buffer, then adds
serially (no OpenMP around it: several points may add at one element), and gives eager's sums
on every call. The cases: fireclay-loops' tests/scatter_programs.py."""

import pytest
import torch

scatter_programs = pytest.importorskip("scatter_programs", reason="needs fireclay-loops' tests in the checkout")

import fireclay_cpp  # noqa: E402
from fireclay_loops import lower, schedule  # noqa: E402


@pytest.mark.parametrize("name", list(scatter_programs.PROGRAMS))
def test_scatter_add_matches_eager_on_every_call(name):
    builder, program, values = scatter_programs.build(name)
    compiled = fireclay_cpp.compile_program(program, values)
    for _ in range(3):  # later calls find the buffer's memory holding the last call's sums
        values = [torch.randn_like(values[0]), values[1].reshape(-1)[torch.randperm(values[1].numel())].view(values[1].shape)]
        torch.testing.assert_close(compiled(*values)[0], builder.eager(*values)[0], atol=1e-5, rtol=1e-5)


def test_the_adding_kernel_is_cleared_and_serial():
    _, program, _ = scatter_programs.build("index_put_into_zeros")
    sources = fireclay_cpp.generate_kernels(schedule(lower(program)))
    adding = [k.source for k in sources if "+=" in k.source]
    assert len(adding) == 1
    lines = adding[0].splitlines()
    assert "#pragma omp" not in adding[0]
    assert lines[1].strip().startswith("for (int64_t fc_i = 0; fc_i < 52; fc_i++)")  # 13 x 4 zeros first
    # the other kernels keep their OpenMP (the multiplication reading the sums)
    assert all("+=" not in k.source for k in sources if k.source not in adding)
