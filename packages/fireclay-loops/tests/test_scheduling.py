"""Kernel counts and fusion decisions for common patterns (no torch needed)."""

from hand import Hand, layer_norm_decomposed, softmax_decomposed, t

from fireclay_ir import DType
from fireclay_loops import exprs, lower, schedule


def kernels(program, **kw):
    s = schedule(lower(program), **kw)
    return s, len(s.kernels), len(s.extern_calls)


def test_softmax_is_one_kernel():
    h = Hand()
    x = h.input("x", 16, 32)
    s, k, e = kernels(h.program(h.op("_softmax.default", x, 1, False, out=t(16, 32))))
    assert (k, e) == (1, 0)
    assert s.kernels[0].kind == "reduction"
    assert s.kernels[0].rsizes == [32]


def test_decomposed_softmax_is_one_kernel():
    h = Hand()
    x = h.input("x", 16, 32)
    _, k, e = kernels(h.program(softmax_decomposed(h, x, 16, 32)))
    assert (k, e) == (1, 0)


def test_layer_norm_is_one_kernel():
    h = Hand()
    x, w, b = h.input("x", 8, 64), h.input("w", 64), h.input("b", 64)
    out = h.op("native_layer_norm.default", x, [64], w, b, 1e-5, out=[t(8, 64), t(8, 1), t(8, 1)])
    s, k, e = kernels(h.program(out[0]))
    assert (k, e) == (1, 0)
    # Everything but the input and the output stays in registers.
    assert set(s.kernels[0].write_buffers()) == set(s.program.outputs)


def test_decomposed_layer_norm_is_one_kernel():
    h = Hand()
    x, w, b = h.input("x", 8, 64), h.input("w", 64), h.input("b", 64)
    s, k, e = kernels(h.program(layer_norm_decomposed(h, x, w, b, 8, 64)))
    assert (k, e) == (1, 0)
    assert len(s.kernels[0].nodes) == 7


def test_gelu_of_matmul_plus_bias_is_extern_and_one_kernel():
    h = Hand()
    x, w, b = h.input("x", 8, 16), h.input("w", 16, 32), h.input("b", 32)
    m = h.op("mm.default", x, w, out=t(8, 32))
    a = h.op("add.Tensor", m, b, out=t(8, 32))
    s, k, e = kernels(h.program(h.op("gelu.default", a, out=t(8, 32))))
    assert (k, e) == (1, 1)
    assert s.steps[0].kind == "extern" and s.steps[0].op == "aten::mm.default"


def test_addmm_then_gelu():
    h = Hand()
    x, w, b = h.input("x", 8, 16), h.input("w", 16, 32), h.input("b", 32)
    m = h.op("addmm.default", b, x, w, out=t(8, 32))
    _, k, e = kernels(h.program(h.op("gelu.default", m, out=t(8, 32))))
    assert (k, e) == (1, 1)


def test_pointwise_chain_never_stores_intermediates():
    h = Hand()
    x = h.input("x", 4, 8)
    v = x
    for op in ("exp.default", "sin.default", "neg.default", "relu.default", "cos.default"):
        v = h.op(op, v, out=t(4, 8))
    s, k, _ = kernels(h.program(v))
    assert k == 1
    assert len(s.kernels[0].internal) == 4
    assert s.bytes_moved == 2 * 4 * 8 * 4


def test_fusion_off_gives_one_kernel_per_node():
    h = Hand()
    x = h.input("x", 4, 8)
    v = x
    for op in ("exp.default", "sin.default", "neg.default"):
        v = h.op(op, v, out=t(4, 8))
    _, k, _ = kernels(h.program(v), fusion=False)
    assert k == 3


def test_horizontal_fusion_of_reductions_over_one_input():
    h = Hand()
    x = h.input("x", 4, 8)
    a = h.op("sum.dim_IntList", x, [1], out=t(4))
    b = h.op("amax.default", x, [1], out=t(4))
    s, k, _ = kernels(h.program(a, b))
    assert k == 1
    assert any(d.kind == "horizontal" and d.action == "fuse" for d in s.decisions)


