"""Channels-last layouts around 2-D convolutions (fireclay_loops.layout): the table of
convolution programs of ``conv_programs`` run by the reference executor against eager, in
float32 and float64, with the layouts checked: convolutions read channels-last activations, the
kernels around them store channels-last buffers in memory order, outputs have eager's strides
(saved outputs keep the compiler's), and the libraries' layout rule holds for every op the
lowering relies on."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from aten_builder import AtenBuilder  # noqa: E402
from conv_programs import CL, PROGRAMS, build, is_channels_last, same_strides, tolerance  # noqa: E402

from fireclay_ir import Graph, Program, TensorMeta  # noqa: E402
from fireclay_loops import ComputeNode, ExternNode, config, layout, lower, schedule  # noqa: E402
from fireclay_loops.config import Config  # noqa: E402
from fireclay_loops.reference import run  # noqa: E402

DTYPES = [torch.float32, torch.float64]


# The arguments passed channels-last: the activations, and a forward convolution's weight.
ACTIVATIONS = {"aten::convolution.default": (0, 1), "aten::convolution_backward.default": (0, 1)}


def _channels_last_views(program):
    """For each convolution call: whether its 4-D activation arguments (and a forward's weight)
    are channels-last."""
    found = []
    for n in program.nodes:
        if isinstance(n, ExternNode) and n.op in ACTIVATIONS:
            acts = [n.args[k] for k in ACTIVATIONS[n.op] if layout.can_be_channels_last(n.args[k].size)]
            found.append(all(layout.is_channels_last(a.size, a.stride) for a in acts))
    return found


@pytest.mark.parametrize("dtype", DTYPES, ids=["float32", "float64"])
@pytest.mark.parametrize("case", PROGRAMS, ids=[c.name for c in PROGRAMS])
def test_conv_program_matches_eager_with_its_strides(case, dtype):
    program, b, make_inputs = build(case, dtype, seed=sum(map(ord, case.name)))
    loop_program = lower(program, channels_last=True)
    scheduled = schedule(loop_program)
    for _ in range(2):
        inputs = make_inputs()
        got, want = run(scheduled, *inputs), b.eager(*inputs)
        for k, (g, w) in enumerate(zip(got, want)):
            torch.testing.assert_close(g, w, **tolerance(dtype), equal_nan=True)
            if k in case.saved:
                continue
            expected = program.main.outputs[k].meta.strides if case.meta_strides_differ else w.stride()
            assert same_strides(g, expected), (k, g.stride(), expected)
    # the convolution forward and backward calls read channels-last activations (and weights)
    assert all(_channels_last_views(loop_program))


@pytest.mark.parametrize("case", PROGRAMS, ids=[c.name for c in PROGRAMS])
def test_without_the_option_nothing_is_channels_last(case):
    program, b, make_inputs = build(case, torch.float32, seed=3)
    loop_program = lower(program, channels_last=False)
    computed = [buf for buf in loop_program.buffers.values() if not buf.is_input]
    assert not any(layout.is_channels_last(buf.size, buf.stride) for buf in computed
                   if not any(isinstance(n, ExternNode) and buf.name in n.outputs for n in loop_program.nodes))
    inputs = make_inputs()
    for g, w in zip(run(schedule(loop_program), *inputs), b.eager(*inputs)):
        torch.testing.assert_close(g, w, **tolerance(torch.float32))


def test_kernels_around_convolutions_store_channels_last_in_memory_order():
    case = next(c for c in PROGRAMS if c.name == "conv_bn_relu_pool")
    program, _, _ = build(case, torch.float32, seed=1)
    loop_program = lower(program, channels_last=True)
    stored = [n for n in loop_program.nodes if isinstance(n, ComputeNode)]
    cl = [n for n in stored if any(layout.is_channels_last(loop_program.buffers[b].size, loop_program.buffers[b].stride)
                                   for b, _, _ in n.body.writes())]
    # the input copy, both batch norms and both poolings
    assert len(cl) >= 5
    for n in cl:
        # the innermost loop walks the channels: the store's index moves by 1 along it
        [(_, index, _)] = n.body.writes()
        inner = n.body.vars[-1]
        assert index.coeff(inner) == 1, (n.name, index)


def test_saved_outputs_keep_the_computed_layout():
    case = next(c for c in PROGRAMS if c.name == "training_forward")
    program, b, make_inputs = build(case, torch.float32, seed=2)
    scheduled = schedule(lower(program, channels_last=True))
    got = run(scheduled, *make_inputs())
    pooled, indices, conv_out, relu_out = got[:4]
    assert not is_channels_last(pooled)  # a user output: eager's (contiguous) strides
    assert is_channels_last(indices) and is_channels_last(conv_out) and is_channels_last(relu_out)
    del program.main.meta["autograd.saved_outputs"]
    got = run(schedule(lower(program, channels_last=True)), *make_inputs())
    assert not any(is_channels_last(t) for t in got)


def test_program_choice_follows_config_and_device():
    case = next(c for c in PROGRAMS if c.name == "strided_conv_bias")
    program, _, _ = build(case, torch.float32, seed=4)
    assert layout.uses_channels_last(program.main, ("cpu",))
    assert not layout.uses_channels_last(program.main, ("cuda",))
    assert not layout.uses_channels_last(program.main, ())
    saved = config.channels_last
    try:
        config.channels_last = ()
        assert not lower(program).buffers.keys() - {n for n in lower(program, channels_last=False).buffers}
        assert not any(layout.is_channels_last(b.size, b.stride) for b in lower(program).buffers.values())
        config.channels_last = ("cpu",)
        assert any(layout.is_channels_last(b.size, b.stride) for b in lower(program).buffers.values())
    finally:
        config.channels_last = saved


CUDA_CASES = [
    # (program, dtype, channels-last on CUDA)
    ("strided_conv_bias", torch.float32, True),  # inference: TF32 outputs within float32's tolerance
    ("training_forward", torch.float32, False),  # weight gradients 6e-2 off eager's with TF32 NHWC
    ("training_backward", torch.float32, False),
    ("strided_conv_bias", torch.bfloat16, True),
    ("training_forward", torch.bfloat16, True),
    ("training_backward", torch.float16, True),
]


@pytest.mark.parametrize("name,dtype,expected", CUDA_CASES, ids=[f"{n}-{str(d)[6:]}" for n, d, _ in CUDA_CASES])
def test_on_cuda_float32_training_keeps_eager_layout(name, dtype, expected):
    """cuDNN runs TF32 kernels for channels-last float32 convolutions where eager's NCHW calls
    mostly do not: float32 training keeps eager's layout on CUDA; inference and 16-bit types
    change it."""
    case = next(c for c in PROGRAMS if c.name == name)
    program, _, _ = build(case, dtype, seed=4, device="cuda")
    assert layout.uses_channels_last(program.main, ("cpu", "cuda")) is expected
    cpu_program, _, _ = build(case, torch.float32, seed=4)
    assert layout.uses_channels_last(cpu_program.main, ("cpu", "cuda"))


@pytest.mark.parametrize("batch,expected", [(2, False), (32, True)])
def test_cpu_programs_whose_weight_copies_outweigh_activations_keep_eager_layout(batch, expected):
    """A channels-last CPU program copies every k x k weight on every call: worth it only where
    the convolutions' activations have at least as many elements (ResNet-18 at batch 2: 1.8x
    slower channels-last). CUDA's choice is its own."""
    case = next(c for c in PROGRAMS if c.name == "heavy_weights")
    program, _, _ = build(case, torch.float32, seed=5)
    assert not layout.uses_channels_last(program.main, ("cpu",))
    b = AtenBuilder()
    x = b.input(torch.randn(batch, 16, 4, 4), "x")
    w = b.input(torch.randn(32, 16, 3, 3), "w")  # 4608 elements to copy; activations 256 a sample
    conv = b.call("convolution.default", x, w, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1)
    assert layout.uses_channels_last(b.output(conv).main, ("cpu",)) is expected
    cuda_program, _, _ = build(case, torch.bfloat16, seed=5, device="cuda")
    assert layout.uses_channels_last(cuda_program.main, ("cpu", "cuda"))


