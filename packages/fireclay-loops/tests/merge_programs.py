"""Programs whose kernels may or may not merge adjacent loops (fireclay_loops.merge_loops), each
with the iteration spaces its kernels must have once merged. Shared by fireclay-loops' tests
(reference executor) and the code generators' tests, which run the same table compiled.

A space prints as ``[60]`` (outer loops) or ``[24] x r[16]`` (outer x reduction loops)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch
from aten_builder import AtenBuilder, T

from fireclay_loops import exprs


@dataclass
class MergeCase:
    name: str
    build: object  # (builder, *input handles) -> output handles
    inputs: list
    spaces: list[str]  # every kernel's iteration space after merging, in order
    random: bool = False  # random numbers: compared with the unmerged schedule, not eager


def space(kernel) -> str:
    xs = ", ".join(exprs.to_str(s) for s in kernel.xsizes)
    rs = ", ".join(exprs.to_str(s) for s in kernel.rsizes)
    return f"[{xs}]" + (f" x r[{rs}]" if kernel.rsizes else "")


def _exp_plus_one(b, x):
    return (b.call("add.Tensor", b.call("exp.default", x), 1.0),)


def _gelu(b, x):
    return (b.call("gelu.default", x),)


def _mul_add(b, x, y):
    return (b.call("add.Tensor", b.call("mul.Tensor", x, y), 1.0),)


def _bias(b, x, bias):
    return (b.call("add.Tensor", x, bias),)


def _channel_scale(b, x, s):
    return (b.call("mul.Tensor", x, s),)


def _transposed_add(b, x, y):
    return (b.call("add.Tensor", b.call("permute.default", x, [0, 2, 1]), y),)


def _last_two_swapped(b, x):
    return (b.call("mul.Tensor", b.call("permute.default", x, [0, 1, 3, 2]), 2.0),)


def _slice_rows(b, x):
    return (b.call("exp.default", b.call("slice.Tensor", x, 0, 2, 7)),)


def _narrow_last(b, x):
    return (b.call("neg.default", b.call("narrow.default", x, 2, 1, 8)),)


def _strided_slice(b, x):
    return (b.call("exp.default", b.call("slice.Tensor", x, 1, 0, 6, 2)),)


def _layer_norm(b, x, w, bias):
    return b.call("native_layer_norm.default", x, [16], w, bias, 1e-5)


def _softmax_last(b, x):
    return (b.call("_softmax.default", x, -1, False),)


def _sum_trailing(b, x):
    return (b.call("sum.dim_IntList", x, [1, 2]),)


def _sum_middle(b, x):
    return (b.call("sum.dim_IntList", x, [1, 2], True),)


def _sum_outer_and_inner(b, x):
    return (b.call("sum.dim_IntList", x, [0, 2]),)


def _argmax_all(b, x):
    return (b.call("argmax.default", x),)


def _amax_trailing_then_sub(b, x):
    m = b.call("amax.default", x, [2, 3], True)
    return (b.call("sub.Tensor", x, m),)


def _arange(b, n, dtype):
    h = b.call("arange.default", n, dtype=dtype, device=torch.device("cpu"))
    h.meta = h.meta.to("meta")  # the builder's shape propagation runs on meta tensors
    return h


def _causal_softmax(b, x):
    rows = b.call("unsqueeze.default", _arange(b, 8, torch.int64), 1)
    cols = b.call("unsqueeze.default", _arange(b, 8, torch.int64), 0)
    keep = b.call("ge.Tensor", rows, cols)
    masked = b.call("masked_fill.Scalar", x, b.call("logical_not.default", keep), float("-inf"))
    return (b.call("_softmax.default", masked, -1, False),)


def _add_position(b, x):
    pos = _arange(b, 8, torch.float32)
    return (b.call("add.Tensor", x, pos),)


def _flat_position(b, x):
    flat = _arange(b, 48, torch.float32)
    return (b.call("mul.Tensor", x, b.call("view.default", flat, [4, 12])),)


def _embedding(b, table, ids):
    return (b.call("mul.Tensor", b.call("embedding.default", table, ids), 2.0),)


def _view_then_add(b, x, y):
    e = b.call("exp.default", x)
    return (b.call("add.Tensor", b.call("view.default", e, [2, 3, 8]), y),)


def _view_then_add_reversed(b, x, y):
    e = b.call("exp.default", x)
    return (b.call("add.Tensor", b.call("view.default", e, [6, 8]), y),)


def _view_then_transpose(b, x, y):
    e = b.call("exp.default", x)
    return (b.call("add.Tensor", b.call("view.default", e, [2, 3, 8]), b.call("permute.default", y, [1, 2, 0])),)


def _dropout(b, x):
    out, mask = b.call("native_dropout.default", x, 0.5, True)
    return out, mask


def _flip_all(b, x):
    return (b.call("add.Tensor", b.call("flip.default", x, [0, 1, 2]), 1.0),)


def _size_one_dims(b, x, y):
    return (b.call("add.Tensor", x, y),)


I64 = torch.int64
BOOL = torch.bool

CASES = [
    MergeCase("pointwise_2d", _exp_plus_one, [T(6, 10)], ["[60]"]),
    MergeCase("pointwise_3d_gelu", _gelu, [T(4, 6, 10)], ["[240]"]),
    MergeCase("pointwise_4d", _mul_add, [T(2, 3, 4, 5), T(2, 3, 4, 5)], ["[120]"]),
    MergeCase("bias_over_rows", _bias, [T(6, 10), T(10)], ["[6, 10]"]),
    MergeCase("bias_over_rows_3d", _bias, [T(4, 6, 10), T(10)], ["[24, 10]"]),
    MergeCase("per_channel_scale", _channel_scale, [T(2, 3, 4, 5), T(3, 1, 1)], ["[2, 3, 20]"]),
    MergeCase("transposed_read", _transposed_add, [T(4, 6, 8), T(4, 8, 6)], ["[4, 8, 6]"]),
    MergeCase("last_two_swapped", _last_two_swapped, [T(2, 3, 4, 5)], ["[6, 5, 4]"]),
    MergeCase("slice_rows_offset", _slice_rows, [T(10, 4, 8)], ["[160]"]),
    MergeCase("narrow_last_offset", _narrow_last, [T(4, 6, 10)], ["[24, 8]"]),
    MergeCase("strided_slice", _strided_slice, [T(4, 6, 5)], ["[12, 5]"]),
    MergeCase("layer_norm_3d", _layer_norm, [T(4, 6, 16), T(16), T(16)], ["[24] x r[16]"]),
    MergeCase("softmax_4d_last", _softmax_last, [T(2, 3, 4, 10)], ["[24] x r[10]"]),
    MergeCase("sum_trailing_dims", _sum_trailing, [T(6, 4, 5)], ["[6] x r[20]"]),
    MergeCase("sum_middle_dims", _sum_middle, [T(4, 5, 6, 7)], ["[4, 7] x r[30]"]),
    MergeCase("sum_outer_and_inner", _sum_outer_and_inner, [T(4, 5, 6)], ["[5] x r[4, 6]"]),
    MergeCase("argmax_all", _argmax_all, [T(6, 5, 4)], ["[] x r[120]"]),
    MergeCase("amax_trailing_then_sub", _amax_trailing_then_sub, [T(2, 3, 4, 5)], ["[6] x r[20]"]),
    MergeCase("causal_mask_softmax", _causal_softmax, [T(2, 3, 8, 8)], ["[6, 8] x r[8]"]),
    MergeCase("add_position", _add_position, [T(4, 6, 8)], ["[24, 8]"]),
    MergeCase("flat_position", _flat_position, [T(4, 12)], ["[48]"]),
    MergeCase("embedding", _embedding, [T(20, 8), T(3, 5, dtype=I64, high=20)], ["[15, 8]"]),
    MergeCase("view_then_add", _view_then_add, [T(6, 8), T(2, 3, 8)], ["[48]"]),
    MergeCase("view_then_add_reversed", _view_then_add_reversed, [T(2, 3, 8), T(6, 8)], ["[48]"]),
    MergeCase("view_then_bias", _view_then_add_reversed, [T(2, 3, 8), T(8)], ["[6, 8]"]),
    MergeCase("view_then_transpose", _view_then_transpose, [T(6, 8), T(8, 2, 3)], ["[6, 8]"]),
    MergeCase("dropout", _dropout, [T(4, 6, 8)], ["[192]"], random=True),
    MergeCase("flip_all", _flip_all, [T(3, 4, 5)], ["[60]"]),
    MergeCase("size_one_dims", _size_one_dims, [T(1, 6, 1, 8), T(1, 6, 1, 8)], ["[48]"]),
]

PARAMS = [pytest.param(c, id=c.name) for c in CASES]


def build(case: MergeCase, seed: int = 0):
    """The case's aten program, its builder (for the eager replay) and random inputs."""
    gen = torch.Generator().manual_seed(seed)
    b = AtenBuilder()
    tensors = [spec.make(gen) for spec in case.inputs]
    handles = [b.input(t, f"x{i}") for i, t in enumerate(tensors)]
    outs = case.build(b, *handles)
    return b, b.output(*outs), tensors


