"""The op table: each aten op is lowered, scheduled and run by the reference executor, and must
match eager on fresh random inputs."""

import pytest

torch = pytest.importorskip("torch")

from aten_builder import AtenBuilder, T  # noqa: E402

from fireclay_loops import lower, schedule  # noqa: E402
from fireclay_loops.reference import run  # noqa: E402

F64 = torch.float64
I64 = torch.int64
BOOL = torch.bool


def case(op, *args, id=None, atol=1e-5, rtol=1e-5, first_only=False, **kwargs):
    # first_only: eager and the meta kernel disagree on the shapes of the op's other outputs
    return pytest.param(op, args, kwargs, atol, rtol, first_only, id=id or op)


A = T(4, 8)
B = T(4, 8)
POS = T(4, 8, fill="pos")
UNIT = T(4, 8, fill="unit")

UNARY = ["abs", "neg", "exp", "exp2", "expm1", "sin", "cos", "tan", "atan", "sinh", "cosh", "tanh",
         "asinh", "erf", "erfc", "sigmoid", "relu", "floor", "ceil", "round", "trunc", "sign",
         "frac", "isnan", "isinf", "isfinite", "silu", "mish", "hardsigmoid", "hardswish", "gelu",
         "logical_not"]
UNARY_POS = ["log", "log2", "log10", "log1p", "sqrt", "rsqrt", "reciprocal", "lgamma", "acosh"]
UNARY_UNIT = ["asin", "acos", "atanh"]

