"""The generated Triton of small programs, golden-tested: the text a user reads in a dump.
Regenerate with ``FIRECLAY_UPDATE_GOLDEN=1`` after an intended change, and read the diff."""

import os

import pytest
import torch
from aten_builder import AtenBuilder

from fireclay_loops import lower, schedule
from fireclay_triton import generate_kernels

GOLDEN = os.path.join(os.path.dirname(__file__), "golden")


def _softmax(cols):
    b = AtenBuilder()
    x = b.input(torch.empty(6, cols, device="meta"), "x")
    return b.output(b.call("_softmax.default", x, 1, False))


def _gelu_add():
    b = AtenBuilder()
    x = b.input(torch.empty(5, 7, device="meta"), "x")
    y = b.input(torch.empty(7, device="meta"), "y")
    return b.output(b.call("gelu.default", b.call("add.Tensor", x, y)))


def _layer_norm():
    b = AtenBuilder()
    x = b.input(torch.empty(4, 300, device="meta"), "x")
    w = b.input(torch.empty(300, device="meta"), "w")
    out, _, _ = b.call("native_layer_norm.default", x, [300], w, None, 1e-5)
    return b.output(out)


def _transpose_add():
    b = AtenBuilder()
    x = b.input(torch.empty(64, 48, device="meta"), "x")
    y = b.input(torch.empty(48, 64, device="meta"), "y")
    return b.output(b.call("add.Tensor", b.call("permute.default", x, [1, 0]), y))


def _column_sum():
    b = AtenBuilder()
    x = b.input(torch.empty(3000, 40, device="meta"), "x")
    return b.output(b.call("sum.dim_IntList", x, [0]))


PROGRAMS = {"softmax_persistent": lambda: _softmax(100), "softmax_looped": lambda: _softmax(20000),
            "gelu_add_broadcast": _gelu_add, "layer_norm_welford": _layer_norm,
            "transpose_add_tiled": _transpose_add, "column_sum_looped": _column_sum}


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_generated_kernel_matches_golden(name):
    kernels = generate_kernels(schedule(lower(PROGRAMS[name]())), interpret=False)
    text = "\n".join(k.source for k in kernels)
    path = os.path.join(GOLDEN, f"{name}.py.txt")
    if os.environ.get("FIRECLAY_UPDATE_GOLDEN") == "1":
        with open(path, "w") as f:
            f.write(text)
    with open(path) as f:
        assert text == f.read()
