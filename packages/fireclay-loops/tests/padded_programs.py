"""Programs whose intermediate buffers get padded rows (fireclay_loops.layout.padded_strides),
shared by fireclay-loops' reference-executor test and the backends' compiled tests: matmuls
reading a padded buffer as A, as B and transposed, reductions and pointwise kernels reading and
writing padded buffers, returned results (never padded) and saved outputs (padded).

Each case is built for a row length ``n`` (1, 7, 1025 and a vocabulary-like 50257 at few rows);
:func:`padding_on` turns the padding on for the CPU with a threshold of one element, so that
short rows are padded too (to 128 bytes: 7 float32 elements take a row of 32)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from aten_builder import AtenBuilder

from fireclay_loops.config import config as loops_config
from fireclay_loops.lowering.context import SAVED_OUTPUTS

ROWS = 3
WIDTHS = [1, 7, 1025, 50257]


@contextlib.contextmanager
def padding_on(min_stride: int = 1) -> Iterator[None]:
    with loops_config.patch(pad_strides=("cpu",), pad_min_stride=min_stride):
        yield


def _scaled(b, x):
    """A pointwise kernel writing a padded buffer (the logits gradient's stand-in)."""
    return b.call("mul.Tensor", b.call("sub.Tensor", x, 0.5), 2.0)


def mm_a(b, n, g):  # padded [R, n] @ [n, 4]: the hidden state's gradient
    x, w = b.input(g((ROWS, n))), b.input(g((n, 4)))
    return (b.call("mm.default", _scaled(b, x), w),)


def mm_b(b, n, g):  # [5, R] @ padded [R, n]
    x, w = b.input(g((ROWS, n))), b.input(g((5, ROWS)))
    return (b.call("mm.default", w, _scaled(b, x)),)


def mm_a_transposed(b, n, g):  # padded.t() @ [R, 4]: the lm_head weight's gradient
    x, h = b.input(g((ROWS, n))), b.input(g((ROWS, 4)))
    return (b.call("mm.default", b.call("t.default", _scaled(b, x)), h),)


def mm_b_transposed(b, n, g):  # [4, n] @ padded.t()
    x, w = b.input(g((ROWS, n))), b.input(g((4, n)))
    return (b.call("mm.default", w, b.call("t.default", _scaled(b, x))),)


def bmm_batched(b, n, g):  # padded [2, R, n] @ [2, n, 3]
    x, w = b.input(g((2, ROWS, n))), b.input(g((2, n, 3)))
    return (b.call("bmm.default", _scaled(b, x), w),)


def mm_viewed(b, n, g):  # padded [2, R, n] viewed as [2R, n] into a matmul
    x, w = b.input(g((2, ROWS, n))), b.input(g((n, 3)))
    return (b.call("mm.default", b.call("view.default", _scaled(b, x), [2 * ROWS, n]), w),)


def softmax_rows(b, n, g):  # a reduction and pointwise kernels reading a padded buffer, writing one
    x, w = b.input(g((ROWS, n))), b.input(g((n, 2)))
    s = b.call("_softmax.default", _scaled(b, x), 1, False)
    return (b.call("mm.default", s, w), b.call("sum.dim_IntList", s, [0]))


def reduction_writes_padded(b, n, g):  # sum over the batch writes [R, n] rows, read by a matmul
    x, w = b.input(g((4, ROWS, n))), b.input(g((n, 2)))
    return (b.call("mm.default", b.call("sum.dim_IntList", x, [0]), w),)


def max_two_results(b, n, g):  # one reduction writing float32 and int64 rows (two alignments)
    x, w = b.input(g((4, ROWS, n))), b.input(g((n, 2)))
    values, indices = b.call("max.dim", x, 0)
    both = b.call("add.Tensor", values, b.call("_to_copy.default", indices, dtype=torch.float32))
    return (b.call("mm.default", both, w),)


def returned(b, n, g):  # returned results keep eager's strides, a view of one too
    x = b.input(g((ROWS, n)))
    y = _scaled(b, x)
    return (y, b.call("view.default", b.call("exp.default", y), [ROWS * n]))


def returned_and_read(b, n, g):  # returned and read by a matmul: not padded
    x, w = b.input(g((ROWS, n))), b.input(g((n, 2)))
    y = _scaled(b, x)
    return (y, b.call("mm.default", y, w))


def flattened_read(b, n, g):  # read through a reshape no stride can express (recomputed, or read padded)
    x = b.input(g((ROWS, n)))
    y = _scaled(b, x)
    return (b.call("cumsum.default", b.call("view.default", y, [ROWS * n]), 0),)


def as_strided_read(b, n, g):  # as_strided addresses memory by eager's layout: not padded
    x = b.input(g((ROWS, n)))
    y = _scaled(b, x)
    return (b.call("exp.default", b.call("as_strided.default", y, [ROWS - 1, 1], [n, 1], n - 1)),)


@dataclass
class Case:
    name: str
    build: Callable[..., tuple]
    padded: bool  # whether some buffer a kernel stores is padded (others may be, never stored)
    saved: tuple[int, ...] = ()  # outputs only a backward reads (may be padded)


def _saved_logits_gradient(b, n, g):  # the forward's saved output: padded, as it is handed over
    x, w = b.input(g((ROWS, n))), b.input(g((n, 2)))
    y = _scaled(b, x)
    return (b.call("mm.default", y, w), y)


CASES = [
    Case("mm_a", mm_a, True), Case("mm_b", mm_b, True), Case("mm_a_transposed", mm_a_transposed, True),
    Case("mm_b_transposed", mm_b_transposed, True), Case("bmm_batched", bmm_batched, True),
    Case("mm_viewed", mm_viewed, True), Case("softmax_rows", softmax_rows, True),
    Case("reduction_writes_padded", reduction_writes_padded, True), Case("max_two_results", max_two_results, True),
    Case("returned", returned, False), Case("returned_and_read", returned_and_read, False),
    Case("flattened_read", flattened_read, False), Case("as_strided_read", as_strided_read, False),
    Case("saved_output", _saved_logits_gradient, True, saved=(1,)),
]


def build(case: Case, n: int, seed: int = 0, device: str | None = None) -> tuple[AtenBuilder, Any]:
    gen = torch.Generator().manual_seed(seed)
    b = AtenBuilder(device)
    program = b.output(*case.build(b, n, lambda shape: torch.randn(shape, generator=gen)))
    if case.saved:
        program.main.meta[SAVED_OUTPUTS] = list(case.saved)
    return b, program


def fresh_inputs(b: AtenBuilder, seed: int, device: str = "cpu") -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(h.meta.shape, generator=gen, dtype=h.meta.dtype).to(device) for h in b.inputs]


