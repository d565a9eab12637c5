"""``torch.library`` custom operators at the aten level: one node per call
(``aten::<ns>::<op>.<overload>``, output metadata from the fake kernel), the backward through the
op's autograd formula, the aten program saved and loaded in this process, and a mutating op
functionalized through a functional form that keeps its write. Built by hand as capture records such calls:
``torch::torch.ops.<ns>.<op>.<overload>``, a callable registered in this process."""

from __future__ import annotations

import pytest
import torch
from helpers import compare_with_eager
from torch import Tensor

from fireclay_autograd import aot_graphs, compile_program, trace_to_aten
from fireclay_autograd.convert import tensor_meta
from fireclay_ir import Graph, Program, dumps, interpret, loads, register_callable, verify

LIB = "fireclay_autograd_test"
ops = getattr(torch.ops, LIB)


@torch.library.custom_op(f"{LIB}::mul_shift", mutates_args=())
def mul_shift(x: Tensor, w: Tensor, shift: int) -> tuple[Tensor, Tensor]:
    return x * w, torch.roll(x, shift, 0)


@mul_shift.register_fake
def _(x, w, shift):
    return torch.empty_like(x), torch.empty_like(x)


def _mul_shift_backward(ctx, grad_product, grad_rolled):
    x, w = ctx.saved_tensors
    gx, gw = ops.mul_shift_backward(x, w, grad_product, grad_rolled, ctx.shift)
    return gx, gw, None


def _mul_shift_setup(ctx, inputs, output):
    ctx.save_for_backward(inputs[0], inputs[1])
    ctx.shift = inputs[2]


mul_shift.register_autograd(_mul_shift_backward, setup_context=_mul_shift_setup)


@torch.library.custom_op(f"{LIB}::mul_shift_backward", mutates_args=())
def mul_shift_backward(x: Tensor, w: Tensor, grad_product: Tensor, grad_rolled: Tensor,
                       shift: int) -> tuple[Tensor, Tensor]:
    return grad_product * w + torch.roll(grad_rolled, -shift, 0), (grad_product * x).sum_to_size(w.shape)


@mul_shift_backward.register_fake
def _(x, w, grad_product, grad_rolled, shift):
    return torch.empty_like(x), torch.empty_like(w)


@torch.library.custom_op(f"{LIB}::write_half", mutates_args=("out",))
def write_half(out: Tensor, x: Tensor) -> None:
    out.copy_(x / 2)


@write_half.register_fake
def _(out, x):
    return None


def _callable(op) -> str:
    name = f"torch.ops.{LIB}.{op._opname}.{op._overloadname}"
    register_callable(name, op, side_effects=op._schema.is_mutable)
    return f"torch::{name}"


def uses_mul_shift(x, w):
    a, b = ops.mul_shift(x.sin(), w, 1)
    return a + b.exp()


def _program(inputs: list[Tensor], mutate: bool = False) -> Program:
    """``uses_mul_shift`` (or, with ``mutate``, ``write_half(x, w); x * 3``) as capture records it."""
    g = Graph("main")
    x = g.add_input("x", tensor_meta(inputs[0]))
    w = g.add_input("w", tensor_meta(inputs[1]))
    if mutate:
        g.call(_callable(ops.write_half.default), [x, w], out=[])
        out = g.call("torch::operator.mul", [x, 3], out=tensor_meta(inputs[0]))
    else:
        s = g.call("torch::torch.sin", [x], out=tensor_meta(inputs[0]))
        pair = g.call(_callable(ops.mul_shift.default), [s, w, 1], out=[tensor_meta(inputs[0])] * 2)
        e = g.call("torch::torch.exp", [pair[1]], out=tensor_meta(inputs[0]))
        out = g.call("torch::operator.add", [pair[0], e], out=tensor_meta(inputs[0]))
    g.set_outputs([out])
    return Program.single(g)


CUSTOM = f"aten::{LIB}::mul_shift.default"
CUSTOM_BACKWARD = f"aten::{LIB}::mul_shift_backward.default"


@pytest.mark.parametrize("shape", [(5, 3), (2, 4, 3)])
def test_one_node_per_call_with_the_fake_kernels_metadata(shape):
    inputs = [torch.randn(*shape), torch.randn(shape[-1])]
    aten = trace_to_aten(_program(inputs), inputs)
    calls = [n for n in aten.main.nodes if n.op == CUSTOM]
    assert len(calls) == 1 and len(calls[0].outputs) == 2
    assert [tuple(o.meta.shape) for o in calls[0].outputs] == [shape, shape]
    verify(aten)  # the call binds to the op's schema
    # the aten program is a document like any other in this process: saved, loaded, run
    x = inputs[0]
    (out,) = interpret(loads(dumps(aten)), *inputs)
    torch.testing.assert_close(out, uses_mul_shift(x, inputs[1]))


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("grad", [False, True])
def test_compiled_matches_eager(seed, grad):
    torch.manual_seed(seed)
    inputs = [torch.randn(6, 4, requires_grad=grad), torch.randn(4, requires_grad=grad)]
    compiled = compile_program(_program(inputs), inputs)
    compare_with_eager(uses_mul_shift, compiled, inputs, grad=grad)


def test_the_backward_calls_the_ops_formula():
    inputs = [torch.randn(6, 4, requires_grad=True), torch.randn(4, requires_grad=True)]
    graphs = aot_graphs(_program(inputs), inputs)
    forward_ops = [n.op for n in graphs.partition.forward.main.nodes]
    backward_ops = [n.op for n in graphs.partition.backward.main.nodes]
    assert forward_ops.count(CUSTOM) == 1 and CUSTOM_BACKWARD not in forward_ops
    assert backward_ops.count(CUSTOM_BACKWARD) == 1 and CUSTOM not in backward_ops


def writes_half(x, w):
    ops.write_half(x, w)
    return x * 3


@pytest.mark.parametrize("seed", [0, 1])
def test_a_mutating_custom_op_becomes_its_functional_form(seed):
    torch.manual_seed(seed)
    inputs = [torch.randn(5), torch.randn(5)]
    aten = trace_to_aten(_program(inputs, mutate=True), inputs)
    ops_used = [n.op for n in aten.main.nodes]
    assert f"aten::fireclay_functional::{LIB}__write_half__default.default" in ops_used
    assert not any("write_half.default" in op for op in ops_used if "fireclay_functional" not in op)
    compiled = compile_program(_program(inputs, mutate=True), inputs)
    ours, theirs = [t.clone() for t in inputs], [t.clone() for t in inputs]
    torch.testing.assert_close(compiled(*ours)[0], writes_half(*theirs))
    torch.testing.assert_close(ours[0], theirs[0])  # the write into x reached the caller's tensor
