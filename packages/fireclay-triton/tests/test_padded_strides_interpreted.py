"""Intermediate buffers with long rows get padded row strides (fireclay_loops.layout.padded_strides;
on for CUDA by default): Triton kernels and the wrapper's library calls read and write them through
their strides. Without a GPU, the programs of fireclay-loops' tests/padded_programs.py run in
Triton's interpreter with the padding forced on for the CPU; on a CUDA GPU, a language model head's
backward in bf16 with the default settings gets its logits gradient padded, against eager."""

import os

import pytest
import torch

import fireclay_triton

programs = pytest.importorskip("padded_programs", reason="needs fireclay-loops' tests in the checkout")

CUDA = torch.cuda.is_available()
# the interpreter runs kernels slowly: rows of 7 (padded to 32) for every case, 1025 (to 1056) for a few
LONG = {"mm_a_transposed", "softmax_rows", "max_two_results", "saved_output"}
CASES = [(c, 7) for c in programs.CASES] + [(c, 1025) for c in programs.CASES if c.name in LONG]


@pytest.mark.skipif(CUDA or os.environ.get("TRITON_INTERPRET") != "1", reason="CPU cases in Triton's interpreter")
@pytest.mark.parametrize("case,n", CASES, ids=[f"{c.name}-{n}" for c, n in CASES])
def test_padded_programs_match_eager_interpreted(case, n):
    b, program = programs.build(case, n)
    with programs.padding_on():
        compiled = fireclay_triton.compile_program(program)
    if case.padded:
        assert programs.padded_buffers(compiled.scheduled), str(compiled.scheduled)
    inputs = programs.fresh_inputs(b, 1)
    programs.check(case, n, compiled(*inputs), b.eager(*inputs))


@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU")
def test_logits_gradient_is_padded_on_cuda():
    """The lm_head's backward: a [tokens, 50257] bf16 gradient our kernel writes, read by the
    two matmuls (as A, and transposed as A): stored with rows of 50304 elements by default."""
    gen = torch.Generator().manual_seed(0)
    b = programs.AtenBuilder("cuda")
    x, w, h = (b.input(torch.randn(s, generator=gen, dtype=torch.bfloat16))
               for s in ((512, 50257), (50257, 64), (512, 64)))
    grad = b.call("mul.Tensor", b.call("sub.Tensor", x, 0.5), 2.0)
    program = b.output(b.call("mm.default", grad, w), b.call("mm.default", b.call("t.default", grad), h))
    compiled = fireclay_triton.compile_program(program)
    a = compiled.scheduled.extern_calls[0].tensor_args()[0]
    assert [int(s) for s in compiled.scheduled.program.buffers[a.buffer].stride] == [50304, 1]
    inputs = [t.to(torch.bfloat16).cuda() for t in programs.fresh_inputs(b, 1)]
    for g, want in zip(compiled(*inputs), b.eager(*inputs)):
        assert g.stride() == want.stride()
        torch.testing.assert_close(g.float(), want.float(), atol=1.0, rtol=3e-2)
