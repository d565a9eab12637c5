"""Pointwise lowerings: broadcasting, type promotion, and the elementwise op table."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import sympy

from fireclay_loops import dtypes
from fireclay_loops.lowering.context import fallback
from fireclay_loops.lowering.registry import register_lowering
from fireclay_loops.lowering.values import TensorValue, load_broadcast
from fireclay_loops.ops import ops


def _value(x: Any, index: list, size: list, dtype: str) -> Any:
    if isinstance(x, TensorValue):
        return ops.to_dtype(load_broadcast(x, index, size), dtype)
    if isinstance(x, sympy.Basic):
        return ops.to_dtype(ops.index_expr(x, "int64"), dtype)
    return ops.constant(x, dtype)


def lower_pointwise(ctx, inputs: list, fn: Callable[..., Any], compute: str | None = None,
                    input_dtypes: list[str | None] | None = None):
    """One pointwise node computing ``fn(*loaded inputs)`` over the output's shape; inputs are
    broadcast to it and cast to ``compute`` (default: the output dtype, half types in float32)."""
    size, dtype, device = ctx.out_meta()
    compute = compute or dtypes.compute_dtype(dtype)
    casts = input_dtypes or [None] * len(inputs)

    def inner(index):
        values = [_value(x, index, size, c or compute) for x, c in zip(inputs, casts)]
        saved, _compute[0] = _compute[0], compute
        try:
            return fn(*values)
        finally:
            _compute[0] = saved

    return ctx.pointwise(size, dtype, device, inner)


def promoted(*inputs: Any) -> str:
    tensors = [(x.dtype, x.rank) for x in inputs if isinstance(x, TensorValue)]
    scalars = [x for x in inputs if not isinstance(x, TensorValue)]
    scalars = [0 if isinstance(s, sympy.Basic) else s for s in scalars]
    return dtypes.compute_dtype(dtypes.result_type(tensors, scalars))


# The dtype the pointwise body being recorded computes in, for the constants its formula uses.
_compute = ["float32"]


def _c(value, dtype: str | None = None):
    return ops.constant(value, dtype or _compute[0])


# --------------------------------------------------------------------------- unary table

_UNARY_SAME = {
    "abs": "abs", "neg": "neg", "exp": "exp", "exp2": "exp2", "expm1": "expm1", "log": "log",
    "log2": "log2", "log10": "log10", "log1p": "log1p", "sqrt": "sqrt", "rsqrt": "rsqrt",
    "sin": "sin", "cos": "cos", "tan": "tan", "asin": "asin", "acos": "acos", "atan": "atan",
    "sinh": "sinh", "cosh": "cosh", "tanh": "tanh", "asinh": "asinh", "acosh": "acosh",
    "atanh": "atanh", "erf": "erf", "erfc": "erfc", "sigmoid": "sigmoid", "relu": "relu",
    "reciprocal": "reciprocal", "floor": "floor", "ceil": "ceil", "round": "round",
    "trunc": "trunc", "sign": "sign", "sgn": "sign", "frac": "frac", "lgamma": "lgamma",
}


def _unary(op_name: str):
    def lower(ctx, x, *_ignored):
        return lower_pointwise(ctx, [x], getattr(ops, op_name))

    lower.__name__ = f"lower_{op_name}"
    return lower


for _aten, _op in _UNARY_SAME.items():
    register_lowering(f"{_aten}.default")(_unary(_op))


@register_lowering("logical_not.default")
def lower_logical_not(ctx, x):
    return lower_pointwise(ctx, [x], ops.logical_not, compute="bool")


@register_lowering("bitwise_not.default")
def lower_bitwise_not(ctx, x):
    op = ops.logical_not if x.dtype == "bool" else ops.bitwise_not
    return lower_pointwise(ctx, [x], op)


@register_lowering("isnan.default")
def lower_isnan(ctx, x):
    return lower_pointwise(ctx, [x], ops.isnan, compute=dtypes.compute_dtype(x.dtype))


@register_lowering("isinf.default")
def lower_isinf(ctx, x):
    return lower_pointwise(ctx, [x], ops.isinf, compute=dtypes.compute_dtype(x.dtype))


@register_lowering("isfinite.default")
def lower_isfinite(ctx, x):
    def fn(v):
        return ops.logical_not(ops.logical_or(ops.isnan(v), ops.isinf(v)))

    return lower_pointwise(ctx, [x], fn, compute=dtypes.compute_dtype(x.dtype))


# --------------------------------------------------------------------------- binary table

_BINARY = {
    "mul.Tensor": "mul", "mul.Scalar": "mul", "maximum.default": "maximum",
    "minimum.default": "minimum", "remainder.Tensor": "remainder", "remainder.Scalar": "remainder",
    "fmod.Tensor": "fmod", "fmod.Scalar": "fmod", "atan2.default": "atan2",
    "floor_divide.default": "floordiv", "copysign.Tensor": "copysign",
    "pow.Tensor_Tensor": "pow", "pow.Scalar": "pow",
    "bitwise_and.Tensor": "bitwise_and", "bitwise_and.Scalar": "bitwise_and",
    "bitwise_or.Tensor": "bitwise_or", "bitwise_or.Scalar": "bitwise_or",
    "bitwise_xor.Tensor": "bitwise_xor", "bitwise_xor.Scalar": "bitwise_xor",
}
_COMPARE = {
    "eq.Tensor": "eq", "eq.Scalar": "eq", "ne.Tensor": "ne", "ne.Scalar": "ne",
    "lt.Tensor": "lt", "lt.Scalar": "lt", "le.Tensor": "le", "le.Scalar": "le",
    "gt.Tensor": "gt", "gt.Scalar": "gt", "ge.Tensor": "ge", "ge.Scalar": "ge",
}
_LOGICAL = {"logical_and.default": "logical_and", "logical_or.default": "logical_or",
            "logical_xor.default": "logical_xor"}


_INTEGER_DIVISIONS = {"floordiv": "floor_divide", "remainder": "remainder", "fmod": "fmod"}


def _checked_divisor(ctx, b: Any, dtype: str, what: str) -> Callable[[Any], Any]:
    """What the divisor of an integer division goes through: ``ops.check_nonzero`` where eager
    raises on a zero divisor (integers on the CPU) and ``b`` is not a known non-zero number."""
    device = ctx.out_meta()[2]
    if (dtypes.is_float(dtype) or dtype == "bool" or not ctx.checks_on(device, integer_division=True)
            or (isinstance(b, (int, float)) and not isinstance(b, bool) and b != 0)):
        return lambda y: y
    site = ctx.check_site(what)
    return lambda y: ops.check_nonzero(y, site)


def _binary(op_name: str):
    def lower(ctx, a, b):
        size, dtype, _ = ctx.out_meta()
        if dtype == "bool" and op_name.startswith("bitwise_"):
            return lower_pointwise(ctx, [a, b], getattr(ops, "logical" + op_name[len("bitwise"):]), compute="bool")
        if op_name in _INTEGER_DIVISIONS:
            divisor = _checked_divisor(ctx, b, dtype, _INTEGER_DIVISIONS[op_name])
            op = getattr(ops, op_name)
            return lower_pointwise(ctx, [a, b], lambda x, y: op(x, divisor(y)))
        return lower_pointwise(ctx, [a, b], getattr(ops, op_name))

    lower.__name__ = f"lower_{op_name}"
    return lower


def _compare(op_name: str):
    def lower(ctx, a, b):
        return lower_pointwise(ctx, [a, b], getattr(ops, op_name), compute=promoted(a, b))

    lower.__name__ = f"lower_{op_name}"
    return lower


def _logical(op_name: str):
    def lower(ctx, a, b):
        return lower_pointwise(ctx, [a, b], getattr(ops, op_name), compute="bool")

    lower.__name__ = f"lower_{op_name}"
    return lower


for _aten, _op in _BINARY.items():
    register_lowering(_aten)(_binary(_op))
for _aten, _op in _COMPARE.items():
    register_lowering(_aten)(_compare(_op))
for _aten, _op in _LOGICAL.items():
    register_lowering(_aten)(_logical(_op))


@register_lowering("add.Tensor", "add.Scalar")
def lower_add(ctx, a, b, alpha=1):
    if alpha == 1:
        return lower_pointwise(ctx, [a, b], ops.add)
    return lower_pointwise(ctx, [a, b, alpha], lambda x, y, al: ops.add(x, ops.mul(al, y)))


@register_lowering("sub.Tensor", "sub.Scalar")
def lower_sub(ctx, a, b, alpha=1):
    if alpha == 1:
        return lower_pointwise(ctx, [a, b], ops.sub)
    return lower_pointwise(ctx, [a, b, alpha], lambda x, y, al: ops.sub(x, ops.mul(al, y)))


@register_lowering("rsub.Scalar", "rsub.Tensor")
def lower_rsub(ctx, a, b, alpha=1):
    return lower_pointwise(ctx, [a, b, alpha], lambda x, y, al: ops.sub(y, ops.mul(al, x)))


@register_lowering("div.Tensor", "div.Scalar")
def lower_div(ctx, a, b):
    return lower_pointwise(ctx, [a, b], ops.truediv)


@register_lowering("div.Tensor_mode", "div.Scalar_mode")
def lower_div_mode(ctx, a, b, rounding_mode=None):
    _, dtype, _ = ctx.out_meta()
    if rounding_mode is None:
        return lower_pointwise(ctx, [a, b], ops.truediv)
    if dtypes.is_float(dtype):
        rnd = ops.floor if rounding_mode == "floor" else ops.trunc
        return lower_pointwise(ctx, [a, b], lambda x, y: rnd(ops.truediv(x, y)))
    divisor = _checked_divisor(ctx, b, dtype, f"div(rounding_mode={rounding_mode!r})")
    if rounding_mode == "floor":
        return lower_pointwise(ctx, [a, b], lambda x, y: ops.floordiv(x, divisor(y)))
    # Integer division truncating toward zero: floor of the magnitudes, sign put back.
    return lower_pointwise(ctx, [a, b], lambda x, y: ops.mul(
        ops.mul(ops.sign(x), ops.sign(y)), ops.floordiv(ops.abs(x), ops.abs(divisor(y)))))


# Integer exponents up to this size become multiplications (as eager's CPU kernel does for 2 and
# 3, and Inductor for any small integer): a vectorised pow() of a negative base is one to two
# orders of magnitude slower than two multiplies (GELU's tanh form cubes its input).
MAX_MULTIPLIED_EXPONENT = 32


def _integer_power(v, n: int):
    """``v ** n`` for an integer ``n >= 1`` by squaring (``v * (v*v)`` for 3: eager's bits)."""
    result = None
    square = v
    while True:
        if n & 1:
            result = square if result is None else ops.mul(result, square)
        n >>= 1
        if not n:
            return result
        square = ops.mul(square, square)


@register_lowering("pow.Tensor_Scalar")
def lower_pow_scalar(ctx, x, exponent):
    is_float = dtypes.is_float(ctx.out_meta()[1])
    if exponent == 0.5:
        return lower_pointwise(ctx, [x], ops.sqrt)
    if exponent == -0.5 and is_float:
        return lower_pointwise(ctx, [x], ops.rsqrt)
    if (isinstance(exponent, (int, float)) and not isinstance(exponent, bool) and float(exponent).is_integer()
            and 1 <= abs(exponent) <= MAX_MULTIPLIED_EXPONENT and (exponent > 0 or is_float)):
        n = int(exponent)
        if n > 0:
            return lower_pointwise(ctx, [x], lambda v: _integer_power(v, n))
        return lower_pointwise(ctx, [x], lambda v: ops.reciprocal(_integer_power(v, -n)))
    return lower_pointwise(ctx, [x, exponent], ops.pow)


# --------------------------------------------------------------------------- selection, clamps


@register_lowering("where.self", "where.ScalarSelf", "where.ScalarOther", "where.Scalar")
def lower_where(ctx, cond, a, b):
    return lower_pointwise(ctx, [cond, a, b], ops.where, input_dtypes=["bool", None, None])


@register_lowering("masked_fill.Scalar", "masked_fill.Tensor")
def lower_masked_fill(ctx, x, mask, value):
    return lower_pointwise(ctx, [mask, value, x], ops.where, input_dtypes=["bool", None, None])


def _clamp_fn(lo: Any, hi: Any):
    def fn(v, *bounds):
        k = 0
        if lo is not None:
            v = ops.maximum(v, bounds[k])
            k += 1
        if hi is not None:
            v = ops.minimum(v, bounds[k])
        return v

    return fn


@register_lowering("clamp.default", "clamp.Tensor")
def lower_clamp(ctx, x, min=None, max=None):
    return lower_pointwise(ctx, [x] + [b for b in (min, max) if b is not None], _clamp_fn(min, max))


@register_lowering("clamp_min.default", "clamp_min.Tensor")
def lower_clamp_min(ctx, x, min):
    return lower_pointwise(ctx, [x, min], ops.maximum)


@register_lowering("clamp_max.default", "clamp_max.Tensor")
def lower_clamp_max(ctx, x, max):
    return lower_pointwise(ctx, [x, max], ops.minimum)


@register_lowering("hardtanh.default")
def lower_hardtanh(ctx, x, min_val=-1.0, max_val=1.0):
    return lower_pointwise(ctx, [x, min_val, max_val], lambda v, lo, hi: ops.minimum(ops.maximum(v, lo), hi))


@register_lowering("threshold.default")
def lower_threshold(ctx, x, threshold, value):
    return lower_pointwise(ctx, [x, threshold, value], lambda v, t, val: ops.where(ops.le(v, t), val, v))


@register_lowering("nan_to_num.default")
def lower_nan_to_num(ctx, x, nan=None, posinf=None, neginf=None):
    _, dtype, _ = ctx.out_meta()
    big = {"float64": 1.7976931348623157e308, "float32": 3.4028234663852886e38,
           "float16": 65504.0, "bfloat16": 3.3895313892515355e38}.get(dtype)
    if big is None:
        return lower_pointwise(ctx, [x], lambda v: v)
    pos = big if posinf is None else posinf
    neg = -big if neginf is None else neginf
    compute = dtype  # keep the dtype's own range so its max survives

    def fn(v):
        v = ops.where(ops.isnan(v), _c(0.0 if nan is None else nan, compute), v)
        v = ops.where(ops.logical_and(ops.isinf(v), ops.gt(v, _c(0.0, compute))), _c(pos, compute), v)
        return ops.where(ops.logical_and(ops.isinf(v), ops.lt(v, _c(0.0, compute))), _c(neg, compute), v)

    return lower_pointwise(ctx, [x], fn, compute=compute)


# --------------------------------------------------------------------------- copies and casts


@register_lowering("_to_copy.default", "clone.default")
def lower_copy(ctx, x, *args, **kwargs):
    _, dtype, device = ctx.out_meta()
    if isinstance(x, TensorValue) and _device_kind(device) != _device_kind(x.device):
        # a copy between devices (CPU index tensors for a CUDA tensor) is the library's
        # transfer: a kernel runs on one device and cannot read the other's memory
        return fallback(ctx, kind="extern")
    return lower_pointwise(ctx, [x], lambda v: v, compute=dtype)


@register_lowering("copy.default")
def lower_copy_into(ctx, x, src, non_blocking=False):
    """The functional copy: ``src`` broadcast to ``x``'s shape in ``x``'s dtype. Functionalization
    writes ``view[...] = value`` as copy(view, value) scattered back into the base; ``x``'s values
    are never read, so a lazily computed ``x`` (a view of a chain of such scatters) is not stored
    just to be overwritten, as a library call would need it."""
    _, dtype, device = ctx.out_meta()
    if isinstance(src, TensorValue) and _device_kind(device) != _device_kind(src.device):
        return fallback(ctx, kind="extern")
    return lower_pointwise(ctx, [src], lambda v: v, compute=dtype)


def _device_kind(device: str) -> str:
    """The device a kernel would run on, with "cuda" meaning "cuda:0" as eager does."""
    return device if ":" in device or device in ("cpu", "meta") else f"{device}:0"


@register_lowering("lerp.Scalar", "lerp.Tensor")
def lower_lerp(ctx, a, b, weight):
    return lower_pointwise(ctx, [a, b, weight], lambda x, y, w: ops.add(x, ops.mul(w, ops.sub(y, x))))


@register_lowering("addcmul.default")
def lower_addcmul(ctx, x, t1, t2, value=1):
    return lower_pointwise(ctx, [x, t1, t2, value], lambda a, b, c, v: ops.add(a, ops.mul(v, ops.mul(b, c))))


@register_lowering("addcdiv.default")
def lower_addcdiv(ctx, x, t1, t2, value=1):
    return lower_pointwise(ctx, [x, t1, t2, value], lambda a, b, c, v: ops.add(a, ops.mul(v, ops.truediv(b, c))))


# --------------------------------------------------------------------------- activations


def _gelu(v, approximate: str):
    half = _c(0.5)
    if approximate == "tanh":
        inner = ops.mul(_c(math.sqrt(2.0 / math.pi)), ops.add(v, ops.mul(_c(0.044715), ops.mul(v, ops.mul(v, v)))))
        return ops.mul(ops.mul(half, v), ops.add(_c(1.0), ops.tanh(inner)))
    return ops.mul(ops.mul(half, v), ops.add(_c(1.0), ops.erf(ops.mul(v, _c(1.0 / math.sqrt(2.0))))))


@register_lowering("gelu.default")
def lower_gelu(ctx, x, approximate="none"):
    return lower_pointwise(ctx, [x], lambda v: _gelu(v, approximate))


@register_lowering("silu.default")
def lower_silu(ctx, x):
    return lower_pointwise(ctx, [x], lambda v: ops.mul(v, ops.sigmoid(v)))


@register_lowering("mish.default")
def lower_mish(ctx, x):
    return lower_pointwise(ctx, [x], lambda v: ops.mul(v, ops.tanh(_softplus(v, 1.0, 20.0))))


def _softplus(v, beta, threshold):
    scaled = ops.mul(v, _c(float(beta)))
    soft = ops.truediv(ops.log1p(ops.exp(scaled)), _c(float(beta)))
    return ops.where(ops.gt(scaled, _c(float(threshold))), v, soft)


@register_lowering("softplus.default")
def lower_softplus(ctx, x, beta=1.0, threshold=20.0):
    return lower_pointwise(ctx, [x], lambda v: _softplus(v, beta, threshold))


@register_lowering("hardsigmoid.default")
def lower_hardsigmoid(ctx, x):
    return lower_pointwise(ctx, [x], lambda v: ops.truediv(
        ops.minimum(ops.maximum(ops.add(v, _c(3.0)), _c(0.0)), _c(6.0)), _c(6.0)))


@register_lowering("hardswish.default")
def lower_hardswish(ctx, x):
    return lower_pointwise(ctx, [x], lambda v: ops.truediv(
        ops.mul(v, ops.minimum(ops.maximum(ops.add(v, _c(3.0)), _c(0.0)), _c(6.0))), _c(6.0)))


@register_lowering("leaky_relu.default")
def lower_leaky_relu(ctx, x, negative_slope=0.01):
    return lower_pointwise(ctx, [x, negative_slope],
                           lambda v, s: ops.where(ops.gt(v, _c(0.0)), v, ops.mul(v, s)))


@register_lowering("elu.default")
def lower_elu(ctx, x, alpha=1.0, scale=1.0, input_scale=1.0):
    def fn(v):
        neg = ops.mul(ops.expm1(ops.mul(v, _c(float(input_scale)))), _c(float(alpha) * float(scale)))
        return ops.where(ops.gt(v, _c(0.0)), ops.mul(v, _c(float(scale))), neg)

    return lower_pointwise(ctx, [x], fn)


@register_lowering("log_sigmoid_forward.default")
def lower_log_sigmoid_forward(ctx, x):
    # log(sigmoid(v)) = min(v, 0) - log1p(exp(-|v|)), stable for large |v|; the buffer output
    # is only used by the backward, which recomputes it, so it is an empty tensor.
    out = lower_pointwise(ctx, [x], lambda v: ops.sub(ops.minimum(v, _c(0.0)), ops.log1p(ops.exp(ops.neg(ops.abs(v))))))
    size, dtype, device = ctx.out_meta(1)
    return out, ctx.constant(0.0, size, dtype, device)
