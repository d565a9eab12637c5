"""Scatter-adds (``index_put`` with ``accumulate``, ``index_add``, ``scatter_add``, the embedding's
backward) lower to one loop node adding at indices read from a tensor (``ops.store_add``), in a
kernel of its own; the op table (test_op_table.py) checks their values against eager."""

import pytest

torch = pytest.importorskip("torch")

from aten_builder import AtenBuilder  # noqa: E402
from scatter_programs import PROGRAMS, build  # noqa: E402

from fireclay_ir import dumps, loads  # noqa: E402
from fireclay_loops import lower, schedule  # noqa: E402
from fireclay_loops.dialect import from_program, to_program  # noqa: E402
from fireclay_loops.ir import ComputeNode, ExternNode  # noqa: E402
from fireclay_loops.printer import format_schedule  # noqa: E402
from fireclay_loops.reference import run  # noqa: E402


@pytest.mark.parametrize("name", list(PROGRAMS))
def test_lowered_as_a_loop_that_adds_in_a_kernel_of_its_own(name):
    b, program, values = build(name)
    lowered = lower(program)
    assert not [n for n in lowered.nodes if isinstance(n, ExternNode)]
    adding = [n for n in lowered.nodes if isinstance(n, ComputeNode) and n.body.accumulates]
    assert len(adding) == 1
    scheduled = schedule(lowered)
    kernels = [k for k in scheduled.kernels if k.accumulated_buffers()]
    assert len(kernels) == 1 and len(kernels[0].nodes) == 1
    assert any("scatter-add runs in a kernel of its own" in d.reason for d in scheduled.decisions) or \
        len(scheduled.kernels) == 2
    assert "store_add(" in format_schedule(scheduled)
    want = b.eager(*values)
    torch.testing.assert_close(run(scheduled, *values)[0], want[0], atol=1e-5, rtol=1e-5)
    # the dialect's document round trip keeps the op
    again = from_program(loads(dumps(to_program(scheduled))))
    torch.testing.assert_close(run(again, *values)[0], want[0], atol=1e-5, rtol=1e-5)


def test_a_reused_allocation_is_cleared_before_adding():
    """The buffer added into may take the memory of a buffer that died before it: the adds
    start from zero all the same (two scatter-adds in a row, the second into freed memory)."""
    b = AtenBuilder()
    g = b.input(torch.randn(6, 3), "g")
    i = b.input(torch.randint(0, 4, (6,)), "i")
    first = b.call("index_put.default", b.call("full.default", [4, 3], 0.0), [i], b.call("exp.default", g), True)
    second = b.call("index_put.default", b.call("full.default", [4, 3], 0.0), [i], b.call("sin.default", g), True)
    total = b.call("add.Tensor", b.call("sum.default", first), b.call("sum.default", second))
    program = b.output(total)
    scheduled = schedule(lower(program))
    values = [torch.randn(6, 3), torch.randint(0, 4, (6,))]
    for _ in range(2):  # the second call finds the memory dirty
        torch.testing.assert_close(run(scheduled, *values)[0], b.eager(*values)[0], atol=1e-5, rtol=1e-5)


def test_index_put_without_accumulate_stays_a_library_call():
    b = AtenBuilder()
    x = b.input(torch.randn(5, 3), "x")
    i = b.input(torch.randint(0, 5, (4,)), "i")
    program = b.output(b.call("index_put.default", x, [i], b.call("slice.Tensor", x, 0, 0, 4)))
    assert [n.op for n in lower(program).nodes if isinstance(n, ExternNode)] == ["aten::index_put.default"]
