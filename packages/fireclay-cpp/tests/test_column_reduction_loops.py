"""Column reductions whose kernel has later loops over ``r`` (batch norm's backward over
channels-last memory: the per-channel sums of the first loop feed the input gradient computed in
a second loop over N, H and W). Every loop runs with the kept dim in blocks, inside the loop over
``r`` (see kernel_codegen's docstring). Each case runs against eager on fresh random inputs, and
the table checks the loop order the batch-norm kernel got, so a case cannot silently test the
other one."""

from __future__ import annotations

import pytest
import torch
from aten_builder import AtenBuilder
from batch import SEED

import fireclay_cpp
from fireclay_cpp.column_loops import COLUMN_BLOCK

GEN = torch.Generator().manual_seed(SEED)
COLUMN_LOOP = "fc_xb += "  # the block loop of a column reduction
CL = torch.channels_last


def _randn(*shape, dtype=torch.float32, channels_last=False, positive=False):
    t = torch.rand(shape, generator=GEN, dtype=torch.float64) + 0.5 if positive else \
        torch.randn(shape, generator=GEN, dtype=torch.float64)
    t = t.to(dtype)
    return t.contiguous(memory_format=CL) if channels_last else t


def _kernels(source: str) -> list[str]:
    """The text of each kernel function of a library."""
    parts = source.split('extern "C" void kernel')[1:]
    return [p[:p.index('\nextern "C"')] if '\nextern "C"' in p else p for p in parts]


