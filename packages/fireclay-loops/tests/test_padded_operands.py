"""A zero-padded matmul operand that our kernels compute is written in place
(fireclay_loops.lowering.matmul.padded_in_place): the library call reads a view of the
producer's own buffer, a small kernel writes the pad's zeros, and no kernel copies the operand;
graph inputs, library results and returned values are still copied. Every program of
padded_operand_programs.py runs in the reference executor against eager on fresh inputs, with
the padding forced on for the CPU."""

import pytest

torch = pytest.importorskip("torch")

import padded_operand_programs as programs  # noqa: E402

from fireclay_loops import lower, schedule  # noqa: E402
from fireclay_loops.reference import run  # noqa: E402


@pytest.mark.parametrize("k,dtype,padded", programs.SHAPES, ids=lambda v: str(v))
@pytest.mark.parametrize("case", programs.CASES, ids=[c.name for c in programs.CASES])
def test_computed_operands_are_padded_in_place(case, k, dtype, padded):
    b, program = programs.build(case, k, dtype)
    with programs.padding_on():
        scheduled = schedule(lower(program))
    want = (case.in_place, case.copied) if padded is not None else (0, 0)
    assert programs.padded_operands(scheduled) == want, str(scheduled)
    inputs = programs.fresh_inputs(b, 1)
    programs.check(run(scheduled, *inputs), b.eager(*inputs), dtype)


def test_the_logits_gradient_is_written_once_on_cuda():
    """The lm_head's backward in small (bf16, a vocabulary of 50257 over 256 tokens), planned for
    CUDA with the default settings: the cross-entropy backward's kernel writes the gradient into
    rows of 50304, both matmuls read that buffer (K padded to 50264 for the hidden state's
    gradient; transposed for the weight's, whose 50257 rows are padded to 50264 by the same
    columns: cuBLAS runs a slower kernel for the unaligned extent), and besides it only the pad's
    256 x 7 zeros are written; no kernel iterates over the padded extent. (Planned, not run: the table above runs
    the same structure against eager.)"""
    gen = torch.Generator().manual_seed(0)
    b = programs.AtenBuilder("cuda")
    v, tokens, hidden = 50257, 256, 256
    logits, dy = (b.input(torch.randn(tokens, v, generator=gen, dtype=torch.bfloat16)) for _ in range(2))
    w, h = (b.input(torch.randn(s, generator=gen, dtype=torch.bfloat16)) for s in ((v, hidden), (tokens, hidden)))
    logp = b.call("_log_softmax.default", b.call("_to_copy.default", logits, dtype=torch.float32), 1, False)
    total = b.call("sum.dim_IntList", b.call("_to_copy.default", dy, dtype=torch.float32), [1], True)
    grad = b.call("sub.Tensor", b.call("_to_copy.default", dy, dtype=torch.float32),
                  b.call("mul.Tensor", b.call("exp.default", logp), total))
    grad = b.call("_to_copy.default", grad, dtype=torch.bfloat16)
    program = b.output(b.call("mm.default", grad, w), b.call("mm.default", b.call("t.default", grad), h))
    scheduled = schedule(lower(program))
    mm_input, mm_weight = scheduled.extern_calls
    a = mm_input.tensor_args()[0]
    assert [int(n) for n in a.size] == [tokens, 50264] and [int(s) for s in a.stride] == [50304, 1]
    assert mm_weight.tensor_args()[0].buffer == a.buffer
    assert [int(s) for s in mm_weight.tensor_args()[0].stride] == [1, 50304]
    assert [int(n) for n in mm_weight.tensor_args()[0].size] == [50264, tokens]
    stored = [programs._points(kn.node) for step in scheduled.steps for kn in getattr(step, "nodes", ())
              if any(buf == a.buffer for buf, _, _ in kn.node.body.writes())]
    assert sorted(stored) == [tokens * 7, tokens * v], stored
    assert programs.padded_operands(scheduled, 50264) == (2, 1)  # the weight (a graph input) is copied


def test_readers_wait_for_every_writer_of_a_buffer():
    """The pad's zeros and the operand come from two nodes: the matmul runs after both, even
    where the program lists the zeros after the matmul (ready steps run in program order)."""
    b, program = programs.build(programs.CASES[0], 1031, torch.float32)
    with programs.padding_on():
        lowered = lower(program)
        (fill,) = [n for n in lowered.nodes if getattr(n, "body", None) is not None and programs._is_zero_fill(n)]
        lowered.nodes.remove(fill)
        lowered.nodes.insert(len(lowered.nodes) - 1, fill)  # after the matmuls, before the output
        scheduled = schedule(lowered)
    (call,) = [k for k, step in enumerate(scheduled.steps) if getattr(step, "op", "") == "aten::mm.default"]
    operand = scheduled.steps[call].tensor_args()[0].buffer
    writers = [k for k, step in enumerate(scheduled.steps) if operand in step.write_buffers()]
    assert len(writers) == 2 and max(writers) < call, [str(s) for s in scheduled.steps]
    inputs = programs.fresh_inputs(b, 1)
    programs.check(run(scheduled, *inputs), b.eager(*inputs), torch.float32)