@pytest.mark.parametrize("batch", [1, 2, 3, 4, 5, 8])
def test_a_training_steps_forward_and_backward_choose_the_same_cpu_layout(batch):
    """The backward weighs its convolution's input against the weight, as the forward does, not
    the output's gradient too: with it, batches 2-4 below gave an NCHW forward and a channels-last
    backward, which copied every saved activation, gradient and weight on each step (timm's
    ResNet-50 training, 1.2x slower than either layout)."""
    x, w = torch.randn(batch, 16, 4, 4), torch.randn(32, 16, 3, 3)  # 4608 weight elements, 256 a sample
    forward = AtenBuilder()
    conv = forward.call("convolution.default", forward.input(x, "x"), forward.input(w, "w"), None,
                        [1, 1], [1, 1], [1, 1], False, [0, 0], 1)
    backward = AtenBuilder()
    grads = backward.call("convolution_backward.default", backward.input(torch.randn(batch, 32, 4, 4), "g"),
                          backward.input(x, "x"), backward.input(w, "w"), [0], [1, 1], [1, 1], [1, 1], False,
                          [0, 0], 1, [True, True, False])
    backward_program = backward.output(grads[0], grads[1])
    chosen = {layout.uses_channels_last(forward.output(conv).main, ("cpu",)),
              layout.uses_channels_last(backward_program.main, ("cpu",))}
    assert chosen == {batch * 256 * layout.WEIGHT_COPY_LIMIT >= 4608}


