"""Programs of scatter-adds (``index_put`` with ``accumulate``, ``index_add``, ``scatter_add``, the
embedding's backward), shared by fireclay-loops' tests and the backends'."""

from __future__ import annotations

import torch
from aten_builder import AtenBuilder


def _relative_bias_backward(b, grad, idx):
    """Swin's relative position bias backward: zeros of the table, the gradient added at each
    pair's index (``table[idx]``'s backward)."""
    zeros = b.call("new_zeros.default", grad, [13, 4])
    return b.call("index_put.default", zeros, [idx], grad, True)


PROGRAMS = {
    "index_put_into_zeros": (lambda b, g, i: _relative_bias_backward(b, g, i),
                             lambda: [torch.randn(49, 49, 4), torch.randint(0, 13, (49, 49))]),
    "index_put_into_x": (lambda b, g, i: b.call("index_put.default", b.call("exp.default", g), [i],
                                                b.call("slice.Tensor", g, 0, 0, 5), True),
                         lambda: [torch.randn(7, 3), torch.randint(-7, 7, (5,))]),
    "index_add": (lambda b, g, i: b.call("index_add.default", g, 0, i, b.call("slice.Tensor", g, 0, 0, 5)),
                  lambda: [torch.randn(7, 3), torch.randint(0, 7, (5,))]),
    "scatter_add": (lambda b, g, i: b.call("scatter_add.default", g, 1, i, g),
                    lambda: [torch.randn(4, 6), torch.randint(0, 6, (4, 6))]),
    "embedding_backward": (lambda b, g, i: b.call("embedding_dense_backward.default", g, i, 10, 0, False),
                           lambda: [torch.randn(3, 8, 5), torch.randint(0, 10, (3, 8))]),
}


def build(name: str, device: str = "cpu"):
    """(builder, program, inputs) of one case, read by a multiplication (the sum's reader)."""
    make, inputs = PROGRAMS[name]
    values = [v.to(device) for v in inputs()]
    b = AtenBuilder()
    g = b.input(values[0], "g")
    i = b.input(values[1], "i")
    out = b.call("mul.Tensor", make(b, g, i), 2.0)  # a reader of the sum
    return b, b.output(out), values
