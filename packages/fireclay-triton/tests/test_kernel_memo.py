"""Kernels equal by structure are written once (``fireclay_triton.api.KernelMemo``): the layers of
a model give kernels that differ only in their buffers. The memo must change no generated text,
and kernels that differ in anything a generator writes (a constant, a dtype, a stride, a size)
must not share it. Generation runs anywhere; the compiled programs run in Triton's interpreter."""

import os

import pytest
import torch
from aten_builder import AtenBuilder

import fireclay_triton.api as api
from fireclay_loops import lower, schedule
from fireclay_triton import Config, compile_program, generate_kernels
from fireclay_triton.kernel_codegen import generate_kernel

interpreted = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="runs in Triton's interpreter")


def layers(n: int, x: torch.Tensor, weights: list[torch.Tensor]):
    """``n`` identical layers: a matmul (a kernel boundary), shift, relu, a softmax over the rows, a
    residual add."""
    b = AtenBuilder()
    h = b.input(x, "x")
    ws = [b.input(w, f"w{k}") for k, w in enumerate(weights[:n])]
    for w in ws:
        y = b.call("relu.default", b.call("add.Tensor", b.call("mm.default", h, w), 0.5))
        h = b.call("add.Tensor", h, b.call("_softmax.default", y, 1, False))
    return b, b.output(h)


def fresh_memo(monkeypatch) -> api.KernelMemo:
    memo = api.KernelMemo()
    monkeypatch.setattr(api, "kernel_memo", memo)
    return memo


def without_memo(scheduled, interpret: bool):
    prog = scheduled.program
    return [generate_kernel(k, lambda b: prog.buffers[b].dtype, lambda b: prog.buffers[b].storage_numel,
                            interpret, Config().persistent_limit) for k in scheduled.kernels]


def test_generated_kernels_do_not_grow_with_the_layers(monkeypatch):
    x = torch.randn(8, 32)
    weights = [torch.randn(32, 32) for _ in range(6)]
    generated = {}
    for n in (2, 6):
        memo = fresh_memo(monkeypatch)
        _, program = layers(n, x, weights)
        scheduled = schedule(lower(program))
        kernels = generate_kernels(scheduled, interpret=False)
        assert len(kernels) >= n  # a kernel or more per layer...
        generated[n] = memo.generated  # ...but the same ones written for 2 layers as for 6
        assert memo.reused == len(kernels) - memo.generated
        # and the text, names and arguments are what generating each kernel alone gives
        alone = without_memo(scheduled, interpret=False)
        assert [(k.name, k.source, k.buffers, k.symbols, k.kind) for k in kernels] == \
            [(k.name, k.source, k.buffers, k.symbols, k.kind) for k in alone]
    assert generated[6] == generated[2]


def pointwise(fn, *inputs: torch.Tensor):
    b = AtenBuilder()
    handles = [b.input(t, f"x{k}") for k, t in enumerate(inputs)]
    return b, b.output(fn(b, *handles))


def scale(c):
    return lambda b, x: b.call("mul.Tensor", b.call("add.Tensor", x, 1.0), c)


def total(b, x):
    return b.call("sum.dim_IntList", b.call("exp.default", x), [1], True)


# (what differs, the first program, the second): each pair differs in that alone
DIFFERENT = [
    ("constant", (scale(2.0), torch.randn(8, 16)), (scale(3.0), torch.randn(8, 16))),
    ("sign of zero", (scale(0.0), torch.randn(8, 16)), (scale(-0.0), torch.randn(8, 16))),
    ("dtype", (scale(2.0), torch.randn(8, 16)), (scale(2.0), torch.randn(8, 16, dtype=torch.float64))),
    ("stride", (scale(2.0), torch.randn(8, 16)), (scale(2.0), torch.randn(16, 8).t())),
    ("size", (total, torch.randn(8, 16)), (total, torch.randn(8, 17))),
    ("reduction size", (total, torch.randn(4, 64)), (total, torch.randn(4, 65))),
]


@pytest.mark.parametrize("what,first,second", DIFFERENT, ids=[c[0] for c in DIFFERENT])
def test_kernels_that_differ_do_not_share(monkeypatch, what, first, second):
    memo = fresh_memo(monkeypatch)
    for fn, x in (first, second):
        _, program = pointwise(fn, x)
        scheduled = schedule(lower(program))
        before = memo.generated
        kernels = generate_kernels(scheduled, interpret=False)
        assert memo.generated == before + len(kernels), f"a kernel of another {what} was reused"
        assert [k.source for k in kernels] == [k.source for k in without_memo(scheduled, interpret=False)]
    # the same program again is all reuse
    fn, x = second
    kernels = generate_kernels(schedule(lower(pointwise(fn, x)[1])), interpret=False)
    assert memo.reused == len(kernels)


@interpreted
@pytest.mark.parametrize("what,first,second", DIFFERENT, ids=[c[0] for c in DIFFERENT])
def test_reused_kernels_give_eager_results(monkeypatch, what, first, second):
    fresh_memo(monkeypatch)
    for fn, x in (first, second, first, second):  # the second round is served by the memo
        b, program = pointwise(fn, x)
        inputs = [torch.randn(x.shape, dtype=x.dtype).as_strided(x.shape, x.stride())]
        got = compile_program(program, inputs)(*inputs)
        (want,) = b.eager(*inputs)
        torch.testing.assert_close(got[0], want)


@interpreted
def test_layers_give_eager_results(monkeypatch):
    memo = fresh_memo(monkeypatch)
    x = torch.randn(4, 16)
    weights = [torch.randn(16, 16) for _ in range(3)]
    b, program = layers(3, x, weights)
    got = compile_program(program, [x, *weights])(x, *weights)
    (want,) = b.eager(x, *weights)
    assert memo.reused > 0
    torch.testing.assert_close(got[0], want)
