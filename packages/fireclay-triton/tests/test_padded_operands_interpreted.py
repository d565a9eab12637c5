"""A zero-padded matmul operand that our kernels compute is written in place
(fireclay_loops.lowering.matmul.padded_in_place): the Triton kernels write the operand into its
producer's buffer and the pad's zeros beside it, and the library call reads the padded view.
Without a GPU, the programs of fireclay-loops' tests/padded_operand_programs.py run in
Triton's interpreter with the padding forced on for the CPU; on a CUDA GPU, a language model
head's backward in bf16 with the default settings, against eager."""

import os

import pytest
import torch

import fireclay_triton

programs = pytest.importorskip("padded_operand_programs", reason="needs fireclay-loops' tests in the checkout")

CUDA = torch.cuda.is_available()
CASES = programs.CASES


@pytest.mark.skipif(CUDA or os.environ.get("TRITON_INTERPRET") != "1", reason="CPU cases in Triton's interpreter")
@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_computed_operands_are_padded_in_place_interpreted(case):
    k, dtype, _ = programs.SHAPES[0]  # float32 only: the interpreter runs kernels slowly
    b, program = programs.build(case, k, dtype)
    with programs.padding_on():
        compiled = fireclay_triton.compile_program(program)
    assert programs.padded_operands(compiled.scheduled) == (case.in_place, case.copied)
    inputs = programs.fresh_inputs(b, 1)
    programs.check(compiled(*inputs), b.eager(*inputs), dtype)


@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU")
def test_logits_gradient_is_padded_in_place_on_cuda():
    """The lm_head's backward (bf16, 50257 words, 1024 tokens, 768 wide) with the default
    settings: the gradient's kernel writes rows of 50304, the hidden state's gradient reads them
    with K padded to 50264 (the pad's zeros from a small kernel), the weight's transposed."""
    gen = torch.Generator().manual_seed(0)
    b = programs.AtenBuilder("cuda")
    v, tokens, hidden = 50257, 1024, 768
    x, w, h = (b.input(torch.randn(s, generator=gen, dtype=torch.bfloat16))
               for s in ((tokens, v), (v, hidden), (tokens, hidden)))
    grad = b.call("mul.Tensor", b.call("sub.Tensor", x, 0.5), 2.0)
    program = b.output(b.call("mm.default", grad, w), b.call("mm.default", b.call("t.default", grad), h))
    compiled = fireclay_triton.compile_program(program)
    assert programs.padded_operands(compiled.scheduled, 50264) == (1, 1)
    inputs = [t.to(torch.bfloat16).cuda() for t in programs.fresh_inputs(b, 1)]
    x, w, h = inputs
    grad = (x - 0.5) * 2.0  # in bf16, rounded as the program rounds it
    exact = (grad.double() @ w.double(), grad.double().t() @ h.double())
    for g, want, ref in zip(compiled(*inputs), b.eager(*inputs), exact):
        assert g.stride() == want.stride()
        # eager's own bf16 GEMM over 50257 terms may reduce split-K partial sums in bf16
        # (torch's default allow_bf16_reduced_precision_reduction), and it picks another
        # algorithm for K=50257 than ours for K=50264: both are judged against float64, and
        # ours may be off by no more than eager is, or by a rounding of the output.
        ours, eagers = ((t.double() - ref).abs().max().item() for t in (g, want))
        assert ours <= max(1.5 * eagers, ref.abs().max().item() * 2.0**-7), (ours, eagers)