def _bn_backward(b, shape, dtype, *, relu: bool, weight: bool, pool: bool):
    """``grad`` -> (max pooling's backward) -> (ReLU's backward) -> batch norm's backward -> a
    convolution's backward, as a training step's backward hands it over: saved activations
    channels-last as the forward left them. Returns the outputs and a maker of fresh inputs."""
    n, c, h, w = shape
    specs = [("grad", (n, c, h // 2, w // 2) if pool else (n, c, h, w), False), ("y", (n, c, h, w), False)]
    specs += [("gamma", (c,), True)] if weight else []
    specs += [("mean", (c,), False), ("rstd", (c,), True)] + ([("r", (n, c, h, w), False)] if relu else [])
    # a 1 x 1 convolution: its weight is the same memory in both layouts, so the layout rule
    # (fireclay_loops.layout) makes the program channels-last at any batch and image size
    specs += [("x", (n, 3, h, w), False), ("w", (c, 3, 1, 1), False)]

    def make():
        return {name: _randn(*size, dtype=dtype, channels_last=len(size) == 4 and name != "w", positive=positive)
                for name, size, positive in specs}

    made = make()
    handles = {name: b.input(t, name) for name, t in made.items()}
    grad = handles["grad"]
    if pool:  # 2x2 windows over the ReLU's output, the indices as its forward saved them
        _, idx = b.call("max_pool2d_with_indices.default", handles["r"], [2, 2], [2, 2])
        grad = b.call("max_pool2d_with_indices_backward.default", grad, handles["r"], [2, 2], [2, 2], [0, 0],
                      [1, 1], False, idx)
    if relu:  # (ReLU's backward as the decomposition writes it)
        grad = b.call("where.ScalarSelf", b.call("le.Scalar", handles["r"], 0), 0.0, grad)
    # native_batch_norm_backward as fireclay-autograd decomposes it for the loops stage
    dims, count = [0, 2, 3], float(n * h * w)

    def per_channel(name):
        return b.call("view.default", handles[name], [1, c, 1, 1])

    rstd = per_channel("rstd")
    centred = b.call("sub.Tensor", handles["y"], per_channel("mean"))
    sum_grad = b.call("sum.dim_IntList", grad, dims, True)
    dot = b.call("sum.dim_IntList", b.call("mul.Tensor", grad, centred), dims, True)
    projection = b.call("mul.Tensor", b.call("mul.Tensor", dot, 1.0 / count), b.call("mul.Tensor", rstd, rstd))
    scale = b.call("mul.Tensor", rstd, per_channel("gamma")) if weight else rstd
    grad_input = b.call("mul.Tensor", b.call("sub.Tensor", b.call("sub.Tensor", grad, b.call(
        "mul.Tensor", centred, projection)), b.call("mul.Tensor", sum_grad, 1.0 / count)), scale)
    # the convolution before it in the forward: what makes the program channels-last
    grad_x, grad_w, _ = b.call("convolution_backward.default", grad_input, handles["x"], handles["w"], [0],
                               [1, 1], [0, 0], [1, 1], False, [0, 0], 1, [True, True, False])
    outs = [grad_input, grad_x, grad_w, b.call("view.default", sum_grad, [c])]
    if weight:
        outs.append(b.call("view.default", b.call("mul.Tensor", dot, rstd), [c]))
    return outs, lambda: list(make().values())


# (id, N, C, H, W): channels of a block, fewer than a block, ragged blocks, one channel
SHAPES = [
    ("cnn_first_stage", 8, 16, 32, 32),
    ("one_block", 2, COLUMN_BLOCK, 6, 6),
    ("ragged_blocks", 3, 2 * COLUMN_BLOCK + 7, 5, 3),
    ("few_channels", 4, 3, 7, 9),
    ("one_image", 1, 24, 6, 6),
]


@pytest.mark.parametrize("relu,weight,pool", [(True, True, True), (True, True, False), (False, False, False)],
                         ids=["pool_relu_weight", "relu_weight", "plain"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("cid,n,c,h,w", SHAPES, ids=[s[0] for s in SHAPES])
def test_channels_last_batch_norm_backward(cid, n, c, h, w, dtype, relu, weight, pool):
    b = AtenBuilder()
    outs, make_inputs = _bn_backward(b, (n, c, h, w), dtype, relu=relu, weight=weight, pool=pool)
    compiled = fireclay_cpp.compile_program(b.output(*outs))
    source = compiled.cpp_sources[0]
    reductions = [k for k in _kernels(source) if "acc" in k]
    assert reductions and all(COLUMN_LOOP in k for k in reductions), source
    # the input gradient: a second loop over r, in blocks like the first
    assert any(k.count("#pragma omp simd") >= 2 for k in reductions), source
    tol = {"atol": 1e-4, "rtol": 1e-4} if dtype == torch.float32 else {"atol": 1e-10, "rtol": 1e-10}
    for _ in range(2):  # fresh inputs on the second call
        tensors = make_inputs()
        got, want = compiled(*tensors), b.eager(*tensors)
        assert len(got) == len(want)
        for g, wnt in zip(got, want):
            # (the convolution's gradients sum over every channel: errors scale with their size)
            atol = tol["atol"] * max(1.0, wnt.abs().max().item())
            torch.testing.assert_close(g, wnt, atol=atol, rtol=tol["rtol"],
                                       msg=lambda m: f"{cid} (seed {SEED}): {m}")


def _centre_columns(b, x):
    """x - mean over rows: the sums in one loop, the centred values in a second."""
    return (b.call("sub.Tensor", x, b.call("mean.dim", x, [0], True)),)


def _standardise_columns(b, x):
    """Three loops: the mean, the sum of squared deviations from it, then the standardised
    values (a reduction in a later loop too)."""
    centred = b.call("sub.Tensor", x, b.call("mean.dim", x, [0], True))
    var = b.call("mean.dim", b.call("mul.Tensor", centred, centred), [0], True)
    return (b.call("mul.Tensor", centred, b.call("rsqrt.default", b.call("add.Tensor", var, 1e-5))),)


def _softmax_over_rows(b, x):
    """max, sum of exp, then the normalised values: softmax along the reduced (strided) dim."""
    return (b.call("_softmax.default", x, 0, False),)


def _scaled_by_column_sum_of_3d(b, x):
    """Reduced dims on both sides of the kept one, with the kept dim innermost in memory."""
    s = b.call("sum.dim_IntList", x, [0, 1], True)
    return b.call("mul.Tensor", x, b.call("sigmoid.default", s)), s


# (id, builder, input shape, atol, rtol)
CASES = [
    ("centre", _centre_columns, (300, 40), 1e-5, 1e-5),
    ("centre_ragged", _centre_columns, (37, COLUMN_BLOCK + 3), 1e-5, 1e-5),
    ("standardise", _standardise_columns, (200, 70), 1e-4, 1e-4),
    ("softmax_rows", _softmax_over_rows, (129, 33), 1e-5, 1e-5),
    ("three_dims", _scaled_by_column_sum_of_3d, (6, 11, 20), 1e-4, 1e-5),
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("cid,build,shape,atol,rtol", CASES, ids=[c[0] for c in CASES])
def test_later_column_loops_match_eager(cid, build, shape, atol, rtol, dtype):
    x = _randn(*shape, dtype=dtype)
    b = AtenBuilder()
    program = b.output(*build(b, b.input(x, "x")))
    compiled = fireclay_cpp.compile_program(program)
    source = compiled.cpp_sources[0]
    assert COLUMN_LOOP in source and source.count("#pragma omp simd") >= 2, source
    for _ in range(2):
        got, want = compiled(x), b.eager(x)
        for g, w in zip(got, want):
            torch.testing.assert_close(g, w, atol=atol, rtol=rtol, msg=lambda m: f"{cid} (seed {SEED}): {m}")
        x = _randn(*shape, dtype=dtype)


@pytest.mark.parametrize("rows,cols", [(3, 5), (64, 32), (513, 257 + COLUMN_BLOCK)])
def test_symbolic_centred_columns(rows, cols):
    """Symbolic sizes: the block's width and the ragged last block are decided at run time."""
    from fireclay_ir import Graph, Program, TensorMeta

    g = Graph("main")
    x = g.add_input("x", TensorMeta("float32", ("s0", "s1")))
    s = g.call("aten::sum.dim_IntList", (x, [0], True), out=TensorMeta("float32", (1, "s1")))
    g.set_outputs([g.call("aten::sub.Tensor", (x, s), out=TensorMeta("float32", ("s0", "s1")))])
    p = Program.single(g)
    p.add_symbol("s0", hint=64, min=2)
    p.add_symbol("s1", hint=32, min=2)
    compiled = fireclay_cpp.compile_program(p)
    source = compiled.cpp_sources[0]
    assert COLUMN_LOOP in source and source.count("#pragma omp simd") >= 2, source
    x = _randn(rows, cols)
    (got,) = compiled(x)
    torch.testing.assert_close(got, x - x.sum(0, keepdim=True), atol=1e-4, rtol=1e-5)