def check(case: Case, n: int, got: Any, want: Any, padded_above: int | None = 1) -> None:
    """Values equal eager's; outputs the caller receives in eager's strides; saved outputs padded
    when the case pads rows of ``n`` (at least ``padded_above``; None: not checked, the reference
    executor returns copies)."""
    for pos, (g, w) in enumerate(zip(got, want)):
        assert g.shape == w.shape
        if pos in case.saved:
            if case.padded and g.dim() > 1 and g.shape[0] > 1 and padded_above is not None and n >= padded_above:
                assert g.stride() != w.stride(), f"saved output {pos} was not padded"
        else:
            same = all(a == b or d == 1 for d, a, b in zip(g.shape, g.stride(), w.stride()))
            assert same, f"output {pos}: {g.stride()} vs eager's {w.stride()}"
        # long rows sum thousands of terms in another order than eager's
        tol = 1e-4 if n < 1000 else 2e-3
        torch.testing.assert_close(g, w, atol=tol, rtol=tol)


def padded_buffers(scheduled: Any) -> list[Any]:
    """The scheduled program's buffers laid out with other strides than contiguous ones."""
    from fireclay_loops import exprs

    prog = scheduled.program
    return [buf for buf in prog.buffers.values() if not buf.is_input and any(
        not exprs.equal(s, c) and not exprs.equal(d, 1)
        for d, s, c in zip(buf.size, buf.stride, exprs.contiguous_strides(buf.size)))]
