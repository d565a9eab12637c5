"""A ``torch.library`` custom operator in an aten program is an extern call the C++ wrapper
makes, between generated kernels that read and write its results."""

import pytest
import torch
from torch import Tensor

from fireclay_cpp import compile_program
from fireclay_ir import Graph, Program, TensorMeta
from fireclay_ir.dialects import custom_op_name, register_custom_op

LIB = "fireclay_cpp_test"
DEVICE = "cpu"


@torch.library.custom_op(f"{LIB}::mm_rowsum", mutates_args=())
def mm_rowsum(x: Tensor, w: Tensor) -> tuple[Tensor, Tensor]:
    return x @ w, x.sum(-1)


@mm_rowsum.register_fake
def _(x, w):
    return x.new_empty(x.shape[0], w.shape[1]), x.new_empty(x.shape[0])


OP = custom_op_name(LIB, "mm_rowsum", "default")
register_custom_op(OP, str(mm_rowsum._opoverload._schema), lambda: mm_rowsum._opoverload)


def meta(*shape: int) -> TensorMeta:
    return TensorMeta("float32", shape, device=DEVICE)


def program(n: int, k: int, m: int) -> Program:
    """``tanh(mm_rowsum(relu(x), w)[0]), rowsum * rowsum``."""
    g = Graph("main")
    x, w = g.add_input("x", meta(n, k)), g.add_input("w", meta(k, m))
    r = g.call("aten::relu.default", [x], out=meta(n, k))
    a, b = g.call(OP, [r, w], out=[meta(n, m), meta(n)])
    c = g.call("aten::tanh.default", [a], out=meta(n, m))
    d = g.call("aten::mul.Tensor", [b, b], out=meta(n))
    g.set_outputs([c, d])
    return Program.single(g)


def eager(x, w):
    a, b = mm_rowsum(x.relu(), w)
    return a.tanh(), b * b


@pytest.mark.parametrize("seed, n, k, m", [(0, 7, 5, 3), (1, 33, 16, 9)])
def test_custom_op_between_kernels_matches_eager(seed, n, k, m):
    gen = torch.Generator().manual_seed(seed)
    x, w = torch.randn(n, k, generator=gen).to(DEVICE), torch.randn(k, m, generator=gen).to(DEVICE)
    compiled = compile_program(program(n, k, m), [x, w])
    got = compiled(x, w)
    for g, e in zip(got, eager(x, w)):
        torch.testing.assert_close(g, e, atol=1e-5, rtol=1e-5)
