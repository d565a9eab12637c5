"""Layer norm's backward as fireclay-loops lowers it: the input gradient (two row reductions) and
the weight and bias gradients (column sums over every row, one kernel). Each case runs against
eager on fresh random inputs over a table of shapes (ragged ones, one wider than a column block)
and dtypes. The weight and bias gradients must come from the column form of the C++ reduction
(whole rows in memory order), and their blocks, narrowed at run time when there are fewer than
threads, must not change a single bit of the result.

In bfloat16 the oracle is eager in float64 on the same inputs: eager's own bfloat16 weight
gradient accumulates in bfloat16 (tens of units in the last place off at 4096 rows), while the
compiled kernels accumulate in float32 and round once."""

from __future__ import annotations

import pytest
import torch
from aten_builder import AtenBuilder
from batch import SEED

import fireclay_cpp
from fireclay_cpp.column_loops import COLUMN_BLOCK_BYTES
from fireclay_cpp.config import Config

GEN = torch.Generator().manual_seed(SEED)
COLUMN_LOOP = "fc_xb += "  # the block loop of a column reduction
NARROWED = "int64_t fc_w = "  # the block width chosen at run time

# Columns beyond one block of the two float32 gradients' accumulators: two blocks, the second ragged.
WIDE = COLUMN_BLOCK_BYTES // 8 + 37

# (id, input shape, normalized dims)
SHAPES = [
    ("3x5", (3, 5), 1),
    ("37x100", (37, 100), 1),
    ("64x256", (64, 256), 1),
    ("130x768", (130, 768), 1),
    ("4096x256", (4096, 256), 1),
    ("3x7x33", (3, 7, 33), 1),
    ("5x6x10_two_dims", (5, 6, 10), 2),
    ("9xwide", (9, WIDE), 1),
]
MASKS = {"all": [True, True, True], "params": [False, True, True], "input": [True, False, False],
         "weight": [False, True, False]}
# Sums of up to 4096 products in float32; bfloat16 results are rounded to 8 bits of mantissa.
TOLERANCE = {torch.float64: (1e-9, 1e-9), torch.float32: (2e-3, 1e-4), torch.bfloat16: (2e-2, 1e-2)}


def _inputs(shape, dims, dtype):
    x = torch.randn(shape, generator=GEN, dtype=torch.float64).to(dtype)
    normalized = list(shape[-dims:])
    weight = torch.randn(normalized, generator=GEN, dtype=torch.float64).to(dtype)
    bias = torch.randn(normalized, generator=GEN, dtype=torch.float64).to(dtype)
    _, mean, rstd = torch.ops.aten.native_layer_norm(x, normalized, weight, bias, 1e-5)
    grad = torch.randn(shape, generator=GEN, dtype=torch.float64).to(dtype)
    return [grad, x, mean, rstd, weight, bias], normalized


def _program(tensors, normalized, mask):
    b = AtenBuilder()
    g, x, mean, rstd, weight, bias = (b.input(t, n) for t, n in
                                      zip(tensors, ["grad", "x", "mean", "rstd", "weight", "bias"]))
    outs = b.call("native_layer_norm_backward.default", g, x, normalized, mean, rstd, weight, bias, mask)
    return b, b.output(*[o for o, wanted in zip(outs, mask) if wanted])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16], ids=str)
@pytest.mark.parametrize("mask", list(MASKS.values()), ids=list(MASKS))
@pytest.mark.parametrize("sid,shape,dims", SHAPES, ids=[s[0] for s in SHAPES])
def test_layer_norm_backward_matches_eager(sid, shape, dims, mask, dtype):
    tensors, normalized = _inputs(shape, dims, dtype)
    b, program = _program(tensors, normalized, mask)
    compiled = fireclay_cpp.compile_program(program)
    source = "\n".join(compiled.cpp_sources)
    if mask[1] or mask[2]:
        assert COLUMN_LOOP in source, source
    atol, rtol = TOLERANCE[dtype]
    for _ in range(2):  # fresh inputs on the second call
        got = compiled(*tensors)
        if dtype == torch.bfloat16:
            want = [w for w in b.eager(*[t.double() for t in tensors]) if w is not None]
            got = [g.double() for g in got]
        else:
            want = [w for w in b.eager(*tensors) if w is not None]
        assert len(got) == len(want)
        for g, w in zip(got, want):
            torch.testing.assert_close(g, w, atol=atol, rtol=rtol, msg=lambda m: f"{sid} (seed {SEED}): {m}")
        tensors, _ = _inputs(shape, dims, dtype)


@pytest.mark.parametrize("shape", [(256, 100), (2048, 256), (17, WIDE)], ids=str)
def test_narrowed_blocks_give_the_same_bits(shape):
    """Planned for 4 threads, a kernel with one block per row narrows its blocks at run time;
    each column is still summed over the rows in order, so 1, 2, 3 or 4 threads (each block
    width) give identical gradients, equal to eager's."""
    tensors, normalized = _inputs(shape, 1, torch.float32)
    b, program = _program(tensors, normalized, MASKS["params"])
    compiled = fireclay_cpp.compile_program(program, cfg=Config(threads=4))
    assert NARROWED in "\n".join(compiled.cpp_sources)
    before = torch.get_num_threads()
    try:
        results = []
        for threads in (1, 2, 3, 4):
            torch.set_num_threads(threads)
            results.append(compiled(*tensors))
    finally:
        torch.set_num_threads(before)
    for other in results[1:]:
        for g, first in zip(other, results[0]):
            assert torch.equal(g, first)
    want = [w for w in b.eager(*tensors) if w is not None]
    for g, w in zip(results[0], want):
        torch.testing.assert_close(g, w, atol=2e-3, rtol=1e-4)
