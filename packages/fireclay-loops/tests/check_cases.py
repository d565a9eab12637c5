"""The table of kernel checks (what eager raises on, that generated kernels must raise on too),
shared by fireclay-loops' reference executor test and the backends' ``tests/security``.

Each op is one aten program, compiled once; its index (or divisor) input then takes each value of
the table, and the compiled result must equal eager's, or raise an error of the type eager raises.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from aten_builder import AtenBuilder

ROWS, COLS = 4, 5  # the indexed tensor: [ROWS, COLS]
HUGE = 2**40


@dataclass
class IndexOp:
    """An op reading ``x`` at indices from a tensor: ``build(b, x, idx)`` adds it to a builder;
    ``size`` is the extent of the indexed dimension, ``idx_shape`` the index tensor's shape."""

    name: str
    build: Any
    size: int
    idx_shape: tuple
    x_shape: tuple = (ROWS, COLS)
    negative_ok: bool = False  # eager counts negative indices from the end (advanced indexing)
    site: str = "dimension"  # how a failed check's message names what was indexed
    atol: float = 0.0  # scatter-adds: x + (a + b) where eager computes (x + a) + b


def _rows(b, x, n=3):
    return b.call("slice.Tensor", x, 0, 0, n)


INDEX_OPS = [
    IndexOp("index_select_dim0", lambda b, x, i: b.call("index_select.default", x, 0, i), ROWS, (3,)),
    IndexOp("index_select_dim1", lambda b, x, i: b.call("index_select.default", x, 1, i), COLS, (3,)),
    IndexOp("gather_dim1", lambda b, x, i: b.call("gather.default", x, 1, i), COLS, (ROWS, 3)),
    IndexOp("embedding", lambda b, w, i: b.call("embedding.default", w, i), 6, (2, 3), x_shape=(6, 3)),
    IndexOp("index_rows", lambda b, x, i: b.call("index.Tensor", x, [i]), ROWS, (3,), negative_ok=True),  # x[idx]
    IndexOp("index_cols", lambda b, x, i: b.call("index.Tensor", x, [None, i]), COLS, (3,), negative_ok=True),  # x[:, idx]
    # indices read inside a reduction loop (the C++ kernel checks them before the loop)
    IndexOp("gather_then_sum", lambda b, x, i: b.call("sum.dim_IntList", b.call("gather.default", x, 1, i), [1]),
            COLS, (ROWS, 3)),
    IndexOp("index_cols_then_amax", lambda b, x, i: b.call("amax.default", b.call("index.Tensor", x, [None, i]), [1]),
            COLS, (3,), negative_ok=True),
    # a scatter of one position per row (a loss's one-hot), lowered as a pointwise choice
    IndexOp("scatter_value_one_per_row", lambda b, x, i: b.call("scatter.value", x, 1, i, -1.0), COLS, (ROWS, 1)),
    IndexOp("scatter_src_one_per_row", lambda b, x, i: b.call("scatter.src", x, 1, i, x), COLS, (ROWS, 1)),
    # one_hot's classes: eager refuses one outside [0, num_classes) (decomposed, a row of zeros)
    IndexOp("one_hot", lambda b, x, i: b.call("one_hot.default", i, COLS), COLS, (ROWS, 3),
            site="the classes of one_hot"),
    IndexOp("one_hot_times_x", lambda b, x, i: b.call("mul.Tensor", b.call("one_hot.default", i, COLS), x),
            COLS, (ROWS,), site="the classes of one_hot"),
    IndexOp("one_hot_then_sum", lambda b, x, i: b.call("sum.dim_IntList", b.call(
        "mul.Tensor", b.call("one_hot.default", i, COLS), x), [1]), COLS, (ROWS,),
            site="the classes of one_hot"),
    # scatter-adds: one loop node adding at the indices (ops.store_add)
    IndexOp("index_put_accumulate", lambda b, x, i: b.call("index_put.default", x, [i], _rows(b, x, 3), True),
            ROWS, (3,), negative_ok=True, atol=1e-6),
    IndexOp("index_put_accumulate_cols", lambda b, x, i: b.call("index_put.default", x, [None, i],
                                                                b.call("slice.Tensor", x, 1, 0, 3), True),
            COLS, (3,), negative_ok=True, atol=1e-6),
    IndexOp("index_add", lambda b, x, i: b.call("index_add.default", x, 0, i, _rows(b, x, 3)), ROWS, (3,),
            atol=1e-6),
    IndexOp("scatter_add", lambda b, x, i: b.call("scatter_add.default", x, 1, i, x), COLS, (ROWS, 3), atol=1e-6),
]

