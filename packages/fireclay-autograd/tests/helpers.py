"""Shared checks: run a function eagerly and through fireclay-autograd, compare everything."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import torch
from fx_programs import program_from

from fireclay_autograd import compile_program


def clone_inputs(inputs: list[Any]) -> list[Any]:
    out = []
    for x in inputs:
        if isinstance(x, torch.Tensor):
            y = x.detach().clone()
            y.requires_grad_(x.requires_grad)
            out.append(y)
        else:
            out.append(x)
    return out


def as_tuple(x: Any) -> tuple:
    return tuple(x) if isinstance(x, (tuple, list)) else (x,)


def check_against_eager(fn: Callable, inputs: list[Any], *, grad: bool = True, atol: float = 1e-5,
                        rtol: float = 1e-5, **compile_kwargs: Any) -> Any:
    """Forward outputs, and (``grad``) gradients of a random cotangent, equal eager's."""
    program = program_from(fn, clone_inputs(inputs))
    compiled = compile_program(program, clone_inputs(inputs), **compile_kwargs)
    return compare_with_eager(fn, compiled, inputs, grad=grad, atol=atol, rtol=rtol)


def compare_with_eager(fn: Callable, compiled: Callable, inputs: list[Any], *, grad: bool = True,
                       atol: float = 1e-5, rtol: float = 1e-5) -> Any:
    """Run ``compiled`` (a compiled form of ``fn``) and ``fn`` on copies of ``inputs``; forward
    outputs and (``grad``) gradients of a random cotangent must match."""
    eager_in, ours_in = clone_inputs(inputs), clone_inputs(inputs)
    fn_eager = copy.deepcopy(fn) if isinstance(fn, torch.nn.Module) else fn
    with torch.set_grad_enabled(grad):
        expected = as_tuple(fn_eager(*eager_in))
        got = as_tuple(compiled(*ours_in))
    assert len(expected) == len(got)
    for e, g in zip(expected, got):
        if isinstance(e, torch.Tensor):
            assert g.shape == e.shape and g.dtype == e.dtype, (g.shape, e.shape, g.dtype, e.dtype)
            torch.testing.assert_close(g, e, atol=atol, rtol=rtol, equal_nan=True)
            assert g.requires_grad == e.requires_grad
        else:
            assert g == e
    if not grad:
        return compiled
    pairs = [(e, g) for e, g in zip(expected, got) if isinstance(e, torch.Tensor) and e.requires_grad]
    if not pairs:
        return compiled
    cotangents = [torch.randn_like(e) for e, _ in pairs]
    eager_leaves = [x for x in eager_in if isinstance(x, torch.Tensor) and x.requires_grad]
    our_leaves = [x for x in ours_in if isinstance(x, torch.Tensor) and x.requires_grad]
    if isinstance(fn, torch.nn.Module):
        eager_leaves += [p for p in fn_eager.parameters() if p.requires_grad]
        our_leaves += [p for p in fn.parameters() if p.requires_grad]
    e_grads = torch.autograd.grad([e for e, _ in pairs], eager_leaves, cotangents, allow_unused=True)
    g_grads = torch.autograd.grad([g for _, g in pairs], our_leaves, cotangents, allow_unused=True)
    for eg, gg in zip(e_grads, g_grads):
        if eg is None:
            assert gg is None or bool((gg == 0).all())
            continue
        assert gg is not None
        torch.testing.assert_close(gg, eg, atol=atol, rtol=rtol, equal_nan=True)
    return compiled
