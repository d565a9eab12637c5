"""The reference runner on loops documents from someone else (``fireclay run`` of a loops file):
with ``limits`` (fireclay-ir's ``RunLimits``) a run is bounded in steps and bytes as the reference
interpreter's is, and an extern step cannot call an op that reads files. Before, a document could
allocate whatever its sizes said, spend unbounded time on a size expression, and call
``aten::from_file``."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from aten_builder import AtenBuilder  # noqa: E402

import fireclay_ir as ir  # noqa: E402
from fireclay_loops import from_program, lower, schedule, to_program  # noqa: E402
from fireclay_loops.reference import run  # noqa: E402

SMALL = ir.RunLimits(max_steps=10_000, max_bytes=2**20)


def _program(with_mm: bool = False) -> ir.Program:
    """relu then a row sum (one kernel), and a matmul (an extern step) when asked."""
    b = AtenBuilder()
    x = b.input(torch.empty(4, 8), "x")
    y = b.call("sum.dim_IntList", b.call("relu.default", x), [1])
    if with_mm:
        y = b.call("mm.default", b.call("view.default", y, [2, 2]), b.call("view.default", y, [2, 2]))
    return to_program(schedule(lower(b.output(y))))


def _document(program: ir.Program) -> ir.Program:
    """``program`` as a reader gets it from a file."""
    return ir.loads(ir.dumps(program))


def _kernel_node(program: ir.Program) -> ir.Node:
    return next(n for n in program.main.nodes if n.op == "loops::kernel")


def test_an_honest_document_runs_the_same_with_limits():
    x = torch.randn(4, 8)
    scheduled = from_program(_document(_program(with_mm=True)))
    limited = run(scheduled, x, limits=ir.RunLimits())
    torch.testing.assert_close(limited[0], run(scheduled, x)[0], rtol=0, atol=0)
    y = x.relu().sum(1).view(2, 2)
    torch.testing.assert_close(limited[0], y @ y)


def test_steps_are_counted():
    scheduled = from_program(_document(_program(with_mm=True)))
    with pytest.raises(ir.RunLimitError, match="more than 3 steps"):
        run(scheduled, torch.randn(4, 8), limits=ir.RunLimits(max_steps=3))


def test_a_huge_allocation_is_refused_before_it_is_made():
    program = _program()
    program.add_symbol("s0", hint=2**40)  # a row count no memory holds: 4 TiB of results
    kernel = _kernel_node(program)
    kernel.kwargs["xsizes"] = ["s0"]
    out = next(n for n in program.main.nodes if n.op == "loops::buffer" and n.kwargs.get("allocation"))
    out.outputs[0].type = ir.TensorMeta("float32", ("s0",))
    with pytest.raises(ir.RunLimitError, match=r"allocation mem\d+ needs 4398046511104 bytes"):
        run(from_program(_document(program)), torch.randn(4, 8), limits=SMALL)


def test_a_huge_kernel_grid_is_refused_before_it_is_made():
    program = _program()
    _kernel_node(program).kwargs["xsizes"] = [2**36]  # index tensors of 512 GiB
    with pytest.raises(ir.RunLimitError, match="would allocate"):
        run(from_program(_document(program)), torch.randn(4, 8), limits=SMALL)


def test_a_size_beyond_64_bits_is_refused():
    program = _program()
    program.add_symbol("s0", hint=10)
    _kernel_node(program).kwargs["xsizes"] = ["s0**1000"]
    with pytest.raises(ir.RunLimitError, match="too large"):
        run(from_program(_document(program)), torch.randn(4, 8), limits=SMALL)


def test_index_arithmetic_counts_as_steps():
    """A power in an index expression is that many multiplications of the whole grid."""
    program = _program()
    body = program.graphs["op0"]
    load = next(n for n in body.nodes if n.op == "loops::load")
    load.args = (load.args[0], ir.SymExpr("Mod(i0**1024, 4)*8 + i1"))
    with pytest.raises(ir.RunLimitError, match="steps .* stopped at index expression"):
        run(from_program(_document(program)), torch.randn(4, 8), limits=ir.RunLimits(max_steps=1000))


def test_an_extern_step_cannot_read_a_file():
    program = _program(with_mm=True)
    extern = next(n for n in program.main.nodes if n.op == "loops::extern")
    extern.kwargs["op"] = "aten::from_file.default"
    extern.kwargs["args"] = ["/etc/passwd", False, 16]
    with pytest.raises(ir.IRError, match="aten::from_file.default is refused in a program: it reads or writes files"):
        from_program(_document(program))


def test_an_extern_step_calls_aten_ops_only():
    program = _program(with_mm=True)
    next(n for n in program.main.nodes if n.op == "loops::extern").kwargs["op"] = "profiler::_record_function_enter"
    with pytest.raises(ir.IRError, match="not an aten op"):
        from_program(_document(program))