@pytest.mark.parametrize("image,kernel,eager_layout", [(2, 5, True), (4, 5, True), (2, 3, True), (4, 3, False),
                                                       (8, 5, False)])
def test_depthwise_backward_with_a_kernel_larger_than_its_image_runs_in_eager_layout(image, kernel, eager_layout):
    """oneDNN's channels-last depthwise backward is 2.5-4x slower than its NCHW one where the kernel
    is larger than the image (EfficientNet's last stages); elsewhere channels-last is faster."""
    c = 48
    x = torch.randn(2, c, image, image).to(memory_format=torch.channels_last)  # a saved activation
    b = AtenBuilder()
    xi, gi, wi = b.input(x, "x"), b.input(torch.randn(2, c, image, image), "g"), b.input(torch.randn(c, 1, kernel, kernel), "w")
    g = b.call("relu.default", gi)  # a gradient our kernels compute
    grads = b.call("convolution_backward.default", g, xi, wi, [0], [1, 1], [kernel // 2] * 2, [1, 1], False,
                   [0, 0], c, [True, True, False])
    program = b.output(grads[0], grads[1])
    loop_program = lower(program, channels_last=True)
    assert _channels_last_views(loop_program) == [not eager_layout]
    scheduled = schedule(loop_program)
    for seed in range(2):
        torch.manual_seed(seed)
        inputs = [torch.randn(2, c, image, image).to(memory_format=torch.channels_last),
                  torch.randn(2, c, image, image), torch.randn(c, 1, kernel, kernel)]
        for got, want in zip(run(scheduled, *inputs), b.eager(*inputs)):
            torch.testing.assert_close(got, want, **tolerance(torch.float32))


def test_programs_without_2d_convolutions_are_left_alone():
    b = AtenBuilder()
    x, w = b.input(torch.randn(2, 3, 9), "x"), b.input(torch.randn(4, 3, 3), "w")
    y = b.call("convolution.default", x, w, None, [1], [1], [1], False, [0], 1)  # 1-D
    p = b.output(b.call("relu.default", y))
    assert not layout.uses_channels_last(p.main, ("cpu",))
    t = torch.randn(2, 8, 4, 4)
    b = AtenBuilder()
    p = b.output(b.call("relu.default", b.input(t, "x")))
    assert not layout.uses_channels_last(p.main, ("cpu",))


@pytest.mark.parametrize("raw,expected", [(None, ("cpu", "cuda")), ("cpu", ("cpu",)), ("", ()), ("none", ()),
                                          ("0", ()), ("cpu,cuda", ("cpu", "cuda")), (" CUDA ", ("cuda",))])
def test_environment_variable(monkeypatch, raw, expected):
    if raw is None:
        monkeypatch.delenv("FIRECLAY_LOOPS_CHANNELS_LAST", raising=False)
    else:
        monkeypatch.setenv("FIRECLAY_LOOPS_CHANNELS_LAST", raw)
    assert Config.from_environment().channels_last == expected


def test_symbolic_sizes():
    """A batch and image size only known at run time: channels-last strides are expressions."""
    g = Graph("main")
    x = g.add_input("x", TensorMeta("float32", ("s0", 3, "s1", "s1")))
    w = g.add_input("w", TensorMeta("float32", (5, 3, 3, 3)))
    c = g.call("aten::convolution.default", (x, w, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1),
               out=TensorMeta("float32", ("s0", 5, "s1", "s1")))
    r = g.call("aten::relu.default", (c,), out=TensorMeta("float32", ("s0", 5, "s1", "s1")))
    s = g.call("aten::add.Tensor", (r, c), out=TensorMeta("float32", ("s0", 5, "s1", "s1")))
    g.set_outputs([s])
    p = Program.single(g)
    p.add_symbol("s0", hint=4, min=2)
    p.add_symbol("s1", hint=6, min=2)
    loop_program = lower(p, channels_last=True)
    assert all(_channels_last_views(loop_program))
    scheduled = schedule(loop_program)
    for n, hw in ((2, 5), (3, 7)):
        xs, ws = torch.randn(n, 3, hw, hw), torch.randn(5, 3, 3, 3)
        y = torch.nn.functional.conv2d(xs, ws, padding=1)
        [got] = run(scheduled, xs, ws)
        torch.testing.assert_close(got, torch.relu(y) + y, atol=1e-5, rtol=1e-5)
        assert got.is_contiguous()


# The lowering plans the results of these library calls channels-last when the argument at the
# table's position is; a wrong entry would cost a copy per call (never a wrong answer): check
# each against eager, with only that argument channels-last.
def _follow_cases():
    x, w = torch.randn(2, 4, 6, 6), torch.randn(5, 4, 3, 3)
    g, gamma, beta = torch.randn(2, 5, 6, 6), torch.rand(4) + 0.5, torch.randn(4)
    mean, var = torch.randn(4), torch.rand(4) + 0.5
    pooled, idx = torch.ops.aten.max_pool2d_with_indices.default(x, [2, 2], [2, 2])
    gp = torch.randn_like(pooled)
    return {
        "aten::convolution.default": (x, w, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1),
        "aten::convolution_backward.default": (g, x, w, [0], [1, 1], [1, 1], [1, 1], False, [0, 0], 1,
                                               [True, True, False]),
        "aten::_native_batch_norm_legit_functional.default": (x, gamma, beta, mean, var, True, 0.1, 1e-5),
        "aten::_native_batch_norm_legit.default": (x, gamma, beta, mean.clone(), var.clone(), True, 0.1, 1e-5),
        "aten::_native_batch_norm_legit.no_stats": (x, gamma, beta, True, 0.1, 1e-5),
        "aten::_native_batch_norm_legit_no_training.default": (x, gamma, beta, mean, var, 0.1, 1e-5),
        "aten::native_batch_norm.default": (x, gamma, beta, mean.clone(), var.clone(), True, 0.1, 1e-5),
        "aten::native_batch_norm_backward.default": (torch.randn_like(x), x, gamma, mean, var, mean, var, True,
                                                     1e-5, [True, True, True]),
        "aten::max_pool2d_with_indices.default": (x, [2, 2], [2, 2]),
        "aten::max_pool2d_with_indices_backward.default": (gp, x, [2, 2], [2, 2], [0, 0], [1, 1], False, idx),
        "aten::avg_pool2d.default": (x, [2, 2], [2, 2]),
        "aten::avg_pool2d_backward.default": (gp, x, [2, 2], [2, 2], [0, 0], False, True, None),
    }


@pytest.mark.parametrize("op", sorted(layout.FOLLOWS_INPUT_LAYOUT))
def test_library_layout_rule_holds_in_eager(op):
    from aten_builder import aten_op

    args = list(_follow_cases()[op])
    pos = layout.FOLLOWS_INPUT_LAYOUT[op]
    args[pos] = args[pos].contiguous(memory_format=CL)
    result = aten_op(op)(*args)
    results = result if isinstance(result, (tuple, list)) else [result]
    four_d = [r for r in results if isinstance(r, torch.Tensor) and r.dim() == 4 and layout.can_be_channels_last(r.shape)]
    assert four_d and all(is_channels_last(r) for r in four_d)
