"""Short reduction rows keep what later loops would recompute: a softmax over scores plus a
gathered bias (Swin's relative position bias; windows of 4 x 4 or 7 x 7 tokens) gathers the bias
and computes the ``exp`` once per element, not once in each of its three loops over the row.
Results are checked against eager, with rows longer than the cache takes as the control."""

from __future__ import annotations

import pytest
import torch
from aten_builder import AtenBuilder
from batch import SEED

import fireclay_cpp
from fireclay_cpp.kernel_codegen import ROW_CACHE_MAX

GEN = torch.Generator().manual_seed(SEED)


def _biased_softmax(b, scores, table, index, odd, heads, row, masked):
    """softmax(scores + table[index] (- 100 on the keys ``odd`` marks)) over rows of ``row``."""
    bias = b.call("index.Tensor", table, [b.call("view.default", index, [-1])])
    bias = b.call("permute.default", b.call("view.default", bias, [row, row, heads]), [2, 0, 1])
    logits = b.call("add.Tensor", scores, bias)
    if masked:
        logits = b.call("where.self", odd, b.call("add.Tensor", logits, -100.0), logits)
    return b.call("_softmax.default", logits, -1, False)


def _build(row, heads, dtype, masked, index=None):
    scores = torch.randn(3, heads, row, row, generator=GEN, dtype=torch.float64).to(dtype)
    table = torch.randn(2 * row - 1, heads, generator=GEN, dtype=torch.float64).to(dtype)
    if index is None:
        index = torch.randint(-(2 * row - 1), 2 * row - 1, (row, row), generator=GEN)
    odd = torch.arange(row) % 2 == 1
    b = AtenBuilder()
    program = b.output(_biased_softmax(b, b.input(scores, "scores"), b.input(table, "table"),
                                       b.input(index, "index"), b.input(odd, "odd"), heads, row, masked))
    return b, program, (scores, table, index, odd)


def _kernel_reading(source: str, buffer: str) -> str:
    for part in source.split('extern "C" void ')[1:]:
        body = part[:part.index("\n}\n")]
        if f"{buffer}[" in body and "fc_exp(" in body:
            return body
    raise AssertionError(f"no kernel gathers from {buffer} and exponentiates:\n{source}")


# (rows, heads, dtype, masked): windows of Swin's small and base configurations, a double and a
# bfloat16 program, and a row longer than the cache takes (recomputed, as before).
CASES = [(16, 2, torch.float32, False), (16, 2, torch.float32, True), (49, 3, torch.float32, True),
         (16, 2, torch.float64, True), (16, 2, torch.bfloat16, False), (ROW_CACHE_MAX + 8, 1, torch.float32, True)]


@pytest.mark.parametrize("row,heads,dtype,masked", CASES, ids=[f"{c[0]}-{c[1]}-{c[2]}-{'masked' if c[3] else 'plain'}"
                                                                for c in CASES])
def test_a_short_row_gathers_and_exponentiates_once(row, heads, dtype, masked):
    b, program, inputs = _build(row, heads, dtype, masked)
    compiled = fireclay_cpp.compile_program(program)
    kernel = _kernel_reading(compiled.cpp_sources[0], "in_table")
    assert fireclay_cpp.compile_program(program).cpp_sources == compiled.cpp_sources  # one text, one cache key
    loops = 1 if row <= ROW_CACHE_MAX else 3  # max, sum of exp, normalise
    assert kernel.count("in_table[") == loops, kernel
    assert kernel.count("fc_exp(") == (1 if row <= ROW_CACHE_MAX else 2), kernel
    tol = {"atol": 2e-2, "rtol": 2e-2} if dtype == torch.bfloat16 else {"atol": 1e-6, "rtol": 1e-5}
    for got, want in zip(compiled(*inputs), b.eager(*inputs)):
        torch.testing.assert_close(got, want, **tol)


def test_an_index_out_of_range_still_raises_with_the_row_kept():
    row = 16
    index = torch.randint(0, 2 * row - 1, (row, row), generator=GEN)
    b, program, (scores, table, _, odd) = _build(row, 2, torch.float32, True, index)
    compiled = fireclay_cpp.compile_program(program)
    torch.testing.assert_close(compiled(scores, table, index, odd)[0], b.eager(scores, table, index, odd)[0])
    bad = index.clone()
    bad[5, 3] = 2 * row - 1
    with pytest.raises(IndexError, match="out of bounds"):
        compiled(scores, table, bad, odd)
