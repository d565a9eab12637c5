"""``torch.library`` custom operators through the whole pipeline, against eager: a custom op with
a fake kernel is one opaque extern call of the aten graph (capture, aten tracing,
functionalization, partitioning, lowering and the C++ wrapper), with fresh random inputs per
case; a mutating one through its functional form, its writes kept. ``fullgraph=True`` proves
there was no fallback."""

from __future__ import annotations

import logging

import pytest
import torch
from torch import Tensor

import fireclay
from fireclay_ir.stages import NOTICES

LIB = "fireclay_test_customops"
ops = getattr(torch.ops, LIB)


@torch.library.custom_op(f"{LIB}::scale_add", mutates_args=())
def scale_add(x: Tensor, y: Tensor, alpha: float) -> Tensor:
    return x * alpha + y


@scale_add.register_fake
def _(x, y, alpha):
    return torch.empty_like(x)


def _scale_add_backward(ctx, grad):
    return grad * ctx.alpha, grad, None


def _scale_add_setup(ctx, inputs, output):
    ctx.alpha = inputs[2]


scale_add.register_autograd(_scale_add_backward, setup_context=_scale_add_setup)


@torch.library.custom_op(f"{LIB}::matmul_rowsum", mutates_args=())
def matmul_rowsum(x: Tensor, w: Tensor) -> tuple[Tensor, Tensor]:
    return x @ w, x.sum(-1)


@matmul_rowsum.register_fake
def _(x, w):
    return x.new_empty(x.shape[0], w.shape[1]), x.new_empty(x.shape[0])


@torch.library.custom_op(f"{LIB}::grouped_rows", mutates_args=())
def grouped_rows(x: Tensor, weight: Tensor, offs: Tensor) -> Tensor:
    """Rows of ``x`` in groups (ends in ``offs``), each times its own matrix: the shape of
    transformers' grouped matmul fallback, with a loop over data no graph could hold."""
    out = x.new_zeros(x.shape[0], weight.shape[2])
    start = 0
    for i, end in enumerate(offs.tolist()):
        out[start:end] = x[start:end] @ weight[i]
        start = end
    return out


@grouped_rows.register_fake
def _(x, weight, offs):
    return x.new_empty(x.shape[0], weight.shape[2])


@torch.library.custom_op(f"{LIB}::grouped_rows_backward", mutates_args=())
def grouped_rows_backward(x: Tensor, weight: Tensor, offs: Tensor, grad: Tensor) -> tuple[Tensor, Tensor]:
    gx, gw = torch.zeros_like(x), torch.zeros_like(weight)
    start = 0
    for i, end in enumerate(offs.tolist()):
        gx[start:end] = grad[start:end] @ weight[i].T
        gw[i] = x[start:end].T @ grad[start:end]
        start = end
    return gx, gw


@grouped_rows_backward.register_fake
def _(x, weight, offs, grad):
    return torch.empty_like(x), torch.empty_like(weight)


def _grouped_rows_backward(ctx, grad):
    # as transformers does: the formula is itself a custom op, so a graph can hold it
    x, weight = ctx.saved_tensors
    gx, gw = ops.grouped_rows_backward(x, weight, ctx.offs, grad)
    return gx, gw, None


def _grouped_rows_setup(ctx, inputs, output):
    ctx.save_for_backward(inputs[0], inputs[1])
    ctx.offs = inputs[2]


grouped_rows.register_autograd(_grouped_rows_backward, setup_context=_grouped_rows_setup)


@torch.library.custom_op(f"{LIB}::clamp_mask", mutates_args=())
def clamp_mask(x: Tensor, bound: float) -> Tensor:
    """No autograd formula: used where no gradient flows."""
    return (x.abs() < bound).to(x.dtype)


@clamp_mask.register_fake
def _(x, bound):
    return torch.empty_like(x)


@torch.library.custom_op(f"{LIB}::row_scale", mutates_args=())
def row_scale(x: Tensor, scales: Tensor) -> Tensor:
    return x * scales[:, None]