def test_max_dim_values_and_indices_share_a_kernel():
    h = Hand()
    x = h.input("x", 4, 8)
    v, i = h.op("max.dim", x, 1, out=[t(4), t(4, dtype="int64")])
    _, k, _ = kernels(h.program(v, i))
    assert k == 1


def test_transposed_producer_fuses_by_reordering_loops():
    # sum over dim 0 of exp(x): the reduction walks x column-wise; the pointwise producer is
    # iterated in the reduction's order, so both fit one kernel. (16 rows: a column reduction
    # over a few points is pointwise code, config.unroll_reductions.)
    h = Hand()
    x = h.input("x", 16, 8)
    e = h.op("exp.default", x, out=t(16, 8))
    s, k, _ = kernels(h.program(h.op("sum.dim_IntList", e, [0], out=t(8))))
    assert k == 1
    assert s.kernels[0].xsizes == [8] and s.kernels[0].rsizes == [16]


def test_pointwise_read_at_another_index_is_recomputed():
    # flip(exp(x)) + 1: the add reads exp's buffer backwards, so exp is recomputed inside it.
    h = Hand()
    x = h.input("x", 4, 8)
    e = h.op("exp.default", x, out=t(4, 8))
    f = h.op("flip.default", e, [0, 1], out=t(4, 8))
    s, k, _ = kernels(h.program(h.op("add.Tensor", f, 1.0, out=t(4, 8))))
    assert k == 1
    [why] = [d for d in s.decisions if d.action == "inline"]
    assert (why.first, why.second) == ("op0", "op1")
    assert "load(in_x, 31 - x0)" in str(s)  # both dims flipped: one loop read backwards


def test_broadcast_consumer_recomputes_its_producer():
    h = Hand()
    x, y = h.input("x", 4, 8), h.input("y", 3, 4, 8)
    e = h.op("exp.default", x, out=t(4, 8))
    s, k, _ = kernels(h.program(h.op("mul.Tensor", y, e, out=t(3, 4, 8))))
    assert k == 1
    assert "buf0" not in s.program.buffers


def test_producer_that_is_also_an_output_is_not_recomputed():
    h = Hand()
    x = h.input("x", 4, 8)
    e = h.op("exp.default", x, out=t(4, 8))
    f = h.op("flip.default", e, [0], out=t(4, 8))
    s, k, _ = kernels(h.program(h.op("add.Tensor", f, 1.0, out=t(4, 8)), e))
    assert k == 2
    assert not [d for d in s.decisions if d.action == "inline"]


def test_reduction_read_at_another_index_stays_apart_and_says_why():
    h = Hand()
    x = h.input("x", 4, 8)
    r = h.op("sum.dim_IntList", x, [1], out=t(4))
    f = h.op("flip.default", r, [0], out=t(4))
    s, k, _ = kernels(h.program(h.op("add.Tensor", f, 1.0, out=t(4))))
    assert k == 2
    [why] = [d for d in s.decisions if d.action == "keep apart"]
    assert "reads buf0 at 3 - x0 but it is written at x0" in why.reason


def test_different_reduction_spaces_stay_apart():
    h = Hand()
    x = h.input("x", 4, 8)
    a = h.op("sum.dim_IntList", x, [0], out=t(8))
    b = h.op("sum.dim_IntList", x, [1], out=t(4))
    s, k, _ = kernels(h.program(a, b))
    assert k == 2
    assert any("iteration spaces differ" in d.reason for d in s.decisions)


def test_no_fusion_across_an_extern_call_that_sits_between():
    h = Hand()
    x, w = h.input("x", 8, 8), h.input("w", 8, 8)
    a = h.op("exp.default", x, out=t(8, 8))
    m = h.op("mm.default", a, w, out=t(8, 8))
    c = h.op("mul.Tensor", m, a, out=t(8, 8))
    s, k, e = kernels(h.program(c))
    assert (k, e) == (2, 1)
    assert any("runs between" in d.reason for d in s.decisions)
    assert [type(x).__name__ for x in s.steps] == ["Kernel", "ExternNode", "Kernel"]


