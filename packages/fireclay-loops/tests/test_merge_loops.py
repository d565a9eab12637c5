"""Merging a kernel's adjacent loops (fireclay_loops.merge_loops): which loops merge, and that the
merged schedules still compute what eager does (reference executor)."""

import pytest

torch = pytest.importorskip("torch")

from merge_programs import (  # noqa: E402
    PARAMS,
    SYMBOLIC_PARAMS,
    SYMBOLIC_SIZES,
    assert_results_match,
    build,
    build_symbolic,
    schedule_with,
    space,
)

from fireclay_ir import dumps, loads  # noqa: E402
from fireclay_loops import exprs, from_program, lower, record_body, schedule, to_program  # noqa: E402
from fireclay_loops.ir import ComputeNode  # noqa: E402
from fireclay_loops.kernel import Kernel, KernelNode  # noqa: E402
from fireclay_loops.merge_loops import merge_kernel_loops, walks_as_one  # noqa: E402
from fireclay_loops.ops import ops  # noqa: E402
from fireclay_loops.reference import run  # noqa: E402


@pytest.mark.parametrize("case", PARAMS)
def test_merged_schedule_matches_eager(case):
    b, program, tensors = build(case)
    scheduled = schedule(lower(program))
    assert [space(k) for k in scheduled.kernels] == case.spaces
    got = run(scheduled, *tensors)
    # random numbers are drawn per flat element: the unmerged schedule must draw the same ones
    want = run(schedule_with(program, False), *tensors) if case.random else b.eager(*tensors)
    assert_results_match(case, got, want)


@pytest.mark.parametrize("case", SYMBOLIC_PARAMS)
def test_symbolic_sizes_merge_only_where_the_rule_holds_for_every_size(case):
    program = build_symbolic(case)
    scheduled = schedule(lower(program))
    assert [space(k) for k in scheduled.kernels] == case.spaces
    gen = torch.Generator().manual_seed(0)
    for a, b in SYMBOLIC_SIZES:
        tensors = [torch.randn(shape, generator=gen) for shape in case.shapes(a, b)]
        for g, w in zip(run(scheduled, *tensors), case.eager(*tensors)):
            torch.testing.assert_close(g, w, atol=1e-5, rtol=1e-5)


def test_the_knob_keeps_the_tensors_loops():
    case = next(p.values[0] for p in PARAMS if p.id == "pointwise_3d_gelu")
    _, program, _ = build(case)
    assert [space(k) for k in schedule_with(program, False).kernels] == ["[4, 6, 10]"]


def test_printed_schedule_shows_the_merged_loop():
    case = next(p.values[0] for p in PARAMS if p.id == "layer_norm_3d")
    _, program, _ = build(case)
    scheduled = schedule(lower(program))
    text = str(scheduled)
    assert "def kernel0(x0 < 24, r0 < 16):  # reduction" in text
    assert "load(in_x0, r0 + 16*x0)" in text
    assert "x1 <" not in text and "FloorDiv" not in text
    # the merged bodies survive the loops dialect's JSON round trip
    assert str(from_program(loads(dumps(to_program(scheduled))))) == text


# --------------------------------------------------------------------------- the rule itself


def _s(name):
    return exprs.symbol(name)


RULE = [
    ("1572864*i0 + 3072*i1 + i2", "i1", "i2", 3072, True),  # a contiguous tensor
    ("1572864*i0 + 3072*i1 + i2", "i0", "i1", 512, True),
    ("2*i1 + 2*s1*i0 + 5", "i0", "i1", "s1", True),  # symbolic extent, offset, scale
    ("s1*i0 + i1", "i0", "i1", 8, False),  # holds only when s1 == 8
    ("s0*s1*i0 + s1*i1", "i0", "i1", "s0", True),
    ("i1", "i0", "i1", 10, False),  # a bias over rows: the rows do not move it
    ("i0", "i0", "i1", 10, False),  # a per-row value
    ("42", "i0", "i1", 10, True),  # neither loop: any extent
    ("i0 + 8*i1", "i0", "i1", 8, False),  # transposed
    ("4*i0 + FloorDiv(i1, 2)", "i0", "i1", 8, False),  # a loop split by a view
    ("i0*i1", "i0", "i1", 8, False),
    ("8*i0*ind0 + i1*ind0", "i0", "i1", 8, False),  # coefficients must not move with the loops
    ("-8*i0 - i1 + 31", "i0", "i1", 8, True),  # flipped: one loop read backwards
]


@pytest.mark.parametrize("expr,u,v,size,expected", RULE, ids=[r[0] for r in RULE])
def test_walks_as_one(expr, u, v, size, expected):
    loops = {_s(n) for n in ("i0", "i1", "i2", "ind0")}
    assert walks_as_one(exprs.parse(expr), _s(u), _s(v), exprs.as_expr(size), loops) is expected


def _kernel(xsizes, rsizes, fn):
    body = record_body(xsizes, rsizes, fn, lambda b: "float32")
    var_map = {v: _s(f"x{k}") for k, v in enumerate(body.vars)} | \
              {r: _s(f"r{k}") for k, r in enumerate(body.reduction_vars)}
    return Kernel("kernel0", [KernelNode(ComputeNode("op0", body), var_map)],
                  [exprs.as_expr(s) for s in xsizes], [exprs.as_expr(s) for s in rsizes])


def _indices(k):
    return [exprs.to_str(i) for kn in k.nodes for _, i, _ in kn.reads() + kn.writes()]


def test_unit_loops_merge_whatever_their_strides():
    def fn(i, r):
        ops.store("out", 8 * i[1] + i[3], ops.load("x", 99 * i[0] + 8 * i[1] + 7 * i[2] + i[3]))

    merged = merge_kernel_loops(_kernel([1, 6, 1, 8], [], fn))
    assert merged.xsizes == [48] and _indices(merged) == ["x0", "x0"]


def test_a_mask_from_loop_indices_keeps_its_loops():
    # out[b, h, i, j] = x[b, h, i, j] where i >= j (a causal mask): batch and heads merge, the
    # rows and columns the mask reads stay loops of their own
    def fn(i, r):
        keep = ops.ge(ops.index_expr(i[2], "int64"), ops.index_expr(i[3], "int64"))
        idx = 192 * i[0] + 64 * i[1] + 8 * i[2] + i[3]
        ops.store("out", idx, ops.where(keep, ops.load("x", idx), ops.constant(0.0, "float32")))

    merged = merge_kernel_loops(_kernel([2, 3, 8, 8], [], fn))
    assert merged.xsizes == [6, 8, 8]
    body = merged.nodes[0].node.body
    masks = [exprs.to_str(op.args[0].xreplace(merged.nodes[0].var_map)) for op in body.ops if op.name == "index_expr"]
    assert masks == ["x1", "x2"] and _indices(merged) == ["64*x0 + 8*x1 + x2"] * 2


def test_reduction_loops_merge_and_keep_their_order():
    def fn(i, r):
        v = ops.reduction("int64", "float32", "argmax", ops.load("x", 20 * i[0] + 5 * r[0] + r[1]))
        ops.store_reduction("out", i[0], v)

    merged = merge_kernel_loops(_kernel([3], [4, 5], fn))
    assert (merged.xsizes, merged.rsizes) == ([3], [20])
    assert _indices(merged) == ["r0 + 20*x0", "x0"]


def test_an_unmapped_or_mixed_node_refuses():
    def fn(i, r):
        ops.store("out", i[0] + 4 * i[1], ops.load("x", 4 * i[0] + i[1]))

    k = _kernel([4, 4], [], fn)
    assert merge_kernel_loops(k) is k  # the store is transposed against the load
