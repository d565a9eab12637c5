"""Test helper: programs of library calls (matmuls, fused attention forward and backward,
convolution) over operands in several layouts (contiguous, transposed or permuted views of
inputs, and values computed from such views), shared by fireclay-loops' tests and the code
generators' (which check the results against eager and count the library results their
wrappers copy into another layout)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from aten_builder import AtenBuilder


def laid_out(shape: Sequence[int], order: Sequence[int], gen: torch.Generator, dtype=torch.float32) -> torch.Tensor:
    """A random tensor of ``shape`` whose dimensions lie in memory in ``order`` (outermost first)."""
    stored = torch.randn([shape[k] for k in order], generator=gen, dtype=dtype)
    inverse = [list(order).index(k) for k in range(len(shape))]
    return stored.permute(*inverse)


@dataclass(frozen=True, kw_only=True)
class Case:
    name: str
    inputs: tuple[tuple[tuple[int, ...], tuple[int, ...]], ...]  # (shape, memory order) of each input
    build: Callable[..., tuple]  # (builder, *input handles) -> outputs
    atol: float = 1e-5
    # whether the program's outputs have eager's strides: not where the builder's metadata (from
    # meta kernels) differs from eager, as convolution's does for a channels-last input (its
    # meta kernel answers contiguous; the program returns the metadata's layout)
    eager_strides: bool = True

    def make(self, gen: torch.Generator, dtype=torch.float32) -> list[torch.Tensor]:
        return [laid_out(shape, order, gen, dtype) for shape, order in self.inputs]

    def program(self, gen: torch.Generator, device: str | None = None):
        """(builder, program) over inputs in this case's layouts."""
        b = AtenBuilder(device=device)
        handles = [b.input(t, f"x{k}") for k, t in enumerate(self.make(gen))]
        return b, b.output(*self.build(b, *handles))


def _computed(b, x):
    """A value computed from ``x``, as a rotary embedding computes a query: elementwise."""
    return b.call("add.Tensor", b.call("mul.Tensor", x, 0.5), b.call("exp.default", x))


def _mm(computed: bool):
    def build(b, x, w):
        if computed:
            x = _computed(b, x)
        y = b.call("mm.default", x, w)
        return b.call("exp.default", y), y
    return build


def _bmm(b, x, w):
    y = b.call("bmm.default", x, w)
    return b.call("exp.default", y), y


def _addmm(b, bias, x, w):
    y = b.call("addmm.default", bias, x, w)
    return b.call("exp.default", y), y


def _attention(computed: bool):
    def build(b, q, k, v):
        if computed:
            q, k = _computed(b, q), _computed(b, k)
        out, _ = b.call("_scaled_dot_product_flash_attention_for_cpu.default", q, k, v, 0.0, True, scale=0.3)
        return b.call("exp.default", out), out
    return build


def _attention_backward(computed: bool):
    def build(b, q, k, v):
        if computed:
            q, k = _computed(b, q), _computed(b, k)
        out, lse = b.call("_scaled_dot_product_flash_attention_for_cpu.default", q, k, v, 0.0, True, scale=0.3)
        grad_out = b.call("mul.Tensor", out, 2.0)
        dq, dk, dv = b.call("_scaled_dot_product_flash_attention_for_cpu_backward.default", grad_out, q, k, v,
                            out, lse, 0.0, True, scale=0.3)
        return b.call("exp.default", dq), b.call("exp.default", dk), dv
    return build


def _convolution(b, x, w):
    y = b.call("convolution.default", x, w, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1)
    return b.call("exp.default", y), y


HEADS = (2, 3, 5, 8)  # (batch, heads, sequence, dim)
# memory orders of a (batch, heads, sequence, dim) tensor: contiguous; heads split off a
# projection by view + transpose; heads outermost
HEAD_ORDERS = {"contiguous": (0, 1, 2, 3), "bshd": (0, 2, 1, 3), "hbsd": (1, 0, 2, 3)}

CASES: list[Case] = []
for _computed_x in (False, True):
    for _xo in ((0, 1), (1, 0)):
        for _wo in ((0, 1), (1, 0)):
            CASES.append(Case(name=f"mm-x{''.join(map(str, _xo))}-w{''.join(map(str, _wo))}"
                              + ("-computed" if _computed_x else ""),
                              inputs=(((6, 5), _xo), ((5, 7), _wo)), build=_mm(_computed_x)))
for _xo, _wo in [((0, 1, 2), (0, 1, 2)), ((0, 2, 1), (0, 2, 1)), ((1, 0, 2), (2, 0, 1))]:
    CASES.append(Case(name=f"bmm-x{''.join(map(str, _xo))}-w{''.join(map(str, _wo))}",
                      inputs=(((3, 4, 5), _xo), ((3, 5, 6), _wo)), build=_bmm))
CASES.append(Case(name="addmm-x10", inputs=(((7,), (0,)), ((6, 5), (1, 0)), ((5, 7), (0, 1))), build=_addmm))
for _name, _order in HEAD_ORDERS.items():
    for _computed_qk in (False, True):
        _suffix = f"{_name}" + ("-computed" if _computed_qk else "")
        CASES.append(Case(name=f"attention-{_suffix}", inputs=((HEADS, _order),) * 3,
                          build=_attention(_computed_qk)))
        CASES.append(Case(name=f"attention-backward-{_suffix}", inputs=((HEADS, _order),) * 3,
                          build=_attention_backward(_computed_qk), atol=1e-4))
for _name, _order in {"nchw": (0, 1, 2, 3), "nhwc": (0, 2, 3, 1)}.items():
    CASES.append(Case(name=f"convolution-{_name}", inputs=(((2, 3, 6, 6), _order), ((4, 3, 3, 3), (0, 1, 2, 3))),
                      build=_convolution, atol=1e-4, eager_strides=_name == "nchw"))