def test_reduction_epilogue_and_prologue_fuse():
    # sum(exp(x), 1) * 2 -> prologue exp, reduction, epilogue multiply: one kernel.
    h = Hand()
    x = h.input("x", 4, 8)
    e = h.op("exp.default", x, out=t(4, 8))
    r = h.op("sum.dim_IntList", e, [1], out=t(4))
    s, k, _ = kernels(h.program(h.op("mul.Tensor", r, 2.0, out=t(4))))
    assert k == 1
    kinds = [kn.node.kind for kn in s.kernels[0].nodes]
    assert kinds == ["pointwise", "reduction", "pointwise"]


def test_fallback_keeps_program_running():
    h = Hand()
    x = h.input("x", 4, 8)
    c = h.op("cumsum.default", x, 1, out=t(4, 8))
    s, k, e = kernels(h.program(h.op("exp.default", c, out=t(4, 8))))
    assert (k, e) == (1, 1)
    assert s.steps[0].kind == "fallback"
    assert s.report().fallback_count == 1


def test_report_lists_counts_bytes_and_reasons():
    h = Hand()
    x = h.input("x", 4, 8)
    e = h.op("exp.default", x, out=t(4, 8))
    s = schedule(lower(h.program(h.op("sum.dim_IntList", e, [1], out=t(4)))))
    text = str(s.report())
    assert "kernels: 1, extern calls: 0, fallbacks: 0" in text
    assert f"bytes moved: {4 * 8 * 4 + 4 * 4}" in text
    assert "fuse op0 + op1 (vertical)" in text


def test_value_needed_by_a_later_reduction_loop_is_recomputed_there():
    # In eager's decomposition of softmax, exp(x - max) feeds the sum (loop 1) and the division
    # (loop 2, after the sum is known): a looped reduction cannot keep it in registers, and the
    # division's loop computes it again from x and the max rather than reading it from memory.
    h = Hand()
    x = h.input("x", 4, 8)
    s = schedule(lower(h.program(softmax_decomposed(h, x, 4, 8))))
    [k] = s.kernels
    stages = {kn.node.name: kn.stage for kn in k.nodes}
    assert stages == {"op0": 0, "op1": 1, "op2": 1, "op3": 1, "op4": 2}
    exp_buffer = k.nodes[2].node.write_buffers()[0]
    assert exp_buffer in k.internal and exp_buffer not in s.plan.buffer_allocation
    assert k.nodes[1].node.write_buffers()[0] in k.internal  # x - max: used in its own loop only


def test_independent_ops_without_shared_reads_stay_apart():
    h = Hand()
    x, y = h.input("x", 4, 8), h.input("y", 4, 8)
    a = h.op("exp.default", x, out=t(4, 8))
    b = h.op("sin.default", y, out=t(4, 8))
    s, k, _ = kernels(h.program(a, b))
    assert k == 2
    assert not s.decisions  # no shared buffer: never even a candidate


def test_a_transformer_like_stack_gives_one_kernel_per_layer_norm_block():
    h = Hand()
    x = h.input("x", 16, 64)
    for i in range(24):
        w, g, b = h.input(f"w{i}", 64, 64), h.input(f"g{i}", 64), h.input(f"b{i}", 64)
        y = layer_norm_decomposed(h, x, g, b, 16, 64)
        y = h.op("gelu.default", h.op("mm.default", y, w, out=t(16, 64)), out=t(16, 64))
        x = h.op("add.Tensor", x, y, out=t(16, 64))
    s = schedule(lower(h.program(x)))
    # per layer: layer norm (one kernel), mm (extern), gelu + residual add fused into the next
    # layer norm's kernel; the last gelu + add is a kernel of its own
    assert len(s.kernels) == 25 and len(s.extern_calls) == 24


