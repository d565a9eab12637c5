"""The kept workspace (wrapper_codegen.py): memory only a call's temporaries use is held as
storages whose views are made once and given their bytes where the memory plan allocates.

Checked on a CUDA GPU, else in Triton's interpreter, against eager, over several calls with fresh
random inputs:
values; that a result a caller keeps is never changed by a later call (every output is checked
after the next calls, outputs that took over a temporary's memory among them); that the wrapper
keeps exactly internal temporaries (never an output or an input) and frees each at the plan's
point; that nothing but the workspace's own views outlives a call; and that a second workspace
serves a call while the first is taken (another thread's call). On a GPU, also through CUDA
graphs (a capture takes and frees the workspace's memory in the graph's pool).
"""

import os
import re

import pytest
import torch
from aten_builder import AtenBuilder
from test_memory import wrapper_of  # (the scheduled program of a build and its wrapper text)

from fireclay_triton import Config, compile_program, cudagraphify

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
pytestmark = pytest.mark.skipif(DEVICE == "cpu" and os.environ.get("TRITON_INTERPRET") != "1",
                                reason="needs a CUDA GPU or Triton's interpreter")


def mm_chain(b, x, w):  # matmul results that die at once: written in place into kept memory
    h = x
    for act in ("relu", "sigmoid", "tanh", "gelu"):
        h = b.call(f"{act}.default", b.call("mm.default", h, w))
    return (b.call("sum.dim_IntList", h, [1]),)


def residual_chain(b, x, w):  # temporaries of several layouts sharing memory, an output after them
    h = b.call("mm.default", x, w)
    r = b.call("add.Tensor", b.call("relu.default", h), x)
    n, _, _ = b.call("native_layer_norm.default", r, [x.meta.shape[-1]], None, None, 1e-5)
    return (b.call("mm.default", n, w), b.call("amax.default", r, [0]))


def backward_like(b, x, w):
    """Gradient-shaped outputs (small vectors, matrices) made after temporaries died, as a
    backward returns them: they take over the temporaries' memory in the plan."""
    h = b.call("mm.default", x, w)
    a = b.call("tanh.default", h)
    g = b.call("mul.Tensor", a, a)
    gw = b.call("mm.default", b.call("t.default", x), g)
    gsum = b.call("sum.dim_IntList", g, [0])
    addmm = b.call("addmm.default", gsum, g, w)
    return gw, gsum, b.call("relu.default", addmm)


def batched(b, x, w):
    q = b.call("view.default", x, [4, 8, 32])
    s = b.call("bmm.default", q, b.call("permute.default", q, [0, 2, 1]))
    p = b.call("_softmax.default", s, -1, False)
    o = b.call("baddbmm.default", q, p, q)
    return (b.call("sum.dim_IntList", b.call("gelu.default", o), [2]),)


def linear_layers(b, x, w):  # matmuls by a transposed weight input: torch's linear, no view made
    bias = b.call("sum.dim_IntList", w, [1])
    h = b.call("addmm.default", bias, x, b.call("t.default", w))
    inner = b.call("mm.default", b.call("relu.default", h), b.call("t.default", w))
    return b.call("mm.default", b.call("sigmoid.default", inner), b.call("t.default", w)), h


def input_views(b, x, w):  # one view of an input read by two matmuls
    xv = b.call("view.default", x, [64, 16])
    ws = b.call("slice.Tensor", w, 0, 0, 16)
    both = b.call("add.Tensor", b.call("mm.default", xv, ws), b.call("mm.default", xv, b.call("relu.default", ws)))
    return (b.call("gelu.default", both),)


BUILDS = [mm_chain, residual_chain, backward_like, batched, linear_layers, input_views]


def compiled_and_builder(build, keep=True):
    b = AtenBuilder()
    x, w = b.input(torch.empty(32, 32, device=DEVICE), "x"), b.input(torch.empty(32, 32, device=DEVICE), "w")
    program = b.output(*build(b, x, w))
    return compile_program(program, cfg=Config(keep_workspace=keep)), b


def fresh_inputs(seed):
    gen = torch.Generator().manual_seed(seed)
    return [(torch.randn(32, 32, generator=gen) / 4).to(DEVICE) for _ in range(2)]


@pytest.mark.parametrize("build", BUILDS)
def test_values_and_kept_results_over_calls(build):
    compiled, b = compiled_and_builder(build)
    assert "resize_(" in compiled.wrapper_source, "no temporary was kept"
    kept = []
    for seed in range(3):
        xs = fresh_inputs(seed)
        got = compiled(*xs)
        want = b.eager(*xs)
        for g, e in zip(got, want, strict=True):
            torch.testing.assert_close(g, e, atol=1e-4, rtol=1e-4)
        kept.append(([g.clone() for g in got], got))
    for copies, results in kept:  # later calls wrote nothing a returned tensor uses
        for c, r in zip(copies, results):
            assert torch.equal(c, r)
    storages = {r.untyped_storage().data_ptr() for _, results in kept for r in results}
    assert len(storages) == sum(len(results) for _, results in kept), "two results share memory"


