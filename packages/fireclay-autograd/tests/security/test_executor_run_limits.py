"""The executor on programs from someone else (``fireclay autograd`` traces a document; the
default backend then runs its aten graph): with ``limits`` (fireclay-ir's ``RunLimits``) a trace
or a run is bounded in steps, and a run on real tensors in bytes, as the reference interpreter
is; a size expression whose folded power no size needs is refused instead of evaluated."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

torch = pytest.importorskip("torch")

import fireclay_ir as ir  # noqa: E402
from fireclay_autograd import aot_graphs, trace_to_aten  # noqa: E402
from fireclay_autograd.executor import run_program  # noqa: E402


def f32(*shape) -> ir.TensorMeta:
    return ir.TensorMeta("float32", tuple(shape))


def _document(program: ir.Program) -> ir.Program:
    return ir.loads(ir.dumps(program))


def _chain(length: int) -> ir.Program:
    """``x + 1 + 1 ...``: ``length`` nodes."""
    g = ir.Graph("main")
    y = g.add_input("x", f32(3))
    for _ in range(length):
        y = g.call("torch::operator.add", [y, 1.0], out=f32(3))
    g.set_outputs([y])
    return _document(ir.Program.single(g))


@pytest.mark.parametrize("trace", [trace_to_aten, aot_graphs], ids=["inference", "training"])
def test_tracing_stops_at_the_step_limit(trace):
    x = torch.randn(3, requires_grad=trace is aot_graphs)
    with pytest.raises(ir.RunLimitError, match="more than 20 steps"):
        trace(_chain(50), [x], limits=ir.RunLimits(max_steps=20))


def test_limited_traces_and_runs_match_unlimited_ones():
    program, x = _chain(5), torch.randn(3)
    limited = trace_to_aten(program, [x], limits=ir.RunLimits())
    assert ir.dumps(limited) == ir.dumps(trace_to_aten(program, [x]))
    torch.testing.assert_close(run_program(limited, x, limits=ir.RunLimits())[0], x + 5)


def test_a_run_stops_at_the_step_limit():
    aten = trace_to_aten(_chain(50), [torch.randn(3)])
    with pytest.raises(ir.RunLimitError, match="more than 20 steps"):
        run_program(aten, torch.randn(3), limits=ir.RunLimits(max_steps=20))


def test_an_allocation_the_program_hides_is_refused_before_it_is_made():
    g = ir.Graph("main")
    x = g.add_input("x", f32(2))
    g.set_outputs([g.call("torch::torch.ones", [[2**40]], out=f32(2)), x])  # declares 2 floats, asks for 4 TiB
    with pytest.raises(ir.RunLimitError, match="would allocate 4398046511104 bytes"):
        run_program(_document(ir.Program.single(g)), torch.ones(2), limits=ir.RunLimits(max_bytes=2**30))


def test_inputs_beyond_the_byte_limit_are_refused():
    with pytest.raises(ir.RunLimitError, match="the input data needs 4096 bytes"):
        run_program(_chain(1), torch.ones(1024), limits=ir.RunLimits(max_bytes=1000))


def test_a_folded_power_no_size_needs_is_refused_not_evaluated():
    """Each ``**`` within fireclay-shapes' limit, but sympy folds them into s0**1000000000: the
    trace evaluated it for the input's size and never ended."""
    code = textwrap.dedent("""
        import torch
        import fireclay_ir as ir
        from fireclay_autograd import trace_to_aten
        g = ir.Graph("main")
        x = g.add_input("x", ir.TensorMeta("float32", ("s0",)))
        y = g.call("torch::operator.add", [x, ir.SymExpr("((s0**1000)**1000)**1000")], out=ir.TensorMeta("float32", ("s0",)))
        g.set_outputs([y])
        program = ir.Program.single(g)
        program.add_symbol("s0", hint=5)
        try:
            trace_to_aten(ir.loads(ir.dumps(program)), [torch.ones(5)], limits=ir.RunLimits())
        except Exception as e:
            print("refused:", type(e).__name__, e)
    """)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert "refused:" in result.stdout and "exponent larger than the limit" in result.stdout, result.stderr[-2000:]