@row_scale.register_fake
def _(x, scales):
    return torch.empty_like(x)


def _row_scale_backward(ctx, grad):
    # reads data in Python: a formula no graph can hold
    factors = [float(s) for s in ctx.scales.tolist()]
    return grad * torch.tensor(factors)[:, None], None


def _row_scale_setup(ctx, inputs, output):
    ctx.scales = inputs[1]


row_scale.register_autograd(_row_scale_backward, setup_context=_row_scale_setup)


@torch.library.custom_op(f"{LIB}::accumulate", mutates_args=("out",))
def accumulate(out: Tensor, x: Tensor) -> None:
    out.add_(x * 2)


@accumulate.register_fake
def _(out, x):
    return None




def functional(x, y):
    return ops.scale_add(x.sin(), y, 2.5).cos() + 1


def several_outputs(x, w):
    a, b = ops.matmul_rowsum(x.relu(), w)
    return a.tanh(), b * 2


def twice(x, y):
    # two calls of one op, one of them on the other's result
    z = ops.scale_add(x, y, 0.5)
    return ops.scale_add(z.exp(), x, -1.0)


def masked(x, y):
    return x * ops.clamp_mask(y.detach(), 0.5) + y


def grouped(x, w):
    offs = torch.tensor([2, 2, 5, 7])  # a constant of the graph, read by the op's own loop
    return ops.grouped_rows(x.sigmoid(), w, offs).relu()


class Expert(torch.nn.Module):
    """A layer around custom ops: a linear projection, a grouped matmul over expert weights,
    a custom scale-add residual, a norm."""

    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(6, 6)
        self.experts = torch.nn.Parameter(torch.randn(3, 6, 6) * 0.3)
        self.norm = torch.nn.LayerNorm(6)
        self.register_buffer("offs", torch.tensor([3, 5, 8]))

    def forward(self, x):
        h = self.proj(x)
        h = ops.grouped_rows(h, self.experts, self.offs)
        h = ops.scale_add(torch.nn.functional.gelu(h), x, 0.5)
        return self.norm(h) * ops.clamp_mask(x.detach(), 1.0)


def _inputs(shapes, grad, seed):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(*s, generator=gen).requires_grad_(grad) for s in shapes]


CASES = [
    pytest.param(functional, [(4, 5), (4, 5)], id="functional"),
    pytest.param(several_outputs, [(4, 5), (5, 3)], id="several_outputs"),
    pytest.param(twice, [(3, 4), (3, 4)], id="two_calls"),
    pytest.param(masked, [(5, 3), (5, 3)], id="no_autograd_formula_off_the_grad_path"),
    pytest.param(grouped, [(7, 4), (4, 4, 3)], id="grouped_matmul"),
]


@pytest.fixture(autouse=True)
def _isolated(monkeypatch):
    monkeypatch.setattr(fireclay.config, "compile_cache", False)
    NOTICES.clear()
    yield
    NOTICES.clear()


def _close(got, want):
    got = got if isinstance(got, tuple) else (got,)
    want = want if isinstance(want, tuple) else (want,)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("fn, shapes", CASES)
def test_inference_in_one_graph_matches_eager(fn, shapes, seed):
    compiled = fireclay.compile(fn, fullgraph=True)
    for s in (seed, seed + 10):  # a second call reuses the compiled graph
        inputs = _inputs(shapes, False, s)
        with torch.no_grad():
            _close(compiled(*inputs), fn(*inputs))


@pytest.mark.parametrize("fn, shapes", [c for c in CASES if c.id != "several_outputs"])
def test_training_traces_through_the_autograd_formula(fn, shapes):
    compiled = fireclay.compile(fn, fullgraph=True)
    ours, theirs = _inputs(shapes, True, 3), _inputs(shapes, True, 3)
    got, want = compiled(*ours), fn(*theirs)
    _close(got, want)
    got = got if isinstance(got, tuple) else (got,)
    want = want if isinstance(want, tuple) else (want,)
    cotangents = [torch.randn_like(w) for w in want]
    torch.autograd.backward(got, cotangents)
    torch.autograd.backward(want, cotangents)
    for a, b in zip(ours, theirs):
        torch.testing.assert_close(a.grad, b.grad, atol=1e-5, rtol=1e-5)


