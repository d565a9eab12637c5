"""Library calls over operands in several layouts (fireclay-loops' tests/extern_layout_programs.py)
through the Triton wrapper, against eager, values and output strides, with every library result
taken as the library returned it (no copy into another layout): a few CPU cases in Triton's
interpreter; on a CUDA GPU, a language model's attention block with each fused attention kernel
(cuDNN, flash, memory-efficient), forward and backward."""

import os

import pytest
import torch

import fireclay_triton
import fireclay_triton.runtime

CUDA = torch.cuda.is_available()
programs = pytest.importorskip("extern_layout_programs", reason="needs fireclay-loops' tests in the checkout")


@pytest.fixture
def copies(monkeypatch):
    """The library results the compiled wrapper had to copy into another layout."""
    return programs.counted_copies(monkeypatch, fireclay_triton.runtime)


NAMES = ["mm-x10-w01-computed", "attention-bshd-computed"]
CASES = [c for c in programs.CASES if c.name in NAMES]


@pytest.mark.skipif(CUDA or os.environ.get("TRITON_INTERPRET") != "1", reason="CPU cases in Triton's interpreter")
@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_library_calls_over_layouts_interpreted(case, copies):
    assert len(CASES) == len(NAMES)
    programs.check_against_eager(case, lambda b, program, inputs: fireclay_triton.compile_program(program)(*inputs))
    assert copies == []


@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU")
@pytest.mark.parametrize("training", [False, True], ids=["inference", "training"])
@pytest.mark.parametrize("rotary", [False, True], ids=["plain", "rotary"])
@pytest.mark.parametrize("kind", ["cudnn", "flash", "efficient"])
def test_attention_block_on_cuda_copies_no_attention_result(kind, rotary, training, copies):
    dtype = torch.float32 if kind == "efficient" else torch.bfloat16
    b, program = programs.attention_block(kind, rotary, training, torch.Generator().manual_seed(0), dtype)
    inputs = programs.attention_inputs(torch.Generator().manual_seed(1), dtype, "cuda")
    got, want = fireclay_triton.compile_program(program)(*inputs), b.eager(*inputs)
    tol = 1e-4 if dtype == torch.float32 else 2e-2
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, atol=tol, rtol=tol)
    assert copies == []
