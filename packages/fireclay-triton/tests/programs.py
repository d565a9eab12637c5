"""Multi-op programs at sizes that exercise ragged edges, several programs per launch and
multi-iteration reduction loops; shared by the interpreted and the GPU tests."""

from __future__ import annotations

import pytest
import torch
from aten_builder import AtenBuilder, T  # fireclay-loops' test helper (see conftest)

I64 = torch.int64


def _gelu_chain(b, x, y):
    return (b.call("gelu.default", b.call("add.Scalar", b.call("mul.Tensor", x, y), 1.0)),)


def _softmax(b, x):
    return (b.call("_softmax.default", x, 1, False),)


def _log_softmax_cols(b, x):
    return (b.call("_log_softmax.default", x, 0, False),)


def _layer_norm(b, x, w, bias):
    out, mean, rstd = b.call("native_layer_norm.default", x, [x.meta.shape[-1]], w, bias, 1e-5)
    return out, mean, rstd


def _var_mean(b, x):
    return b.call("var_mean.correction", x, [1], correction=1)


def _argmax_ties(b, x):
    return (b.call("argmax.default", x, 1),)


def _sum_strided(b, x):
    return (b.call("sum.dim_IntList", x, [0]),)


def _mm_bias_relu(b, x, w, bias):
    return (b.call("relu.default", b.call("add.Tensor", b.call("mm.default", x, w), bias)),)


def _residual_norm_gelu(b, x, r, w):
    h = b.call("add.Tensor", x, r)
    n, _, _ = b.call("native_layer_norm.default", h, [x.meta.shape[-1]], w, None, 1e-5)
    return (b.call("gelu.default", n), h)


def _max_and_amin(b, x):
    return (b.call("amax.default", x, [1]), b.call("amin.default", x, [0]), b.call("sum.default", x))


def case(fn, *inputs, atol=1e-5, rtol=1e-5, id=None):
    return pytest.param(fn, inputs, atol, rtol, id=id or fn.__name__.lstrip("_"))


PROGRAMS = [
    case(_gelu_chain, T(3, 5000), T(3, 5000), id="pointwise_ragged_15000"),
    case(_gelu_chain, T(37, 129, transposed=True), T(37, 129), id="pointwise_transposed"),
    case(_softmax, T(20, 3000), atol=1e-6, id="softmax_rows_3000"),
    case(_softmax, T(300, 77), id="softmax_many_short_rows"),
    case(_log_softmax_cols, T(1500, 6), id="log_softmax_columns"),
    case(_layer_norm, T(9, 2500), T(2500), T(2500), atol=1e-4, rtol=1e-4, id="layer_norm_2500"),
    case(_layer_norm, T(33, 768), T(768), T(768), atol=1e-4, rtol=1e-4, id="layer_norm_768"),
    case(_var_mean, T(5, 3001), atol=1e-4, rtol=1e-4, id="var_mean_3001"),
    case(_argmax_ties, T(6, 2100, dtype=I64, high=3), id="argmax_ties_2100"),
    case(_sum_strided, T(2000, 12), atol=1e-3, rtol=1e-4, id="sum_over_outer_dim"),
    case(_mm_bias_relu, T(65, 40), T(40, 33), T(33), atol=1e-4, rtol=1e-4, id="mm_bias_relu"),
    case(_residual_norm_gelu, T(17, 1100), T(17, 1100), T(1100), atol=1e-4, rtol=1e-4, id="residual_norm_gelu"),
    case(_max_and_amin, T(40, 1030), atol=1e-3, rtol=1e-4, id="several_reductions"),
]


def build_program(fn, inputs, device: str, dtype: torch.dtype | None = None, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    b = AtenBuilder()
    tensors, handles = [], []
    for i, spec in enumerate(inputs):
        t = spec.make(gen)
        if dtype is not None and t.dtype == torch.float32:
            t = t.to(dtype)
        t = t.to(device)
        tensors.append(t)
        handles.append(b.input(t, f"x{i}"))
    outs = fn(b, *handles)
    return b, b.output(*outs), tensors