CASES = (
    [case(f"{op}.default", A) for op in UNARY]
    + [case(f"{op}.default", POS) for op in UNARY_POS]
    + [case(f"{op}.default", UNIT) for op in UNARY_UNIT]
    + [
        case("add.Tensor", A, B),
        case("add.Tensor", A, T(8), id="add.broadcast_row"),
        case("add.Tensor", T(4, 1), T(1, 8), id="add.broadcast_outer"),
        case("add.Tensor", A, B, alpha=2.5, id="add.alpha"),
        case("add.Scalar", A, 3.0),
        case("add.Tensor", T(4, 8, dtype=I64), T(4, 8), id="add.promote_int_float"),
        case("add.Tensor", T(4, 8, dtype=I64), T(4, 8, dtype=I64), id="add.int64"),
        case("add.Tensor", T(4, 8, dtype=F64), T(4, 8), id="add.promote_f64"),
        case("sub.Tensor", A, B),
        case("sub.Tensor", A, B, alpha=0.5, id="sub.alpha"),
        case("rsub.Scalar", A, 2.0),
        case("mul.Tensor", A, B),
        case("mul.Tensor", T(4, 8, dtype=BOOL), A, id="mul.bool_float"),
        case("mul.Scalar", A, -1.5),
        case("div.Tensor", A, POS),
        case("div.Tensor", T(4, 8, dtype=I64), T(4, 8, dtype=I64, low=1), id="div.int_true"),
        case("div.Tensor_mode", A, POS, rounding_mode="floor", id="div.floor"),
        case("div.Tensor_mode", A, POS, rounding_mode="trunc", id="div.trunc"),
        case("div.Tensor_mode", T(4, 8, dtype=I64, low=-9), T(4, 8, dtype=I64, low=1), rounding_mode="trunc",
             id="div.int_trunc"),
        case("div.Scalar", A, 3.0),
        case("pow.Tensor_Scalar", A, 2),
        case("pow.Tensor_Scalar", POS, 1.7, id="pow.fractional"),
        case("pow.Tensor_Scalar", A, 3.0, id="pow.cube"),
        case("pow.Tensor_Scalar", A, 7, id="pow.seventh"),
        case("pow.Tensor_Scalar", POS, -2.0, id="pow.minus_two", rtol=1e-4),
        case("pow.Tensor_Scalar", POS, -0.5, id="pow.minus_half"),
        case("pow.Tensor_Scalar", A, 1, id="pow.one"),
        case("pow.Tensor_Tensor", POS, UNIT),
        case("pow.Scalar", 2.0, A),
        case("maximum.default", A, B),
        case("minimum.default", A, B),
        case("remainder.Tensor", A, POS),
        case("remainder.Scalar", T(4, 8, dtype=I64, low=-20, high=20), 7, id="remainder.int"),
        case("fmod.Tensor", A, POS),
        case("atan2.default", A, B),
        case("floor_divide.default", T(4, 8, dtype=I64, low=-20, high=20), T(4, 8, dtype=I64, low=1)),
        case("copysign.Tensor", A, B),
        case("eq.Tensor", T(4, 8, dtype=I64, high=3), T(4, 8, dtype=I64, high=3)),
        case("ne.Scalar", T(4, 8, dtype=I64, high=3), 1),
        case("lt.Tensor", A, B),
        case("le.Scalar", A, 0.0),
        case("gt.Tensor", A, T(8), id="gt.broadcast"),
        case("ge.Scalar", T(4, 8, dtype=I64), 5),
        case("logical_and.default", T(4, 8, dtype=BOOL), T(4, 8, dtype=BOOL)),
        case("logical_or.default", T(4, 8, dtype=BOOL), A),
        case("logical_xor.default", T(4, 8, dtype=BOOL), T(4, 8, dtype=BOOL)),
        case("bitwise_and.Tensor", T(4, 8, dtype=I64, high=64), T(4, 8, dtype=I64, high=64)),
        case("bitwise_or.Tensor", T(4, 8, dtype=BOOL), T(4, 8, dtype=BOOL)),
        case("bitwise_xor.Scalar", T(4, 8, dtype=I64, high=64), 5),
        case("bitwise_not.default", T(4, 8, dtype=I64, high=64)),
        case("where.self", T(4, 8, dtype=BOOL), A, B),
        case("where.self", T(4, 1, dtype=BOOL), A, T(8), id="where.broadcast"),
        case("masked_fill.Scalar", A, T(4, 8, dtype=BOOL), -1.0),
        case("clamp.default", A, -0.5, 0.5),
        case("clamp.default", A, None, 0.2, id="clamp.max_only"),
        case("clamp.Tensor", A, T(4, 8), None, id="clamp.tensor_min"),
        case("clamp_min.default", A, 0.1),
        case("clamp_max.default", A, 0.1),
        case("hardtanh.default", A, -0.3, 0.6),
        case("threshold.default", A, 0.1, 20.0),
        case("leaky_relu.default", A, 0.2),
        case("elu.default", A, 1.3),
        case("softplus.default", A, 2.0, 5.0),
        case("gelu.default", A, approximate="tanh", id="gelu.tanh"),
        case("lerp.Scalar", A, B, 0.3),
        case("addcmul.default", A, B, T(4, 8), value=0.5),
        case("addcdiv.default", A, B, POS, value=2.0),
        case("_to_copy.default", A, dtype=torch.float64, id="to_copy.f64"),
        case("_to_copy.default", A, dtype=torch.int64, id="to_copy.int64"),
        case("_to_copy.default", T(4, 8, dtype=I64), dtype=torch.float32, id="to_copy.from_int"),
        case("clone.default", T(4, 8, transposed=True), id="clone.transposed_input"),
        case("copy.default", A, B),
        case("copy.default", A, T(8), id="copy.broadcast_src"),
        case("copy.default", T(4, 8, dtype=F64), T(4, 8, dtype=I64), id="copy.int_into_f64"),
        case("copy.default", T(4, 8, transposed=True), B, id="copy.into_transposed"),
        case("nan_to_num.default", A),
        # reductions
        case("sum.default", A),
        case("sum.dim_IntList", A, [1]),
        case("sum.dim_IntList", T(3, 4, 5), [0, 2], True, id="sum.dims_keepdim"),
        case("sum.dim_IntList", T(4, 8, dtype=I64), [0], id="sum.int"),
        case("sum.dim_IntList", T(4, 8, dtype=BOOL), [1], id="sum.bool"),
        case("sum.dim_IntList", T(4, 8, transposed=True), [1], id="sum.transposed_input"),
        case("mean.default", A),
        case("mean.dim", T(3, 4, 5), [-1], True, id="mean.keepdim"),
        case("mean.dim", T(3, 4, 5), [0, 1], id="mean.outer_dims"),
        case("prod.default", UNIT),
        case("prod.dim_int", UNIT, 1),
        case("amax.default", A, [1]),
        case("amax.default", T(3, 4, 5), [0, 2], True, id="amax.keepdim"),
        case("amin.default", A, [0]),
        case("max.default", A),
        case("min.default", A),
        case("argmax.default", A, 1),
        case("argmax.default", A, id="argmax.flat"),
        case("argmin.default", T(3, 4, 5), 0, True, id="argmin.keepdim"),
        case("max.dim", A, 1),
        case("min.dim", T(3, 4, 5), 1, True, id="min.dim_keepdim"),
        case("any.dim", T(4, 8, dtype=BOOL), 1),
        case("any.default", T(4, 8, dtype=I64, high=2)),
        case("all.dim", T(4, 8, dtype=BOOL), 0),
        case("all.default", T(4, 8, dtype=BOOL)),
        case("var.correction", A, [1], id="var.dim"),
        case("var.correction", T(3, 4, 5), [0, 2], correction=0, keepdim=True, id="var.population"),
        case("std.correction", A, [0], id="std.dim"),
        case("std.correction", A, id="std.all"),
        case("var_mean.correction", T(3, 4, 5), [2], correction=1),
        case("_softmax.default", A, 1, False),
        case("_softmax.default", T(3, 4, 5), 0, False, id="softmax.dim0"),
        case("_log_softmax.default", A, -1, False),
        case("logsumexp.default", T(3, 4, 5), [1]),
        case("native_layer_norm.default", A, [8], T(8), T(8), 1e-5),
        case("native_layer_norm.default", T(2, 3, 8), [3, 8], None, None, 1e-5, id="layer_norm.2d_no_affine"),
        # views
        case("view.default", A, [8, 4]),
        case("view.default", T(2, 3, 4), [6, 4], id="view.merge"),
        case("reshape.default", T(4, 8, transposed=True), [32], id="reshape.transposed_input"),
        case("reshape.default", T(2, 3, 4), [4, 6], id="reshape.contiguous"),
        case("permute.default", T(2, 3, 4), [2, 0, 1]),
        case("transpose.int", A, 0, 1),
        case("t.default", A),
        case("expand.default", T(4, 1), [4, 8]),
        case("expand.default", T(8), [3, 4, 8], id="expand.new_dims"),
        case("slice.Tensor", A, 1, 2, 7),
        case("slice.Tensor", A, 0, 1, 4, 2, id="slice.step"),
        case("slice.Tensor", A, 1, -3, 9223372036854775807, id="slice.negative_start"),
        case("slice.Tensor", A, 0, -512, 9223372036854775807, id="slice.start_before_the_first"),
        case("select.int", A, 1, 3),
        case("select.int", T(3, 4, 5), 0, -1, id="select.negative"),
        case("squeeze.dim", T(4, 1, 8), 1),
        case("squeeze.dims", T(1, 4, 1, 8), [0, 2]),
        case("unsqueeze.default", A, 1),
        case("unsqueeze.default", A, -1, id="unsqueeze.last"),
        case("as_strided.default", T(4, 8), [3, 3], [8, 2], 1),
        case("diagonal.default", T(5, 5), 1),
        case("flip.default", A, [0, 1]),
        case("repeat.default", T(2, 3), [2, 1, 2]),
        case("split.Tensor", T(7, 4), 3),
        case("unbind.int", T(3, 4), 0),
        case("narrow.default", A, 1, 2, 3),
        case("alias.default", A),
        # indexing and data movement
        case("gather.default", A, 1, T(4, 5, dtype=I64, high=8)),
        case("index_select.default", A, 0, T(6, dtype=I64, high=4)),
        case("embedding.default", T(10, 6), T(3, 5, dtype=I64, high=10)),
        case("index.Tensor", A, [T(5, dtype=I64, high=4)], id="index.first_dim"),
        case("index.Tensor", T(3, 4, 5), [None, T(2, 6, dtype=I64, high=4)], id="index.middle"),
        case("index.Tensor", T(3, 4, 5), [T(6, dtype=I64, high=3), None, T(6, dtype=I64, high=5)],
             id="index.non_adjacent"),
        case("index.Tensor", A, [T(5, dtype=I64, low=-4, high=4)], id="index.negative"),
        case("cat.default", [A, T(2, 8), T(3, 8)], 0),
        case("cat.default", [A, T(4, 3)], 1, id="cat.dim1"),
        case("stack.default", [A, B, T(4, 8)], 1),
        case("constant_pad_nd.default", A, [1, 2, 3, 0], 0.5),
        case("constant_pad_nd.default", A, [-1, 2], id="pad.negative"),
        # constants and ranges
        case("full.default", [3, 4], 2.5, dtype=torch.float32, device=torch.device("cpu")),
        case("zeros_like.default", A),
        case("ones_like.default", T(4, 8, dtype=I64)),
        case("full_like.default", A, 7.0),
        case("arange.start_step", 2, 20, 3, dtype=torch.int64, device=torch.device("cpu")),
        case("arange.start_step", 0.5, 3.0, 0.25, dtype=torch.float32, device=torch.device("cpu"), id="arange.float"),
        case("scalar_tensor.default", 3.5, dtype=torch.float32),
        # extern calls and fallbacks
        case("mm.default", T(4, 6), T(6, 5), atol=1e-4),
        case("bmm.default", T(2, 4, 6), T(2, 6, 3), atol=1e-4),
        case("addmm.default", T(5), T(4, 6), T(6, 5), atol=1e-4),
        case("convolution.default", T(1, 2, 6, 6), T(3, 2, 3, 3), T(3), [1, 1], [1, 1], [1, 1], False, [0, 0], 1,
             atol=1e-4),
        case("_scaled_dot_product_flash_attention_for_cpu.default", T(1, 2, 4, 8), T(1, 2, 4, 8), T(1, 2, 4, 8),
             atol=1e-4, id="sdpa"),
        case("cumsum.default", A, 1, id="fallback.cumsum"),
        case("sort.default", A, 1, id="fallback.sort"),
    ]
    # other dtypes
    + [case(f"{op}.default", T(4, 8, dtype=F64), id=f"{op}.f64") for op in ("exp", "tanh", "gelu", "sigmoid", "erf")]
    + [case(f"{op}.default", T(4, 8, dtype=I64, low=-5, high=5), id=f"{op}.int64") for op in ("abs", "neg", "sign")]
    + [
        case("sum.dim_IntList", T(4, 8, dtype=F64), [1], id="sum.f64"),
        case("_softmax.default", T(4, 8, dtype=F64), 1, False, id="softmax.f64"),
        case("var.correction", T(4, 8, dtype=F64), [1], id="var.f64"),
        case("add.Tensor", T(4, 8, dtype=torch.float16), T(4, 8, dtype=torch.float16), atol=1e-3, rtol=1e-3,
             id="add.f16"),
        case("gelu.default", T(4, 8, dtype=torch.bfloat16), atol=1e-2, rtol=1e-2, id="gelu.bf16"),
        case("sum.dim_IntList", T(4, 8, dtype=torch.bfloat16), [1], atol=5e-2, rtol=1e-2, id="sum.bf16"),
        case("prod.dim_int", T(4, 5, dtype=I64, low=1, high=4), 1, id="prod.int64"),
        case("any.dim", A, 1, id="any.float"),
        case("all.dim", T(4, 8, dtype=I64, high=2), 1, id="all.int"),
        case("argmax.default", T(4, 8, dtype=I64, high=4), 1, id="argmax.int_ties"),
        case("pow.Tensor_Scalar", T(4, 8, dtype=I64, high=5), 3, id="pow.int"),
        case("bitwise_or.Tensor", T(4, 8, dtype=I64, high=64), T(8, dtype=I64, high=64), id="bitwise_or.broadcast"),
        case("remainder.Tensor", T(4, 8), T(4, 8, fill="pos"), id="remainder.negative_dividend"),
        case("logical_and.default", T(4, 8, dtype=I64, high=3), A, id="logical_and.int_float"),
        # zero-dim tensors take part in promotion as the weaker side
        case("add.Tensor", T(4, 8, dtype=torch.float16), T(dtype=F64), atol=1e-3, rtol=1e-3, id="add.zero_dim_f64"),
        case("mul.Tensor", T(4, 8, dtype=I64), T(), id="mul.int_by_zero_dim_float"),
        case("sum.default", T(), id="sum.zero_dim"),
        case("exp.default", T(), id="exp.zero_dim"),
        # non-contiguous inputs
        case("add.Tensor", T(4, 8, transposed=True), B, id="add.transposed_input"),
        case("_softmax.default", T(4, 8, transposed=True), 1, False, id="softmax.transposed_input"),
        case("amax.default", T(4, 8, transposed=True), [0], id="amax.transposed_input"),
        case("native_layer_norm.default", T(4, 8, transposed=True), [8], T(8), None, 1e-5,
             id="layer_norm.transposed_weight_only"),
        case("permute.default", T(4, 8, transposed=True), [1, 0], id="permute.transposed_input"),
        case("select.int", T(4, 8, transposed=True), 0, 2, id="select.transposed_input"),
        case("as_strided.default", T(4, 8, transposed=True), [2, 4], [1, 4], 2, id="as_strided.transposed_input"),
        case("mm.default", T(4, 6, transposed=True), T(6, 5, transposed=True), atol=1e-4, id="mm.transposed_inputs"),
        # more views and data movement
        case("expand.default", T(1, 8), [4, -1], id="expand.minus_one"),
        case("slice.Tensor", A, 1, 0, -2, id="slice.negative_end"),
        case("squeeze.default", T(1, 4, 1, 8)),
        case("unsqueeze.default", A, 0, id="unsqueeze.first"),
        case("view.default", T(2, 12), [2, 3, 4], id="view.split_dim"),
        case("index_select.default", T(3, 7), 1, T(4, dtype=I64, high=7), id="index_select.dim1"),
        case("gather.default", T(5, 3), 0, T(2, 3, dtype=I64, high=5), id="gather.dim0"),
        # one position per line (a loss's one-hot of its targets): pointwise; any other shape: the library op
        case("scatter.value", A, 1, T(4, 1, dtype=I64, high=8), -1.0, id="scatter.value_one_per_row"),
        case("scatter.value", A, 0, T(1, 8, dtype=I64, high=4), 2, id="scatter.value_one_per_column"),
        case("scatter.value", T(4, 8, dtype=I64), -1, T(4, 1, dtype=I64, high=8), 7, id="scatter.value_int"),
        case("scatter.value", T(4, 8, dtype=BOOL), 1, T(4, 1, dtype=I64, high=8), True, id="scatter.value_bool"),
        case("scatter.value", T(2, 3, 5), 2, T(2, 3, 1, dtype=I64, high=5), 0.5, id="scatter.value_3d"),
        case("scatter.src", A, 1, T(4, 1, dtype=I64, high=8), B, id="scatter.src_one_per_row"),
        case("scatter.src", A, 1, T(4, 1, dtype=I64, high=8), T(5, 3), id="scatter.src_larger_src"),
        case("scatter.value", A, 1, T(4, 3, dtype=I64, high=8), 2.0, id="scatter.value_several_per_row"),
        case("scatter.value", A, 1, T(2, 1, dtype=I64, high=8), 2.0, id="scatter.value_part_of_x"),
        case("embedding.default", T(10, 4), T(6, dtype=I64, high=10), id="embedding.flat_ids"),
        case("cat.default", [T(2, 3), T(2, 4), T(2, 1)], -1, id="cat.last_dim"),
        case("stack.default", [A, B], 0, id="stack.dim0"),
        case("constant_pad_nd.default", T(2, 3, 4), [1, 1, 2, 0, 0, 1], -2.0, id="pad.3d"),
        case("repeat.default", T(3), [2, 2], id="repeat.new_dim"),
        case("masked_fill.Scalar", T(4, 8, dtype=I64), T(8, dtype=BOOL), 5, id="masked_fill.int_broadcast"),
        case("where.self", T(4, 8, dtype=BOOL), T(4, 8, dtype=I64), T(4, 8), id="where.promote"),
        case("clamp.default", T(4, 8, dtype=I64, low=-9), -3, 4, id="clamp.int"),
        case("arange.default", 7, dtype=torch.int64, device=torch.device("cpu"), id="arange.end"),
        case("arange.start", -3, 4, dtype=torch.float32, device=torch.device("cpu"), id="arange.float_start"),
        case("zeros.default", [2, 3], dtype=torch.int64, device=torch.device("cpu")),
        case("ones.default", [3], dtype=torch.float32, device=torch.device("cpu")),
        case("full_like.default", T(4, 8, dtype=I64), 3, id="full_like.int"),
        case("_log_softmax.default", T(3, 4, 5), 0, False, id="log_softmax.dim0"),
        case("logsumexp.default", T(3, 4, 5), [0, 2], True, id="logsumexp.keepdim"),
        case("_scaled_dot_product_flash_attention_for_cpu.default", T(1, 2, 4, 8), T(1, 2, 4, 8), T(1, 2, 4, 8),
             is_causal=True, atol=1e-4, id="sdpa.causal"),
        case("native_layer_norm_backward.default", T(4, 8), T(4, 8), [8], T(4, 1), T(4, 1, fill="pos"), T(8), T(8),
             [True, True, True], atol=1e-4, id="layer_norm_backward"),
        case("native_layer_norm_backward.default", T(2, 3, 8), T(2, 3, 8), [3, 8], T(2, 1, 1), T(2, 1, 1, fill="pos"),
             None, None, [True, False, False], atol=1e-4, id="layer_norm_backward.2d_no_affine", first_only=True),
        case("native_layer_norm_backward.default", T(8), T(8), [8], T(1), T(1, fill="pos"), T(8), T(8),
             [True, True, True], atol=1e-4, id="layer_norm_backward.one_row"),
        case("native_layer_norm_backward.default", T(4, 8, transposed=True), T(4, 8), [8], T(4, 1),
             T(4, 1, fill="pos"), T(8), T(8), [True, True, True], atol=1e-4, id="layer_norm_backward.transposed_grad"),
        case("_native_batch_norm_legit_no_training.default", T(2, 3, 4, 4), T(3), T(3), T(3), T(3, fill="pos"),
             0.1, 1e-5, id="batch_norm.inference", first_only=True),
        case("_native_batch_norm_legit.no_stats", T(4, 3, 5), T(3), T(3), True, 0.1, 1e-5, atol=1e-4,
             id="batch_norm.training"),
        case("index_put.default", T(5, 3), [T(4, dtype=I64, high=5)], T(4, 3), id="fallback.index_put_no_accumulate"),
        case("scatter.src", T(4, 5), 1, T(4, 2, dtype=I64, high=5), T(4, 2), id="fallback.scatter"),
        # scatter-adds: one loop node adding at indices read from a tensor (ops.store_add);
        # indices repeat (12 of 5 rows), so several points add at one element
        case("index_put.default", T(5, 3), [T(12, dtype=I64, high=5)], T(12, 3), True, id="index_put.accumulate"),
        case("index_put.default", T(5, 3), [T(12, dtype=I64, low=-5, high=5)], T(12, 3), True,
             id="index_put.accumulate_negative"),
        case("_unsafe_index_put.default", T(5, 3), [T(12, dtype=I64, high=5)], T(12, 3), True,
             id="unsafe_index_put.accumulate"),
        case("index_put.default", T(5, 3), [T(8, dtype=I64, high=5)], T(3), True, id="index_put.accumulate_row_value"),
        case("index_put.default", T(4, 5, 3), [T(9, dtype=I64, high=4), T(9, dtype=I64, high=5)], T(9, 3), True,
             id="index_put.accumulate_two_indices"),
        case("index_put.default", T(4, 5), [T(3, 1, dtype=I64, high=4), T(1, 6, dtype=I64, high=5)], T(3, 6), True,
             id="index_put.accumulate_broadcast_indices"),
        case("index_put.default", T(4, 3, 5), [T(7, dtype=I64, high=4), None, T(7, dtype=I64, high=5)], T(7, 3), True,
             id="index_put.accumulate_apart"),
        case("index_put.default", T(3, 7, 2), [None, T(9, dtype=I64, high=7)], T(3, 9, 2), True,
             id="index_put.accumulate_inner_dim"),
        case("index_put.default", T(13, 4), [T(49, 49, dtype=I64, high=13)], T(49, 49, 4), True,
             id="index_put.accumulate_relative_position_bias"),
        case("index_put.default", T(5, 3, dtype=F64), [T(12, dtype=I64, high=5)], T(12, 3, dtype=F64), True,
             id="index_put.accumulate_float64"),
        case("index_put.default", T(5, 3, dtype=torch.bfloat16), [T(12, dtype=I64, high=5)],
             T(12, 3, dtype=torch.bfloat16), True, atol=3e-2, rtol=2e-2, id="index_put.accumulate_bfloat16"),
        case("index_put.default", T(5, 3, dtype=torch.float16), [T(12, dtype=I64, high=5)],
             T(12, 3, dtype=torch.float16), True, atol=3e-3, rtol=2e-3, id="index_put.accumulate_float16"),
        case("index_put.default", T(5, 3, dtype=I64), [T(12, dtype=I64, high=5)], T(12, 3, dtype=I64), True,
             id="index_put.accumulate_int64"),
        case("index_put.default", T(5, 3, dtype=torch.int8), [T(12, dtype=I64, high=5)], T(12, 3, dtype=torch.int8),
             True, id="index_put.accumulate_int8"),
        case("index_put.default", T(5, 3), [T(12, dtype=torch.int32, high=5)], T(12, 3), True,
             id="index_put.accumulate_int32_indices"),
        case("index_add.default", T(5, 3), 0, T(7, dtype=I64, high=5), T(7, 3), id="index_add.dim0"),
        case("index_add.default", T(3, 6), 1, T(9, dtype=I64, high=6), T(3, 9), alpha=2.5, id="index_add.dim1_alpha"),
        case("index_add.default", T(5, 3, dtype=I64), 0, T(7, dtype=I64, high=5), T(7, 3, dtype=I64),
             id="index_add.int64"),
        case("scatter_add.default", T(4, 5), 1, T(4, 7, dtype=I64, high=5), T(4, 7), id="scatter_add.dim1"),
        case("scatter_add.default", T(4, 5), 0, T(6, 3, dtype=I64, high=4), T(7, 5), id="scatter_add.dim0_larger_src"),
        case("embedding_dense_backward.default", T(2, 6, 4), T(2, 6, dtype=I64, high=10), 10, -1, False,
             id="embedding_dense_backward"),
        case("embedding_dense_backward.default", T(2, 6, 4), T(2, 6, dtype=I64, high=10), 10, 3, False,
             id="embedding_dense_backward.padding_idx"),
        case("embedding_dense_backward.default", T(12, 4, dtype=torch.bfloat16), T(12, dtype=I64, high=5), 5, -1,
             False, atol=3e-2, rtol=2e-2, id="embedding_dense_backward.bfloat16"),
        case("embedding_dense_backward.default", T(2, 6, 4), T(2, 6, dtype=I64, high=10), 10, -1, True,
             id="fallback.embedding_dense_backward_scale_grad_by_freq"),
        case("topk.default", T(4, 8), 3, id="fallback.topk_two_outputs"),
        case("max_pool2d_with_indices.default", T(2, 3, 8, 8), [2, 2], [2, 2], id="max_pool2d.2x2"),
        case("max_pool2d_with_indices.default", T(1, 2, 7, 9), [3, 3], [2, 2], [1, 1], [1, 1], True,
             id="max_pool2d.pad_ceil"),
        case("max_pool2d_with_indices.default", T(3, 10, 6), [3, 2], [1, 2], [1, 0], [2, 1], id="max_pool2d.3d_dilated"),
        case("sum.dim_IntList", T(4, 1, 8), [1], id="sum.size_one_dim"),
        case("argmax.default", T(4, 1), 1, id="argmax.size_one_dim"),
        case("var_mean.correction", T(4, 1), [1], correction=0, id="var_mean.size_one_dim"),
        case("amax.default", T(2, 3, 4), [0, 1, 2], id="amax.all_dims"),
        case("diagonal.default", T(4, 6), -1, id="diagonal.negative_offset"),
        case("unfold.default", T(2, 3, 10), -1, 4, 2, id="unfold.last_dim"),
        case("unfold.default", T(2, 9, 3), 1, 3, 3, id="unfold.middle_dim"),
        case("diagonal.default", T(2, 3, 3), 0, 1, 2, id="diagonal.batched"),
        case("baddbmm.default", T(2, 4, 3), T(2, 4, 5), T(2, 5, 3), beta=0.5, alpha=2.0, atol=1e-4),
        # writes through views, functionalized (the backward of slices and of a rotary embedding)
        case("slice_scatter.default", T(4, 8), T(4, 3), 1, 2, 5, id="slice_scatter.middle"),
        case("slice_scatter.default", T(2, 3, 8), T(2, 3, 4), -1, 4, 9223372036854775807, id="slice_scatter.to_end"),
        case("slice_scatter.default", T(6, 5), T(2, 5), 0, -2, id="slice_scatter.negative_start"),
        case("slice_scatter.default", T(6, 5), T(6, 5), id="slice_scatter.whole"),
        case("slice_scatter.default", T(8, 3), T(3, 3), 0, 1, 7, 2, id="slice_scatter.step"),
        case("slice_scatter.default", T(2, 6, 6, 3), T(2, 3, 6, 3), 1, 1, 9223372036854775807, 2,
             id="slice_scatter.step_to_end"),
        case("slice_scatter.default", T(4, 10), T(4, 3), 1, 0, 8, 3, id="slice_scatter.step_three"),
        case("slice_scatter.default", T(9, 2), T(2, 2), 0, -5, 9223372036854775807, 3,
             id="slice_scatter.step_negative_start"),
        case("slice_scatter.default", T(4, 8, dtype=I64), T(4, 2, dtype=I64), 1, 0, 2, id="slice_scatter.int"),
        case("select_scatter.default", T(4, 8), T(8), 0, 2, id="select_scatter.row"),
        case("as_strided_scatter.default", T(24), T(2, 3, 4), [2, 3, 4], [12, 4, 1], id="as_strided_scatter.whole"),
        case("as_strided_scatter.default", T(20), T(3, 1, 4), [3, 1, 4], [4, 7, 1], 5,
             id="as_strided_scatter.run_at_offset"),
        case("as_strided_scatter.default", T(12), T(3, 2), [3, 2], [1, 3], id="as_strided_scatter.transposed"),
        case("select_scatter.default", T(3, 4, 5), T(3, 5), 1, -1, id="select_scatter.negative_index"),
    ]
)


@pytest.mark.parametrize("op,args,kwargs,atol,rtol,first_only", CASES)
def test_op_matches_eager(op, args, kwargs, atol, rtol, first_only):
    gen = torch.Generator().manual_seed(hash(op) % 1000)
    b = AtenBuilder()
    tensors = []

    def bind(a):
        if isinstance(a, T):
            t = a.make(gen)
            tensors.append(t)
            return b.input(t)
        if isinstance(a, list):
            return [bind(x) for x in a]
        return a

    bound = [bind(a) for a in args]
    out = b.call(op, *bound, **kwargs)
    outs = out if isinstance(out, tuple) else (out,)
    program = b.output(*outs)
    scheduled = schedule(lower(program))
    got = run(scheduled, *tensors)
    want = b.eager(*tensors)
    assert len(got) == len(want)
    for g, w in list(zip(got, want))[: 1 if first_only else None]:
        assert g.dtype == w.dtype, f"{op}: dtype {g.dtype} != eager {w.dtype}"
        assert g.shape == w.shape, f"{op}: shape {tuple(g.shape)} != eager {tuple(w.shape)}"
        torch.testing.assert_close(g, w, atol=atol, rtol=rtol, equal_nan=True)