@pytest.mark.parametrize("build", BUILDS)
def test_same_values_as_fresh_memory(build):
    xs = fresh_inputs(7)
    new, _ = compiled_and_builder(build, keep=True)
    old, _ = compiled_and_builder(build, keep=False)
    assert "resize_(" not in old.wrapper_source and "workspace" not in old.wrapper_source
    for _ in range(2):
        for g, e in zip(new(*xs), old(*xs), strict=True):
            torch.testing.assert_close(g, e, atol=0, rtol=0)


@pytest.mark.parametrize("build", BUILDS)
def test_only_internal_temporaries_are_kept_and_each_is_freed(build):
    scheduled, text = wrapper_of(build)
    plan, prog = scheduled.plan, scheduled.program
    call, _, workspace = text.partition("def new_workspace(device):")
    unpacked = re.search(r"^    _, (.*)= workspace$", call, re.M).group(1).split(", ")
    kept = {n for n in unpacked if n.startswith("buf")}
    outputs = set(prog.output_buffers())
    assert kept and not kept & outputs and not kept & set(prog.inputs)
    for b in kept:
        assert plan.lifetimes[b][1] < len(scheduled.steps)
    for storage in (n for n in unpacked if n.startswith("storage_")):
        grows = re.findall(rf"^    {storage}\.resize_\(([1-9]\d*)\)$", call, re.M)
        frees = re.findall(rf"^    {storage}\.resize_\(0\)$", call, re.M)
        assert len(grows) == 1 and len(frees) == 1, storage
        assert call.index(f"{storage}.resize_({grows[0]})") < call.index(f"{storage}.resize_(0)")
        assert f"{storage}.resize_(0)" in workspace  # a workspace holds no memory between calls
    for out in outputs:  # an output is a tensor of its own, never a view of kept memory
        assert not re.search(rf"^    {out} = (typed|mem|view)", call, re.M)


def test_matmul_results_in_kept_memory_are_written_in_place():
    _, text = wrapper_of(mm_chain)
    assert len(re.findall(r"op_aten_mm_default\(.*, out=buf\d+\)", text)) == 4  # each dies inside the call


def test_matmuls_by_transposed_weights_call_linear():
    _, text = wrapper_of(linear_layers)
    assert ".t()" not in text
    assert re.search(r"^    result = linear\(in_x, in_w, buf\d+\)", text, re.M)  # addmm with its bias
    assert re.search(r"^    linear\(buf\d+, in_w, out=buf\d+\)", text, re.M)  # a kept result, in place
    assert re.search(r"^    result = linear\(buf\d+, in_w\)", text, re.M)  # the returned one


def test_a_view_of_what_lives_through_the_call_is_made_once_per_call():
    _, text = wrapper_of(input_views)
    views = dict(re.findall(r"^    (call_view\d+) = (in_x\.as_strided.*)$", text, re.M))
    assert len(views) == 1 and text.count("in_x.as_strided") == 1
    assert len(re.findall(rf"op_aten_mm_default\({next(iter(views))}, ", text)) == 2


def test_a_taken_workspace_is_not_shared():
    """A call finds the pool empty while another call holds its workspace (a second thread):
    it makes its own, and both go back to the pool."""
    compiled, b = compiled_and_builder(residual_chain)
    pool = compiled._call.__globals__["workspaces"]
    xs, ys = fresh_inputs(1), fresh_inputs(2)
    compiled(*xs)
    assert len(pool) == 1
    held = pool.pop()  # as if another call were running with it
    got = compiled(*ys)
    assert len(pool) == 1 and pool[0] is not held
    for g, e in zip(got, b.eager(*ys)):
        torch.testing.assert_close(g, e, atol=1e-4, rtol=1e-4)
    pool.append(held)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("build", BUILDS)
def test_through_cuda_graphs(build):
    compiled, b = compiled_and_builder(build)
    graphed = cudagraphify(compiled)
    kept = []
    for seed in range(4):  # warm-up, capture, replays
        xs = fresh_inputs(seed)
        got = graphed(*xs)
        for g, e in zip(got, b.eager(*xs), strict=True):
            torch.testing.assert_close(g, e, atol=1e-4, rtol=1e-4)
        kept.append(([g.clone() for g in got], got))
    for copies, results in kept:
        for c, r in zip(copies, results):
            assert torch.equal(c, r)


def test_no_memory_is_held_between_calls():
    compiled, _ = compiled_and_builder(backward_like)
    compiled(*fresh_inputs(3))
    (workspace,) = compiled._call.__globals__["workspaces"]
    storages = [t for t in workspace if isinstance(t, torch.UntypedStorage)]
    assert storages and all(s.nbytes() == 0 for s in storages)