def test_fusion_sees_through_views_that_split_or_join_loops():
    # add on [2, 3, 8], view as [6, 8], layer norm, view back, relu: one kernel; the add and
    # the relu run over the reduction's loops with x0 split into (x0 // 3, x0 % 3).
    h = Hand()
    x, r, w, b = h.input("x", 2, 3, 8), h.input("r", 2, 3, 8), h.input("w", 8), h.input("b", 8)
    a = h.op("add.Tensor", x, r, out=t(2, 3, 8))
    v = h.op("view.default", a, [6, 8], out=t(6, 8))
    y = layer_norm_decomposed(h, v, w, b, 6, 8)
    o = h.op("relu.default", h.op("view.default", y, [2, 3, 8], out=t(2, 3, 8)), out=t(2, 3, 8))
    s, k, _ = kernels(h.program(o))
    assert k == 1
    assert "load(in_x, r0 + 24*FloorDiv(x0, 3) + 8*(Mod(x0, 3)))" in str(s)


def test_joined_loops_feed_a_reduction_over_split_ones():
    # exp over [6, 8] read by a sum over the last dim of its [2, 3, 8] view
    h = Hand()
    x = h.input("x", 6, 8)
    e = h.op("exp.default", x, out=t(6, 8))
    v = h.op("view.default", e, [2, 3, 8], out=t(2, 3, 8))
    s, k, _ = kernels(h.program(h.op("sum.dim_IntList", v, [2], out=t(2, 3))))
    assert k == 1
    assert s.kernels[0].internal == {"buf0"}


def test_chains_of_recomputed_producers():
    # tanh -> flip -> tanh -> flip: the second tanh is recomputed in its consumer after the
    # first was recomputed in it (found by the random-program test)
    h = Hand()
    x = h.input("x", 4, 6)
    a = h.op("tanh.default", x, out=t(4, 6))
    b = h.op("tanh.default", h.op("flip.default", a, [0], out=t(4, 6)), out=t(4, 6))
    c = h.op("tanh.default", h.op("flip.default", b, [0], out=t(4, 6)), out=t(4, 6))
    s, k, _ = kernels(h.program(c))
    assert k == 1
    assert "load(in_x, x0)" in str(s)  # flipped twice: back where it started (loops merged)


def test_scaled_input_of_a_softmax_is_recomputed_by_each_loop_not_stored():
    # softmax(x * 2): the max, the sum and the normalisation each read the product at the point
    # they are at; a short pointwise writer, so each loop over r computes it again
    h = Hand()
    x = h.input("x", 16, 32)
    y = h.op("mul.Tensor", x, 2.0, out=t(16, 32))
    s, k, _ = kernels(h.program(h.op("_softmax.default", y, 1, False, out=t(16, 32))))
    assert k == 1
    (kernel,) = s.kernels
    product = kernel.nodes[0].node.write_buffers()[0]
    assert product in kernel.internal and product not in s.plan.buffer_allocation


def test_a_buffer_read_at_another_point_by_a_later_loop_is_stored():
    # x * 2 read transposed by the normalisation: a later loop needs it at another point
    h = Hand()
    x = h.input("x", 8, 8)
    y = h.op("mul.Tensor", x, 2.0, out=t(8, 8))
    m = h.op("amax.default", y, [1], True, out=t(8, 1))
    z = h.op("sub.Tensor", h.op("t.default", y, out=t(8, 8)), m, out=t(8, 8))
    s, _, _ = kernels(h.program(z))
    written = {b for kern in s.kernels for kn in kern.nodes for b, _, _ in kn.writes()}
    stored = written - {b for kern in s.kernels for b in kern.internal}
    assert len(stored) >= 2  # the product and the result