# -- an attention block of a language model -------------------------------------------------

ATTENTION_SIZES = (2, 6, 4, 8)  # batch, sequence, heads, head dim
B, S, H, D = ATTENTION_SIZES
E = H * D


def attention_inputs(gen: torch.Generator, dtype=torch.float32, device: str = "cpu") -> list[torch.Tensor]:
    shapes = [(B, S, E), (E, E), (E, E), (E, E), (E, E), (S, D), (S, D), (B * S, E)]
    return [(torch.randn(*s, generator=gen) * 0.3).to(device=device, dtype=dtype) for s in shapes]


def _heads(b, x2, w):
    """A projection split into heads: linear + view + transpose, (batch, heads, seq, dim)."""
    p = b.call("view.default", b.call("mm.default", x2, b.call("t.default", w)), [B, S, H, D])
    return b.call("transpose.int", p, 1, 2)


def _rotary(b, t, cos, sin):
    return b.call("add.Tensor", b.call("mul.Tensor", t, cos), b.call("mul.Tensor", b.call("neg.default", t), sin))


def _merged(b, t):
    """Heads merged back for the output projection: transpose + view (a view only when the
    attention output lies in (batch, seq, heads, dim) order, as eager's does)."""
    return b.call("view.default", b.call("transpose.int", t, 1, 2), [B * S, E])


def _forward(b, kind, q, k, v):
    """(output, the results its backward needs)."""
    if kind == "cudnn":
        r = b.call("_scaled_dot_product_cudnn_attention.default", q, k, v, None, True, 0.0, True)
        return r[0], r
    if kind == "flash":
        r = b.call("_scaled_dot_product_flash_attention.default", q, k, v, 0.0, True)
        return r[0], r
    r = b.call("_scaled_dot_product_efficient_attention.default", q, k, v, None, True, 0.0, True)
    return r[0], r


def _backward(b, kind, grad, q, k, v, out, r):
    if kind == "cudnn":
        return b.call("_scaled_dot_product_cudnn_attention_backward.default", grad, q, k, v, out, r[1], r[6], r[7],
                      None, r[2], r[3], S, S, 0.0, True)
    if kind == "flash":
        return b.call("_scaled_dot_product_flash_attention_backward.default", grad, q, k, v, out, r[1], r[2], r[3],
                      S, S, 0.0, True, r[6], r[7])
    return b.call("_scaled_dot_product_efficient_attention_backward.default", grad, q, k, v, None, out, r[1],
                  r[2], r[3], 0.0, [True, True, True, False], True)[:3]


def attention_block(kind: str, rotary: bool, training: bool, gen: torch.Generator, dtype=torch.float32,
                    device: str = "cuda") -> tuple[AtenBuilder, Any]:
    """(builder, program): Llama's attention typed on ``device`` with the fused CUDA kernel
    ``kind`` (cudnn, flash, efficient): q, k, v from linear + view + transpose (a rotary
    embedding on q and k), fused attention, the output projection; with ``training`` also the
    backward of the attention and of the projections' weights. Its inputs:
    :func:`attention_inputs`."""
    b = AtenBuilder(device=device)
    x, wq, wk, wv, wo, cos, sin, grad_y = (b.input(t, f"x{i}") for i, t in enumerate(attention_inputs(gen, dtype)))
    x2 = b.call("view.default", x, [B * S, E])
    q, k, v = (_heads(b, x2, w) for w in (wq, wk, wv))
    if rotary:
        q, k = _rotary(b, q, cos, sin), _rotary(b, k, cos, sin)
    out, r = _forward(b, kind, q, k, v)
    y = b.call("mm.default", _merged(b, out), b.call("t.default", wo))
    if not training:
        return b, b.output(y)
    grad_out = b.call("transpose.int", b.call("view.default", b.call("mm.default", grad_y, wo), [B, S, H, D]), 1, 2)
    dq, dk, dv = _backward(b, kind, grad_out, q, k, v, out, r)
    if rotary:
        dq, dk = _rotary(b, dq, cos, sin), _rotary(b, dk, cos, sin)
    grads = [b.call("mm.default", b.call("t.default", _merged(b, g)), x2) for g in (dq, dk, dv)]
    return b, b.output(y, *grads)


def same_strides(shape: Sequence[int], a: Sequence[int], b: Sequence[int]) -> bool:
    """Whether two layouts of ``shape`` agree (strides of extent-1 dimensions address nothing)."""
    return all(n == 1 or x == y for n, x, y in zip(shape, a, b))


def check_against_eager(case: Case, run: Callable[..., Sequence[torch.Tensor]], seed: int = 0) -> None:
    """``run(builder, program, inputs)`` gives the program's outputs; they must equal eager's,
    values and strides."""
    gen = torch.Generator().manual_seed(seed)
    b, program = case.program(gen)
    fresh = case.make(gen)
    got, want = run(b, program, fresh), b.eager(*fresh)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, atol=case.atol, rtol=case.atol)
        if case.eager_strides:
            assert same_strides(w.shape, g.stride(), w.stride()), (case.name, g.stride(), w.stride())


def counted_copies(monkeypatch, runtime) -> list:
    """The library results a compiled wrapper had to copy into another layout: ``runtime``'s
    ``conform`` (a backend's runtime module) is wrapped for the test to count them."""
    counted: list = []
    conform = runtime.conform

    def counting(t, size, stride):
        out = conform(t, size, stride)
        if out.untyped_storage().data_ptr() != t.untyped_storage().data_ptr():  # (a view is no copy)
            counted.append((tuple(t.shape), t.stride(), tuple(stride)))
        return out

    monkeypatch.setattr(runtime, "conform", counting)
    return counted
