"""A ``torch.library`` custom operator between generated kernels, shared by the code generators'
tests (fireclay-cpp and fireclay-triton read fireclay-loops' tests folder from the checkout):
``tanh(mm_rowsum(relu(x), w)[0]), rowsum * rowsum``, as an aten program and in eager."""

from collections.abc import Callable

import torch
from torch import Tensor

from fireclay_ir import Graph, Program, TensorMeta
from fireclay_ir.dialects import custom_op_name, register_custom_op


def mm_rowsum_case(lib: str, device: str) -> tuple[Callable[[int, int, int], Program], Callable]:
    """(program(n, k, m), eager(x, w)) around a ``<lib>::mm_rowsum`` op registered here (a library
    name per test package: an op can be defined once per process)."""

    @torch.library.custom_op(f"{lib}::mm_rowsum", mutates_args=())
    def mm_rowsum(x: Tensor, w: Tensor) -> tuple[Tensor, Tensor]:
        return x @ w, x.sum(-1)

    @mm_rowsum.register_fake
    def _(x, w):
        return x.new_empty(x.shape[0], w.shape[1]), x.new_empty(x.shape[0])

    op = custom_op_name(lib, "mm_rowsum", "default")
    register_custom_op(op, str(mm_rowsum._opoverload._schema), lambda: mm_rowsum._opoverload)

    def meta(*shape: int) -> TensorMeta:
        return TensorMeta("float32", shape, device=device)

    def program(n: int, k: int, m: int) -> Program:
        g = Graph("main")
        x, w = g.add_input("x", meta(n, k)), g.add_input("w", meta(k, m))
        r = g.call("aten::relu.default", [x], out=meta(n, k))
        a, b = g.call(op, [r, w], out=[meta(n, m), meta(n)])
        c = g.call("aten::tanh.default", [a], out=meta(n, m))
        d = g.call("aten::mul.Tensor", [b, b], out=meta(n))
        g.set_outputs([c, d])
        return Program.single(g)

    def eager(x, w):
        a, b = mm_rowsum(x.relu(), w)
        return a.tanh(), b * b

    return program, eager


def check_against_eager(compile_program: Callable, case: tuple, device: str, seed: int, n: int, k: int, m: int) -> None:
    program, eager = case
    gen = torch.Generator().manual_seed(seed)
    x, w = torch.randn(n, k, generator=gen).to(device), torch.randn(k, m, generator=gen).to(device)
    got = compile_program(program(n, k, m), [x, w])(x, w)
    for g, e in zip(got, eager(x, w)):
        torch.testing.assert_close(g, e, atol=1e-5, rtol=1e-5)
