"""Peak memory follows the memory plan: buffers and shared allocations are deleted after their
last use, extern results are the buffers themselves (no copy into planned memory), and the
compiled program's peak on the GPU stays near eager's."""

import re

import pytest
import torch
from aten_builder import AtenBuilder

from fireclay_loops import lower, schedule
from fireclay_triton import generate_kernels
from fireclay_triton.wrapper_codegen import generate_wrapper


def mm_chain(b, x, w):
    h = x
    for act in ("relu", "sigmoid", "tanh", "gelu"):
        h = b.call(f"{act}.default", b.call("mm.default", h, w))
    return (b.call("sum.dim_IntList", h, [1]),)


def residual_chain(b, x, w):
    h = b.call("mm.default", x, w)
    r = b.call("add.Tensor", b.call("relu.default", h), x)
    n, _, _ = b.call("native_layer_norm.default", r, [x.meta.shape[-1]], None, None, 1e-5)
    return (b.call("mm.default", n, w), b.call("amax.default", r, [0]))


def gradient_like(b, x, w):  # outputs made after temporaries died, as a backward's gradients
    a = b.call("tanh.default", b.call("mm.default", x, w))
    g = b.call("mul.Tensor", a, a)
    gsum = b.call("sum.dim_IntList", g, [0])
    return (b.call("mm.default", b.call("t.default", x), g), gsum,
            b.call("relu.default", b.call("addmm.default", gsum, g, w)))


def wrapper_of(build):
    """The scheduled program ``build`` makes of two 32x32 inputs, and its wrapper's text."""
    b = AtenBuilder()
    x, w = b.input(torch.empty(32, 32, device="meta"), "x"), b.input(torch.empty(32, 32, device="meta"), "w")
    scheduled = schedule(lower(b.output(*build(b, x, w))))
    kernels = {k.name: k for k in generate_kernels(scheduled, interpret=False)}
    return scheduled, generate_wrapper(scheduled, kernels).text


@pytest.mark.parametrize("build", [mm_chain, residual_chain, gradient_like])
def test_every_intermediate_is_deleted_after_its_last_use(build):
    scheduled, text = wrapper_of(build)
    assert ".copy_(result" not in text  # extern results are bound, not copied
    assert text.count("    del result") == text.count("    result = ")  # every extern result is let go
    outputs = set(scheduled.program.output_buffers())
    made = set(re.findall(r"^    (buf\d+|mem\d+) = ", text, re.M))
    deleted = {n for line in re.findall(r"^    del (.*)$", text, re.M) for n in line.split(", ")}
    held = {scheduled.plan.buffer_allocation[o] for o in outputs if o in scheduled.plan.buffer_allocation}
    assert made - outputs - held <= deleted, "an intermediate lives until the program returns"


def mm_chain_eager(x, w):  # written as a person would: each intermediate dies when replaced
    h = x
    for act in (torch.relu, torch.sigmoid, torch.tanh, torch.nn.functional.gelu):
        h = act(h @ w)
    return (h.sum(1),)


def gradient_like_eager(x, w):
    g = torch.tanh(x @ w) ** 2
    gsum = g.sum(0)
    return (x.t() @ g, gsum, torch.relu(torch.addmm(gsum, g, w)))


def residual_chain_eager(x, w):
    r = torch.relu(x @ w) + x
    return (torch.nn.functional.layer_norm(r, (r.shape[1],), eps=1e-5) @ w, r.amax(0))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("build,eager", [(mm_chain, mm_chain_eager), (residual_chain, residual_chain_eager),
                                         (gradient_like, gradient_like_eager)])
def test_peak_gpu_memory_is_near_eager(build, eager):
    from fireclay_triton import compile_program

    n = 2048
    xs = [torch.randn(n, n, device="cuda") / n ** 0.5 for _ in range(2)]
    b = AtenBuilder()
    handles = [b.input(t, f"x{i}") for i, t in enumerate(xs)]
    compiled = compile_program(b.output(*build(b, *handles)), xs)

    def peak(fn):
        fn(*xs)  # warm-up (compiles, autotunes)
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        out = fn(*xs)
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() - base, out

    got_peak, got = peak(compiled)
    want_peak, want = peak(eager)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, atol=1e-3, rtol=1e-3)
    assert got_peak <= want_peak * 1.05 + 2**20, (got_peak, want_peak)


@pytest.mark.parametrize("build", [mm_chain, residual_chain])  # typed views of mixed layouts; held as is
def test_shared_allocations_of_one_layout_are_held_without_views(build):
    scheduled, text = wrapper_of(build)
    plan, prog = scheduled.plan, scheduled.program
    for a in set(plan.buffer_allocation.values()):
        users = [buf for buf, alloc in plan.buffer_allocation.items() if alloc == a and f"{buf} = {a}" in text]
        layouts = {(prog.buffers[u].dtype, tuple(prog.buffers[u].size), tuple(prog.buffers[u].stride)) for u in users}
        if users:  # an allocation held as its buffers: made in their one layout, no typed view of it
            assert len(layouts) == 1 and f"typed({a}," not in text
            assert re.search(rf"^ +{a} = torch\.empty_strided\(", text, re.M)  # in the call or its workspace
    for typed_use in re.findall(r"= typed\((mem\d+), ", text):
        owners = [u for u, alloc in plan.buffer_allocation.items() if alloc == typed_use]
        layouts = {(prog.buffers[u].dtype, tuple(prog.buffers[u].size), tuple(prog.buffers[u].stride)) for u in owners}
        assert len(layouts) > 1, f"{typed_use} holds one layout yet its buffers are typed views"