def test_a_model_around_custom_ops_trains_as_in_eager():
    torch.manual_seed(0)
    ours = Expert()
    theirs = Expert()
    theirs.load_state_dict(ours.state_dict())
    compiled = fireclay.compile(ours, fullgraph=True)
    opt_ours = torch.optim.SGD(ours.parameters(), lr=0.1)
    opt_theirs = torch.optim.SGD(theirs.parameters(), lr=0.1)
    for step in range(3):
        x = torch.randn(8, 6, generator=torch.Generator().manual_seed(step))
        for model, opt in ((compiled, opt_ours), (theirs, opt_theirs)):
            opt.zero_grad()
            model(x).pow(2).sum().backward()
            opt.step()
    for (name, a), b in zip(ours.named_parameters(), theirs.parameters()):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5, msg=name)
    with torch.no_grad():
        x = torch.randn(8, 6)
        _close(compiled(x), theirs(x))


def test_without_an_autograd_formula_the_backward_fails_as_in_eager():
    def on_grad_path(x):
        return ops.clamp_mask(x * 2, 0.5).sum()

    x = torch.randn(4, requires_grad=True)
    with pytest.raises(RuntimeError) as eager:
        on_grad_path(x).backward()
    with pytest.raises(RuntimeError) as ours:
        fireclay.compile(on_grad_path)(x).backward()
    assert "clamp_mask" in str(ours.value) and "clamp_mask" in str(eager.value)


def test_an_autograd_formula_no_graph_can_hold_falls_back_with_a_warning(caplog):
    def scaled(x, s):
        return ops.row_scale(x.tanh(), s).sum(0)

    compiled = fireclay.compile(scaled)
    caplog.set_level(logging.INFO)
    for seed in (0, 1):
        ours, theirs = _inputs([(4, 3)], True, seed), _inputs([(4, 3)], True, seed)
        s = torch.rand(4)
        got, want = compiled(ours[0], s), scaled(theirs[0], s)
        _close(got, want)
        got.sum().backward()
        want.sum().backward()
        torch.testing.assert_close(ours[0].grad, theirs[0].grad)
    warned = _fireclay_warnings(caplog)
    assert len(warned) == 1 and "aten tracing" in warned[0], warned


def _fireclay_warnings(caplog) -> list[str]:
    return list(dict.fromkeys(r.getMessage() for r in caplog.records
                              if r.levelno == logging.WARNING and r.name.startswith("fireclay")))


def mutating(x, y):
    z = x * 2
    ops.accumulate(z, y)
    ops.accumulate(z[1:], y[:2].exp())  # a write through a view
    ops.accumulate(x, z)  # a graph input, written in place
    return z + 1


@pytest.mark.parametrize("seed", [0, 1])
def test_a_mutating_custom_op_keeps_its_effect_in_one_graph(seed):
    compiled = fireclay.compile(mutating, fullgraph=True)
    for s in (seed, seed + 10):
        ours, theirs = _inputs([(3,), (3,)], False, s), _inputs([(3,), (3,)], False, s)
        _close(compiled(*ours), mutating(*theirs))
        _close(tuple(ours), tuple(theirs))  # the write into x happened


def test_a_mutating_custom_op_off_the_grad_path_trains_in_one_graph():
    def fn(x, y):
        buf = torch.zeros_like(y)
        ops.accumulate(buf, y.detach())
        return (x.sin() * buf).sum()

    compiled = fireclay.compile(fn, fullgraph=True)
    ours, theirs = _inputs([(4,), (4,)], True, 5), _inputs([(4,), (4,)], True, 5)
    got, want = compiled(*ours), fn(*theirs)
    _close(got, want)
    got.backward()
    want.backward()
    torch.testing.assert_close(ours[0].grad, theirs[0].grad)