# --------------------------------------------------------------------------- symbolic sizes


@dataclass
class SymbolicCase:
    name: str
    graph: object  # (Graph) -> outputs: the program, with sizes over s0 and s1
    shapes: object  # (s0, s1) -> the inputs' shapes
    eager: object  # (*tensors) -> the outputs
    spaces: list[str]


def _meta(*shape):
    from fireclay_ir import TensorMeta

    return TensorMeta("float32", shape)


def _sym_exp(g):
    x = g.add_input("x", _meta("s0", "s1", 8))
    return [g.call("aten::exp.default", (x,), out=_meta("s0", "s1", 8))]


def _sym_bias(g):
    x, y = g.add_input("x", _meta("s0", "s1")), g.add_input("y", _meta("s1"))
    return [g.call("aten::add.Tensor", (x, y), out=_meta("s0", "s1"))]


def _sym_layer_norm(g):
    x, w = g.add_input("x", _meta("s0", "s1", 16)), g.add_input("w", _meta(16))
    out = g.call("aten::native_layer_norm.default", (x, [16], w, None, 1e-5),
                 out=[_meta("s0", "s1", 16), _meta("s0", "s1", 1), _meta("s0", "s1", 1)])
    return [out[0]]


def _sym_sum_trailing(g):
    x = g.add_input("x", _meta("s0", "s1", 4))
    return [g.call("aten::sum.dim_IntList", (x, [1, 2]), out=_meta("s0"))]