# Ops that write at, or read from, indices read from a tensor and that the lowering keeps as calls
# into torch (fallbacks): eager's own kernels check the indices. The table keeps it so: an op
# lowered some day without a check fails here. (``take_along_dim`` decomposes to ``gather``;
# ``x[idx] = v`` and ``index_put_`` are ``index_put``.) The embedding's backward is lowered, and
# like eager's kernel it checks nothing: an index outside the rows adds nothing (the forward
# embedding refused it).
FALLBACK_INDEX_OPS = [
    IndexOp("scatter_value", lambda b, x, i: b.call("scatter.value", x, 1, i, 2.0), COLS, (ROWS, 3)),
    IndexOp("scatter_src", lambda b, x, i: b.call("scatter.src", x, 1, i, x), COLS, (ROWS, 3)),
    IndexOp("scatter_reduce_amax", lambda b, x, i: b.call("scatter_reduce.two", x, 1, i, x, "amax"), COLS, (ROWS, 3)),
    IndexOp("index_put", lambda b, x, i: b.call("index_put.default", x, [i], _rows(b, x, 3)), ROWS, (3,),
            negative_ok=True),
    IndexOp("index_copy", lambda b, x, i: b.call("index_copy.default", x, 0, i, _rows(b, x, 3)), ROWS, (3,)),
    IndexOp("index_fill", lambda b, x, i: b.call("index_fill.int_Scalar", x, 1, i, -1.0), COLS, (3,),
            negative_ok=True),
    IndexOp("embedding_dense_backward",
            lambda b, g, i: b.call("embedding_dense_backward.default", g, i, 6, -1, False), 6, (2, 3), x_shape=(2, 3, 4)),
    IndexOp("embedding_dense_backward_padding_idx",
            lambda b, g, i: b.call("embedding_dense_backward.default", g, i, 6, 2, False), 6, (2, 3), x_shape=(2, 3, 4)),
]

# The value put at one position of an otherwise in-range index tensor, by the size indexed.
INDEX_VALUES = {
    "in_range": lambda n: n - 2,
    "last_negative": lambda n: -1,  # legal for advanced indexing only
    "most_negative": lambda n: -n,
    "below_negative": lambda n: -n - 1,
    "size": lambda n: n,
    "huge": lambda n: HUGE,
    "huge_negative": lambda n: -HUGE,
}


@dataclass
class DivisionOp:
    name: str
    build: Any  # (builder, a, b) -> output
    dtype: torch.dtype = torch.int64
    divisor_is_zero: bool = False  # a literal 0: raises whatever the inputs


DIVISION_OPS = [
    DivisionOp("floor_divide", lambda bl, a, b: bl.call("floor_divide.default", a, b)),
    DivisionOp("remainder", lambda bl, a, b: bl.call("remainder.Tensor", a, b)),
    DivisionOp("fmod", lambda bl, a, b: bl.call("fmod.Tensor", a, b)),
    DivisionOp("div_floor", lambda bl, a, b: bl.call("div.Tensor_mode", a, b, rounding_mode="floor")),
    DivisionOp("div_trunc", lambda bl, a, b: bl.call("div.Tensor_mode", a, b, rounding_mode="trunc")),
    DivisionOp("floor_divide_int32", lambda bl, a, b: bl.call("floor_divide.default", a, b), torch.int32),
    DivisionOp("remainder_uint8", lambda bl, a, b: bl.call("remainder.Tensor", a, b), torch.uint8),
    DivisionOp("remainder_scalar_zero", lambda bl, a, b: bl.call("remainder.Scalar", a, 0), divisor_is_zero=True),
    DivisionOp("float_div", lambda bl, a, b: bl.call("div.Tensor", a, b), torch.float32),  # inf/nan, no error
]


def index_program(op: IndexOp, device: str = "cpu"):
    """(builder, program) of ``op`` over a float input and an int64 index input on ``device``."""
    b = AtenBuilder()
    x = b.input(torch.empty(op.x_shape, device=device), "x")
    i = b.input(torch.empty(op.idx_shape, dtype=torch.int64, device=device), "idx")
    return b, b.output(op.build(b, x, i))


def index_inputs(op: IndexOp, value: str, seed: int = 0) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(op.x_shape, generator=gen)
    idx = torch.randint(0, op.size, op.idx_shape, generator=gen)
    idx.view(-1)[idx.numel() // 2] = INDEX_VALUES[value](op.size)
    return [x, idx]


def division_program(op: DivisionOp, device: str = "cpu"):
    b = AtenBuilder()
    x = b.input(torch.empty(3, 4, dtype=op.dtype, device=device), "a")
    y = b.input(torch.empty(3, 4, dtype=op.dtype, device=device), "b")
    return b, b.output(op.build(b, x, y))


def division_inputs(op: DivisionOp, zero: bool, seed: int = 0) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    if op.dtype.is_floating_point:
        a, d = torch.randn(3, 4, generator=gen), torch.randn(3, 4, generator=gen)
    else:
        low = 0 if op.dtype == torch.uint8 else -9
        a = torch.randint(low, 10, (3, 4), generator=gen, dtype=op.dtype)
        d = torch.randint(1, 5, (3, 4), generator=gen, dtype=op.dtype)
        if op.dtype != torch.uint8:
            d = d * torch.where(torch.rand(3, 4, generator=gen) < 0.5, -1, 1).to(op.dtype)
    if zero:
        d[1, 2] = 0
    return [a, d]


def eager_result(builder: AtenBuilder, inputs: list[torch.Tensor]):
    """Eager's outputs, or the exception it raises."""
    try:
        return builder.eager(*[t.clone() for t in inputs])
    except Exception as error:  # noqa: BLE001 (the oracle's error is the expected result)
        return error


def check_against_eager(compiled_call, builder: AtenBuilder, inputs: list[torch.Tensor], atol: float = 0.0) -> Any:
    """Run the compiled program: the same outputs as eager (within ``atol``), or an error of the
    type eager raised (returned, for the caller to check its message)."""
    want = eager_result(builder, inputs)
    if isinstance(want, Exception):
        try:
            got = compiled_call(*inputs)
        except type(want) as error:
            return error
        raise AssertionError(f"eager raised {type(want).__name__}({want}); the compiled program returned {got}")
    got = compiled_call(*inputs)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=0, atol=atol, equal_nan=True)
    return None
