"""Torch-free test helper: aten programs written by hand, each output's TensorMeta given."""

from __future__ import annotations

from fireclay_ir import Graph, Program, TensorMeta


def t(*shape, dtype: str = "float32") -> TensorMeta:
    return TensorMeta(dtype, tuple(shape))


class Hand:
    def __init__(self):
        self.graph = Graph("main")

    def input(self, name: str, *shape, dtype: str = "float32"):
        return self.graph.add_input(name, t(*shape, dtype=dtype))

    def op(self, op: str, *args, out, **kwargs):
        return self.graph.call(f"aten::{op}", args, kwargs, out=out)

    def program(self, *outputs) -> Program:
        self.graph.set_outputs(list(outputs))
        return Program.single(self.graph)


def softmax_decomposed(h: Hand, x, n: int, d: int):
    m = h.op("amax.default", x, [1], True, out=t(n, 1))
    s = h.op("sub.Tensor", x, m, out=t(n, d))
    e = h.op("exp.default", s, out=t(n, d))
    z = h.op("sum.dim_IntList", e, [1], True, out=t(n, 1))
    return h.op("div.Tensor", e, z, out=t(n, d))


def layer_norm_decomposed(h: Hand, x, w, b, n: int, d: int):
    var, mean = h.op("var_mean.correction", x, [1], correction=0, keepdim=True, out=[t(n, 1), t(n, 1)])
    a = h.op("add.Tensor", var, 1e-5, out=t(n, 1))
    r = h.op("rsqrt.default", a, out=t(n, 1))
    c = h.op("sub.Tensor", x, mean, out=t(n, d))
    y = h.op("mul.Tensor", c, r, out=t(n, d))
    y = h.op("mul.Tensor", y, w, out=t(n, d))
    return h.op("add.Tensor", y, b, out=t(n, d))