def _sym_softmax(g):
    x = g.add_input("x", _meta("s0", 4, "s1"))
    return [g.call("aten::_softmax.default", (x, -1, False), out=_meta("s0", 4, "s1"))]


SYMBOLIC = [
    SymbolicCase("exp_3d", _sym_exp, lambda a, b: [(a, b, 8)], lambda x: (x.exp(),), ["[8*s0*s1]"]),
    SymbolicCase("bias_over_rows", _sym_bias, lambda a, b: [(a, b), (b,)], lambda x, y: (x + y,), ["[s0, s1]"]),
    SymbolicCase("layer_norm", _sym_layer_norm, lambda a, b: [(a, b, 16), (16,)],
                 lambda x, w: (torch.nn.functional.layer_norm(x, [16], w, None, 1e-5),), ["[s0*s1] x r[16]"]),
    SymbolicCase("sum_trailing", _sym_sum_trailing, lambda a, b: [(a, b, 4)], lambda x: (x.sum((1, 2)),),
                 ["[s0] x r[4*s1]"]),
    SymbolicCase("softmax_last", _sym_softmax, lambda a, b: [(a, 4, b)], lambda x: (torch.softmax(x, -1),),
                 ["[4*s0] x r[s1]"]),
]

SYMBOLIC_PARAMS = [pytest.param(c, id=c.name) for c in SYMBOLIC]
SYMBOLIC_SIZES = [(3, 5), (2, 7)]


def build_symbolic(case: SymbolicCase):
    from fireclay_ir import Graph, Program

    g = Graph("main")
    g.set_outputs(case.graph(g))
    p = Program.single(g)
    p.add_symbol("s0", hint=4, min=2)
    p.add_symbol("s1", hint=6, min=2)
    return p


def assert_results_match(case, got, want) -> None:
    """Outputs of merged kernels against ``want``: eager's, or for a random case the unmerged
    schedule's (random numbers are drawn per flat element, so both draw the same ones)."""
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape
        if case.random:
            assert torch.equal(g, w)
        else:
            torch.testing.assert_close(g, w, atol=1e-5, rtol=1e-5)


def assert_symbolic_matches(run, case, seed: int) -> None:
    """``run(*tensors)`` (one compile of a symbolic case) against eager at every binding."""
    gen = torch.Generator().manual_seed(seed)
    for a, b in SYMBOLIC_SIZES:
        tensors = [torch.randn(shape, generator=gen) for shape in case.shapes(a, b)]
        for g, w in zip(run(*tensors), case.eager(*tensors)):
            torch.testing.assert_close(g, w, atol=1e-5, rtol=1e-5)


def schedule_with(program, merge: bool):
    """``program`` scheduled with loop merging on or off (the config is restored after)."""
    from fireclay_loops import lower, schedule
    from fireclay_loops.config import config

    previous = config.merge_loops
    config.merge_loops = merge
    try:
        return schedule(lower(program))
    finally:
        config.merge_loops = previous