def test_chain_before_a_pooling_window_is_recomputed_whole():
    # (x * 2 + 1) -> relu -> 2x2 max pool: the pool reads its input at four shifted indices, so
    # neither producer shares its kernel; both are recomputed in the windows, nothing is stored
    h = Hand()
    x = h.input("x", 2, 4, 8, 8)
    a = h.op("add.Tensor", h.op("mul.Tensor", x, 2.0, out=t(2, 4, 8, 8)), 1.0, out=t(2, 4, 8, 8))
    r = h.op("relu.default", a, out=t(2, 4, 8, 8))
    p, _ = h.op("max_pool2d_with_indices.default", r, [2, 2], [2, 2], out=[t(2, 4, 4, 4), t(2, 4, 4, 4, dtype="int64")])
    s, k, _ = kernels(h.program(p))
    assert k == 1
    assert [b for b in s.program.buffers if not s.program.buffers[b].is_input] == [s.program.outputs[0]]


def test_recomputation_stops_when_the_consumer_has_grown_enough(monkeypatch):
    from fireclay_loops.config import config
    from fireclay_loops.inline import INLINED_BODY_LIMIT

    monkeypatch.setattr(config, "max_inline_ops", 4)  # a short chain reaches the limit
    # a chain of exp nodes read by a flip: each recomputed copy adds a few ops to the consumer
    h = Hand()
    x = h.input("x", 4, 8)
    v = x
    for _ in range(INLINED_BODY_LIMIT * config.max_inline_ops):
        v = h.op("exp.default", v, out=t(4, 8))
    f = h.op("flip.default", v, [0], out=t(4, 8))
    s, k, _ = kernels(h.program(h.op("add.Tensor", f, 1.0, out=t(4, 8))))
    inlined = [d for d in s.decisions if d.action == "inline"]
    assert inlined and k >= 2  # some of the chain recomputed in the consumer, the rest stored
    biggest = max(len(kn.node.body.ops) for kern in s.kernels for kn in kern.nodes)
    assert biggest <= INLINED_BODY_LIMIT * config.max_inline_ops + config.max_inline_ops


def _reduction_loops_ok(kernel) -> bool:
    """Every reduction node of ``kernel`` reduces over exactly the kernel's reduction loops."""
    rvars = set(kernel.rvars)
    for kn in kernel.nodes:
        if kn.node.kind != "reduction":
            continue
        body = kn.node.body
        outer = set().union(*(kn.var_map[v].free_symbols for v in body.vars))
        inner = set().union(*(kn.var_map[v].free_symbols for v in body.reduction_vars))
        if outer & rvars or inner != rvars:
            return False
    return True


def test_a_reduction_over_extent_one_dims_never_runs_as_another_reductions_loop():
    # ConvNeXt's pooling of a 1x1 feature map: the mean over [H, W] = [1, 1] has no loop of its
    # own; the layer norm after it reduces over the channels. Fused as pointwise, the mean's
    # channel loop became the layer norm's reduction loop and the mean summed over channels.
    h = Hand()
    x, w, b = h.input("x", 2, 64, 1, 1), h.input("w", 64), h.input("b", 64)
    pooled = h.op("mean.dim", x, [-2, -1], out=t(2, 64))
    out = h.op("native_layer_norm.default", pooled, [64], w, b, 1e-6, out=[t(2, 64), t(2, 1), t(2, 1)])
    s, _, _ = kernels(h.program(out[0]))
    assert all(_reduction_loops_ok(k) for k in s.kernels)
    assert any(k.rsizes == [64] for k in s.kernels)


def test_reductions_over_extent_one_dims_still_fuse_with_their_pointwise_neighbours():
    h = Hand()
    x = h.input("x", 8, 1, 16)
    e = h.op("exp.default", x, out=t(8, 1, 16))
    s1 = h.op("sum.dim_IntList", e, [1], False, out=t(8, 16))
    s, k, _ = kernels(h.program(h.op("neg.default", s1, out=t(8, 16))))
    assert k == 1
    assert all(_reduction_loops_ok(kern) for kern in s.kernels)


