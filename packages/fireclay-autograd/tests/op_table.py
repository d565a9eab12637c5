"""The op table: one entry per torch op (or small op pattern), with sample inputs.

Each entry is ``OpCase(name, fn, make_inputs)``; ``make_inputs(dtype)`` returns fresh random
inputs. Float inputs require grad unless the op is not differentiable in them.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass
class OpCase:
    name: str
    fn: Callable
    make: Callable[[torch.dtype], list]
    grad: bool = True
    gradcheck: bool = True  # float64 gradcheck is meaningful (smooth op)


def r(*shape):
    return lambda dt: torch.randn(*shape, dtype=dt).requires_grad_()


def pos(*shape):
    return lambda dt: (torch.rand(*shape, dtype=dt) + 0.5).requires_grad_()


def unit(*shape):
    return lambda dt: (torch.rand(*shape, dtype=dt) * 1.6 - 0.8).requires_grad_()


def ints(*shape, high=5):
    return lambda dt: torch.randint(0, high, shape)


def bools(*shape):
    return lambda dt: torch.rand(*shape) > 0.5


def const(make):
    return lambda dt: make().to(dt)


def inputs(*makers):
    return lambda dt: [m(dt) for m in makers]


def case(name, fn, *makers, grad=True, gradcheck=True):
    return OpCase(name, fn, inputs(*makers), grad, gradcheck)


CASES: list[OpCase] = [
    # unary pointwise
    case("abs", torch.abs, r(3, 4), gradcheck=False),
    case("neg", torch.neg, r(3, 4)),
    case("exp", torch.exp, r(3, 4)),
    case("expm1", torch.expm1, r(3, 4)),
    case("log", torch.log, pos(3, 4)),
    case("log1p", torch.log1p, pos(3, 4)),
    case("log2", torch.log2, pos(3, 4)),
    case("log10", torch.log10, pos(3, 4)),
    case("sqrt", torch.sqrt, pos(3, 4)),
    case("rsqrt", torch.rsqrt, pos(3, 4)),
    case("reciprocal", torch.reciprocal, pos(3, 4)),
    case("sin", torch.sin, r(3, 4)),
    case("cos", torch.cos, r(3, 4)),
    case("tan", torch.tan, unit(3, 4)),
    case("asin", torch.asin, unit(3, 4)),
    case("acos", torch.acos, unit(3, 4)),
    case("atan", torch.atan, r(3, 4)),
    case("sinh", torch.sinh, r(3, 4)),
    case("cosh", torch.cosh, r(3, 4)),
    case("tanh", torch.tanh, r(3, 4)),
    case("asinh", torch.asinh, r(3, 4)),
    case("atanh", torch.atanh, unit(3, 4)),
    case("sigmoid", torch.sigmoid, r(3, 4)),
    case("erf", torch.erf, r(3, 4)),
    case("square", torch.square, r(3, 4)),
    case("sign", torch.sign, r(3, 4), gradcheck=False),
    case("floor", torch.floor, r(3, 4), gradcheck=False),
    case("ceil", torch.ceil, r(3, 4), gradcheck=False),
    case("round", torch.round, r(3, 4), gradcheck=False),
    case("trunc", torch.trunc, r(3, 4), gradcheck=False),
    case("frac", torch.frac, r(3, 4), gradcheck=False),
    # activations
    case("relu", F.relu, r(3, 4), gradcheck=False),
    case("gelu", F.gelu, r(3, 4)),
    case("gelu_tanh", lambda x: F.gelu(x, approximate="tanh"), r(3, 4)),
    case("silu", F.silu, r(3, 4)),
    case("mish", F.mish, r(3, 4)),
    case("elu", F.elu, r(3, 4), gradcheck=False),
    case("selu", F.selu, r(3, 4), gradcheck=False),
    case("leaky_relu", lambda x: F.leaky_relu(x, 0.1), r(3, 4), gradcheck=False),
    case("hardtanh", F.hardtanh, r(3, 4), gradcheck=False),
    case("softplus", F.softplus, r(3, 4)),
    case("hardswish", F.hardswish, r(3, 4), gradcheck=False),
    case("hardsigmoid", F.hardsigmoid, r(3, 4), gradcheck=False),
    case("logsigmoid", F.logsigmoid, r(3, 4)),
    case("softmax", lambda x: F.softmax(x, -1), r(3, 5)),
    case("log_softmax", lambda x: F.log_softmax(x, 1), r(3, 5)),
    # binary and ternary pointwise
    case("add", torch.add, r(3, 4), r(3, 4)),
    case("add_alpha", lambda a, b: torch.add(a, b, alpha=2.5), r(3, 4), r(4)),
    case("sub_broadcast", operator.sub, r(3, 1), r(1, 4)),
    case("mul", operator.mul, r(3, 4), r(3, 4)),
    case("mul_scalar", lambda a: a * 3.0, r(3, 4)),
    case("div", operator.truediv, r(3, 4), pos(3, 4)),
    case("rdiv_scalar", lambda a: 2.0 / a, pos(3, 4)),
    case("pow_scalar", lambda a: a ** 3, r(3, 4)),
    case("pow_tensor", torch.pow, pos(3, 4), r(3, 4)),
    case("rsub", lambda a: 1 - a, r(3, 4)),
    case("maximum", torch.maximum, r(3, 4), r(3, 4), gradcheck=False),
    case("minimum", torch.minimum, r(3, 4), r(3, 4), gradcheck=False),
    case("atan2", torch.atan2, r(3, 4), pos(3, 4)),
    case("where", lambda c, a, b: torch.where(c, a, b), bools(3, 4), r(3, 4), r(3, 4)),
    case("clamp", lambda a: torch.clamp(a, -0.5, 0.5), r(3, 4), gradcheck=False),
    case("clamp_min", lambda a: torch.clamp_min(a, 0.1), r(3, 4), gradcheck=False),
    case("lerp", lambda a, b: torch.lerp(a, b, 0.3), r(3, 4), r(3, 4)),
    case("addcmul", lambda a, b, c: torch.addcmul(a, b, c, value=0.5), r(3, 4), r(3, 4), r(3, 4)),
    case("addcdiv", lambda a, b, c: torch.addcdiv(a, b, c, value=0.5), r(3, 4), r(3, 4), pos(3, 4)),
    case("hypot", torch.hypot, pos(3, 4), pos(3, 4)),
    case("fmod", lambda a: torch.fmod(a, 1.5), r(3, 4), gradcheck=False),
    case("remainder", lambda a: torch.remainder(a, 1.5), r(3, 4), gradcheck=False),
    case("xlogy", torch.xlogy, pos(3, 4), pos(3, 4)),
    # comparisons and logic (no gradient)
    case("gt", operator.gt, r(3, 4), r(3, 4), grad=False),
    case("le_scalar", lambda a: a <= 0.2, r(3, 4), grad=False),
    case("eq", torch.eq, ints(3, 4), ints(3, 4), grad=False),
    case("ne", torch.ne, ints(3, 4), ints(3, 4), grad=False),
    case("logical_and", torch.logical_and, bools(3, 4), bools(3, 4), grad=False),
    case("logical_not", torch.logical_not, bools(3, 4), grad=False),
    case("bitwise_xor", torch.bitwise_xor, ints(3, 4), ints(3, 4), grad=False),
    case("isnan", lambda a: torch.isnan(a / a), r(3, 4), grad=False),
    case("masked_fill", lambda a, m: a.masked_fill(m, 0.5), r(3, 4), bools(3, 4)),
    # reductions
    case("sum", torch.sum, r(3, 4)),
    case("sum_dim", lambda a: a.sum(dim=1, keepdim=True), r(3, 4)),
    case("mean", lambda a: a.mean(dim=(0, 2)), r(2, 3, 4)),
    case("prod", lambda a: a.prod(dim=1), pos(3, 4)),
    case("amax", lambda a: a.amax(dim=1), r(3, 4), gradcheck=False),
    case("max_dim", lambda a: a.max(dim=1)[0], r(3, 4), gradcheck=False),
    case("min_dim_indices", lambda a: a.min(dim=1)[1], r(3, 4), grad=False),
    case("argmax", lambda a: a.argmax(dim=-1), r(3, 4), grad=False),
    case("var", lambda a: a.var(dim=1), r(3, 4)),
    case("std", lambda a: a.std(dim=0, unbiased=False), r(3, 4)),
    case("logsumexp", lambda a: torch.logsumexp(a, dim=1), r(3, 4)),
    case("norm", lambda a: torch.linalg.vector_norm(a, dim=1), r(3, 4)),
    case("cumsum", lambda a: torch.cumsum(a, dim=1), r(3, 4)),
    case("any", lambda a: (a > 0).any(dim=1), r(3, 4), grad=False),
    # linear algebra
    case("mm", torch.mm, r(3, 4), r(4, 5)),
    case("matmul_batched", torch.matmul, r(2, 3, 4), r(4, 5)),
    case("bmm", torch.bmm, r(2, 3, 4), r(2, 4, 5)),
    case("addmm", lambda b, x, y: torch.addmm(b, x, y), r(5), r(3, 4), r(4, 5)),
    case("linear", F.linear, r(3, 4), r(5, 4), r(5)),
    case("einsum", lambda a, b: torch.einsum("bij,bjk->bik", a, b), r(2, 3, 4), r(2, 4, 2)),
    case("outer", torch.outer, r(3), r(4)),
    case("baddbmm", lambda c, a, b: torch.baddbmm(c, a, b, alpha=0.5), r(2, 3, 5), r(2, 3, 4), r(2, 4, 5)),
    # shape and view ops
    case("view", lambda a: a.view(4, 3) * 2, r(3, 4)),
    case("reshape", lambda a: a.reshape(-1) + 1, r(3, 4)),
    case("transpose", lambda a: a.transpose(0, 1) * 2, r(3, 4)),
    case("permute", lambda a: a.permute(2, 0, 1).exp(), r(2, 3, 4)),
    case("t", lambda a: a.t().sin(), r(3, 4)),
    case("unsqueeze_squeeze", lambda a: a.unsqueeze(1).squeeze(1) * 3, r(3, 4)),
    case("flatten", lambda a: torch.flatten(a, 1) * 2, r(2, 3, 4)),
    case("expand", lambda a: a.expand(3, 4) * 2, r(1, 4)),
    case("slice", lambda a: a[1:, ::2] * 2, r(4, 6)),
    case("select", lambda a: a[1] * 2, r(3, 4)),
    case("index_tensor", lambda a, i: a[i], r(5, 3), ints(4, high=5)),
    case("index_select", lambda a, i: torch.index_select(a, 0, i), r(5, 3), ints(4, high=5)),
    case("gather", lambda a, i: torch.gather(a, 1, i), r(3, 5), ints(3, 2, high=5)),
    case("cat", lambda a, b: torch.cat([a, b], dim=1), r(3, 4), r(3, 2)),
    case("stack", lambda a, b: torch.stack([a, b]), r(3, 4), r(3, 4)),
    case("split", lambda a: torch.split(a, 2, dim=1)[1] * 2, r(3, 6)),
    case("chunk", lambda a: a.chunk(3, dim=0)[1] * 2, r(6, 2)),
    case("unbind", lambda a: a.unbind(0)[2] * 2, r(3, 4)),
    case("flip", lambda a: torch.flip(a, [0]), r(3, 4)),
    case("roll", lambda a: torch.roll(a, 1, 1), r(3, 4)),
    case("repeat", lambda a: a.repeat(2, 3), r(2, 3)),
    case("tril", torch.tril, r(4, 4)),
    case("triu", lambda a: torch.triu(a, 1), r(4, 4)),
    case("diagonal", lambda a: torch.diagonal(a) * 2, r(4, 4)),
    case("narrow", lambda a: a.narrow(1, 1, 2) * 2, r(3, 4)),
    case("contiguous", lambda a: a.t().contiguous() + 1, r(3, 4)),
    case("pad", lambda a: F.pad(a, (1, 2)), r(3, 4)),
    case("scatter_add", lambda a, i, s: a.scatter_add(1, i, s), r(3, 5), ints(3, 2, high=5), r(3, 2)),
    # dtype and construction
    case("to_float64", lambda a: a.to(torch.float64) * 2, r(3, 4)),
    case("type_as_int", lambda a: a.int(), r(3, 4), grad=False),
    case("zeros_like", lambda a: torch.zeros_like(a) + a, r(3, 4)),
    case("ones", lambda a: torch.ones(3, 4) * a, r(3, 4)),
    case("full", lambda a: torch.full((3, 4), 2.5) + a, r(3, 4)),
    case("arange", lambda a: torch.arange(4, dtype=a.dtype) * a, r(3, 4)),
    case("new_zeros", lambda a: a.new_zeros(3, 4) + a, r(3, 4)),
    case("detach", lambda a: a.detach() * a, r(3, 4), gradcheck=False),
    # normalization and nn layers
    case("layer_norm", lambda a, w, b: F.layer_norm(a, (4,), w, b), r(3, 4), r(4), r(4)),
    case("group_norm", lambda a, w, b: F.group_norm(a, 2, w, b), r(2, 4, 3), r(4), r(4)),
    case("batch_norm_eval", lambda a, rm, rv: F.batch_norm(a, rm, rv, training=False),
         r(4, 3), const(lambda: torch.zeros(3)), const(lambda: torch.ones(3))),
    case("rms_norm", lambda a, w: F.rms_norm(a, (4,), w), r(3, 4), r(4)),
    case("conv1d", lambda x, w, b: F.conv1d(x, w, b, padding=1), r(2, 3, 8), r(4, 3, 3), r(4)),
    case("conv2d", lambda x, w: F.conv2d(x, w, stride=2), r(2, 3, 8, 8), r(4, 3, 3, 3)),
    case("max_pool2d", lambda x: F.max_pool2d(x, 2), r(2, 3, 6, 6), gradcheck=False),
    case("avg_pool2d", lambda x: F.avg_pool2d(x, 2), r(2, 3, 6, 6)),
    case("adaptive_avg_pool2d", lambda x: F.adaptive_avg_pool2d(x, 1), r(2, 3, 4, 4)),
    case("embedding", lambda i, w: F.embedding(i, w), ints(2, 3, high=7), r(7, 4)),
    case("cross_entropy", lambda x, t: F.cross_entropy(x, t), r(4, 5), ints(4, high=5)),
    case("nll_loss", lambda x, t: F.nll_loss(F.log_softmax(x, -1), t), r(4, 5), ints(4, high=5)),
    case("mse_loss", F.mse_loss, r(3, 4), r(3, 4)),
    case("l1_loss", F.l1_loss, r(3, 4), r(3, 4), gradcheck=False),
    case("bce_with_logits", F.binary_cross_entropy_with_logits, r(3, 4), const(lambda: torch.rand(3, 4))),
    case("smooth_l1", F.smooth_l1_loss, r(3, 4), r(3, 4), gradcheck=False),
    case("cosine_similarity", lambda a, b: F.cosine_similarity(a, b), r(3, 4), r(3, 4)),
    case("sdpa", lambda q, k, v: F.scaled_dot_product_attention(q, k, v), r(1, 2, 3, 4), r(1, 2, 3, 4), r(1, 2, 3, 4)),
    case("sdpa_causal", lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
         r(1, 2, 3, 4), r(1, 2, 3, 4), r(1, 2, 3, 4)),
    case("normalize", lambda a: F.normalize(a, dim=-1), r(3, 4)),
    case("dropout_eval", lambda a: F.dropout(a, 0.5, training=False), r(3, 4)),
    case("interpolate_nearest", lambda x: F.interpolate(x, scale_factor=2.0), r(1, 2, 3, 3)),
    # patterns of several ops
    case("mlp_block", lambda x, w1, w2: F.linear(F.gelu(F.linear(x, w1)), w2), r(4, 8), r(16, 8), r(8, 16)),
    case("attention_scores", lambda q, k: torch.softmax(q @ k.transpose(-1, -2) / 2.0, -1), r(2, 3, 4), r(2, 3, 4)),
    case("multi_output", lambda a, b: (a + b, a * b, (a - b).sum()), r(3, 4), r(3, 4)),
    case("unused_input", lambda a, b: a * 2, r(3, 4), r(3, 4)),
]
