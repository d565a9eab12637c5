"""Extern results are planned in the layout the library returns for the operands' real layouts
(fireclay_loops.lowering.library_layouts), so the generated wrappers take them as they are: no
copy into a traced layout. Checked three ways: the table of library calls over operand layouts
(extern_layout_programs) against eager, values and output strides; every planned result against
what the CPU library really returns; and an attention block planned for CUDA on this machine
(its values typed on device cuda), whose fused attention results, forward and backward, are
planned as torch's meta kernels for the CUDA kernels say, with no kernel between the attention
and the output projection."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from aten_builder import AtenBuilder  # noqa: E402
from extern_layout_programs import ATTENTION_SIZES, CASES, attention_block, check_against_eager, same_strides  # noqa: E402

from fireclay_ir import TensorMeta  # noqa: E402
from fireclay_loops import lower, schedule  # noqa: E402
from fireclay_loops.ir import ExternNode, TensorArg  # noqa: E402
from fireclay_loops.lowering.library_layouts import dense_order, strides_in_order  # noqa: E402
from fireclay_loops.reference import run  # noqa: E402


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_library_calls_over_layouts_match_eager(case):
    check_against_eager(case, lambda b, program, inputs: run(schedule(lower(program)), *inputs))


def _library_args(step: ExternNode, scheduled, device: str, gen: torch.Generator | None):
    """``step``'s arguments as tensors of the planned layouts (random values, or meta)."""
    buffers = scheduled.program.buffers

    def arg(a):
        if isinstance(a, TensorArg):
            size, stride, offset = [int(s) for s in a.size], [int(s) for s in a.stride], int(a.offset)
            need = offset + 1 + sum((n - 1) * s for n, s in zip(size, stride))
            dtype = getattr(torch, buffers[a.buffer].dtype)
            base = (torch.randn(need, generator=gen, dtype=dtype) if device == "cpu"
                    else torch.empty(need, dtype=dtype, device=device))
            return base.as_strided(size, stride, offset)
        if isinstance(a, (list, tuple)):
            return type(a)(arg(x) for x in a)
        if hasattr(a, "is_Integer"):
            return int(a)
        return a

    return arg(step.args), {k: arg(v) for k, v in step.kwargs.items()}


def _copies(scheduled, device: str) -> list[str]:
    """The extern results whose planned layout differs from the one the library returns for the
    planned operands (each would be copied by the wrapper on every call); graph outputs, which
    keep eager's layout, are not counted."""
    gen = torch.Generator().manual_seed(0)
    returned = scheduled.program.output_buffers()
    found = []
    for step in scheduled.extern_calls:
        op = step.op.removeprefix("aten::")
        packet, _, overload = op.partition(".")
        args, kwargs = _library_args(step, scheduled, device, gen)
        result = getattr(getattr(torch.ops.aten, packet), overload)(*args, **kwargs)
        results = list(result) if isinstance(result, (tuple, list)) else [result]
        for b, k in zip(step.outputs, step.result_positions()):
            buf = scheduled.program.buffers[b]
            shape = [int(n) for n in buf.size]
            if b not in returned and not same_strides(shape, results[k].stride(), [int(s) for s in buf.stride]):
                found.append(f"{step.op} result {k}: planned {buf.stride}, library {results[k].stride()}")
    return found


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_planned_results_are_what_the_cpu_library_returns(case):
    _, program = case.program(torch.Generator().manual_seed(1))
    scheduled = schedule(lower(program))
    assert _copies(scheduled, "cpu") == [], str(scheduled)


# -- an attention block planned for CUDA ------------------------------------------------------

@pytest.mark.parametrize("training", [False, True], ids=["inference", "training"])
@pytest.mark.parametrize("rotary", [False, True], ids=["plain", "rotary"])
@pytest.mark.parametrize("kind", ["cudnn", "flash", "efficient"])
def test_attention_block_on_cuda_plans_no_copy_of_attention_results(kind, rotary, training):
    _, program = attention_block(kind, rotary, training, torch.Generator().manual_seed(2))
    scheduled = schedule(lower(program))
    assert all(scheduled.program.buffers[b].device == "cuda" for b in scheduled.program.buffers)
    # what the CUDA kernels return, as torch's meta kernels describe them (a CPU build has them)
    assert _copies(scheduled, "meta") == [], str(scheduled)
    attention = [s for s in scheduled.extern_calls if "attention" in s.op]
    results = {b for s in attention for b in s.outputs}
    # the output projection (and the weight gradients) read the attention results as views:
    # no kernel copies them into another order (a rotary embedding's backward reads two)
    read = results if not rotary else {attention[0].outputs[0]}
    assert not any(read & set(k.read_buffers()) for k in scheduled.kernels), str(scheduled)
    projections = [s for s in scheduled.extern_calls if s.op == "aten::mm.default"
                   and any(a.buffer in results for a in s.tensor_args())]
    assert len(projections) == (1 if not training else 1 + (3 if not rotary else 1)), str(scheduled)
    # flash and cuDNN write their output in the query's order: the query lies in eager's
    # (batch, seq, heads, dim) order, a rotary embedding's result included
    for s in attention:
        for a in s.tensor_args()[:3]:
            shape = [int(n) for n in a.size]
            assert dense_order(shape, [int(x) for x in a.stride]) == [0, 2, 1, 3], str(scheduled)


def test_graph_outputs_keep_eager_strides_when_the_library_differs():
    """A fused attention result returned by the program keeps the metadata's (eager's)
    strides even where the planned query's layout makes the library return another."""
    b = AtenBuilder(device="cuda")
    B, S, H, D = ATTENTION_SIZES
    q1, q2, k, v = (b.input(torch.randn(B, H, S, n), f"x{n}") for n in (D // 2, D // 2, D, D))
    q = b.call("cat.default", [q1, q2], -1)  # realized for the call in (batch, seq, heads, dim) order
    out = b.call("_scaled_dot_product_cudnn_attention.default", q, k, v, None, False, 0.0, True)[0]
    program = b.output(out)
    scheduled = schedule(lower(program))
    (call,) = scheduled.extern_calls
    query = call.tensor_args()[0]
    assert dense_order([int(n) for n in query.size], [int(x) for x in query.stride]) == [0, 2, 1, 3]
    (name,) = scheduled.program.outputs
    meta: TensorMeta = program.main.outputs[0].meta
    assert [int(s) for s in scheduled.program.buffers[name].stride] == list(meta.strides)


@pytest.mark.parametrize("size,stride,order", [
    ((2, 3, 4), (12, 4, 1), [0, 1, 2]), ((2, 3, 4), (12, 1, 3), [0, 2, 1]), ((2, 1, 4), (4, 99, 1), [1, 0, 2]),
    ((2, 3, 4), (24, 4, 1), None), ((2, 3, 4), (4, 4, 1), None), ((2, 0, 4), (4, 4, 1), None)])
def test_dense_order(size, stride, order):
    assert dense_order(size, stride) == order
    if order is not None:
        assert same_strides(size, [int(s) for s in strides_in_order(size, order)], stride)
