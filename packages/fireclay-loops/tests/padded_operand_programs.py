"""Programs whose library matmuls take a zero-padded operand (fireclay_loops.lowering.matmul) that
is computed in the same program, shared by fireclay-loops' reference-executor test and
fireclay-cpp's compiled one.

Where our kernels compute the operand and nothing else needs its memory in eager's layout, the
padded operand is a view of the producer's own buffer (rows padded by ``pad_strides``, or the
allocation grown past its end) and a small kernel writes zeros into the pad: no kernel copies the
operand. Where the operand is a graph input, a library's result or a returned value, it is
copied. Each case says which (``in_place``). The producers: pointwise, a reduction's epilogue
(the cross-entropy backward), a reduction's result, a library call, a graph input; extra
readers of the operand: the weight gradient's matmul through a transposed view, pointwise and
reduction kernels, a 3-D tensor read as rows.

Sizes: M rows and N columns of 256 (the padding's minimum side), a reduction length K of 1031
(float32 and bfloat16 pad it to 1032, float16 1029 to 1032) or an aligned 1028 (nothing padded).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from aten_builder import AtenBuilder

from fireclay_loops import exprs
from fireclay_loops.config import config as loops_config

M, N = 256, 256
# (K, dtype, padded K or None)
SHAPES = [(1031, torch.float32, 1032), (1031, torch.bfloat16, 1032), (1029, torch.float16, 1032),
          (1028, torch.float32, None)]


@contextlib.contextmanager
def padding_on() -> Iterator[None]:
    """Matmul padding and padded row strides on for the CPU (CUDA's defaults)."""
    with loops_config.patch(pad_matmul=("cpu",), pad_strides=("cpu",)):
        yield


def _scaled(b, x):  # a pointwise producer (a loss gradient's stand-in)
    return b.call("mul.Tensor", b.call("sub.Tensor", x, 0.5), 2.0)


def pointwise_a(b, k, g):  # grad @ w: the operand's K padded in its own rows
    x, w = b.input(g((M, k))), b.input(g((k, N)))
    return (b.call("mm.default", _scaled(b, x), w),)


def cross_entropy_backward(b, k, g):  # grad = g - softmax * sum(g): a row reduction's epilogue writes it
    logits, dy, w, h = b.input(g((M, k))), b.input(g((M, k))), b.input(g((k, N))), b.input(g((M, N)))
    logp = b.call("_log_softmax.default", logits, 1, False)
    total = b.call("sum.dim_IntList", dy, [1], True)
    grad = b.call("sub.Tensor", dy, b.call("mul.Tensor", b.call("exp.default", logp), total))
    # the hidden state's gradient (K padded) and the weight's (grad.t() @ h: its M, the same
    # columns of grad, padded in the same place and read as a view)
    return (b.call("mm.default", grad, w), b.call("mm.default", b.call("t.default", grad), h))


def extra_readers(b, k, g):  # pointwise and reduction kernels read the operand too
    x, w = b.input(g((M, k))), b.input(g((k, N)))
    grad = _scaled(b, x)
    return (b.call("mm.default", grad, w), b.call("exp.default", grad),
            b.call("sum.dim_IntList", b.call("relu.default", grad), [0]))


def reduction_result(b, k, g):  # a reduction over a batch stores the operand's rows
    x, w = b.input(g((4, M, k))), b.input(g((k, N)))
    return (b.call("mm.default", b.call("sum.dim_IntList", x, [0]), w),)


def rows_of_3d(b, k, g):  # a [2, M/2, K] tensor read as [M, K] rows
    x, w = b.input(g((2, M // 2, k))), b.input(g((k, N)))
    return (b.call("mm.default", b.call("view.default", _scaled(b, x), [M, k]), w),)


def b_rows_grown(b, k, g):  # x @ grad with grad [K, N]: zero rows appended past the buffer's end
    x, y = b.input(g((M, k))), b.input(g((k, N)))
    return (b.call("mm.default", x, _scaled(b, y)),)


def a_transposed(b, k, g):  # grad.t() @ h with grad [K, M]: grad's K rows grow
    y, h = b.input(g((k, M))), b.input(g((k, N)))
    return (b.call("mm.default", b.call("t.default", _scaled(b, y)), h),)


def b_transposed(b, k, g):  # x @ grad.t() with grad [N, K]: K padded in grad's padded rows
    x, y = b.input(g((M, k))), b.input(g((N, k)))
    return (b.call("mm.default", x, b.call("t.default", _scaled(b, y))),)


def n_padded_b(b, k, g):  # h.t() @ grad: N = K padded in grad's rows; the wide product returned
    h, x = b.input(g((M, N))), b.input(g((M, k)))
    return (b.call("mm.default", b.call("t.default", h), _scaled(b, x)),)


def m_padded_rows(b, k, g):  # grad.t() @ h, M = K unaligned: the product's extra rows never read
    x, h = b.input(g((M, k))), b.input(g((M, N)))
    return (b.call("relu.default", b.call("mm.default", b.call("t.default", _scaled(b, x)), h)),)


def two_matmuls_share(b, k, g):  # grad @ w and v.t() @ grad pad one dimension of grad once
    x, w, v = b.input(g((M, k))), b.input(g((k, N))), b.input(g((M, N)))
    grad = _scaled(b, x)
    return (b.call("mm.default", grad, w), b.call("mm.default", b.call("t.default", v), grad))


def library_producer(b, k, g):  # the operand is a library call's result: copied
    bias, x, y, w = b.input(g((k,))), b.input(g((M, 64))), b.input(g((64, k))), b.input(g((k, N)))
    return (b.call("mm.default", b.call("addmm.default", bias, x, y), w),)


def graph_input(b, k, g):  # the operand is the caller's tensor: copied
    x, w = b.input(g((M, k))), b.input(g((k, N)))
    return (b.call("mm.default", x, w),)


def returned_producer(b, k, g):  # the operand is returned too (eager's layout): copied
    x, w = b.input(g((M, k))), b.input(g((k, N)))
    grad = _scaled(b, x)
    return (b.call("mm.default", grad, w), grad)


@dataclass
class Case:
    name: str
    build: Callable[..., tuple]
    in_place: int  # padded operands the program computes in its own buffers (no copy)
    copied: int  # padded operands copied (graph inputs, library results, returned values)


CASES = [
    Case("pointwise_a", pointwise_a, 1, 1), Case("cross_entropy_backward", cross_entropy_backward, 2, 1),
    Case("extra_readers", extra_readers, 1, 1), Case("reduction_result", reduction_result, 1, 1),
    Case("rows_of_3d", rows_of_3d, 1, 1), Case("b_rows_grown", b_rows_grown, 1, 1),
    Case("a_transposed", a_transposed, 1, 1), Case("b_transposed", b_transposed, 1, 1),
    Case("n_padded_b", n_padded_b, 1, 0), Case("m_padded_rows", m_padded_rows, 1, 0),
    Case("two_matmuls_share", two_matmuls_share, 2, 1),
    Case("library_producer", library_producer, 0, 2), Case("graph_input", graph_input, 0, 2),
    Case("returned_producer", returned_producer, 0, 2),
]


def build(case: Case, k: int, dtype: torch.dtype, seed: int = 0) -> tuple[AtenBuilder, Any]:
    gen = torch.Generator().manual_seed(seed)
    b = AtenBuilder()
    program = b.output(*case.build(b, k, lambda shape: torch.randn(shape, generator=gen).to(dtype)))
    return b, program


def fresh_inputs(b: AtenBuilder, seed: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(h.meta.shape, generator=gen).to(h.meta.dtype) for h in b.inputs]


def check(got: Any, want: Any, dtype: torch.dtype) -> None:
    """Values equal eager's, in eager's strides."""
    for g, w in zip(got, want):
        assert g.shape == w.shape and all(a == c or n == 1 for n, a, c in zip(g.shape, g.stride(), w.stride()))
        tol = 2e-3 if dtype == torch.float32 else 0.5
        torch.testing.assert_close(g, w, atol=tol, rtol=2e-2)


PADDED_K = 1032  # what every padded case pads K (or N) to


def _points(node: Any) -> int:
    return int(exprs.product(list(node.body.sizes) + list(node.body.reduction_sizes)))


def _is_zero_fill(node: Any) -> bool:
    """Whether a loop node only stores zeros (a pad written in place)."""
    ops = node.body.ops
    return not node.body.reads() and all(op.args[0] == 0 for op in ops if op.name == "constant")


def padded_operands(scheduled: Any, padded: int = PADDED_K) -> tuple[int, int]:
    """``(in place, copied)``: the library matmuls' zero-padded operands that are views of the
    buffer their producer's kernel writes (a node writing zeros into the pad beside it), and
    those a kernel copies whole (with the zeros around); ``padded``: the padded extent."""
    writers: dict[str, list[Any]] = {}
    for step in scheduled.steps:
        for kn in getattr(step, "nodes", ()):
            for buf, _, _ in kn.node.body.writes():
                writers.setdefault(buf, []).append(kn.node)
    in_place = copied = 0
    for call in scheduled.extern_calls:
        for arg in call.tensor_args() if "mm" in call.op else ():
            if padded not in [int(n) for n in arg.size]:
                continue
            numel = int(exprs.product(list(arg.size)))
            nodes = writers.get(arg.buffer, [])
            if any(_points(n) == numel for n in nodes):
                copied += 1
            elif any(_is_zero_fill(n) for n in nodes):
                in_place += 1
    return in_place, copied