def test_ops_on_complex_tensors_are_library_calls():
    # Loop bodies have no complex arithmetic: a cast to complex, an FFT, a complex product and
    # the view back to real numbers are all calls; only real-valued math becomes kernels.
    h = Hand()
    x = h.input("x", 4, 8)
    z = h.op("_to_copy.default", x, dtype=DType("complex64"), out=t(4, 8, dtype="complex64"))
    f = h.op("_fft_c2c.default", z, [1], 0, True, out=t(4, 8, dtype="complex64"))
    p = h.op("mul.Tensor", f, z, out=t(4, 8, dtype="complex64"))
    r = h.op("view_as_real.default", p, out=t(4, 8, 2))
    s, _, _ = kernels(h.program(h.op("add.Tensor", h.op("select.int", r, 2, 0, out=t(4, 8)), x, out=t(4, 8))))
    ops = [step.op for step in s.extern_calls]
    assert ops == ["aten::_to_copy.default", "aten::_fft_c2c.default", "aten::mul.Tensor",
                   "aten::view_as_real.default"]
    complex_bufs = {n for n, b in s.program.buffers.items() if b.dtype == "complex64"}
    for k in s.kernels:
        assert not (set(k.read_buffers()) | set(k.write_buffers())) & complex_bufs


def test_a_loss_backward_one_hot_fuses_into_its_kernel():
    # nll_loss's backward: zeros.scatter(1, target, -1) times the upstream gradient, then the
    # log_softmax backward's row sum: one kernel, no scatter call and no tensor of the logits' size
    h = Hand()
    g = h.input("g", 6, 50)
    target = h.input("target", 6, 1, dtype="int64")
    zeros = h.op("full.default", [6, 50], 0.0, out=t(6, 50))
    one_hot = h.op("scatter.value", zeros, 1, target, -1.0, out=t(6, 50))
    grad = h.op("mul.Tensor", one_hot, g, out=t(6, 50))
    total = h.op("sum.dim_IntList", grad, [1], True, out=t(6, 1))
    s, k, e = kernels(h.program(h.op("sub.Tensor", grad, total, out=t(6, 50))))
    assert (k, e) == (1, 0)
    assert s.report().fallback_count == 0


def test_a_cast_read_by_later_loops_through_a_view_is_recomputed_not_stored():
    # softmax over rows of a half-precision tensor viewed [2, 32, 50] -> [64, 50]: the float32 cast
    # is written at 1600*(x // 32) + 50*(x % 32) + r and read at 50*x + r, the same place. The
    # max, the sum and the normalisation loops each compute it again from the input.
    h = Hand()
    x = h.input("x", 2, 32, 50, dtype="float16")
    c = h.op("_to_copy.default", x, dtype="float32", out=t(2, 32, 50))
    v = h.op("view.default", c, [64, 50], out=t(64, 50))
    out = softmax_decomposed(h, v, 64, 50)
    s, k, e = kernels(h.program(out))
    assert (k, e) == (1, 0)
    kernel = s.kernels[0]
    stored = {b for kn in kernel.nodes for b, _, _ in kn.writes()} - set(kernel.internal)
    assert len(stored) == 1, stored  # the result alone


def test_a_view_regroup_never_mixes_a_reductions_outer_and_reduction_loops():
    # Swin's patch-merging gradient ([2, 16, 16, 32]) has the numel of a layer norm's column
    # sums ([128] x r[2, 64]); mapped onto them as one flat index, every load took divisions
    # and remainders of all three loops and nothing vectorised.
    from fireclay_loops.scheduler import _regrouped_map

    x0, r0, r1 = (exprs.symbol(n) for n in ("x0", "r0", "r1"))
    assert _regrouped_map([2, 16, 16, 32], [x0, r0, r1], [128, 2, 64], 1) is None
    # a view of the outer loops alone, or of the reduction loops alone, is still matched
    split = _regrouped_map([2, 3, 8], [x0, r0], [6, 8], 1)
    assert split is not None and set(split) == {exprs.symbol("x0"), exprs.symbol("x1"), exprs.symbol("x2")}
